"""DDP401 collective-in-rank-branch: beyond the fixtures."""

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path, lint_source
from ddpcheck.rules import REGISTRY
from tests.rules.lintsnippet import findings, lines


def test_message_names_the_call_the_ranks_and_the_guard():
    src = """\
import torch.distributed as dist
dist.init_process_group("nccl")
if dist.get_rank() == 0:
    dist.all_reduce(t)
dist.destroy_process_group()
"""
    (f,) = findings("DDP401", src)
    assert f.line == 4 and f.severity.name == "ERROR"
    assert "`dist.all_reduce(...)`" in f.message and "only rank 0" in f.message
    assert "`if dist.get_rank() == 0:`" in f.message and "hangs" in f.message
    assert "dist.barrier()" in f.fix


def test_import_forms_and_variants():
    src = """\
from torch.distributed import barrier, monitored_barrier, all_gather_object, broadcast_object_list
import torch.distributed as d
import torch
if rank == 0:
    barrier()
    monitored_barrier()
    all_gather_object(out, obj)
    broadcast_object_list(objs, src=0)
    d.reduce_scatter_tensor(out, inp)
    torch.distributed.all_to_all_single(out, inp)
"""
    assert lines("DDP401", src) == [5, 6, 7, 8, 9, 10]


def test_non_zero_ranks_only_and_early_exits():
    src = """\
import torch.distributed as dist
def a(rank):
    if rank > 0:
        dist.barrier()
def b():
    if not is_main_process():
        return
    dist.barrier()
def c(loader):
    for x in loader:
        if dist.get_rank() != 0:
            continue
        dist.all_reduce(x)
"""
    fs = findings("DDP401", src)
    assert [f.line for f in fs] == [4, 8, 13]
    assert "only the non-zero ranks" in fs[0].message
    assert "early exit" in fs[1].message


def test_pairing_is_one_to_one_and_per_kind():
    src = """\
import torch.distributed as dist
def f(rank):
    if rank != 0:
        dist.barrier()
    prepare()
    if rank == 0:
        dist.monitored_barrier()
    if rank == 0:
        dist.barrier()
    if rank == 0:
        dist.all_reduce(t)
    if rank != 0:
        dist.broadcast(t, 0)
"""
    # the second rank-0 barrier has no partner; all_reduce and broadcast are different kinds
    assert lines("DDP401", src) == [9, 11, 13]


def test_every_rank_guards_are_fine():
    src = """\
import torch.distributed as dist
if args.distributed:
    dist.barrier()
if dist.is_initialized():
    dist.all_reduce(t)
if world_size > 1:
    dist.all_gather(out, t)
if not args.distributed:
    pass
else:
    dist.barrier()
if rank == 0:
    dist.send(t, dst=1)
else:
    dist.recv(t, src=0)
if rank in (0, 1):
    dist.all_reduce(t, group=pair_group)
dist.barrier()
"""
    assert lines("DDP401", src) == []


def test_rank_zero_only_decorator_and_configured_guard():
    src = """\
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_only

@rank_zero_only
def log_everything(t):
    dist.all_reduce(t)

if on_chief():
    dist.barrier()
"""
    assert lines("DDP401", src) == [6]
    settings = LintSettings(enabled=frozenset(REGISTRY), main_process_guards=("on_chief",))
    fs = [f.line for f in lint_source(textwrap.dedent(src), "train.py", settings) if f.code == "DDP401"]
    assert fs == [6, 9]


def test_ddp_forward_and_helpers_that_run_it():
    src = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def evaluate(net, loader):
    return [net(x) for x in loader]

def run(net, loader):
    return evaluate(net, loader)

def main(rank):
    model = DDP(build().cuda(rank), device_ids=[rank])
    quiet = DDP(build().cuda(rank), device_ids=[rank], broadcast_buffers=False)
    if rank == 0:
        model(x)
        evaluate(model, val)
        run(model, val)
        quiet(x)
        model.module(x)
        evaluate(model.module, val)
    model = model.module
    if rank == 0:
        model(x)
"""
    fs = findings("DDP401", src)
    assert [f.line for f in fs] == [14, 15, 16]
    assert "broadcast" in fs[0].message and "model.module" in fs[0].fix
    assert "runs the DDP forward of `model`" in fs[1].message


def test_self_model_forward_in_a_method():
    src = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

class Trainer:
    def __init__(self, net, rank):
        self.rank = rank
        self.model = DistributedDataParallel(net, device_ids=[rank])

    def validate(self, batch):
        return self.model(batch)

    def step(self, batch):
        if self.rank == 0:
            self.validate(batch)
"""
    fs = findings("DDP401", src)
    assert [f.line for f in fs] == [14]
    assert "in `Trainer.validate`" in fs[0].message


def test_helper_collective_named_at_the_call():
    src = """\
import torch.distributed as dist

def sync_metrics(t):
    if not dist.is_initialized():
        return t
    dist.all_reduce(t)
    return t

def only_others():
    if dist.get_rank() != 0:
        dist.barrier()

if dist.get_rank() == 0:
    sync_metrics(t)
    only_others()
"""
    fs = findings("DDP401", src)
    # only_others() is judged by its own branches: its lone barrier has no partner in it
    assert [f.line for f in fs] == [11, 14]
    assert "`dist.all_reduce(...)` in `sync_metrics`" in fs[1].message


def test_library_collectives():
    src = """\
from detectron2.utils import comm
from accelerate import Accelerator
accelerator = Accelerator()
if comm.is_main_process():
    comm.synchronize()
    accelerator.wait_for_everyone()
if accelerator.is_main_process:
    accelerator.wait_for_everyone()
comm.synchronize()
"""
    assert lines("DDP401", src) == [5, 6, 8]


def test_helper_in_a_local_module(tmp_path):
    (tmp_path / "comm_utils.py").write_text(textwrap.dedent("""\
        import torch.distributed as dist

        def synchronize():
            if not dist.is_available() or not dist.is_initialized():
                return
            if dist.get_world_size() == 1:
                return
            dist.barrier()
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch.distributed as dist
        from comm_utils import synchronize

        dist.init_process_group("nccl")
        if dist.get_rank() == 0:
            synchronize()
        synchronize()
        """))
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP401"})))
    assert [(f.line, f.code) for f in result.findings] == [(6, "DDP401")]
    assert "comm_utils.py" in result.findings[0].message


def test_unresolvable_helpers_and_methods_are_trusted():
    src = """\
import torch.distributed as dist
from mylib.dist import synchronize
if dist.get_rank() == 0:
    synchronize()
    metric_logger.synchronize_between_processes()
"""
    assert lines("DDP401", src) == []


def test_other_arm_with_an_unknown_rank_test_pairs():
    src = """\
import torch.distributed as dist
def f(rank, src):
    if rank == src:
        dist.barrier()
    elif rank == 1:
        dist.barrier()
"""
    assert lines("DDP401", src) == []


def test_tests_that_expect_the_collective_to_fail():
    src = """\
import pytest
import torch.distributed as dist

class TestMonitoredBarrier:
    def test_times_out(self):
        if self.rank == 0:
            with self.assertRaisesRegex(RuntimeError, "failed to pass monitoredBarrier"):
                dist.monitored_barrier(timeout=timeout)

def test_pytest_style(rank):
    if rank == 0:
        with pytest.raises(RuntimeError):
            dist.barrier()
        dist.barrier()
"""
    assert lines("DDP401", src) == [14]
