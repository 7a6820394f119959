"""DDP102 sampler-shuffle-conflict: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, BatchSampler
"""


def test_message_names_the_sampler_and_the_error():
    [f] = findings("DDP102", HEAD + """
sampler = DistributedSampler(ds) if args.distributed else None
loader = DataLoader(ds, batch_size=8, sampler=sampler, shuffle=True)
""")
    assert f.line == 6
    assert "sampler=sampler" in f.message
    assert "mutually exclusive with shuffle" in f.message
    assert "distributed run" in f.message
    assert "shuffle=(sampler is None)" in f.fix
    assert f.severity.name == "ERROR"


def test_positional_shuffle_and_sampler():
    # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
    assert lines("DDP102", HEAD + "loader = DataLoader(ds, 8, True, DistributedSampler(ds))\n") == [4]


def test_batch_sampler_with_shuffle():
    [f] = findings("DDP102", HEAD + """
bs = BatchSampler(DistributedSampler(ds), 8, drop_last=True)
loader = DataLoader(ds, batch_sampler=bs, shuffle=True)
""")
    assert "batch_sampler option is mutually exclusive" in f.message


def test_any_sampler_class_conflicts_not_only_distributed():
    [f] = findings("DDP102", HEAD + "loader = DataLoader(ds, sampler=RandomSampler(ds), shuffle=True)\n")
    assert "whenever it is not None" in f.message


def test_shuffle_name_always_true():
    src = HEAD + "shuffle = True\nloader = DataLoader(ds, sampler=DistributedSampler(ds), shuffle=shuffle)\n"
    assert lines("DDP102", src) == [5]


def test_silent_cases():
    for body in (
        "loader = DataLoader(ds, sampler=None, shuffle=True)\n",
        "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s, shuffle=False)\n",
        "s = DistributedSampler(ds) if args.distributed else None\nloader = DataLoader(ds, sampler=s, shuffle=(s is None))\n",
        "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s, shuffle=args.shuffle)\n",
        "def build(ds, sampler):\n    return DataLoader(ds, sampler=sampler, shuffle=True)\n",
        "from vendor.samplers import make_sampler\nloader = DataLoader(ds, sampler=make_sampler(ds), shuffle=True)\n",
        "loader = DataLoader(ds, shuffle=True, **kwargs)\n",
    ):
        assert lines("DDP102", HEAD + body) == [], body


def test_other_arm_of_the_if_does_not_count():
    src = HEAD + """
if args.distributed:
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, sampler=sampler)
else:
    sampler = None
    loader = DataLoader(ds, sampler=sampler, shuffle=True)
"""
    assert lines("DDP102", src) == []


def test_local_helper_returning_none_only_is_silent():
    src = HEAD + """
def make_sampler(ds):
    return None

loader = DataLoader(ds, sampler=make_sampler(ds), shuffle=True)
"""
    assert lines("DDP102", src) == []


def test_user_dataloader_class_is_not_torch():
    src = HEAD.replace("import DataLoader, ", "import ") + """
class DataLoader:
    def __init__(self, *a, **k):
        pass

loader = DataLoader(ds, sampler=DistributedSampler(ds), shuffle=True)
"""
    assert lines("DDP102", src) == []


def test_batch_sampler_fix_removes_shuffle():
    [f] = findings("DDP102", HEAD + "loader = DataLoader(ds, batch_sampler=BatchSampler(DistributedSampler(ds), 8, True), shuffle=True)\n")
    assert "remove `shuffle=True`" in f.fix and "is None" not in f.fix
