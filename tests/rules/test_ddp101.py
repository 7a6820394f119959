"""DDP101 missing-set-epoch: beyond the fixtures."""

import pytest

from tests.rules.lintsnippet import lines

TEMPLATE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
ONE = 1
data = list(range(64))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
start = 3
for epoch in {epochs}:
    for batch in loader:
        pass
"""


@pytest.mark.parametrize("epochs", ["range(1)", "range(0, 1)", "range(start, start + 1)", "range(ONE)"])
def test_a_loop_of_one_epoch_has_no_order_to_replay(epochs):
    assert lines("DDP101", TEMPLATE.format(epochs=epochs)) == []


@pytest.mark.parametrize("epochs", ["range(2)", "range(start, start + 2)", "range(int(torch.randint(2, 9, (1,))))"])
def test_more_epochs_are_reported(epochs):
    assert lines("DDP101", TEMPLATE.format(epochs=epochs)) == [10]
