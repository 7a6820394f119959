"""Turn the command line's paths into the files to lint, plus one-line
problems for the inputs that cannot be used.

- A named file is always linted, whatever its extension (pre-commit passes
  files); a named folder is walked for `*.py`.
- The walk skips VCS folders, virtualenvs, caches and build output, and does
  not follow symlinked folders (as ruff and ripgrep), so symlink cycles cannot
  make it loop. A symlinked `.py` file is linted; one that dangles or loops is
  reported.
- Config `exclude` globs apply to walked and named paths alike, so a
  pre-commit run honours them too.
- A file reached twice (`a.py ./a.py`, `/abs/a.py a.py`, a symlink and its
  target, a folder named twice) is linted once, under the first spelling
  met, the real file preferred over a symlink to it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from ddpcheck.lint.pathmatch import matches_any, relative_posix

SKIP_DIR_NAMES = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "build", "dist", ".eggs",
    "node_modules", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".hypothesis", "site-packages",
})


@dataclass(frozen=True)
class InputProblem:
    path: str
    message: str
    fatal: bool  # True: an input could not be read (exit 2); False: a warning


@dataclass
class Discovered:
    files: list[str] = field(default_factory=list)
    problems: list[InputProblem] = field(default_factory=list)
    # Files named on the command line (not found by walking a folder): a
    # syntax error in them is reported whatever the prefilter says.
    named: frozenset[str] = frozenset()


def is_skipped_dir(path: str, name: str) -> bool:
    if name in SKIP_DIR_NAMES or name.endswith(".egg-info"):
        return True
    # Any virtualenv, whatever it is called (`env`, `.env311`...).
    return os.path.exists(os.path.join(path, "pyvenv.cfg"))


def _stat_problem(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno == errno.ENOENT:
        return "broken symbolic link" if os.path.islink(path) else "no such file or directory"
    if exc.errno == errno.EACCES:
        return "permission denied"
    return exc.strerror or str(exc)


def _display_dir(path: str) -> str:
    return path if path.endswith(os.sep) else path + os.sep


class _Walker:
    def __init__(self, exclude: tuple[str, ...], root: str | None) -> None:
        self.exclude = exclude
        self.root = root
        self.out = Discovered()
        self.named_keys: set[tuple[int, int]] = set()
        self.seen: dict[tuple[int, int], int] = {}   # (st_dev, st_ino) -> index in out.files

    def add(self, path: str, st: os.stat_result, is_link: bool) -> None:
        """Keep one spelling per file: the first met, unless it is a symlink
        and this one is the file itself."""
        key = (st.st_dev, st.st_ino)
        index = self.seen.get(key)
        if index is None:
            self.seen[key] = len(self.out.files)
            self.out.files.append(path)
        elif not is_link and os.path.islink(self.out.files[index]):
            self.out.files[index] = path

    def excluded(self, path: str, is_dir: bool) -> bool:
        return bool(self.exclude) and matches_any(relative_posix(path, self.root), self.exclude, is_dir)

    def named(self, arg: str) -> None:
        path = os.path.normpath(arg)
        try:
            st = os.stat(path)
        except OSError as exc:
            self.out.problems.append(InputProblem(arg, _stat_problem(path, exc), fatal=True))
            return
        if stat.S_ISDIR(st.st_mode):
            if self.excluded(path, is_dir=True):
                return
            before = (len(self.out.files), len(self.out.problems))
            self.walk(path)
            if (len(self.out.files), len(self.out.problems)) == before:
                self.out.problems.append(InputProblem(_display_dir(arg), "no Python files", fatal=False))
        elif stat.S_ISREG(st.st_mode):
            if not self.excluded(path, is_dir=False):
                self.named_keys.add((st.st_dev, st.st_ino))
                self.add(path, st, os.path.islink(path))
        else:
            self.out.problems.append(InputProblem(arg, "not a regular file or directory", fatal=True))

    def walk(self, top: str) -> None:
        stack = [top]
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self.out.problems.append(InputProblem(_display_dir(folder), _stat_problem(folder, exc), fatal=True))
                continue
            subdirs = []
            for entry in entries:
                self.entry(entry, subdirs)
            stack.extend(reversed(subdirs))

    def entry(self, entry: os.DirEntry, subdirs: list[str]) -> None:
        path = os.path.normpath(entry.path)
        if entry.is_symlink():
            if not entry.name.endswith(".py"):
                return  # symlinked folders are not followed; other links are irrelevant
            try:
                st = os.stat(path)
            except OSError as exc:
                self.out.problems.append(InputProblem(path, _stat_problem(path, exc), fatal=True))
                return
            if stat.S_ISREG(st.st_mode) and not self.excluded(path, is_dir=False):
                self.add(path, st, is_link=True)
            return
        if entry.is_dir(follow_symlinks=False):
            if not is_skipped_dir(entry.path, entry.name) and not self.excluded(path, is_dir=True):
                subdirs.append(path)
        elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
            if not self.excluded(path, is_dir=False):
                self.add(path, entry.stat(follow_symlinks=False), is_link=False)


def discover(paths: list[str] | tuple[str, ...], exclude: tuple[str, ...] = (), root: str | None = None) -> Discovered:
    """Files to lint (deduplicated, sorted) and the problems met on the way."""
    walker = _Walker(tuple(exclude), root)
    for arg in paths:
        walker.named(arg)
    result = walker.out
    result.named = frozenset(result.files[i] for key, i in walker.seen.items() if key in walker.named_keys)
    result.files = sorted(result.files)
    return result
