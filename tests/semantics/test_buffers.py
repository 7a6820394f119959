"""Which modules hold buffers (model/buffers.py): a class of the tree whose
constructor builds a BatchNorm layer or registers a buffer on every path,
itself, through its bases, its submodules' classes or the functions it
calls; torch's BatchNorm layers and torchvision's BatchNorm networks. A
buffer built under a test, or an object the engine cannot follow, is not
known to be there."""

from __future__ import annotations

import pytest

from ddpcheck.model.buffers import holds_buffers
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

_NETS = """
import torch
import torch.nn as nn
import torchvision

def conv_bn(c):
    return nn.Sequential(nn.Conv2d(c, c, 3), nn.BatchNorm2d(c))

class WithHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = conv_bn(8)

class WithBuffer(nn.Module):
    def __init__(self):
        super(WithBuffer, self).__init__()
        self.register_buffer("mask", torch.ones(4))

class Child(WithBuffer):
    pass

class Holder(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.blocks = nn.ModuleList([WithHelper() for _ in range(depth)])

class Optional(nn.Module):
    def __init__(self, norm=False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        if norm:
            self.bn = nn.BatchNorm1d(4)

class Chosen(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.bn = nn.BatchNorm1d(4) if norm else nn.Identity()

class Guarded(nn.Module):
    def __init__(self):
        super().__init__()
        try:
            self.bn = nn.SyncBatchNorm(4)
        except ValueError:
            pass

class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
"""


@pytest.mark.parametrize("made, expected", [
    ("WithHelper()", True),          # through a function of the file
    ("WithBuffer()", True),          # register_buffer on self
    ("Child()", True),               # the base's constructor runs
    ("Holder(4)", True),             # submodules of a class that has them, in a comprehension
    ("nn.BatchNorm2d(3)", True),
    ("torchvision.models.resnet50()", True),
    ("torchvision.models.vgg16_bn()", True),
    ("torchvision.models.vit_b_16()", False),   # LayerNorm only
    ("Optional()", False),           # under a test of the constructor
    ("Chosen(True)", False),         # one arm of a conditional expression
    ("Guarded()", False),            # in a try body: may not have run
    ("Plain()", False),
    ("timm.create_model('resnet50')", False),   # a library model the engine does not know
])
def test_a_module_holds_buffers_when_every_construction_builds_one(made, expected):
    model = build(_NETS + f"net = {made}.cuda()\nuse(net)\n")
    expr, _ = marked(model)
    assert holds_buffers(model, expr) is expected


def test_every_object_a_name_can_hold_must_have_buffers():
    code = _NETS + "net = WithBuffer() if flag else Plain()\nuse(net)\n"
    model = build(code)
    expr, _ = marked(model)
    assert not holds_buffers(model, expr)
    both = build(_NETS + "net = WithBuffer() if flag else WithHelper()\nuse(net)\n")
    assert holds_buffers(both, marked(both)[0])


def test_a_class_of_another_module_is_read_there(tmp_path):
    write(tmp_path / "nets.py", _NETS)
    train = write(tmp_path / "train.py", "from nets import Holder, Plain\nuse(Holder(2))\nuse(Plain(), 1)\n")
    model = build_file(train, tmp_path)
    assert holds_buffers(model, marked(model)[0])
    assert not holds_buffers(model, marked(model, nth=1)[0])
