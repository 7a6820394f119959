"""The result cache: a second run over an unchanged tree reads each file's
findings back instead of parsing it (ruff's `.ruff_cache`).

An entry is keyed by the file's path and everything its findings depend on:
ddpcheck's version and its own code (a fingerprint of its modules' sizes and
modification times, so an edited checkout never reads stale results), the
settings that matter (enabled rules, main-process guards, the project root),
and is valid only while the file's content and the content of every local
helper module its analysis read (the run's import edges, model/project.py) are
unchanged. Results with an internal error are never stored. The folder holds
a CACHEDIR.TAG and a `.gitignore` of `*`, so backups and git skip it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from ddpcheck import __version__
from ddpcheck.findings import Applicability, ErrorKind, FileError, FileResult, Finding, Severity
from ddpcheck.settings import LintSettings

DEFAULT_DIR = ".ddpcheck_cache"
FORMAT = 2
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by ddpcheck.\n"


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def code_fingerprint() -> str:
    """ddpcheck's version and its own modules (size and mtime of each)."""
    package = Path(__file__).resolve().parent.parent
    parts = [__version__, str(FORMAT)]
    for path in sorted(package.rglob("*.py")):
        try:
            st = path.stat()
        except OSError:
            continue
        parts.append(f"{path.relative_to(package)}:{st.st_size}:{st.st_mtime_ns}")
    return _digest("\n".join(parts).encode())


def settings_fingerprint(settings: LintSettings) -> str:
    return _digest(json.dumps([sorted(settings.enabled), list(settings.main_process_guards),
                               os.path.abspath(settings.root) if settings.root else None,
                               list(settings.test_files), list(settings.script_files),
                               os.path.abspath(settings.invoked_from) if settings.invoked_from else None]).encode())


class ResultCache:
    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.code = code_fingerprint()
        self._hashes: dict[str, str | None] = {}
        self._ready = False

    # -- hashing -------------------------------------------------------------------
    def content_hash(self, path: str) -> str | None:
        key = os.path.abspath(path)
        if key not in self._hashes:
            try:
                self._hashes[key] = _digest(Path(key).read_bytes())
            except OSError:
                self._hashes[key] = None
        return self._hashes[key]

    def _entry_path(self, path: str, settings: LintSettings, named: bool) -> Path:
        # `named`: a file named on the command line reports its syntax errors
        # even when no rule needs to parse it, so it is another result
        key = f"{self.code}\0{settings_fingerprint(settings)}\0{named}\0{os.path.abspath(path)}"
        name = _digest(key.encode())
        return self.folder / name[:2] / f"{name}.json"

    # -- reading and writing -------------------------------------------------------
    def lookup(self, path: str, settings: LintSettings, named: bool = False) -> FileResult | None:
        content = self.content_hash(path)
        if content is None:
            return None
        try:
            entry = json.loads(self._entry_path(path, settings, named).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if entry.get("content") != content:
            return None
        helpers = entry.get("helpers", {})
        if any(self.content_hash(h) != digest for h, digest in helpers.items()):
            return None
        try:
            # the path as given this run (`.` then `src/`: the same file, another spelling)
            findings = tuple(replace(_finding(d), path=path) for d in entry["findings"])
            error = _error(entry["error"]) if entry.get("error") else None
        except (KeyError, TypeError, ValueError):
            return None
        return FileResult(path=path, findings=findings, error=error, helpers=tuple(helpers))

    def store(self, result: FileResult, settings: LintSettings, cacheable: bool = True, named: bool = False) -> None:
        if not cacheable:
            return
        content = self.content_hash(result.path)
        helpers = {h: self.content_hash(h) for h in result.helpers}
        if content is None or any(v is None for v in helpers.values()):
            return
        entry = {"content": content, "helpers": helpers,
                 "error": result.error.to_json() if result.error is not None else None,
                 "findings": [_finding_json(f) for f in result.findings]}
        target = self._entry_path(result.path, settings, named)
        try:
            self._prepare()
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entry), encoding="utf-8")
            os.replace(tmp, target)
        except OSError:
            pass   # a read-only checkout still lints, just without a cache

    def _prepare(self) -> None:
        if self._ready:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", "# Created by ddpcheck\n*\n")):
            marker = self.folder / name
            if not marker.exists():
                marker.write_text(text, encoding="utf-8")
        self._ready = True


def _finding_json(f: Finding) -> dict:
    data = asdict(f)
    data["severity"] = int(f.severity)
    data["applicability"] = f.applicability.value if f.applicability else None
    return data


def _finding(d: dict) -> Finding:
    return Finding(path=d["path"], line=d["line"], col=d["col"], code=d["code"], name=d["name"],
                   severity=Severity(d["severity"]), message=d["message"], fix=d["fix"], short=d.get("short", ""),
                   applicability=Applicability(d["applicability"]) if d.get("applicability") else None)


def _error(d: dict) -> FileError:
    return FileError(kind=ErrorKind(d["kind"]), message=d["message"], line=d.get("line"), col=d.get("col"))


# Errors that are not facts about the file's content: retried next run.
NOT_CACHED = frozenset({ErrorKind.INTERNAL, ErrorKind.CRASHED, ErrorKind.TIMED_OUT})


def cacheable(result: FileResult) -> bool:
    """Internal errors (a rule crashed, a worker died or timed out) are
    retried next run; everything else depends only on what the key holds."""
    return result.error is None or result.error.kind not in NOT_CACHED
