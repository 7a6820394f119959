"""Render a lint run: text (ruff-like), JSON, GitHub Actions annotations, and
per-rule statistics. Pure functions from results to strings; the CLI decides
where they go."""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterable

import click
from tabulate import tabulate

from ddpcheck import __version__
from ddpcheck.findings import ErrorKind, FileError, FileResult, Finding, Severity

SEVERITY_COLOR = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
GITHUB_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def all_findings(results: Iterable[FileResult]) -> list[Finding]:
    return sorted(f for r in results for f in r.findings)


def unreadable(results: Iterable[FileResult]) -> list[FileResult]:
    return [r for r in results if r.error is not None]


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


# --- text ----------------------------------------------------------------------

def text_finding(f: Finding, color: bool) -> str:
    def style(text: str, **kw) -> str:
        return click.style(text, **kw) if color else text

    location = style(f.path, bold=True) + f":{f.line}:{f.col}:"
    code = style(f.code, fg=SEVERITY_COLOR[f.severity], bold=True)
    lines = f"{location} {code} {f.message}"
    if f.fix:
        lines += "\n  " + style("help:", fg="green", bold=True) + " " + f.fix
    return lines


def input_error_line(path: str, error: FileError) -> str:
    """One line for an input that could not be analysed; one with a position
    is shown the way compilers show it: "bad.py:3:7: syntax error: invalid syntax"."""
    if error.line is not None:
        label = "syntax error" if error.kind is ErrorKind.SYNTAX else "error"
        return f"{path}:{error.line}:{error.col}: {label}: {error.message}"
    return f"ddpcheck: error: {path}: {error.message}"


def severity_counts(findings: list[Finding]) -> str:
    counts = Counter(f.severity for f in findings)
    parts = []
    for severity in sorted(counts, reverse=True):
        word = str(severity)
        parts.append(plural(counts[severity], word, word if severity is Severity.INFO else None))
    return ", ".join(parts)


def summary(findings: list[Finding], files_checked: int, unreadable_count: int) -> str:
    if findings:
        files_hit = len({f.path for f in findings})
        text = (f"Found {plural(len(findings), 'finding')} ({severity_counts(findings)}) "
                f"in {files_hit} of {plural(files_checked, 'file')}.")
    elif unreadable_count:
        # Not "all checks passed": some inputs were never checked.
        text = f"No findings ({plural(files_checked, 'file')})."
    else:
        text = f"All checks passed ({plural(files_checked, 'file')})."
    if unreadable_count:
        text += f" {plural(unreadable_count, 'input')} could not be read."
    return text


# --- statistics ------------------------------------------------------------------

def statistics_rows(findings: list[Finding]) -> list[dict]:
    counts = Counter(f.code for f in findings)
    first = {}
    for f in findings:
        first.setdefault(f.code, f)
    order = sorted(counts, key=lambda code: (-counts[code], code))
    return [{"count": counts[c], "code": c, "name": first[c].name, "severity": str(first[c].severity)}
            for c in order]


def statistics_table(findings: list[Finding]) -> str:
    rows = statistics_rows(findings)
    if not rows:
        return ""
    return tabulate([list(r.values()) for r in rows], headers=["count", "code", "name", "severity"],
                    colalign=("right", "left", "left", "left"))


# --- JSON ------------------------------------------------------------------------

def json_document(results: list[FileResult], input_errors: list[tuple[str, FileError]], files_checked: int,
                  statistics: bool = False) -> str:
    findings = all_findings(results)
    errors = [{"path": p, **e.to_json()} for p, e in input_errors]
    errors += [{"path": r.path, **r.error.to_json()} for r in unreadable(results)]
    document = {
        "version": __version__,
        "files_checked": files_checked,
        "findings": [f.to_json() for f in findings],
        "errors": sorted(errors, key=lambda e: e["path"]),
    }
    if statistics:
        document["statistics"] = statistics_rows(findings)
    return json.dumps(document, indent=2)


# --- GitHub Actions --------------------------------------------------------------

def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_finding(f: Finding) -> str:
    title = _escape_property(f"{f.code} {f.name}")
    message = _escape_data(f"{f.message}\n{f.fix}" if f.fix else f.message)
    return (f"::{GITHUB_COMMAND[f.severity]} file={_escape_property(f.path)},line={f.line},"
            f"col={f.col},title={title}::{message}")


def github_input_error(path: str, error: FileError) -> str:
    where = f"file={_escape_property(path)}"
    message = error.message
    if error.line is not None:
        where += f",line={error.line},col={error.col}"
        if error.kind is ErrorKind.SYNTAX:
            message = f"syntax error: {message}"
    return f"::error {where},title=ddpcheck::{_escape_data(message)}"
