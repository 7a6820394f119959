"""How a path is spelled once the names it reads are replaced by what they
certainly hold (model/paths.py `path_spelling`): the spelling two places
must share for a load to read the file a save wrote."""

from __future__ import annotations

import pytest

from ddpcheck.model.paths import path_spelling
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

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


def test_what_is_read_from_a_parameter_is_spelled_by_the_parameter():
    code = """
        import os
        class Engine:
            def __init__(self, cfg):
                self.cfg = cfg
            def save(self):
                use(os.path.join(self.cfg.run_dir, "last.pt"))
        def evaluate(cfg, opts):
            use(os.path.join(cfg.run_dir, "last.pt"))
            use(os.path.join(opts["run_dir"], "last.pt"))
        """
    model = build(code)
    spelled = [path_spelling(model, marked(model, nth=i)[0]) for i in range(3)]
    assert spelled == ["{cfg.run_dir}/last.pt", "{cfg.run_dir}/last.pt", "{opts['run_dir']}/last.pt"]


def test_an_option_of_one_parsed_object_is_the_same_wherever_it_is_read():
    code = """
        import argparse, os
        args = argparse.ArgumentParser().parse_args()
        other = argparse.ArgumentParser().parse_args()
        def save():
            use(os.path.join(args.out, "w.pt"))
        def load():
            use(os.path.join(args.out, "w.pt"))
            use(os.path.join(other.out, "w.pt"))
        """
    model = build(code)
    first, second, third = (path_spelling(model, marked(model, nth=i)[0]) for i in range(3))
    assert first == second is not None
    assert third != first   # another object's option


def test_a_constant_imported_from_a_config_module_and_through_a_re_export(tmp_path):
    # `from config import CKPT` and `from settings import CKPT` where the
    # package's __init__ re-exports it: both spell the constant's value
    write(tmp_path / "config.py", 'CKPT: str = "last.pth"\nOTHER = CKPT\n')
    write(tmp_path / "settings" / "__init__.py", "from .paths import CKPT\n")
    write(tmp_path / "settings" / "paths.py", 'import os\nCKPT = "best.pth"\n')
    train = write(tmp_path / "train.py", "import os\nfrom config import CKPT, OTHER\nimport settings\n"
                                         "def f(out):\n    use(os.path.join(out, CKPT))\n"
                                         "    use(os.path.join(out, settings.CKPT), 'b')\n"
                                         "    use(os.path.join(out, OTHER), 'c')\n")
    model = build_file(train)
    spelled = [path_spelling(model, marked(model, "use", nth)[0]) for nth in range(3)]
    assert spelled == ["{out}/last.pth", "{out}/best.pth", "{out}/last.pth"]


def test_a_name_a_config_module_never_binds_is_not_spelled(tmp_path):
    write(tmp_path / "config.py", "def make():\n    return 'x'\n")
    train = write(tmp_path / "train.py", "import os\nfrom config import CKPT\ndef f(out):\n"
                                         "    use(os.path.join(out, CKPT))\n")
    model = build_file(train)
    assert path_spelling(model, marked(model)[0]) is None


def test_a_path_kept_on_an_object_is_the_literal_its_callers_give_it():
    from ddpcheck.model.paths import constant_path

    model = build("""
        class Options:
            ckpt_path = "./out//best.pt"
        class Trainer:
            def __init__(self, opts, other):
                self.opts = opts
                self.other = other
            def save(self):
                use(self.opts.ckpt_path)
                use(self.other)
        def run(where):
            opts = Options()
            Trainer(opts, where).save()
        run("a.pt")
        run("b.pt")
    """)
    # the path the method reads is a parameter until the calls are followed: one literal then
    assert constant_path(model, marked(model, nth=0)[0]) == "out/best.pt"
    # two calls give two paths: no one literal
    assert constant_path(model, marked(model, nth=1)[0]) is None
