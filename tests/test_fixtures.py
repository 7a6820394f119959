"""Every fixture script states its expected findings inline (`# expect: DDP101`
on the reported line, several codes comma-separated). Linting the fixture must
give exactly those findings: a missing one and an extra one both fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)")


def expected_findings(path: Path) -> set[tuple[int, str]]:
    found = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = EXPECT.search(line)
        if m:
            found |= {(lineno, code.strip()) for code in m.group(1).split(",")}
    return found


def fixture_files() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*.py") if "__pycache__" not in p.parts)


def test_expect_comments_name_known_rules():
    for path in fixture_files():
        for _, code in expected_findings(path):
            assert code in REGISTRY, f"{path}: unknown code {code} in an expect comment"


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_findings_match_expectations(path: Path):
    result = lint_path(str(path), LintSettings(enabled=frozenset(REGISTRY)))
    assert result.error is None, result.error
    actual = {(f.line, f.code) for f in result.findings}
    expected = expected_findings(path)
    missing = sorted(expected - actual)
    extra = sorted((line, code, next(f.message for f in result.findings if (f.line, f.code) == (line, code)))
                   for line, code in actual - expected)
    assert not missing and not extra, f"missing: {missing}\nextra: {extra}"


def test_harness_reads_expectations(tmp_path: Path):
    """The harness itself: an expect comment is read back with its line."""
    p = tmp_path / "f.py"
    p.write_text("x = 1\ny = 2  # expect: DDP101, DDP301\n")
    assert expected_findings(p) == {(2, "DDP101"), (2, "DDP301")}
