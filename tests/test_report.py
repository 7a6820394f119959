from __future__ import annotations

import json

import pytest

from ddpcheck.lint import report
from ddpcheck.findings import ErrorKind, FileError, FileResult, Finding, Severity


def f(path="t.py", line=3, col=5, code="DDP101", severity=Severity.ERROR, message="msg", fix="do x") -> Finding:
    return Finding(path, line, col, code, {"DDP101": "missing-set-epoch"}.get(code, "other"), severity, message, fix)


def test_text_finding_is_ruff_like_with_help_line():
    assert report.text_finding(f(), color=False) == "t.py:3:5: DDP101 msg\n  help: do x"
    assert report.text_finding(f(fix=""), color=False) == "t.py:3:5: DDP101 msg"


def test_color_only_when_asked():
    plain = report.text_finding(f(), color=False)
    colored = report.text_finding(f(), color=True)
    assert "\x1b[" not in plain
    assert "\x1b[" in colored
    assert "\x1b[31m" in colored  # errors in red


@pytest.mark.parametrize("findings, checked, unreadable, expected", [
    ([], 4, 0, "All checks passed (4 files)."),
    ([], 1, 0, "All checks passed (1 file)."),
    ([f()], 1, 0, "Found 1 finding (1 error) in 1 of 1 file."),
    ([f(), f(path="b.py", severity=Severity.WARNING), f(line=9, severity=Severity.WARNING),
      f(line=10, severity=Severity.INFO), f(line=11, severity=Severity.INFO)], 5, 0,
     "Found 5 findings (1 error, 2 warnings, 2 info) in 2 of 5 files."),
    ([], 3, 2, "No findings (3 files). 2 inputs could not be read."),
    ([f()], 2, 1, "Found 1 finding (1 error) in 1 of 2 files. 1 input could not be read."),
])
def test_summary(findings, checked, unreadable, expected):
    assert report.summary(findings, checked, unreadable) == expected


def test_statistics_table_counts_per_rule_most_frequent_first():
    findings = [f(code="DDP301", severity=Severity.WARNING)] + [f(line=i) for i in range(3)]
    rows = report.statistics_rows(findings)
    assert [(r["count"], r["code"], r["severity"]) for r in rows] == [(3, "DDP101", "error"), (1, "DDP301", "warning")]
    table = report.statistics_table(findings).splitlines()
    assert table[0].split() == ["count", "code", "name", "severity"]
    assert table[2].split() == ["3", "DDP101", "missing-set-epoch", "error"]
    assert report.statistics_table([]) == ""


def test_json_document():
    results = [FileResult("b.py", (f(path="b.py"),)),
               FileResult("a.py", error=FileError(ErrorKind.SYNTAX, "expected ':'", 3, 7))]
    missing = FileError(ErrorKind.UNREADABLE, "no such file or directory")
    doc = json.loads(report.json_document(results, [("nope.py", missing)], 3, statistics=True))
    assert doc["files_checked"] == 3
    assert doc["findings"] == [{"path": "b.py", "line": 3, "col": 5, "code": "DDP101", "name": "missing-set-epoch",
                                "severity": "error", "message": "msg", "fix": "do x", "short": "",
                                "applicability": None}]
    assert doc["errors"] == [
        {"path": "a.py", "kind": "syntax", "line": 3, "col": 7, "message": "expected ':'"},
        {"path": "nope.py", "kind": "unreadable", "line": None, "col": None, "message": "no such file or directory"}]
    assert doc["statistics"] == [{"count": 1, "code": "DDP101", "name": "missing-set-epoch", "severity": "error"}]


@pytest.mark.parametrize("severity, command", [(Severity.ERROR, "error"), (Severity.WARNING, "warning"),
                                               (Severity.INFO, "notice")])
def test_github_annotation(severity, command):
    line = report.github_finding(f(severity=severity))
    assert line == f"::{command} file=t.py,line=3,col=5,title=DDP101 missing-set-epoch::msg"
    short = report.github_finding(Finding("t.py", 3, 5, "DDP101", "missing-set-epoch", severity, "a long teaching text",
                                          "do x", short="the short form"))
    assert short == f"::{command} file=t.py,line=3,col=5,title=DDP101 missing-set-epoch::the short form"


def test_github_escaping():
    line = report.github_finding(f(path="a,b:c.py", message="50% done\nnext", fix=""))
    assert line == "::error file=a%2Cb%3Ac.py,line=3,col=5,title=DDP101 missing-set-epoch::50%25 done%0Anext"


def test_input_error_lines():
    syntax = FileError(ErrorKind.SYNTAX, "oops", 3, 5)
    libcst_only = FileError(ErrorKind.PARSER, "cannot read this", 3, 5)
    binary = FileError(ErrorKind.UNREADABLE, "binary file")
    assert report.input_error_line("bad.py", syntax) == "bad.py:3:5: syntax error: oops"
    assert report.input_error_line("bad.py", libcst_only) == "bad.py:3:5: error: cannot read this"
    assert report.input_error_line("x.py", binary) == "ddpcheck: error: x.py: binary file"
    assert report.github_input_error("bad.py", syntax) == \
        "::error file=bad.py,line=3,col=5,title=ddpcheck::syntax error: oops"
    assert report.github_input_error("x.py", binary) == "::error file=x.py,title=ddpcheck::binary file"
