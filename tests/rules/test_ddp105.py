"""DDP105 eval-sampler-padding: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("nccl")
"""
EVAL = """
with torch.no_grad():
    for x, y in {loader}:
        correct += (model(x).argmax(1) == y).sum()
dist.all_reduce(correct)
"""


def test_message_and_severity():
    [f] = findings("DDP105", HEAD + "val_sampler = DistributedSampler(ds, shuffle=False)\n"
                   "val_loader = DataLoader(ds, sampler=val_sampler)\n" + EVAL.format(loader="val_loader"))
    assert f.line == 5
    assert f.severity.name == "INFO"
    assert "`val_sampler`" in f.message and "repeating samples" in f.message
    assert "len(dataset) % world_size == 0" in f.fix


def test_inline_sampler_is_reported_on_the_sampler():
    src = HEAD + "test_loader = DataLoader(ds, batch_size=8,\n    sampler=DistributedSampler(ds))\n"
    assert lines("DDP105", src + EVAL.format(loader="test_loader")) == [6]


def test_drop_last_or_runtime_value_is_silent():
    for sampler in ("DistributedSampler(ds, drop_last=True)", "DistributedSampler(ds, drop_last=args.drop)",
                    "DistributedSampler(ds, None, None, False, 0, True)"):
        src = HEAD + f"val_loader = DataLoader(ds, sampler={sampler})\n" + EVAL.format(loader="val_loader")
        assert lines("DDP105", src) == [], sampler


def test_training_loader_is_silent():
    src = HEAD + "train_loader = DataLoader(ds, sampler=DistributedSampler(ds))\n" \
        "for epoch in range(3):\n    for x in train_loader:\n        step(x)\n"
    assert lines("DDP105", src) == []


def test_not_consumed_where_we_can_see_is_silent():
    src = HEAD + "from vendor.engine import evaluate\n" \
        "val_loader = DataLoader(ds, sampler=DistributedSampler(ds))\nevaluate(model, val_loader)\n"
    assert lines("DDP105", src) == []


def test_index_targets_but_not_enumerate_counter():
    base = HEAD + "val_loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
    keyed = base + "with torch.no_grad():\n    for x, idx in val_loader:\n        preds[idx] = model(x)\n"
    counted = base + "with torch.no_grad():\n    for idx, (x, y) in enumerate(val_loader):\n        model(x)\n"
    assert lines("DDP105", keyed) == []
    assert lines("DDP105", counted) == [5]
