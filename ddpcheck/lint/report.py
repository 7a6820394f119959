"""Render a lint run: concise (one line a finding, the default), full (the
teaching text, the fix and the source around the spot), JSON, GitHub Actions
annotations, SARIF 2.1.0 (GitHub code scanning), JUnit XML, and per-rule
statistics. Pure functions from results to strings; the CLI decides where they
go."""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterable

import click
from tabulate import tabulate

from ddpcheck import __version__
from ddpcheck.findings import Applicability, ErrorKind, FileError, FileResult, Finding, Severity

SEVERITY_COLOR = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
GITHUB_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def all_findings(results: Iterable[FileResult]) -> list[Finding]:
    return sorted(f for r in results for f in r.findings)


def unreadable(results: Iterable[FileResult]) -> list[FileResult]:
    return [r for r in results if r.error is not None]


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


# --- text ----------------------------------------------------------------------

def fixable(f: Finding, unsafe_fixes: bool = False) -> bool:
    """`--fix` would fix it (with `--unsafe-fixes` if that is on)."""
    return f.applicability is Applicability.SAFE or (unsafe_fixes and f.applicability is Applicability.UNSAFE)


def _styler(color: bool):
    def style(text: str, **kw) -> str:
        return click.style(text, **kw) if color else text
    return style


def text_finding(f: Finding, color: bool) -> str:
    """The long form: the teaching message and a `help:` line."""
    style = _styler(color)
    location = style(f.path, bold=True) + f":{f.line}:{f.col}:"
    code = style(f.code, fg=SEVERITY_COLOR[f.severity], bold=True)
    lines = f"{location} {code} {f.message}"
    if f.fix:
        lines += "\n  " + style("help:", fg="green", bold=True) + " " + f.fix
    return lines


def concise_finding(f: Finding, color: bool, unsafe_fixes: bool = False) -> str:
    """`path:line:col: CODE [*] short message`: one line, ruff's concise form
    (`[*]`: `--fix` fixes it)."""
    style = _styler(color)
    location = style(f.path, bold=True) + f":{f.line}:{f.col}:"
    code = style(f.code, fg=SEVERITY_COLOR[f.severity], bold=True)
    mark = " " + style("[*]", fg="cyan") if fixable(f, unsafe_fixes) else ""
    return f"{location} {code}{mark} {f.summary}"


SNIPPET_CONTEXT = 2   # source lines shown above and below the reported one


def full_finding(f: Finding, color: bool, source: str | None, unsafe_fixes: bool = False) -> str:
    """The concise line, the source around the spot with a caret under it,
    the teaching message, the fix, and whether `--fix` can apply it."""
    style = _styler(color)
    out = [concise_finding(f, color, unsafe_fixes)]
    lines = source.splitlines() if source is not None else []
    if 1 <= f.line <= len(lines):
        first, last = max(1, f.line - SNIPPET_CONTEXT), min(len(lines), f.line + SNIPPET_CONTEXT)
        width = len(str(last))
        gutter = style(" " * width + " |", fg="blue")
        out.append(gutter)
        for number in range(first, last + 1):
            out.append(style(f"{number:>{width}} |", fg="blue") + (" " + lines[number - 1] if lines[number - 1] else ""))
            if number == f.line:
                out.append(gutter + " " + " " * (f.col - 1) + style("^ " + f.code, fg=SEVERITY_COLOR[f.severity],
                                                                      bold=True))
        out.append(gutter)
    out.append(f"  = {f.message}")
    if f.fix:
        out.append("  " + style("= help:", fg="green", bold=True) + " " + f.fix)
    if f.applicability is not None:
        how = "--fix" if f.applicability is Applicability.SAFE else "--fix --unsafe-fixes"
        out.append(f"  = autofix: `ddpcheck lint {how}` applies it ({f.applicability})")
    return "\n".join(out)


def fix_hint(findings: list[Finding], unsafe_fixes: bool) -> str | None:
    """ruff's summary of what --fix could do: `[*] 2 fixable with --fix (1
    hidden fix can be enabled with --unsafe-fixes).` After a --fix, what is
    left (the unsafe fixes it did not apply)."""
    safe = sum(1 for f in findings if fixable(f, unsafe_fixes))
    hidden = 0 if unsafe_fixes else sum(1 for f in findings if f.applicability is Applicability.UNSAFE)
    if not safe and not hidden:
        return None
    text = f"[*] {safe} fixable with the `--fix` option" if safe else "No fixes available"
    if hidden:
        text += f" ({plural(hidden, 'hidden fix', 'hidden fixes')} can be enabled with the `--unsafe-fixes` option)"
    return text + "."


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


def summary(findings: list[Finding], files_checked: int, unreadable_count: int, fixed_count: int = 0) -> str:
    text = _summary(findings, files_checked, unreadable_count)
    return f"Fixed {plural(fixed_count, 'finding')}. {text}" if fixed_count else text


def fixes_applied(fixed: dict[str, tuple[Finding, ...]]) -> str:
    """--show-fixes: what --fix changed, per file and rule."""
    total = sum(len(v) for v in fixed.values())
    lines = [f"Fixed {plural(total, 'finding')}:"]
    for path in sorted(fixed):
        lines.append(f"- {path}:")
        counts = Counter((f.code, f.name) for f in fixed[path])
        for (code, name), n in sorted(counts.items()):
            lines.append(f"    {n} \u00d7 {code} ({name})")
    return "\n".join(lines)


