"""Which saved state dicts lost the wrapper's `module.` prefix on the way to
the file (model/wrappers.py `strips_prefix`, through a helper of the project
in any module), and which loads read back a checkpoint the module wrote from
a wrapper (`loads_own_wrapped_checkpoint`)."""

from __future__ import annotations

import pytest

from ddpcheck.model.wrappers import loads_own_wrapped_checkpoint, strips_prefix
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

LOOP_HELPER = """
def {name}(sd):
    out = {{}}
    for key, value in sd.items():
        {test}
            out[{key}] = value
        {other}
    return out
"""


def _stripped(code: str) -> bool:
    model = build(code)
    expr, site = marked(model)
    return strips_prefix(model, expr, site.ctx.function)


@pytest.mark.parametrize("test,key,other,expected", [
    ("if 'module' in key:", "key[7:]", "else:\n            out[key] = value", True),
    ("if key.startswith('module.'):", "key[len('module.'):]", "", True),
    ("if True:", "key.replace('module.', '')", "", False),   # a test that says nothing of the key
    ("if 'module' in key:", "key[6:]", "", False),             # another prefix's length
    ("if 'module' in key:", "key.replace('model.', '')", "", False),
    ("if 'module' in key:", "key", "", False),                 # copied unchanged
])
def test_a_loop_helper_that_drops_the_prefix(test, key, other, expected):
    code = LOOP_HELPER.format(name="translate", test=test, key=key, other=other) + \
        "use(translate(net.state_dict()))\n"
    assert _stripped(code) is expected


def test_an_unconditional_loop_and_a_comprehension_helper():
    assert _stripped("def plain(sd):\n    new = {}\n    for k, v in sd.items():\n        new[k[7:]] = v\n"
                     "    return new\nuse(plain(net.state_dict()))\n")
    assert _stripped("def plain(sd):\n    return {k.replace('module.', ''): v for k, v in sd.items()}\n"
                     "use(plain(net.state_dict()))\n")


def test_a_helper_with_one_plain_return_does_not_strip():
    assert not _stripped("def plain(sd, keep):\n    if keep:\n        return sd\n"
                         "    return {k[7:]: v for k, v in sd.items()}\nuse(plain(net.state_dict(), flag))\n")


def test_an_unknown_helper_stays_unknown():
    assert not _stripped("import tools\nuse(tools.translate(net.state_dict()))\n")


def test_a_helper_of_another_module(tmp_path):
    write(tmp_path / "ckpt_tools.py", LOOP_HELPER.format(
        name="translate", test="if 'module' in key:", key="key[7:]", other=""))
    train = write(tmp_path / "train.py", "from ckpt_tools import translate\nuse(translate(net.state_dict()))\n")
    model = build_file(train, root=tmp_path)
    expr, site = marked(model)
    assert strips_prefix(model, expr, site.ctx.function)


ROUND_TRIP = """
import os
import torch
from torch.nn import DataParallel
from torch.nn.parallel import DistributedDataParallel as DDP

def fit(log):
    net = {saved_kind}(make())
    torch.save([net.state_dict(), 3], os.path.join(log, "checkpoint.pth"))

def sample(log, other):
    net = DataParallel(make())
    ckpt = torch.load({path})
    use(ckpt[0])
"""


@pytest.mark.parametrize("saved_kind,path,expected", [
    ("DataParallel", 'os.path.join(log, "checkpoint.pth")', True),
    ("DataParallel", 'os.path.join(log, "best.pth")', False),      # another file
    ("DataParallel", "other", False),                               # a path from elsewhere
    ("DDP", 'os.path.join(log, "checkpoint.pth")', False),          # written from another kind of wrapper
    ("make", 'os.path.join(log, "checkpoint.pth")', False),         # written from the bare network
])
def test_a_load_of_the_modules_own_wrapped_checkpoint(saved_kind, path, expected):
    model = build(ROUND_TRIP.format(saved_kind=saved_kind, path=path))
    expr, _site = marked(model)
    assert loads_own_wrapped_checkpoint(model, expr, "DataParallel") is expected
