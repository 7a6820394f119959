"""DDP306 compiled-state-dict: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"


def test_message_and_fix():
    src = HEAD + "model = torch.compile(model)\ntorch.save(model.state_dict(), 'm.pt')\n"
    (f,) = findings("DDP306", src)
    assert f.line == 5 and f.severity.name == "WARNING"
    assert "`_orig_mod.`" in f.message and "(line 4)" in f.message
    assert "`model._orig_mod.state_dict()`" in f.fix and "`model.compile()`" in f.fix


def test_fix_names_the_module_that_was_compiled():
    src = HEAD + "fast = torch.compile(net).cuda()\ntorch.save(fast.state_dict(), 'm.pt')\n"
    (f,) = findings("DDP306", src)
    assert "save `net.state_dict()`" in f.fix


def test_checkpoint_dict_filled_before_the_save():
    src = HEAD + ("model = torch.compile(model)\nckpt = {}\nckpt['model'] = model.state_dict()\n"
                  "torch.save(ckpt, 'c.pt')\n")
    assert lines("DDP306", src) == [6]


def test_not_reported():
    cases = [
        "model = torch.compile(model)\ntorch.save(model._orig_mod.state_dict(), 'm.pt')\n",
        "model.compile()\ntorch.save(model.state_dict(), 'm.pt')\n",
        "fast = torch.compile(model)\ntorch.save(model.state_dict(), 'm.pt')\n",
        "torch.save(model.state_dict(), 'm.pt')\nmodel = torch.compile(model)\n",
        "model = torch.compile(model)\nmodel = model._orig_mod\ntorch.save(model.state_dict(), 'm.pt')\n",
        "model = torch.compile(model)\nsd = model.state_dict()\nsd = {k.replace('_orig_mod.', ''): v for k, v in sd.items()}\n"
        "torch.save(sd, 'm.pt')\n",
        "if args.compile:\n    model = torch.compile(model)\nelse:\n    torch.save(model.state_dict(), 'm.pt')\n",
    ]
    for body in cases:
        assert lines("DDP306", HEAD + body) == [], body


def test_conditional_compile_is_reported():
    src = HEAD + "if args.compile:\n    model = torch.compile(model)\ntorch.save(model.state_dict(), 'm.pt')\n"
    assert lines("DDP306", src) == [6]


def test_self_model_of_another_class():
    src = HEAD + ("class A:\n    def __init__(self, m):\n        self.model = torch.compile(m)\n"
                  "class B:\n    def save(self):\n        torch.save(self.model.state_dict(), 'b.pt')\n"
                  "    def __init__(self, m):\n        self.model = m\n")
    assert lines("DDP306", src) == []
