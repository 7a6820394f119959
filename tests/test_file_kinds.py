"""Test code and library modules are judged as what they are: each rule says
which kinds of file it looks at, config's `test-files` / `script-files` decide
for a path, and a library module is a package module without a main guard."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from ddpcheck.cli import main
from ddpcheck.lint.analyze import file_kind
from ddpcheck.lint.config import ConfigError, load_config
from ddpcheck.model.project import Project
from ddpcheck.model.filekind import LIBRARY, SCRIPT, TEST, installed_package_module
from ddpcheck.rules.base import REGISTRY
from ddpcheck.settings import DEFAULT_TEST_FILES, LintSettings
from tests.conftest import write

GLOBAL_RANK_DEVICE = (
    "import torch\nimport torch.distributed as dist\n\n"
    "dist.init_process_group('nccl')\n"
    "torch.cuda.set_device(dist.get_rank())\n"
)


def kind_of(path: Path, code: str = "x = 1\n", **settings) -> str:
    s = LintSettings(enabled=frozenset(), **settings)
    return file_kind(Project(s).build(str(path), cst.parse_module(code), code), s)


@pytest.mark.parametrize("rel", ["tests/test_optim.py", "pkg/tests/helpers.py", "test/run.py", "test_x.py",
                                 "unit/opt_test.py", "conftest.py"])
def test_default_test_files(tmp_path, rel):
    assert kind_of(write(tmp_path / rel, "x = 1\n"), root=str(tmp_path)) == TEST


@pytest.mark.parametrize("rel", ["train.py", "latest/train.py", "contest.py", "scripts/testing_utils.py"])
def test_scripts_are_not_tests(tmp_path, rel):
    assert kind_of(write(tmp_path / rel, "x = 1\n"), root=str(tmp_path)) == SCRIPT


def test_config_replaces_and_overrides_the_test_globs(tmp_path):
    path = write(tmp_path / "tests" / "test_optim.py", "x = 1\n")
    assert kind_of(path, root=str(tmp_path), test_files=()) == SCRIPT
    assert kind_of(path, root=str(tmp_path), script_files=("tests/test_optim.py",)) == SCRIPT
    assert kind_of(write(tmp_path / "e2e" / "run.py", "x = 1\n"), root=str(tmp_path), test_files=("e2e",)) == TEST


def test_library_module_needs_a_package_chain_under_a_packaging_file(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'kit'\n")
    for folder in ("src/kit", "src/kit/sub"):
        write(tmp_path / folder / "__init__.py", "")
    module = write(tmp_path / "src" / "kit" / "sub" / "strategy.py", "x = 1\n")
    assert installed_package_module(str(module))
    assert kind_of(module, root=str(tmp_path)) == LIBRARY
    # the same module run as a script is a script
    assert kind_of(module, "if __name__ == '__main__':\n    pass\n", root=str(tmp_path)) == SCRIPT
    # a helper folder of an example (no packaging file above its package) is not a library
    write(tmp_path / "examples" / "vit" / "utils" / "__init__.py", "")
    helper = write(tmp_path / "examples" / "vit" / "utils" / "models.py", "x = 1\n")
    assert not installed_package_module(str(helper))
    assert not installed_package_module(str(write(tmp_path / "train.py", "x = 1\n")))


def test_rules_skip_the_kinds_their_pages_exclude():
    """Every rule declares its kinds; the hang rules look at tests too."""
    for code in ("DDP401", "DDP404", "DDP405"):
        assert TEST in REGISTRY[code].kinds
    for code in ("DDP203", "DDP402", "DDP403", "DDP504"):
        assert REGISTRY[code].kinds == frozenset({SCRIPT})
    # a module of options in an installed package is judged by the documented launch of its scripts
    assert REGISTRY["DDP501"].kinds == frozenset({SCRIPT, LIBRARY})
    assert all(REGISTRY[c].kinds for c in REGISTRY)


def _lint(tmp_path: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["lint", "--no-color", "--no-cache", "--jobs", "1", *args],
                                catch_exceptions=False)
    return result.stdout


def test_test_code_is_silent_unless_config_lints_it_as_scripts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "tests" / "test_ranks.py", GLOBAL_RANK_DEVICE)
    assert "DDP505" not in _lint(tmp_path, "tests")
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.ddpcheck]\ntest-files = []\n")
    assert "DDP505" in _lint(tmp_path, "tests")


def test_test_files_setting_is_validated(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.ddpcheck]\ntest-files = 'tests'\n")
    with pytest.raises(ConfigError, match="test-files must be a list of strings"):
        load_config(None, tmp_path)
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.ddpcheck]\nscript-files = ['tests/e2e']\n")
    config = load_config(None, tmp_path)
    assert config.script_files == ("tests/e2e",) and config.test_files == DEFAULT_TEST_FILES
