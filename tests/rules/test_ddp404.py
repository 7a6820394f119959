"""DDP404 rank-only-exit: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
rank = dist.get_rank()
model = DDP(net)
"""


def test_message_names_the_exit_the_guard_and_the_collective():
    src = HEAD + """\
for epoch in range(10):
    loss = model(x).sum()
    if rank == 0 and loss < 0.1:
        break
"""
    (f,) = findings("DDP404", src)
    assert f.line == 11 and f.severity.name == "ERROR"
    assert "`break`" in f.message and "only rank 0" in f.message
    assert "`if rank == 0 and loss < 0.1:`" in f.message and "`model(...)` (DDP forward)" in f.message
    assert "dist.broadcast" in f.fix


def test_each_exit_kind_and_the_non_zero_ranks():
    src = HEAD + """\
def run(t):
    while True:
        dist.all_reduce(t)
        if rank != 0:
            return t
        if rank == 0 and t.item() > 5:
            sys.exit(0)
        if rank == 0 and t.item() < 0:
            raise RuntimeError("diverged")
run(torch.ones(1))
"""
    fs = findings("DDP404", src)
    assert [f.line for f in fs] == [12, 14, 16]
    assert "only the non-zero ranks" in fs[0].message and "`return`" in fs[0].message
    assert "`sys.exit(0)` ends the process" in fs[1].message
    assert "`raise`" in fs[2].message and "launcher" in fs[2].message


def test_not_exits_of_some_ranks():
    src = HEAD + """\
for epoch in range(10):
    loss = model(x).sum()
    if rank != 0:
        continue
    print(loss)
for epoch in range(10):
    loss = model(x).sum()
    stop = torch.tensor(int(loss < 0.1))
    dist.broadcast(stop, 0)
    if stop.item():
        break
if rank == 0:
    for epoch in range(10):
        loss = model(x).sum()
        if loss < 0.1:
            break
"""
    assert lines("DDP404", src) == []


def test_loops_without_collectives_and_no_grad_forwards():
    src = HEAD + """\
for epoch in range(10):
    for line in open("log"):
        if rank == 0 and "nan" in line:
            break
with torch.no_grad():
    for x in val_loader:
        out = model(x)
        if rank == 0 and out.isnan().any():
            break
for epoch in range(10):
    try:
        loss = model(x).sum()
        if rank == 0 and loss.isnan():
            raise FloatingPointError
    except FloatingPointError:
        pass
"""
    assert lines("DDP404", src) == []


def test_a_return_leaves_the_outer_loop_too():
    src = HEAD + """\
def main():
    for epoch in range(10):
        loss = model(x).sum()
        if rank == 0:
            for name in os.listdir("ckpt"):
                if name.endswith(".bad"):
                    return
                if name.endswith(".old"):
                    break
main()
"""
    assert lines("DDP404", src) == [14]


def test_an_abort_before_the_iterations_first_collective_is_a_config_check():
    src = HEAD + """\
def main(cfg):
    for epoch in range(10):
        if rank == 0 and not os.path.isdir(cfg.data):
            raise FileNotFoundError(cfg.data)
        if rank == 0 and cfg.bad:
            sys.exit(2)
        loss = model(x).sum()
        if rank == 0 and loss.isnan():
            raise FloatingPointError("loss is NaN")
main(cfg)
"""
    assert lines("DDP404", src) == [16]
