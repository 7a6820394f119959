"""Inputs that cannot be linted: each gets one line naming the path and the
problem, the other files are still linted, no traceback, exit 2."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpcheck.cli import main
from tests.conftest import PREAMBLE, ddpcheck_cmd, write

GOOD = PREAMBLE + "BAD_ERROR\n"   # a fake-rule finding, to show the run went on


def bad_inputs(root: Path) -> dict[str, str]:
    """name on the command line -> what its stderr line must say."""
    write(root / "syntax.py", "import torch.distributed as dist\ndist.init_process_group(\"nccl\")\n\ndef f(:\n    pass\n")
    (root / "latin1.py").write_bytes(b"import torch.distributed as dist\n# caf\xe9\n")
    (root / "blob.py").write_bytes(b"\x7fELF\x00\x00distributed\x00")
    (root / "empty").mkdir()
    os.symlink("loop.py", root / "loop.py")
    return {
        "syntax.py": "syntax.py:",
        "latin1.py": "ddpcheck: error: latin1.py: not valid UTF-8",
        "blob.py": "ddpcheck: error: blob.py: binary file",
        "nope.py": "ddpcheck: error: nope.py: no such file or directory",
        "empty": "ddpcheck: warning: empty/: no Python files",
        "loop.py": "ddpcheck: error: loop.py: symbolic link loop",
    }


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "good.py", GOOD)
    return tmp_path


@pytest.mark.parametrize("name", ["syntax.py", "latin1.py", "blob.py", "nope.py", "empty", "loop.py"])
def test_each_bad_input_gets_one_line_and_the_run_goes_on(workdir, fake_rules, name):
    expected = bad_inputs(workdir)[name]
    result = CliRunner().invoke(main, ["lint", "--no-color", name, "good.py"], catch_exceptions=False)
    err_lines = result.stderr.splitlines()
    assert len(err_lines) == 1, result.stderr
    assert err_lines[0].startswith(expected), err_lines
    assert "good.py:2:1: DDP901" in result.stdout      # the good file was still linted
    assert "Traceback" not in result.output
    # An empty folder can be read (it just holds nothing): a warning; the
    # finding in good.py decides. Everything else could not be read: 2.
    assert result.exit_code == (1 if name == "empty" else 2)


def test_syntax_error_names_the_position_real_engine(workdir):
    bad_inputs(workdir)
    result = ddpcheck_cmd("lint", "syntax.py", cwd=workdir)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    # libcst's own positions can be a line late; what matters is a position.
    assert re.match(r"syntax\.py:\d+:\d+: .*syntax error", line), line
    assert "Traceback" not in result.stderr


def test_all_bad_inputs_together_in_a_real_process(workdir):
    expected = bad_inputs(workdir)
    result = ddpcheck_cmd("lint", "--no-color", *expected, "good.py", cwd=workdir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == len(expected)
    for prefix in expected.values():
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, lines)
    assert "5 inputs could not be read." in result.stdout


def test_a_rule_crash_is_that_files_error_only(workdir, fake_rules):
    write(workdir / "crash.py", PREAMBLE + "CRASH_THE_RULE\n")
    result = CliRunner().invoke(main, ["lint", "--no-color", "crash.py", "good.py"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.strip() == \
        "ddpcheck: error: crash.py: internal error (RuntimeError: boom); please report this"
    assert "good.py:2:1: DDP901" in result.stdout


def tree_digest(root: Path) -> dict[str, str]:
    digest = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                digest[str(path)] = "link/dir" if path.is_symlink() or path.is_dir() else "other"
            else:
                digest[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def test_lint_never_writes_to_the_tree(workdir):
    bad_inputs(workdir)
    for i in range(40):  # enough files for the process pool
        write(workdir / "pkg" / f"m{i}.py", PREAMBLE + f"x = {i}\n")
    write(workdir / "pyproject.toml", '[tool.ddpcheck]\nexclude = ["pkg/m1.py"]\n')
    before = tree_digest(workdir)
    for args in (["."], [".", "--format", "json"], [".", "--statistics", "--jobs", "2"]):
        ddpcheck_cmd("lint", *args, cwd=workdir)
    assert tree_digest(workdir) == before
