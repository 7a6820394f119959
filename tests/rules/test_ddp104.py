"""DDP104 missing-distributed-sampler: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, BatchSampler
dist.init_process_group("nccl")
model = DDP(model, device_ids=[0])
"""
LOOP = """
for epoch in range(10):
    for batch in loader:
        step(batch)
"""


def test_message_and_fix():
    [f] = findings("DDP104", HEAD + "loader = DataLoader(ds, batch_size=8, shuffle=True)\n" + LOOP)
    assert f.line == 7
    assert "`loader`" in f.message and "whole data set" in f.message
    assert "DistributedSampler" in f.fix and "set_epoch" in f.fix
    assert f.severity.name == "WARNING"


def test_local_samplers_are_reported():
    for sampler in ("RandomSampler(ds)", "BatchSampler(RandomSampler(ds), 8, False)"):
        kw = "batch_sampler" if sampler.startswith("Batch") else "sampler"
        src = HEAD + f"loader = DataLoader(ds, {kw}={sampler})\n" + LOOP
        assert lines("DDP104", src) == [7], sampler


def test_train_name_without_epoch_loop():
    assert lines("DDP104", HEAD + "train_loader = DataLoader(ds, batch_size=8, shuffle=True)\n") == [7]


def test_silent_cases():
    for body in (
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n",
        "loader = DataLoader(ds, batch_sampler=BatchSampler(DistributedSampler(ds), 8, True))\n",
        "loader = DataLoader(ds, sampler=sampler_from_somewhere)\n",
        "from vendor import make_sampler\nloader = DataLoader(ds, sampler=make_sampler(ds))\n",
        "loader = DataLoader(ds, sampler=MySampler(ds))\n",
        "loader = DataLoader(Shards(files[dist.get_rank()::dist.get_world_size()]), batch_size=8)\n",
        "loader = DataLoader(ds, batch_size=None)\n",
        "val_loader = DataLoader(ds, batch_size=8)\nloader = val_loader\n",
        "loader = DataLoader(ds, batch_size=8)\nloader = accelerator.prepare(loader)\n",
    ):
        assert lines("DDP104", HEAD + body + LOOP) == [], body


def test_no_ddp_wrap_no_finding():
    src = HEAD.replace("model = DDP(model, device_ids=[0])\n", "model = torch.nn.DataParallel(model)\n")
    assert lines("DDP104", src + "loader = DataLoader(ds, shuffle=True)\n" + LOOP) == []


def test_single_process_arm_is_silent():
    src = HEAD + """
if args.distributed:
    loader = DataLoader(ds, sampler=DistributedSampler(ds))
else:
    loader = DataLoader(ds, shuffle=True)
""" + LOOP
    assert lines("DDP104", src) == []


def test_eval_only_loop_is_not_training():
    src = HEAD + """
loader = DataLoader(ds, batch_size=8)
with torch.no_grad():
    for batch in loader:
        model(batch)
"""
    assert lines("DDP104", src) == []
