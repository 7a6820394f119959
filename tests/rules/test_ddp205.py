"""DDP205 wrapper-attribute: beyond the fixtures."""

import pytest

from ddpcheck.model.module_api import WRAPPER_API, on_wrapper
from tests.rules.lintsnippet import findings, lines

HEAD = ("import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('nccl')\n")


def test_the_api_list_matches_installed_torch():
    """Every public name of nn.Module / DDP / DataParallel is the wrapper's own."""
    torch = pytest.importorskip("torch")
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    for cls in (torch.nn.Module, DistributedDataParallel, DataParallel):
        public = {n for n in dir(cls) if not n.startswith("_")}
        assert public <= WRAPPER_API, (cls.__name__, sorted(public - WRAPPER_API))
    assert {"module", "no_sync", "join", "register_comm_hook", "device_ids", "training"} <= WRAPPER_API
    assert not on_wrapper("freeze_bn") and on_wrapper("_orig_mod") and on_wrapper("state_dict")


@pytest.mark.parametrize("use", ["model.freeze_bn()", "x = model.encoder(x)", "out = model.generate(ids)",
                                 "model.save_pretrained('out')", "n = model.config.hidden_size"])
def test_user_attributes_through_the_wrapper(use):
    src = HEAD + f"model = DDP(model, device_ids=[0])\n{use}\n"
    (f,) = findings("DDP205", src)
    assert f.line == 6 and f.severity.name == "ERROR"
    attr = use.split("model.")[1].split("(")[0].split(".")[0]
    assert f"has no attribute '{attr}'" in f.message and f"`model.module.{attr}`" in f.fix


@pytest.mark.parametrize("use", ["model.train()", "model.eval()", "p = model.parameters()", "model.zero_grad()",
                                 "sd = model.state_dict()", "model.module.freeze_bn()", "model.half()",
                                 "model.register_comm_hook(None, hook)", "m = model.named_modules()",
                                 "model.require_backward_grad_sync = False", "model.apply(init_fn)",
                                 "d = model.device_ids", "model._orig_mod", "y = model.forward(x)"])
def test_the_wrappers_own_api(use):
    src = HEAD + f"model = DDP(model, device_ids=[0])\n{use}\n"
    assert lines("DDP205", src) == [], use


def test_dataparallel_too():
    src = HEAD + "net = torch.nn.DataParallel(net)\nnet.freeze_bn()\n"
    (f,) = findings("DDP205", src)
    assert "'DataParallel' object has no attribute 'freeze_bn'" in f.message


def test_before_the_wrap_and_after_unwrapping():
    src = HEAD + "model.freeze_bn()\nmodel = DDP(model)\nmodel = model.module\nmodel.freeze_bn()\n"
    assert lines("DDP205", src) == []


def test_attribute_set_on_the_wrapper():
    src = HEAD + "model = DDP(model)\nmodel.epoch = 0\nprint(model.epoch)\n"
    assert lines("DDP205", src) == []


def test_try_and_isinstance_fallbacks():
    src = HEAD + ("model = DDP(model)\ntry:\n    model.freeze_bn()\nexcept AttributeError:\n"
                  "    model.module.freeze_bn()\nif not isinstance(model, DDP):\n    model.freeze_bn()\n")
    assert lines("DDP205", src) == []


def test_a_parameter_is_not_followed():
    src = HEAD + "model = DDP(model)\ndef evaluate(model):\n    model.freeze_bn()\n"
    assert lines("DDP205", src) == []
    src = HEAD + "def run(model):\n    model = DDP(model)\n    model.freeze_bn()\n"
    assert lines("DDP205", src) == [7]


def test_loop_variable_shadows_the_wrapper():
    src = HEAD + "model = DDP(model)\nfor model in ensemble:\n    model.freeze_bn()\n"
    assert lines("DDP205", src) == []


def test_self_model_in_another_method():
    src = HEAD + ("class T:\n    def __init__(self, m):\n        self.model = DDP(m)\n"
                  "    def step(self):\n        self.model.freeze_bn()\n        self.model.module.freeze_bn()\n")
    assert lines("DDP205", src) == [9]


def test_apex_wrapper_is_not_judged():
    src = HEAD + "from apex.parallel import DistributedDataParallel as ApexDDP\nmodel = ApexDDP(model)\nmodel.freeze_bn()\n"
    assert lines("DDP205", src) == []


def test_wrapper_passed_into_a_function():
    """`train(model, ...)` right after `model = DDP(model)`: the parameter is the wrapper."""
    src = HEAD + ("def train(net, loader):\n    net.train()\n    net.freeze_bn()\n"
                  "def main():\n    model = DDP(build(), device_ids=[0])\n    train(model, loader)\n")
    (f,) = findings("DDP205", src)
    assert f.line == 7
    assert "`net` is the DistributedDataParallel wrapper that `train(...)` in main() passes in" in f.message


def test_function_also_handed_on_or_called_with_the_plain_model():
    handed = HEAD + ("def train(net):\n    net.freeze_bn()\n"
                     "model = DDP(build())\ntrain(model)\nhooks.append(train)\n")
    assert lines("DDP205", handed) == []
    plain = HEAD + ("def train(net):\n    net.freeze_bn()\n"
                    "model = build()\ntrain(model)\nmodel = DDP(model)\ntrain(model.module)\n")
    assert lines("DDP205", plain) == []


def test_method_called_by_the_wrapping_method_before_the_wrap():
    """minGPT-ddp's Trainer: `self._load_snapshot()` runs in __init__ before
    `self.model = DDP(self.model)`."""
    src = HEAD + ("class Trainer:\n    def __init__(self, model):\n        self.model = model\n"
                  "        self._prepare()\n        self.model = DDP(self.model)\n"
                  "    def _prepare(self):\n        self.model.freeze_backbone()\n"
                  "    def later(self):\n        self.model.freeze_backbone()\n")
    assert lines("DDP205", src) == [13]


def test_self_model_of_another_class():
    """A Trainer wraps its `self.model`; an Evaluator's `self.model` is another object."""
    src = HEAD + ("class Trainer:\n    def __init__(self, m):\n        self.model = DDP(m)\n"
                  "class Evaluator:\n    def __init__(self, m):\n        self.model = m\n"
                  "    def run(self):\n        self.model.freeze_bn()\n"
                  "class Exporter:\n    def run(self):\n        self.model.freeze_bn()\n")
    assert lines("DDP205", src) == []
