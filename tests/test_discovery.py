from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpcheck.lint.discovery import discover
from ddpcheck.lint.pathmatch import path_matches, relative_posix
from tests.conftest import write


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for rel in [
        "train.py", "pkg/model.py", "pkg/deep/er/util.py", "README.md", "pkg/data.txt",
        ".git/hooks/x.py", ".hg/x.py", ".svn/x.py", "__pycache__/x.py", "build/x.py", "dist/x.py",
        ".eggs/x.py", "proj.egg-info/x.py", "node_modules/x.py", ".tox/x.py", ".nox/x.py",
        ".mypy_cache/x.py", ".pytest_cache/x.py", "lib/site-packages/x.py", ".venv/x.py", "venv/x.py",
        "env/lib/x.py", "myenv311/lib/x.py",
    ]:
        write(tmp_path / rel, "x = 1\n")
    # Virtualenvs are recognised by their marker file, whatever their name.
    write(tmp_path / "env" / "pyvenv.cfg", "home = /usr\n")
    write(tmp_path / "myenv311" / "pyvenv.cfg", "home = /usr\n")
    return tmp_path


def files(found) -> list[str]:
    return [Path(f).as_posix() for f in found.files]


def test_walk_finds_python_files_and_skips_tool_folders(tree):
    found = discover(["."])
    assert files(found) == ["pkg/deep/er/util.py", "pkg/model.py", "train.py"]
    assert found.problems == []


def test_named_file_is_linted_whatever_its_extension_or_folder(tree):
    found = discover(["README.md", "build/x.py", "pkg/data.txt"])
    assert files(found) == ["README.md", "build/x.py", "pkg/data.txt"]


def test_duplicates_are_linted_once(tree):
    found = discover(["train.py", "./train.py", ".", "pkg"])
    assert files(found) == ["pkg/deep/er/util.py", "pkg/model.py", "train.py"]


def test_missing_path_is_a_fatal_problem(tree):
    found = discover(["nope.py", "train.py"])
    assert files(found) == ["train.py"]
    [problem] = found.problems
    assert (problem.path, problem.message, problem.fatal) == ("nope.py", "no such file or directory", True)


def test_empty_folder_is_a_warning(tree):
    (tree / "empty").mkdir()
    (tree / "only_docs").mkdir()
    write(tree / "only_docs" / "a.md", "hi\n")
    found = discover(["empty", "only_docs/"])
    assert [(p.path, p.message, p.fatal) for p in found.problems] == [
        ("empty" + os.sep, "no Python files", False),
        ("only_docs/", "no Python files", False),
    ]


def test_symlink_loop_file_is_reported_not_followed(tree):
    os.symlink("loop.py", tree / "pkg" / "loop.py")  # points at itself
    found = discover(["pkg"])
    assert "pkg/loop.py" not in files(found)
    assert [(Path(p.path).as_posix(), p.message, p.fatal) for p in found.problems] == [
        ("pkg/loop.py", "symbolic link loop", True)]
    named = discover(["pkg/loop.py"])
    assert [(p.path, p.message) for p in named.problems] == [("pkg/loop.py", "symbolic link loop")]


def test_broken_symlink(tree):
    os.symlink("gone.py", tree / "dangling.py")
    found = discover(["dangling.py"])
    assert [(p.message, p.fatal) for p in found.problems] == [("broken symbolic link", True)]


def test_symlinked_folder_cycle_terminates_and_lints_each_file_once(tree):
    os.symlink("..", tree / "pkg" / "up")          # pkg/up -> the tree root: a cycle
    os.symlink("pkg", tree / "alias")              # a second name for pkg
    found = discover(["."])
    assert files(found) == ["pkg/deep/er/util.py", "pkg/model.py", "train.py"]


def test_symlinked_python_file_is_linted(tree):
    os.symlink("../train.py", tree / "pkg" / "linked_train.py")
    assert "pkg/linked_train.py" in files(discover(["pkg"]))


def test_named_symlinked_folder_is_walked(tree):
    os.symlink("pkg", tree / "alias")
    assert files(discover(["alias"])) == ["alias/deep/er/util.py", "alias/model.py"]


def test_exclude_globs(tree):
    found = discover(["."], exclude=("deep", "/train.py"), root=str(tree))
    assert files(found) == ["pkg/model.py"]


@pytest.mark.parametrize("rel, pattern, is_dir, expected", [
    ("a/b/legacy/x.py", "legacy", False, True),          # a name matches at any depth
    ("a/b/x_old.py", "*_old.py", False, True),
    ("a/b/x.py", "*_old.py", False, False),
    ("scripts/old/x.py", "scripts/old", False, True),    # a folder matches what is below it
    ("other/scripts/old/x.py", "scripts/old", False, False),  # a pattern with / is anchored
    ("tools/x.py", "/tools/x.py", False, True),
    ("tools/x.py", "./tools/*.py", False, True),
    ("gen", "gen/", True, True),                         # trailing / : folders only
    ("gen", "gen/", False, False),
    ("gen/x.py", "gen/", False, True),
    ("tests/a.py", "tests/**/*.py", False, True),        # **/ matches zero folders
    ("tests/u/v/a.py", "tests/**/*.py", False, True),
    ("src/a.py", "tests/**/*.py", False, False),
])
def test_path_matches(rel, pattern, is_dir, expected):
    assert path_matches(rel, pattern, is_dir) is expected


def test_relative_posix(tmp_path):
    assert relative_posix(str(tmp_path / "a" / "b.py"), str(tmp_path)) == "a/b.py"
    outside = relative_posix("/elsewhere/b.py", str(tmp_path))
    assert outside == "/elsewhere/b.py"
