from __future__ import annotations


import pytest
from hypothesis import given, strategies as st

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_source
from ddpcheck.findings import Finding, Severity
from ddpcheck.lint.noqa import apply_noqa, parse_directive, suppressions
from tests.conftest import GUARDED_SAVE, PREAMBLE, UNGUARDED_SAVE, needs_rule


def finding(line: int, code: str = "DDP101") -> Finding:
    return Finding("t.py", line, 1, code, "name", Severity.WARNING, "msg", "fix")


@pytest.mark.parametrize("comment, expected", [
    ("# noqa", None),
    ("#noqa", None),
    ("# NOQA", None),
    ("# NoQa  trailing words", None),
    ("# noqa: DDP101", frozenset({"DDP101"})),
    ("# noqa:DDP101", frozenset({"DDP101"})),
    ("# noqa: DDP101,DDP301", frozenset({"DDP101", "DDP301"})),
    ("# noqa: DDP101, DDP301", frozenset({"DDP101", "DDP301"})),
    ("# noqa:DDP101 DDP301", frozenset({"DDP101", "DDP301"})),
    ("# noqa: ddp101", frozenset({"DDP101"})),
    ("# type: ignore  # noqa: DDP301", frozenset({"DDP301"})),
    # flake8: a colon with no valid code list is a bare noqa
    ("# noqa: not-a-code", None),
    ("# noqa:", None),
    ("# a comment", False),
    ("# noqanything", False),
    ("# noqa123", False),
])
def test_parse_directive(comment, expected):
    assert parse_directive(comment) == expected


def test_bare_noqa_suppresses_every_code_on_its_line_only():
    text = "a = 1  # noqa\nb = 2\n"
    kept = apply_noqa([finding(1, "DDP101"), finding(1, "DDP301"), finding(2)], text)
    assert kept == [finding(2)]


def test_specific_codes_suppress_only_those_codes():
    text = "a = 1  # noqa: DDP301\n"
    assert apply_noqa([finding(1, "DDP101"), finding(1, "DDP301")], text) == [finding(1, "DDP101")]


def test_noqa_inside_a_string_is_not_a_comment():
    text = 's = "# noqa"\n'
    assert apply_noqa([finding(1)], text) == [finding(1)]


def test_multiline_statement_uses_its_first_line():
    text = "torch.save(  # noqa: DDP301\n    state,\n    'x.pt',\n)\nother(\n    1,  # noqa: DDP301\n)\n"
    # Reported on line 1 (first line) -> suppressed; reported on line 5 with
    # the comment on line 6 -> kept.
    assert apply_noqa([finding(1, "DDP301"), finding(5, "DDP301")], text) == [finding(5, "DDP301")]


def test_two_directives_on_one_line_merge():
    assert suppressions("x = 1  # noqa: DDP101  # noqa: DDP301\n") == {1: frozenset({"DDP101", "DDP301"})}


def test_untokenizable_text_falls_back_to_lines():
    text = "x = (  # noqa: DDP101\n"  # unclosed paren: tokenize raises
    assert apply_noqa([finding(1, "DDP101"), finding(1, "DDP301")], text) == [finding(1, "DDP301")]


codes = st.lists(st.from_regex(r"DDP[1-5][0-9]{2}", fullmatch=True), min_size=1, max_size=4, unique=True)


@given(suppressed=codes, reported=codes, separator=st.sampled_from([",", ", ", " ", " , "]),
       noqa=st.sampled_from(["noqa", "NOQA", "NoQA"]), space=st.sampled_from(["", " "]))
def test_exactly_the_listed_codes_are_suppressed(suppressed, reported, separator, noqa, space):
    text = f"x = 1  # {noqa}:{space}{separator.join(suppressed)}\n"
    kept = apply_noqa([finding(1, c) for c in reported], text)
    assert sorted(f.code for f in kept) == sorted(set(reported) - set(suppressed))


def test_engine_applies_noqa(fake_rules):
    text = PREAMBLE + "BAD_ERROR  # noqa: DDP901\nBAD_ERROR; BAD_WARNING  # noqa: DDP901\nBAD_INFO  # noqa\n"
    findings = lint_source(text, "t.py", LintSettings(enabled=frozenset(fake_rules)))
    assert [(f.line, f.code) for f in findings] == [(3, "DDP902")]


@needs_rule("DDP301")
def test_real_rule_is_suppressed_by_noqa_on_the_reported_line():
    settings = LintSettings(enabled=frozenset({"DDP301"}))
    findings = lint_source(UNGUARDED_SAVE, "train.py", settings)
    assert [f.code for f in findings] == ["DDP301"]
    lines = UNGUARDED_SAVE.splitlines()
    lines[findings[0].line - 1] += "  # noqa: DDP301"
    assert lint_source("\n".join(lines) + "\n", "train.py", settings) == []
    other_code = "\n".join(lines).replace("# noqa: DDP301", "# noqa: DDP101") + "\n"
    assert [f.code for f in lint_source(other_code, "train.py", settings)] == ["DDP301"]
    assert lint_source(GUARDED_SAVE, "train.py", settings) == []
