"""Local helper modules (model/project.py): which modules a file can reach,
what a scan of their text proves without parsing them, and that what it
proves never changes an answer, only what gets parsed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst

import ddpcheck.model.project as project_module
from ddpcheck.lint.engine import Projects, lint_path
from ddpcheck.model.project import Project
from ddpcheck.model.distributed import INIT_NEED, function_inits, init_calls
from ddpcheck.model.project import scan_text
from ddpcheck.settings import LintSettings
from ddpcheck.model.flow import resolve_call
from tests.conftest import needs_rule, write

SETTINGS = LintSettings(enabled=frozenset())


def model_of(path: Path):
    text = path.read_text()
    model = Project(SETTINGS).build(str(path), cst.parse_module(text), text)
    return model


def parsed(model, path: Path) -> bool:
    """The run `model` is part of parsed the module at `path`."""
    cached = model.project._models.get(str(path))
    return cached is not None and cached[1] is not None


def test_scan_finds_every_import_form_and_definition():
    scan = scan_text(textwrap.dedent("""\
        import os, utils.dist as du
        from . import engine
        from .helpers import (
            save_on_master,
            init_distributed_mode as init_dist,
        )
        from pkg.sub import \\
            builder
        async def fetch(): ...
        class Trainer:
            def fit(self): ...
        """))
    assert {("os", 0, None), ("utils.dist", 0, None), ("utils", 0, None), ("", 1, "engine"),
            ("helpers", 1, "save_on_master"), ("helpers", 1, "init_distributed_mode"),
            ("pkg.sub", 0, "builder")} <= scan.sources
    assert {"os", "du", "engine", "save_on_master", "init_dist", "builder", "fetch", "fit", "Trainer"} <= scan.bound
    assert "init_distributed_mode" in scan.identifiers and "Trainer" in scan.identifiers


def test_a_helper_that_never_defines_the_called_name_is_not_parsed(tmp_path):
    write(tmp_path / "layers.py", "import functools\nfrom torch import nn\nconv3x3 = functools.partial(nn.Conv2d, kernel_size=3)\n")
    train = write(tmp_path / "train.py", "import layers\nb = layers.conv3x3(3, 64)\n")
    model = model_of(train)
    call = next(c for c in model.calls if c.func == "layers.conv3x3")
    assert resolve_call(model, call) is None
    assert not parsed(model, tmp_path / "layers.py")


def test_init_found_through_a_module_that_only_imports_the_one_that_starts_it(tmp_path):
    # train.py -> setup.py (never names init_process_group) -> dist_utils.py (does)
    write(tmp_path / "dist_utils.py", "import torch.distributed as dist\n"
                                      "def start():\n    dist.init_process_group('nccl')\n")
    write(tmp_path / "setup.py", "from dist_utils import start\ndef prepare():\n    start()\n")
    write(tmp_path / "plots.py", "def draw():\n    return 1\n")
    train = write(tmp_path / "train.py", "from setup import prepare\nfrom plots import draw\n"
                                         "prepare()\ndraw()\n")
    model = model_of(train)
    assert model.may_reach(INIT_NEED)
    assert [c.func for c in init_calls(model)] == ["prepare"]
    # plots.py names nothing that starts a group: asked, it is never parsed
    assert not parsed(model, tmp_path / "plots.py")


def test_a_module_that_cannot_reach_an_init_is_proved_so_without_parsing(tmp_path):
    write(tmp_path / "metrics.py", "def top1(x):\n    return x\n")
    train = write(tmp_path / "train.py", "from metrics import top1\ndef main():\n    top1(1)\n")
    model = model_of(train)
    assert not model.may_reach(INIT_NEED)
    main = next(f for f in model.functions if f.name == "main")
    assert function_inits(model, main) is False
    assert not parsed(model, tmp_path / "metrics.py")


def test_a_web_of_modules_larger_than_a_training_repo_is_answered_maybe(tmp_path, monkeypatch):
    monkeypatch.setattr(project_module, "MAX_REACH_MODULES", 3)
    for i in range(6):
        write(tmp_path / f"m{i}.py", f"import m{i + 1}\n" if i < 5 else "x = 1\n")
    train = write(tmp_path / "train.py", "import m0\n")
    assert model_of(train).may_reach(INIT_NEED)   # not proved absent: helpers get parsed when called


def test_modules_beside_an_installed_package_are_libraries(tmp_path):
    site = tmp_path / "lib" / "site-packages"
    write(site / "mypkg" / "__init__.py", "")
    write(site / "otherdist.py", "def helper():\n    pass\n")
    write(site / "mypkg" / "util.py", "def helper():\n    pass\n")
    inside = write(site / "mypkg" / "core.py", "import otherdist\nfrom . import util\n")
    index = Project(SETTINGS)
    assert index.find_module(str(inside), "otherdist", 0) is None   # another distribution
    assert index.find_module(str(inside), "util", 1) == site / "mypkg" / "util.py"   # its own package


@needs_rule("DDP403")
def test_rank_read_before_an_init_two_modules_away_is_still_reported(tmp_path):
    write(tmp_path / "dist_utils.py", "import torch.distributed as dist\n"
                                      "def start():\n    dist.init_process_group('nccl')\n")
    write(tmp_path / "setup.py", "from dist_utils import start\ndef prepare():\n    start()\n")
    train = write(tmp_path / "train.py", "import torch.distributed as dist\nfrom setup import prepare\n"
                                         "def main():\n    r = dist.get_rank()\n    prepare()\n    dist.barrier()\n")
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP403"})))
    assert [(f.line, f.code) for f in result.findings] == [(4, "DDP403")]


def test_a_constructor_call_lands_in_init_here_and_in_a_helper_package(tmp_path):
    write(tmp_path / "tools" / "__init__.py", "from .logger import Logger\n")
    write(tmp_path / "tools" / "logger.py", "class Logger:\n    def __init__(self, log_dir):\n        self.d = log_dir\n")
    train = write(tmp_path / "train.py", "from tools import Logger\n"
                                         "class Meter:\n    def __init__(self, name):\n        self.name = name\n"
                                         "class Plain:\n    pass\n"
                                         "log = Logger('runs')\nm = Meter('loss')\np = Plain()\n")
    model = model_of(train)
    by_func = {c.func: resolve_call(model, c) for c in model.calls}
    helper, init = by_func["Logger"]
    assert init.name == "__init__" and init.class_name == "Logger" and helper.path.endswith("logger.py")
    here, meter_init = by_func["Meter"]
    assert here is model and meter_init.class_name == "Meter"
    assert by_func["Plain"] is None   # no __init__ of its own: nothing of the file's runs


def test_a_method_call_on_an_object_lands_in_its_class_even_through_a_factory(tmp_path):
    write(tmp_path / "data" / "wrapper.py", "class LoaderWrapper:\n    def load_data(self):\n        return 1\n")
    # a folder without __init__.py importing its sibling by the folder's name,
    # as it does when the entry script above it runs
    write(tmp_path / "data" / "factory.py", "from data.wrapper import LoaderWrapper\n"
                                            "def make(opt):\n    w = LoaderWrapper()\n    return w\n")
    train = write(tmp_path / "train.py", "from data.factory import make\n"
                                         "class Trainer:\n    def fit(self):\n        pass\n"
                                         "def main():\n    t = Trainer()\n    t.fit()\n"
                                         "    loader = make(None)\n    loader.load_data()\n    loader.missing()\n")
    model = model_of(train)
    by_func = {c.func: resolve_call(model, c) for c in model.calls}
    assert by_func["t.fit"][1].qualname.endswith("Trainer.fit")
    wmodel, method = by_func["loader.load_data"]
    assert wmodel.path.endswith("wrapper.py") and method.class_name == "LoaderWrapper"
    assert by_func["loader.missing"] is None   # not a method of the class (an inherited one is not followed)


def _root_layout(tmp_path):
    """A script in scripts/ importing `common.dist`, which only the project
    root (the folder above) can resolve."""
    write(tmp_path / "common" / "__init__.py", "")
    write(tmp_path / "common" / "dist.py", "import torch\n\ndef save_ckpt(model, path):\n"
                                           "    torch.save(model.state_dict(), path)\n")
    return write(tmp_path / "scripts" / "train.py",
                 "import torch\nimport torch.distributed as dist\nfrom common.dist import save_ckpt\n\n"
                 "dist.init_process_group('nccl')\nmodel = torch.nn.Linear(2, 2)\nsave_ckpt(model, 'ckpt.pt')\n")


@needs_rule("DDP301")
def test_linting_with_and_without_a_root_in_one_process_does_not_depend_on_order(tmp_path):
    # Import lookups used to be cached process-wide without the root in
    # their key: whichever lint came first decided what the second saw.
    train = _root_layout(tmp_path)
    with_root = LintSettings(enabled=frozenset({"DDP301"}), root=str(tmp_path))
    no_root = LintSettings(enabled=frozenset({"DDP301"}))

    def codes(settings, projects=None):
        return [(f.line, f.code) for f in lint_path(str(train), settings, projects=projects).findings]

    expected_root, expected_none = [(7, "DDP301")], []
    assert (codes(with_root), codes(no_root)) == (expected_root, expected_none)
    assert (codes(no_root), codes(with_root)) == (expected_none, expected_root)
    # one run's worker keeps a project per root: still independent
    projects = Projects()
    assert (codes(no_root, projects), codes(with_root, projects)) == (expected_none, expected_root)
