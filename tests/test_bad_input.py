"""Inputs that cannot be linted: each gets one line naming the path and the
problem, the other files are still linted, no traceback, exit 2."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpcheck.cli import main
from tests.conftest import PREAMBLE, UNGUARDED_SAVE, ddpcheck_cmd, write

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
    assert line == "syntax.py:4:7: syntax error: invalid syntax", line
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


# --- encodings, the way Python reads source ------------------------------------

@pytest.mark.parametrize("data", [
    b"# -*- coding: latin-1 -*-\nimport torch.distributed as dist\n# caf\xe9\nx = 'caf\xe9'\n",
    b"\xef\xbb\xbfimport torch.distributed as dist\nx = 'caf\xc3\xa9'\n",                  # UTF-8 BOM
    b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\nimport torch.distributed as dist\nx = '\x80'\n",
])
def test_declared_encodings_are_read_like_python_reads_them(workdir, data):
    (workdir / "enc.py").write_bytes(data)
    compile(data, "enc.py", "exec")   # valid Python, as Python reads it
    result = ddpcheck_cmd("lint", "enc.py", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("data, message", [
    (b"import torch.distributed as dist\n# caf\xe9\n", "not valid UTF-8 (line 2, byte 0xe9)"),
    (b"# coding: ascii\nimport torch.distributed as dist\n# caf\xe9\n", "not valid ascii (line 3, byte 0xe9)"),
    (b"# coding: klingon\nimport torch.distributed as dist\n", "bad coding declaration (unknown encoding"),
])
def test_invalid_in_its_declared_encoding(workdir, data, message):
    (workdir / "enc.py").write_bytes(data)
    result = ddpcheck_cmd("lint", "enc.py", cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.startswith(f"ddpcheck: error: enc.py: {message}"), result.stderr


# --- syntax errors: Python's position, whatever the prefilter says --------------

SYNTAX_CASES = {
    "def f(:\n": "def f(:",                                 # nothing distributed in it: prefiltered
    "x = (1,\n": "x = (1,",
    "if True:\npass\n": "pass",
    "print 'hello'\n": "print 'hello'",
}


@pytest.mark.parametrize("body", list(SYNTAX_CASES))
@pytest.mark.parametrize("prelude", ["import os\n\n", PREAMBLE + "\n"])
def test_syntax_error_at_pythons_line_and_column(workdir, body, prelude):
    text = prelude + body
    write(workdir / "bad.py", text)
    with pytest.raises(SyntaxError) as python:
        compile(text, "bad.py", "exec")
    result = ddpcheck_cmd("lint", "bad.py", cwd=workdir)
    assert result.returncode == 2
    assert result.stderr == (f"bad.py:{python.value.lineno}:{python.value.offset}: syntax error: "
                             f"{python.value.msg}\n")


def test_def_f_on_line_3_is_3_7(workdir):
    write(workdir / "bad.py", "import os\n\ndef f(:\n    pass\n")
    result = ddpcheck_cmd("lint", "--format", "json", "bad.py", cwd=workdir)
    assert json.loads(result.stdout)["errors"] == [
        {"path": "bad.py", "kind": "syntax", "line": 3, "col": 7, "message": "invalid syntax"}]


def test_a_walked_file_the_prefilter_skips_is_not_parsed(workdir):
    # Only files named on the command line pay for a syntax check when they
    # do not mention distributed training.
    write(workdir / "pkg" / "notes.py", "def f(:\n")
    result = ddpcheck_cmd("lint", "pkg", cwd=workdir)
    assert result.returncode == 0 and result.stderr == ""


# --- usage ----------------------------------------------------------------------

def test_empty_select_is_a_usage_error(workdir):
    result = ddpcheck_cmd("lint", "--select=", "good.py", cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.startswith("ddpcheck: error: --select is empty:"), result.stderr
    assert result.stdout == ""


def test_empty_select_in_config_is_a_usage_error(workdir):
    write(workdir / "pyproject.toml", "[tool.ddpcheck]\nselect = []\n")
    result = ddpcheck_cmd("lint", "good.py", cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.startswith("ddpcheck: error: pyproject.toml: [tool.ddpcheck] select is empty:")


def test_ignoring_every_selected_rule_is_a_usage_error(workdir):
    result = ddpcheck_cmd("lint", "--select", "DDP101", "--ignore", "DDP1", "good.py", cwd=workdir)
    assert result.returncode == 2 and "no rule left to run" in result.stderr


def test_config_dev_null_is_an_empty_config(workdir):
    write(workdir / "train.py", UNGUARDED_SAVE)
    result = ddpcheck_cmd("lint", "--config", "/dev/null", "train.py", cwd=workdir)
    assert result.returncode == 1, result.stderr
    assert "train.py:6:1: DDP301" in result.stdout and result.stderr == ""


@pytest.mark.parametrize("spellings", [["a.py", "./a.py"], ["a.py", "link.py"], ["link.py", "a.py"],
                                       ["a.py", "ABS"], [".", "a.py"]])
def test_the_same_file_under_two_spellings_is_linted_once(workdir, spellings):
    write(workdir / "a.py", UNGUARDED_SAVE)
    os.symlink("a.py", workdir / "link.py")
    args = [str(workdir / "a.py") if s == "ABS" else s for s in spellings]
    result = ddpcheck_cmd("lint", "--select", "DDP301", *args, cwd=workdir)
    assert result.stdout.count("DDP301") == 1, result.stdout


def test_a_helper_module_is_read_with_its_declared_encoding(workdir):
    folder = Path(__file__).resolve().parent.parent / "fixtures" / "multifile" / "ddp301_save_helpers"
    write(workdir / "train.py", (folder / "train.py").read_text())
    helper = (folder / "utils.py").read_text().replace(
        '"""torchvision', '# -*- coding: latin-1 -*-\n"""caf\xe9 torchvision')
    (workdir / "utils.py").write_bytes(helper.encode("latin-1"))
    result = ddpcheck_cmd("lint", "--output-format", "full", "--select", "DDP301", "train.py", cwd=workdir)
    # The unguarded save is only visible by reading the helper.
    assert "train.py:19:9: DDP301" in result.stdout and "`save_checkpoint(...)` (utils.py)" in result.stdout, \
        result.stdout + result.stderr
