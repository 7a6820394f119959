"""DDP203 prefer-ddp: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines


def test_each_wrap_is_reported_with_the_reasons():
    src = """\
import torch
import torch.nn as nn
a = nn.DataParallel(a)
b = torch.nn.parallel.DataParallel(b, device_ids=[0, 1])
"""
    fs = findings("DDP203", src)
    assert [f.line for f in fs] == [3, 4]
    assert fs[0].severity.name == "INFO"
    assert "GIL" in fs[0].message and "GPU 0" in fs[0].message
    assert "torchrun" in fs[0].fix


def test_from_import_alias():
    assert lines("DDP203", "from torch.nn import DataParallel as DP\nm = DP(m)\n") == [2]


def test_silent_next_to_a_ddp_path():
    src = """\
import torch
if args.distributed:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
else:
    model = torch.nn.DataParallel(model).cuda()
"""
    assert lines("DDP203", src) == []


def test_not_torch_dataparallel():
    assert lines("DDP203", "from torch_geometric.nn import DataParallel\nm = DataParallel(m)\n") == []
    src = "class DataParallel:\n    pass\n\nm = DataParallel()\n"
    assert lines("DDP203", src) == []
