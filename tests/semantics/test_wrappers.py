"""Which objects are the DDP / DataParallel wrapper (model/values.py `wraps`,
model/wrappers.py `wrapper_in`): torch's classes, and classes of the tree
that derive from them, across modules and re-exports."""

from __future__ import annotations

import pytest

from ddpcheck.model.values import wraps
from ddpcheck.model.wrappers import kinds_told_apart, tells_wrapper_apart, wrapper_in
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked


def held(model, marker: str = "use"):
    expr, site = marked(model, marker)
    found = wrapper_in(model, expr, site.ctx)
    return found[0] if found is not None else None


def _package(tmp_path, body: str = "    pass\n"):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "nets" / "__init__.py", "from pkg.nets.wrapping import ParallelNet\n")
    write(tmp_path / "pkg" / "nets" / "wrapping.py",
          "import torch.nn as nn\n"
          "class Saving(nn.Module):\n    def save_to(self, path):\n        pass\n"
          "class ParallelNet(nn.parallel.DistributedDataParallel, Saving):\n" + body)


def test_a_subclass_of_ddp_in_a_helper_package_is_the_wrapper(tmp_path):
    _package(tmp_path)
    train = write(tmp_path / "train.py",
                  "from pkg.nets import ParallelNet\n"
                  "class Runner:\n"
                  "    def __init__(self, net):\n"
                  "        self.net = net\n"
                  "        if distributed:\n"
                  "            self.net = ParallelNet(self.net, device_ids=[0])\n"
                  "    def checkpoint(self):\n"
                  "        use(self.net)\n")
    model = build_file(train)
    (w,) = wraps(model)
    assert w.kind == "DistributedDataParallel" and w.subclass[1].name == "ParallelNet"
    assert held(model) is w
    assert not w.overrides("state_dict") and w.overrides("save_to")


def test_a_subclass_that_defines_its_own_state_dict_overrides_it(tmp_path):
    _package(tmp_path, "    def state_dict(self, *a, **k):\n        return self.module.state_dict(*a, **k)\n")
    train = write(tmp_path / "train.py", "from pkg.nets import ParallelNet\nnet = ParallelNet(net)\nuse(net)\n")
    (w,) = wraps(build_file(train))
    assert w.overrides("state_dict")


def test_a_subclass_of_dataparallel_in_the_same_file():
    model = build("""
        from torch import nn
        class Balanced(nn.DataParallel):
            pass
        net = Balanced(net)
        use(net)
        """)
    (w,) = wraps(model)
    assert w.kind == "DataParallel" and w.subclass is not None and held(model) is w


def test_a_class_of_the_tree_named_like_the_wrapper_is_not_it():
    # the name is the user's own: no torch base
    model = build("""
        import torch.nn as nn
        class DistributedDataParallel(nn.Module):
            def __init__(self, module):
                super().__init__()
                self.module = module
        net = DistributedDataParallel(net)
        use(net)
        """)
    assert wraps(model) == [] and held(model) is None


def test_a_subclass_of_another_library_class_is_not_the_wrapper():
    model = build("""
        import torch.nn as nn
        class Net(nn.Module):
            pass
        net = Net()
        use(net)
        """)
    assert wraps(model) == [] and held(model) is None


@pytest.mark.parametrize("test, kinds", [
    ("isinstance(m, DataParallel)", frozenset({"DataParallel"})),
    ("not isinstance(m, nn.DataParallel)", frozenset({"DataParallel"})),
    ("isinstance(m, DDP)", frozenset({"DistributedDataParallel"})),
    ("isinstance(m, (DataParallel, DDP))", frozenset({"DataParallel", "DistributedDataParallel"})),
    ("hasattr(m, 'module')", None),              # every kind has `.module`
    ("isinstance(m, MyWrapper)", None),          # a class the engine cannot name: every kind
    ("epoch > 3", frozenset()),                  # tells nothing
])
def test_the_wrapper_kinds_a_test_tells_apart(test, kinds):
    code = ("import torch.nn as nn\nfrom torch.nn import DataParallel\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            f"use({test})\n")
    model = build(code)
    expr, _ = marked(model)
    assert kinds_told_apart(model, expr) == kinds


_REBOUND = ("import torch\nfrom torch.nn import DataParallel\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "def save(model):\n    if isinstance(model, {cls}):\n        model = model.module\n    use(model)\n"
            "def main(net):\n    model = {wrap}(net)\n    save(model)\n")


@pytest.mark.parametrize("cls, wrap, wrapped", [
    ("DDP", "DDP", False),                           # unwrapped on the only path the call takes
    ("(DataParallel, DDP)", "DataParallel", False),
    ("DataParallel", "DDP", True),                   # a DDP model is no DataParallel: still the wrapper
    ("DDP", "DataParallel", True),
])
def test_an_isinstance_rebinding_is_judged_by_what_the_call_passes(cls, wrap, wrapped):
    assert (held(build(_REBOUND.format(cls=cls, wrap=wrap))) is not None) is wrapped


@pytest.mark.parametrize("helper, told", [
    ("return type(m) in (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)", True),
    ("return hasattr(m, 'module')", True),
    ("return m.training", False),                   # says nothing of the wrapper
    ("if m is None:\n        return False\n    return isinstance(m, DDP)", False),   # one return tells nothing
])
def test_a_call_of_a_helper_returning_a_wrapper_test_tells_it_apart(helper, told):
    code = ("import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            f"def is_parallel(m):\n    {helper}\nuse(is_parallel(net))\nuse(not is_parallel(net), 1)\n")
    model = build(code)
    assert tells_wrapper_apart(model, marked(model)[0]) is told
    assert tells_wrapper_apart(model, marked(model, nth=1)[0]) is told
