"""Work every rank does at once, found down a chain of calls into other
modules (model/rankfirst.py: unordered_work, helper_work_at_once).

The chain is followed to its end, any number of calls down: a constructor
whose `__init__` calls `super().__init__`, which makes an object of a third
module whose `__init__` calls a method of its own that creates the folder. A
rank guard anywhere on the chain, an argument that turns the work off, or
`exist_ok=True` stop it; a recursive chain ends."""

from __future__ import annotations

from ddpcheck.model.downloads import same_download
from ddpcheck.model.makedirs import racy_folder_creation
from ddpcheck.model.rankfirst import every_rank_at_once, helper_work_at_once
from tests.conftest import write
from tests.semantics.helpers import build, build_file

RECORDER = """\
import os
class Recorder:
    def __init__(self, out):
        self.out = out
        self.open()
    def open(self):
        if not os.path.exists(self.out):
            os.makedirs(self.out{exist_ok})
"""

BASE = """\
from rec import Recorder
class Base:
    def __init__(self, out, rank, log=True):
        {guard}self.rec = Recorder(out)
"""

TASK = """\
from base import Base
class Task(Base):
    def __init__(self, out, rank, log=True):
        super().__init__(out, rank, log=log)
"""


def _work(tmp_path, entry: str, exist_ok: str = "", guard: str = "if log:\n            "):
    write(tmp_path / "rec.py", RECORDER.format(exist_ok=exist_ok))
    write(tmp_path / "base.py", BASE.format(guard=guard))
    write(tmp_path / "task.py", TASK)
    model = build_file(write(tmp_path / "train.py", "import torch.distributed as dist\nfrom task import Task\n"
                                                    "dist.init_process_group('nccl')\n" + entry), tmp_path)
    site = next(c for c in model.calls if c.func == "Task")
    found = helper_work_at_once(model, site, racy_folder_creation)
    return None if found is None else (found[0].file_name, found[1].func)


def test_the_work_four_calls_down_is_found(tmp_path):
    assert _work(tmp_path, "t = Task('out', dist.get_rank())\n") == ("rec.py", "os.makedirs")


def test_a_rank_guard_at_the_call_stops_it(tmp_path):
    assert _work(tmp_path, "if dist.get_rank() == 0:\n    t = Task('out', 0)\n") is None


def test_a_rank_guard_inside_the_chain_stops_it(tmp_path):
    assert _work(tmp_path, "t = Task('out', dist.get_rank())\n", guard="if rank == 0:\n            ") is None


def test_an_argument_that_turns_the_work_off_stops_it(tmp_path):
    # `log=False` is handed on by Task to Base, whose `if log:` is judged at the outer call
    assert _work(tmp_path, "t = Task('out', dist.get_rank(), log=False)\n") is None


def test_exist_ok_stops_it(tmp_path):
    assert _work(tmp_path, "t = Task('out', dist.get_rank())\n", exist_ok=", exist_ok=True") is None


def test_a_recursive_chain_ends(tmp_path):
    write(tmp_path / "walk.py", "def down(d, n):\n    if n:\n        up(d, n - 1)\n"
                                "def up(d, n):\n    down(d, n)\n")
    model = build_file(write(tmp_path / "train.py", "import torch.distributed as dist\nfrom walk import down\n"
                                                    "dist.init_process_group('nccl')\ndown('o', 3)\n"), tmp_path)
    site = next(c for c in model.calls if c.func == "down")
    assert helper_work_at_once(model, site, racy_folder_creation) is None


ORDERING = """\
import os, shutil, time
import torch.distributed as dist
from torchvision.datasets import CIFAR10
def main(local_rank, root):
    dist.init_process_group("nccl")
    if local_rank == 0:
        {rank_zero}
    else:
        {others}
    return CIFAR10(root, download=True)
main(int(os.environ["LOCAL_RANK"]), "data")
"""


def _download_at_once(rank_zero: str, others: str) -> bool:
    model = build(ORDERING.format(rank_zero=rank_zero, others=others))
    site = next(c for c in model.calls if c.func == "CIFAR10")
    return every_rank_at_once(model, site, same_download)


def test_a_wait_loop_for_another_file_does_not_order_the_download():
    assert _download_at_once("shutil.copy('a', 'b')",
                             "while not os.path.exists('b'):\n            time.sleep(1)")


def test_rank_zero_downloading_before_a_barrier_orders_it():
    assert not _download_at_once("CIFAR10(root, download=True)\n        dist.barrier()", "dist.barrier()")


def test_a_call_made_inside_a_rank_zero_first_manager_orders_what_it_runs():
    from ddpcheck.model.rankfirst import ordered_first

    model = build("""
        import torch
        from utils import torch_distributed_zero_first
        class Cache:
            def __init__(self, p):
                self.fill(p)
            def fill(self, p):
                torch.save({}, p)
        def make(p, rank):
            with torch_distributed_zero_first(rank):
                return Cache(p)
        def plain(p):
            torch.save({}, p)
        def first(p, rank):
            make(p, rank)
            plain(p)
            with torch_distributed_zero_first(rank):
                plain(p)
    """)
    saves = {c.ctx.function.name: ordered_first(model, c) for c in model.calls if c.func == "torch.save"}
    # `fill` runs only from a construction inside the manager; `plain` is also called outside it
    assert saves == {"fill": True, "plain": False}
