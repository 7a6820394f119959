"""The result cache: an unchanged file is not analysed again; a changed
file, a changed helper module it imports, or changed settings are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import ddpcheck.lint.analyze as analysis
from ddpcheck.cli import main
from tests.conftest import MISSING_SET_EPOCH, REPO, WITH_SET_EPOCH, write

HELPER_FIXTURE = REPO / "fixtures" / "multifile" / "ddp402_cleanup_in_utils"


def lint(*args: str):
    return CliRunner().invoke(main, ["lint", "--no-color", "--jobs", "1", *args], catch_exceptions=False)


class AnalysisLog:
    """The files really analysed (not read back from the cache). Files are
    linted in forked worker processes, so the log is a file, not a list."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def names(self) -> list[str]:
        return sorted(self.path.read_text().split()) if self.path.exists() else []

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture
def counted(monkeypatch, tmp_path_factory):
    log = AnalysisLog(tmp_path_factory.mktemp("analysed") / "log")
    real = analysis.analyze

    def counting(text, path, settings, project=None):
        with open(log.path, "a") as handle:
            handle.write(os.path.basename(path) + "\n")
        return real(text, path, settings, project)

    monkeypatch.setattr(analysis, "analyze", counting)
    return log


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCHECK_CACHE_DIR", str(tmp_path / "cache"))
    write(tmp_path / "train.py", MISSING_SET_EPOCH)
    write(tmp_path / "other.py", WITH_SET_EPOCH)
    return tmp_path


def touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))


def test_second_run_reads_the_cache(project, counted):
    first = lint(".")
    assert counted.names() == ["other.py", "train.py"]
    second = lint(".")
    assert second.stdout == first.stdout and second.exit_code == first.exit_code == 1
    assert counted.names() == ["other.py", "train.py"], "the second run analysed again"
    assert (project / "cache" / "CACHEDIR.TAG").is_file()
    assert (project / "cache" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_changed_file_is_analysed_again(project, counted):
    lint(".")
    counted.clear()
    write(project / "train.py", WITH_SET_EPOCH)
    result = lint(".")
    assert counted.names() == ["train.py"]
    assert "DDP101" not in result.stdout


def test_settings_changes_never_reuse_results(project, counted):
    lint(".")
    counted.clear()
    result = lint("--select", "DDP101", ".")
    assert counted.names() == ["other.py", "train.py"]
    assert "DDP402" not in result.stdout and "DDP101" in result.stdout


def test_the_same_file_under_another_spelling_reports_that_spelling(project, counted):
    lint(".")
    result = lint(str(project / "train.py"))
    assert f"{project / 'train.py'}:9:1: DDP101" in result.stdout


def test_a_changed_helper_module_invalidates_the_script_importing_it(tmp_path, monkeypatch, counted):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCHECK_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(HELPER_FIXTURE, tmp_path / "proj")
    first = lint("--select", "DDP402", "proj/train.py")
    assert first.exit_code == 0 and counted.names() == ["train.py"]
    counted.clear()
    lint("--select", "DDP402", "proj/train.py")
    assert counted.names() == [], "unchanged: read from the cache"
    helper = tmp_path / "proj" / "dist_utils.py"
    helper.write_text(helper.read_text().replace("        dist.destroy_process_group()\n", "        pass\n"))
    touch_later(helper)
    changed = lint("--select", "DDP402", "proj/train.py")
    assert counted.names() == ["train.py"]
    assert "proj/train.py:12:5: DDP402" in changed.stdout


def test_no_cache_neither_reads_nor_writes(project, counted):
    lint(".")
    counted.clear()
    lint("--no-cache", ".")
    assert counted.names() == ["other.py", "train.py"]
    shutil.rmtree(project / "cache")
    lint("--no-cache", ".")
    assert not (project / "cache").exists()


def test_default_folder_is_the_project_root_and_cache_dir_moves_it(tmp_path, monkeypatch):
    monkeypatch.delenv("DDPCHECK_CACHE_DIR")
    root = tmp_path / "repo"
    write(root / "pyproject.toml", "[tool.ddpcheck]\nfail-on = \"error\"\n")
    write(root / "src" / "train.py", MISSING_SET_EPOCH)
    monkeypatch.chdir(root / "src")
    lint("train.py")
    assert (root / ".ddpcheck_cache" / "CACHEDIR.TAG").is_file()
    write(root / "pyproject.toml", "[tool.ddpcheck]\ncache-dir = \"build/lint-cache\"\n")
    lint("train.py")
    assert (root / "build" / "lint-cache" / "CACHEDIR.TAG").is_file()
    lint("--cache-dir", str(tmp_path / "elsewhere"), "train.py")
    assert (tmp_path / "elsewhere" / "CACHEDIR.TAG").is_file()


def test_internal_errors_are_not_cached(project, monkeypatch):
    def crash(text, path, settings, project=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(analysis, "analyze", crash)
    assert lint("train.py").exit_code == 2
    monkeypatch.undo()
    monkeypatch.chdir(project)
    monkeypatch.setenv("DDPCHECK_CACHE_DIR", str(project / "cache"))
    assert lint("train.py").exit_code == 1


def test_a_run_answered_from_the_cache_never_imports_libcst(project):
    """The warm path is file hashing and JSON: the rule codes come from the
    rule modules' names, not from importing them (and libcst with them)."""
    import subprocess
    import sys

    from ddpcheck.rules.base import REGISTRY

    env = dict(os.environ, DDPCHECK_CACHE_DIR=str(project / "cache"))
    code = ("import sys\nfrom ddpcheck.lint.config import known_codes\nprint(','.join(known_codes()))\n"
            "from ddpcheck.cli import main\n"
            "try:\n    main(['lint', '--jobs', '1', '.'])\nexcept SystemExit as exit:\n"
            "    print('libcst' in sys.modules, exit.code)\n")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True)
            for _ in range(2)]
    first, second = (r.stdout.splitlines() for r in runs)
    assert first[0].split(",") == sorted(REGISTRY)
    assert first[-1].endswith(" 1")  # cold: analysed (in worker processes)
    assert second[-1] == "False 1"   # warm: the driver never imported libcst (nor the rules); same exit code
    assert list((project / "cache").rglob("*.json"))


def test_a_skipped_script_is_analysed_once_a_module_it_imports_turns_distributed(tmp_path, monkeypatch, counted):
    """The script names no distributed word; whether it is analysed depends
    on the modules it imports, so its cached result does too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPCHECK_CACHE_DIR", str(tmp_path / "cache"))
    helper = write(tmp_path / "runner.py", "class Runner:\n    def run(self):\n        pass\n")
    write(tmp_path / "train.py", "from runner import Runner\n\nif __name__ == '__main__':\n    Runner().run()\n")
    first = lint("--select", "DDP402", "train.py")
    assert first.exit_code == 0 and counted.names() == []
    lint("--select", "DDP402", "train.py")
    assert counted.names() == []
    helper.write_text("import torch\n\n\nclass Runner:\n    def run(self):\n"
                      "        torch.distributed.init_process_group('nccl')\n")
    touch_later(helper)
    changed = lint("--select", "DDP402", "train.py")
    assert counted.names() == ["train.py"]
    assert "train.py:4:5: DDP402" in changed.stdout
