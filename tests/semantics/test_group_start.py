"""Where running a function starts the process group (model/distributed.py:
group_start_in): in its body or any number of calls down, across modules and
through constructors and methods; a recursive chain ends."""

from __future__ import annotations

from ddpcheck.model.distributed import group_start_in
from ddpcheck.model.flow import resolve_call
from tests.conftest import write
from tests.semantics.helpers import build_file


def _start(tmp_path, entry_call: str):
    model = build_file(tmp_path / "train.py", tmp_path)
    site = next(c for c in model.calls if c.func == entry_call)
    found = group_start_in(*resolve_call(model, site))
    return None if found is None else (found[0].file_name, found[1].func)


def test_three_calls_down_through_a_base_class_constructor(tmp_path):
    write(tmp_path / "comm.py", "import torch.distributed as dist\ndef start():\n    dist.init_process_group('nccl')\n")
    write(tmp_path / "base.py", "from comm import start\nclass Base:\n    def __init__(self):\n        self.setup()\n"
                                "    def setup(self):\n        start()\n")
    write(tmp_path / "task.py", "from base import Base\nclass Task(Base):\n    pass\n")
    write(tmp_path / "train.py", "from task import Task\nTask()\n")
    assert _start(tmp_path, "Task") == ("comm.py", "dist.init_process_group")


def test_a_chain_that_starts_nothing(tmp_path):
    write(tmp_path / "walk.py", "import torch.distributed as dist\n"
                                "def down(n):\n    if n:\n        up(n)\n"
                                "def up(n):\n    down(n - 1)\n"
                                "def never():\n    dist.init_process_group('gloo')\n")
    write(tmp_path / "train.py", "from walk import down\ndown(3)\n")
    assert _start(tmp_path, "down") is None
