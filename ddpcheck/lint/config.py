"""`[tool.ddpcheck]` in pyproject.toml, validated into a Config.

The nearest pyproject.toml with a `[tool.ddpcheck]` table, walking up from the
first linted path (or the cwd), is used; `--config PATH` names one explicitly.
Every mistake (unknown key, unknown rule code, wrong type, broken TOML) is a
ConfigError whose message is one line naming the file and the problem.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ddpcheck.findings import Severity
from ddpcheck.settings import DEFAULT_TEST_FILES
from ddpcheck.lint.pathmatch import matches_any, relative_posix

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; tomli is the same parser, backported.
    import tomli as tomllib

KNOWN_KEYS = ("select", "ignore", "per-file-ignores", "exclude", "main-process-guards", "fail-on",
              "extend-select", "extend-ignore", "cache-dir", "test-files", "script-files")
ALL = "ALL"


class ConfigError(Exception):
    """A configuration mistake; str() is the one-line message for the user."""


@dataclass(frozen=True)
class Config:
    path: Path | None = None            # the pyproject.toml it came from
    select: tuple[str, ...] | None = None   # None: every rule
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()
    main_process_guards: tuple[str, ...] = ()
    fail_on: Severity | None = None
    extend_select: tuple[str, ...] = ()
    extend_ignore: tuple[str, ...] = ()
    cache_dir: str | None = None        # as written; relative to the pyproject's folder
    test_files: tuple[str, ...] = DEFAULT_TEST_FILES   # globs of test code (judged as tests, not scripts)
    script_files: tuple[str, ...] = ()  # globs of files every rule treats as training scripts

    @property
    def root(self) -> str | None:
        """Folder holding the pyproject.toml; anchors globs and local imports."""
        return str(self.path.parent) if self.path else None


# --- rule codes --------------------------------------------------------------

def known_codes() -> list[str]:
    """Every rule code. Read from the rule modules' names (`ddp101_*.py`)
    without importing them: importing the rules imports libcst, which a run
    answered entirely from the result cache never needs. Rules registered
    by other means (already imported) count too."""
    import pkgutil
    import re

    import ddpcheck

    rules_path = [os.path.join(os.path.dirname(ddpcheck.__file__), "rules")]
    codes = {f"DDP{m.group(1)}" for info in pkgutil.iter_modules(rules_path)
             if (m := re.fullmatch(r"ddp(\d{3})_\w+", info.name))}
    registry = sys.modules.get("ddpcheck.rules.base")
    if registry is not None:
        codes |= set(registry.REGISTRY)
    return sorted(codes)


def selector_matches(code: str, selector: str) -> bool:
    """`DDP1` selects DDP101, DDP102... as in ruff; `ALL` selects everything."""
    return selector == ALL or code.startswith(selector)


def check_selectors(selectors: tuple[str, ...], where: str, codes: list[str]) -> None:
    for selector in selectors:
        if not any(selector_matches(code, selector) for code in codes):
            known = ", ".join(codes) or "none registered"
            raise ConfigError(f"{where}: unknown rule code {selector!r} (known: {known})")


def parse_code_list(text: str) -> tuple[str, ...]:
    """`--select DDP101,DDP3` -> ('DDP101', 'DDP3')."""
    return tuple(part.strip().upper() for part in text.split(",") if part.strip())


def resolve_enabled(select: tuple[str, ...] | None, ignore: tuple[str, ...], codes: list[str]) -> frozenset[str]:
    """Selected minus ignored. An ignore always wins over a select, however
    specific the select (flake8's rule; simpler to predict than ruff's)."""
    chosen = codes if select is None else [c for c in codes if any(selector_matches(c, s) for s in select)]
    return frozenset(c for c in chosen if not any(selector_matches(c, s) for s in ignore))


def ignored_for(path: str, config: Config) -> frozenset[str]:
    """Selectors that `per-file-ignores` turns off for one file."""
    if not config.per_file_ignores:
        return frozenset()
    rel = relative_posix(path, config.root)
    out: set[str] = set()
    for pattern, selectors in config.per_file_ignores:
        if matches_any(rel, (pattern,)):
            out.update(selectors)
    return frozenset(out)


# --- finding and reading pyproject.toml ---------------------------------------

def find_pyproject(start: Path) -> Path | None:
    """Nearest pyproject.toml at or above `start` that has [tool.ddpcheck]."""
    # abspath, not resolve(): resolving a symlink loop raises, and the first
    # path may well be a bad input that discovery reports on its own.
    start = Path(os.path.abspath(start))
    folder = start if start.is_dir() else start.parent
    for candidate_dir in (folder, *folder.parents):
        candidate = candidate_dir / "pyproject.toml"
        if not candidate.is_file():
            continue
        try:
            text = candidate.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        # A plain text test first: an unrelated (even broken) pyproject.toml
        # that never mentions ddpcheck is skipped without parsing.
        if "ddpcheck" in text and "ddpcheck" in _tool_table(_parse(candidate, text)):
            return candidate
    return None


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _parse(path: Path, text: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{_display(path)}: invalid TOML: {exc}") from None


def _tool_table(data: dict) -> dict:
    tool = data.get("tool", {})
    return tool if isinstance(tool, dict) else {}


def load_config(explicit: str | None, start: Path) -> Config:
    """The Config for a run: `explicit` (--config) or the nearest pyproject."""
    if explicit is not None:
        path = Path(explicit)
        if not path.exists():
            raise ConfigError(f"{explicit}: config file not found")
        if path.is_dir():
            raise ConfigError(f"{explicit}: is a directory, not a config file")
    else:
        found = find_pyproject(start)
        if found is None:
            return Config()
        path = found
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_display(path)}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    table = _tool_table(_parse(path, text)).get("ddpcheck", {})
    return config_from_table(table, path)


def config_from_table(table: object, path: Path) -> Config:
    where = f"{_display(path)}: [tool.ddpcheck]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key in table:
        if key not in KNOWN_KEYS:
            raise ConfigError(f"{where} unknown key {key!r} (known: {', '.join(KNOWN_KEYS)})")
    codes = known_codes()

    def str_list(key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} {key} must be a list of strings, got {value!r}")
        return tuple(value)

    def code_list(key: str, value: object, label: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} {label} must be a list of rule codes, got {value!r}")
        if key == "select" and not value:
            raise ConfigError(f"{where} select is empty: list rule codes or prefixes (select = [\"DDP1\"]), "
                              "or remove the key to run every rule")
        selectors = tuple(v.strip().upper() for v in value)
        check_selectors(selectors, f"{where} {label}", codes)
        return selectors

    select = code_list("select", table["select"], "select") if "select" in table else None
    ignore = code_list("ignore", table.get("ignore", []), "ignore")
    extend_select = code_list("extend-select", table.get("extend-select", []), "extend-select")
    extend_ignore = code_list("extend-ignore", table.get("extend-ignore", []), "extend-ignore")
    cache_dir = table.get("cache-dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir.strip()):
        raise ConfigError(f"{where} cache-dir must be a folder path (a string), got {cache_dir!r}")

    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where} per-file-ignores must be a table of glob = [codes], got {pfi!r}")
    per_file = tuple(
        (pattern, code_list("per-file-ignores", value, f"per-file-ignores {pattern!r}"))
        for pattern, value in pfi.items()
    )

    fail_on = None
    if "fail-on" in table:
        value = table["fail-on"]
        try:
            fail_on = Severity.parse(value) if isinstance(value, str) else Severity.parse("?")
        except ValueError:
            raise ConfigError(f"{where} fail-on must be \"error\", \"warning\" or \"info\", got {value!r}") from None

    guards = str_list("main-process-guards")
    for guard in guards:
        if not guard.replace(".", "_").isidentifier():
            raise ConfigError(f"{where} main-process-guards: {guard!r} is not a Python name")

    return Config(
        # Only a regular file anchors globs and local imports: `--config
        # /dev/null` (an empty config) or a pipe must not make /dev the root.
        path=path.resolve() if path.is_file() else None,
        select=select,
        ignore=ignore,
        per_file_ignores=per_file,
        exclude=str_list("exclude"),
        main_process_guards=guards,
        fail_on=fail_on,
        extend_select=extend_select,
        extend_ignore=extend_ignore,
        cache_dir=cache_dir,
        test_files=str_list("test-files") if "test-files" in table else DEFAULT_TEST_FILES,
        script_files=str_list("script-files"),
    )
