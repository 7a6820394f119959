"""Gitignore-ish glob matching for `exclude` and `per-file-ignores`.

Paths are POSIX strings relative to the project root (the folder holding the
pyproject.toml, else the current directory). Rules, as in .gitignore:

- a pattern without `/` matches a file or folder name at any depth
  (`legacy`, `*_old.py`);
- a pattern with `/` matches the relative path from the root (`scripts/old/*`,
  `/tools/x.py`); a leading `/` or `./` only anchors it;
- a pattern that matches a folder matches everything below it;
- a trailing `/` matches folders only;
- `**/` also matches zero folders (`tests/**/*.py` matches `tests/a.py`).

`*` may cross `/` (fnmatch), which errs on the side of matching.
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath


def relative_posix(path: str, root: str | None) -> str:
    """`path` relative to `root` (or the cwd) as a POSIX string; paths outside
    the root stay as given (normalized) so anchored patterns simply miss."""
    base = Path(root) if root else Path.cwd()
    absolute = Path(os.path.abspath(path))
    try:
        rel = absolute.relative_to(os.path.abspath(base))
    except ValueError:
        return PurePosixPath(Path(os.path.normpath(path))).as_posix()
    return rel.as_posix()


def _variants(pattern: str) -> list[str]:
    """The pattern plus its forms with `**/` standing for zero folders."""
    out = [pattern]
    while "**/" in out[-1]:
        out.append(out[-1].replace("**/", "", 1))
    return out


def path_matches(rel: str, pattern: str, is_dir: bool = False) -> bool:
    pattern = pattern.strip()
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    if not pattern or not rel:
        return False
    parts = rel.split("/")
    # Candidates: the path itself and every folder above it, each flagged with
    # whether it is a folder (for trailing-slash patterns).
    n = len(parts)
    for i in range(n, 0, -1):
        candidate_is_dir = is_dir if i == n else True
        if dir_only and not candidate_is_dir:
            continue
        target = "/".join(parts[:i]) if anchored else parts[i - 1]
        if any(fnmatchcase(target, p) for p in _variants(pattern)):
            return True
    return False


def matches_any(rel: str, patterns: tuple[str, ...] | list[str], is_dir: bool = False) -> bool:
    return any(path_matches(rel, p, is_dir) for p in patterns)
