"""A test of an attribute of the object a method runs on (`if self.device_id
== 0:`) judged by the value the attribute holds, not by its name: the store
in the constructor (through `super().__init__(...)` too) and what each
construction of the object passes. Unknown stays unknown: one construction
passing something that is not a rank, or a store outside the constructor,
leaves the test unjudged (every rank may write)."""

from __future__ import annotations

from ddpcheck.model.flow import resolve_call
from ddpcheck.model.writes import writes_on_every_rank
from tests.conftest import write
from tests.semantics.helpers import build_file

_BASE = ("import torch\n"
         "class Base:\n"
         "    def __init__(self, net, device_id):\n"
         "        self.net = net\n"
         "        self.device_id = device_id\n"
         "    def save(self, path):\n"
         "        if self.device_id == 0:\n"
         "            torch.save(self.net.state_dict(), path)\n"
         "class Loop(Base):\n"
         "    def __init__(self, net, device_id):\n"
         "        super().__init__(net, device_id)\n"
         "    def run(self):\n"
         "        self.save('w.pt')\n")


def _every_rank_writes(tmp_path, script: str, method: str = "run") -> bool:
    write(tmp_path / "base.py", _BASE)
    model = build_file(write(tmp_path / "train.py", "import os\nimport torch.distributed as dist\n"
                                                    "from base import Loop\n" + script))
    site = next(c for c in model.calls if c.attr == method)
    target = resolve_call(model, site)
    assert target is not None
    return writes_on_every_rank(*target, frames=((model, site),)) is not None


def test_an_attribute_holding_the_rank_each_construction_passes_is_a_rank_test(tmp_path):
    assert not _every_rank_writes(tmp_path, "local_rank = int(os.environ['LOCAL_RANK'])\n"
                                            "Loop(None, device_id=local_rank).run()\n")


def test_the_rank_passed_through_a_variable_holding_the_object(tmp_path):
    assert not _every_rank_writes(tmp_path, "loop = Loop(None, dist.get_rank())\nloop.run()\n")


def test_a_literal_passed_on_every_rank_lets_every_rank_write(tmp_path):
    assert _every_rank_writes(tmp_path, "Loop(None, device_id=0).run()\n")


def test_one_construction_passing_something_else_leaves_the_test_unjudged(tmp_path):
    assert _every_rank_writes(tmp_path, "import sys\nloop = Loop(None, dist.get_rank())\n"
                                        "if sys.argv:\n    loop = Loop(None, 0)\nloop.run()\n")


def test_an_attribute_stored_again_outside_the_constructor_is_not_judged(tmp_path):
    write(tmp_path / "base.py", _BASE + "    def move(self, d):\n        self.device_id = d\n")
    model = build_file(write(tmp_path / "train.py", "import torch.distributed as dist\nfrom base import Loop\n"
                                                    "Loop(None, dist.get_rank()).run()\n"))
    site = next(c for c in model.calls if c.attr == "run")
    assert writes_on_every_rank(*resolve_call(model, site), frames=((model, site),)) is not None
