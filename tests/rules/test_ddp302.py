"""DDP302 wrapped-state-dict: beyond the fixtures."""

from pathlib import Path

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY
from tests.conftest import write
from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(build(), device_ids=[0])
"""


def test_direct_save_message():
    [f] = findings("DDP302", HEAD + "torch.save(model.state_dict(), 'a.pt')\n")
    assert f.line == 5
    assert "`model.state_dict()`" in f.message and "module." in f.message
    assert "DistributedDataParallel" in f.message
    assert "model.module.state_dict()" in f.fix


def test_through_dict_and_subscript_assignments():
    src = HEAD + """
ckpt = {"model": model.state_dict(), "epoch": 3}
torch.save(ckpt, "a.pt")
state = {}
state["net"] = model.state_dict()
torch.save(state, "b.pt")
"""
    assert lines("DDP302", src) == [6, 9]


def test_not_saved_is_silent():
    assert lines("DDP302", HEAD + "sd = model.state_dict()\nprint(len(sd))\n") == []


def test_unwrapped_forms_are_silent():
    for body in (
        "torch.save(model.module.state_dict(), 'a.pt')\n",
        "m = model.module if hasattr(model, 'module') else model\ntorch.save(m.state_dict(), 'a.pt')\n",
        "torch.save(model.module.state_dict() if args.distributed else model.state_dict(), 'a.pt')\n",
        "model = model.module\ntorch.save(model.state_dict(), 'a.pt')\n",
        "np.save(model.state_dict())\n",
    ):
        assert lines("DDP302", HEAD + body) == [], body


def test_save_before_the_wrap_is_silent():
    src = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n" \
          "torch.save(model.state_dict(), 'init.pt')\nmodel = DDP(model)\n"
    assert lines("DDP302", src) == []


def test_dataparallel_and_self_attribute():
    src = """\
import torch
import torch.nn as nn

class Trainer:
    def __init__(self, net):
        self.net = nn.DataParallel(net)

    def save(self, path):
        torch.save({"net": self.net.state_dict()}, path)
"""
    [f] = findings("DDP302", src)
    assert f.line == 9 and "DataParallel" in f.message


def test_unseen_helpers_count_only_when_named_like_a_save():
    src = HEAD + "from vendor import io\nio.save_on_master({'m': model.state_dict()}, 'a')\nio.log_state(model.state_dict())\n"
    assert lines("DDP302", src) == [6]


def test_helper_of_the_tree_is_read(tmp_path: Path):
    write(tmp_path / "ckpt.py", """\
        import torch
        import torch.distributed as dist

        def store(obj, path):
            torch.save(obj, path)

        def save_checkpoint(sd, path):
            torch.save({k.replace("module.", ""): v for k, v in sd.items()}, path)
        """)
    train = write(tmp_path / "train.py", """\
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from ckpt import save_checkpoint, store

        model = DDP(build())
        store(model.state_dict(), "a.pt")
        save_checkpoint(model.state_dict(), "b.pt")
        """)
    result = lint_path(str(train), LintSettings(enabled=frozenset(REGISTRY)))
    assert [f.line for f in result.findings if f.code == "DDP302"] == [6]


def test_wrap_in_one_arm_reaches_the_save_after_the_if():
    src = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
model = build()
if args.distributed:
    model = DDP(model, device_ids=[args.gpu])
else:
    model = model.cuda()
torch.save(model.state_dict(), "last.pth")
"""
    assert lines("DDP302", src) == [8]


def test_both_kinds_named_in_the_message():
    src = """\
import torch
if args.distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
else:
    model = torch.nn.DataParallel(model)
torch.save({"state_dict": model.state_dict()}, "ckpt.pth")
"""
    [f] = findings("DDP302", src)
    assert "DistributedDataParallel or DataParallel" in f.message
