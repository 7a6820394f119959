"""DDP403 rank-before-init: beyond the fixtures."""

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from tests.rules.lintsnippet import findings, lines


def test_message_points_at_the_init():
    src = """\
import torch.distributed as dist
rank = dist.get_rank()
dist.init_process_group("nccl")
dist.destroy_process_group()
"""
    (f,) = findings("DDP403", src)
    assert f.line == 2 and f.severity.name == "ERROR"
    assert "`dist.get_rank(...)`" in f.message and "(line 3)" in f.message
    assert "Default process group has not been initialized" in f.message
    assert 'os.environ["RANK"]' in f.fix


def test_queries_and_collectives_before_init():
    src = """\
from torch.distributed import get_world_size, all_reduce, init_process_group, get_backend
world = get_world_size()
all_reduce(t)
backend = get_backend()
init_process_group("nccl")
after = get_world_size()
"""
    assert lines("DDP403", src) == [2, 3, 4]


def test_nothing_without_an_init_on_the_path():
    src = """\
import torch.distributed as dist
def helper():
    return dist.get_rank()
def main(args):
    if args.distributed:
        dist.init_process_group("nccl")
    else:
        print(dist.get_world_size())
    print(dist.get_rank())
"""
    # the world-size query sits in the other arm; the one after the `if` may follow an init
    assert lines("DDP403", src) == []


def test_expression_guards_and_probes():
    src = """\
import torch.distributed as dist
def is_dist():
    return dist.is_available() and dist.is_initialized()
ws = dist.get_world_size() if dist.is_initialized() else 1
r = 0 if not dist.is_initialized() else dist.get_rank()
main = not dist.is_initialized() or dist.get_rank() == 0
ok = is_dist() and dist.get_rank() == 0
try:
    r = dist.get_rank()
except (RuntimeError, ValueError):
    r = 0
later = lambda: dist.get_rank()
if is_dist():
    dist.barrier()
dist.init_process_group("nccl")
"""
    assert lines("DDP403", src) == []


def test_query_helper_is_reported_at_its_call():
    src = """\
import torch.distributed as dist
def rank_of_this_process():
    return dist.get_rank()
def main():
    seed = 1 + rank_of_this_process()
    dist.init_process_group("nccl")
"""
    (f,) = findings("DDP403", src)
    assert f.line == 5
    assert "which calls `dist.get_rank(...)` in `rank_of_this_process`" in f.message


def test_init_in_a_local_module_orders_the_calls(tmp_path):
    (tmp_path / "dist_utils.py").write_text(textwrap.dedent("""\
        import os
        import torch
        import torch.distributed as dist

        def init_distributed_mode(args):
            args.gpu = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(args.gpu)
            dist.init_process_group(backend="nccl")

        def get_rank():
            return dist.get_rank()
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch.distributed as dist
        import dist_utils

        def main(args):
            before = dist_utils.get_rank()
            dist_utils.init_distributed_mode(args)
            after = dist.get_rank()
        """))
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP403"})))
    assert [f.line for f in result.findings] == [5]
    assert "dist_utils.py" in result.findings[0].message