def _summary(findings: list[Finding], files_checked: int, unreadable_count: int) -> str:
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
    """One workflow command; the annotation carries the short message (the
    title names the rule, whose page has the rest)."""
    title = _escape_property(f"{f.code} {f.name}")
    message = _escape_data(f.summary)
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


# --- SARIF 2.1.0 -------------------------------------------------------------------

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _sarif_uri(path: str, root: str | None) -> str:
    """A relative forward-slash URI for a path under the run's root (what
    GitHub code scanning matches against the repository), else the file URI."""
    import os
    from pathlib import Path
    from urllib.parse import quote

    absolute = os.path.abspath(path)
    base = os.path.abspath(root or os.getcwd())
    try:
        rel = os.path.relpath(absolute, base)
    except ValueError:   # another drive on Windows
        rel = None
    if rel is not None and not rel.startswith(".."):
        return quote(Path(rel).as_posix())
    return Path(absolute).as_uri()


def sarif_rule(rule) -> dict:
    from ddpcheck.pages import PageNotFound, load_page, page_url

    try:
        page = load_page(rule.code)
    except PageNotFound:
        page = None
    help_text = f"{rule.fix}" if rule.fix else rule.message
    entry = {
        "id": rule.code,
        "name": "".join(part.capitalize() for part in rule.name.split("-")),
        "shortDescription": {"text": getattr(rule, "short", "") or rule.message},
        "fullDescription": {"text": rule.message},
        "help": {"text": help_text, **({"markdown": page} if page else {})},
        "helpUri": page_url(rule.code),
        "defaultConfiguration": {"level": SARIF_LEVEL[rule.severity]},
        "properties": {"tags": [rule.name], "fixable": bool(getattr(rule, "fixable", False))},
    }
    return entry


def sarif_document(results: list[FileResult], input_errors: list[tuple[str, FileError]], rules: dict,
                   root: str | None = None) -> str:
    """One SARIF 2.1.0 log: the rules ran (with their metadata) and one result
    per finding; inputs that could not be read are tool notifications."""
    findings = all_findings(results)
    codes = sorted(set(rules) | {f.code for f in findings})
    index = {code: i for i, code in enumerate(c for c in codes if c in rules)}
    sarif_results = []
    for f in findings:
        result = {
            "ruleId": f.code,
            "level": SARIF_LEVEL[f.severity],
            "message": {"text": f"{f.message}. Fix: {f.fix}" if f.fix else f.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": _sarif_uri(f.path, root), "uriBaseId": "%SRCROOT%"},
                "region": {"startLine": f.line, "startColumn": f.col},
            }}],
        }
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        sarif_results.append(result)
    errors = list(input_errors) + [(r.path, r.error) for r in unreadable(results)]
    notifications = []
    for path, error in errors:
        physical: dict = {"artifactLocation": {"uri": _sarif_uri(path, root)}}
        if error.line is not None:
            physical["region"] = {"startLine": max(1, error.line), "startColumn": max(1, error.col or 1)}
        notifications.append({"level": "error", "message": {"text": f"{path}: {error.kind.value}: {error.message}"},
                              "locations": [{"physicalLocation": physical}]})
    run = {
        "tool": {"driver": {
            "name": "ddpcheck",
            "version": __version__,
            "semanticVersion": __version__,
            "informationUri": page_base_uri(),
            "rules": [sarif_rule(rules[c]) for c in codes if c in rules],
        }},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": _dir_uri(root)}},
        "results": sarif_results,
        "invocations": [{"executionSuccessful": not errors, "toolExecutionNotifications": notifications}],
    }
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _dir_uri(root: str | None) -> str:
    import os
    from pathlib import Path

    uri = Path(os.path.abspath(root or os.getcwd())).as_uri()
    return uri if uri.endswith("/") else uri + "/"


def page_base_uri() -> str:
    from ddpcheck.pages import HOME_URL

    return HOME_URL


# --- JUnit XML -----------------------------------------------------------------------

def junit_document(results: list[FileResult], input_errors: list[tuple[str, FileError]]) -> str:
    """JUnit XML as CI systems read it: one test suite, one test case per
    linted file, a <failure> per finding (an <error> for an unreadable input)."""
    import xml.etree.ElementTree as ET

    findings = all_findings(results)
    by_path: dict[str, list[Finding]] = {}
    for f in findings:
        by_path.setdefault(f.path, []).append(f)
    errors = dict(input_errors) | {r.path: r.error for r in unreadable(results)}
    paths = sorted({r.path for r in results} | set(errors))
    suite = ET.Element("testsuite", name="ddpcheck", tests=str(len(paths)),
                       failures=str(sum(1 for p in paths if by_path.get(p))), errors=str(len(errors)))
    for path in paths:
        case = ET.SubElement(suite, "testcase", name=path, classname="ddpcheck")
        for f in by_path.get(path, []):
            failure = ET.SubElement(case, "failure", message=f"{f.code} {f.summary}", type=f.code)
            failure.text = f"{f.path}:{f.line}:{f.col}: {f.code} {f.message}\nhelp: {f.fix}"
        if path in errors:
            ET.SubElement(case, "error", message=str(errors[path]), type=errors[path].kind.value)
    root = ET.Element("testsuites", name="ddpcheck", tests=suite.get("tests"), failures=suite.get("failures"),
                      errors=suite.get("errors"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")
