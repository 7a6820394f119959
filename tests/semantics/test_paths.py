"""How a path is spelled once the names it reads are replaced by what they
certainly hold (model/paths.py `path_spelling`): the spelling two places
must share for a load to read the file a save wrote."""

from __future__ import annotations

import pytest

from ddpcheck.model.paths import path_spelling
from tests.semantics.helpers import build, marked

PREAMBLE = """
import os
from pathlib import Path
NAME = "model.pth"
def f(out, args, flag):
    joined = os.path.join(out, NAME)
    if flag:
        either = "a.pth"
    else:
        either = "b.pth"
    with open(os.path.join(out, "model.pth"), "rb") as handle:
        pass
    use({expr})
"""


@pytest.mark.parametrize("expr,spelling", [
    ('os.path.join(out, "model.pth")', "{out}/model.pth"),
    ("joined", "{out}/model.pth"),                      # a variable holding the join
    ('f"{out}/model.pth"', "{out}/model.pth"),
    ('"{}/{}".format(out, NAME)', "{out}/model.pth"),
    ('out + "/" + NAME', "{out}/model.pth"),
    ("Path(out) / NAME", "{out}/model.pth"),
    ("str(Path(out).joinpath(NAME))", "{out}/model.pth"),
    ("handle", "{out}/model.pth"),                      # the file opened at that path
    ('os.path.join(args.out_dir, "model.pth")', "{args.out_dir}/model.pth"),
    ('"./ckpt//model.pth"', "ckpt/model.pth"),
    ("either", None),                                   # two values on two paths
    ('os.path.join(out, make_name())', None),           # a call whose result is not a path spelling
    ('f"{out:>8}/model.pth"', None),
])
def test_path_spelling(expr, spelling):
    model = build(PREAMBLE.format(expr=expr))
    read, _site = marked(model)
    assert path_spelling(model, read) == spelling
