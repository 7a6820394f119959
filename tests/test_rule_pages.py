"""Every registered rule has a reference page whose examples are true: each
`## Example` block reports the rule, no `## Use instead` block does."""

from __future__ import annotations

import pytest

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_source
from ddpcheck.pages import REQUIRED_SECTIONS, PageNotFound, load_page, page_examples, page_sections, python_blocks
from ddpcheck.rules.base import REGISTRY
from tests.conftest import REPO

CODES = sorted(REGISTRY)
EVERY_RULE = LintSettings(enabled=frozenset(REGISTRY))


def example_blocks(kind: str) -> list[tuple[str, int, str]]:
    """(code, block number, source) for every block of one kind, as test params."""
    out = []
    for code in CODES:
        try:
            bad, good = page_examples(code)
        except PageNotFound:
            continue  # test_every_rule_has_a_complete_page reports it
        for i, block in enumerate(bad if kind == "bad" else good):
            out.append(pytest.param(code, block, id=f"{code}-{kind}-{i}"))
    return out


@pytest.mark.parametrize("code", CODES)
def test_every_rule_has_a_complete_page(code):
    assert (REPO / "rules" / f"{code}.md").is_file(), f"rules/{code}.md is missing"
    text = load_page(code)
    sections = page_sections(text)
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    assert not missing, f"rules/{code}.md lacks sections {missing}"
    assert code in text.splitlines()[0], "the page title names the rule"
    bad, good = page_examples(code)
    assert bad, f"rules/{code}.md: no ```python block under ## Example"
    assert good, f"rules/{code}.md: no ```python block under ## Use instead"


@pytest.mark.parametrize("code", CODES)
def test_every_page_says_whether_the_rule_is_fixable(code):
    """`**Fix:** safe/unsafe, applied by ...` exactly for the rules that carry an autofix."""
    from ddpcheck.rules.base import REGISTRY

    fix_lines = [line for line in load_page(code).splitlines() if line.startswith("**Fix:**")]
    assert len(fix_lines) == 1, f"rules/{code}.md: one **Fix:** line under the severity"
    automatic = "--fix" in fix_lines[0]
    assert automatic == bool(getattr(REGISTRY[code], "fixable", False)), fix_lines[0]


@pytest.mark.parametrize("code, block", example_blocks("bad"))
def test_example_block_reports_the_rule(code, block):
    codes = [f.code for f in lint_source(block, "example.py", EVERY_RULE)]
    assert code in codes, f"## Example of {code} does not report it (got {codes})"


@pytest.mark.parametrize("code, block", example_blocks("good"))
def test_use_instead_block_does_not_report_the_rule(code, block):
    findings = [f for f in lint_source(block, "example.py", EVERY_RULE) if f.code == code]
    assert not findings, f"## Use instead of {code} still reports it: {findings}"


def test_registry_is_not_empty():
    assert CODES, "no rules registered: ddpcheck.rules imports none"


# --- the page parser itself ----------------------------------------------------

PAGE = """# DDP999 sample

## What it does

Text.

## Example

```python
bad_one()
```

Some prose, then a non-python block that is ignored:

```text
## not a heading
```

```python
bad_two()
```

## Use instead

```py
good()
```

## References

- somewhere
"""


def test_page_sections_and_blocks():
    sections = page_sections(PAGE)
    assert list(sections) == ["What it does", "Example", "Use instead", "References"]
    assert python_blocks(sections["Example"]) == ["bad_one()\n", "bad_two()\n"]
    assert python_blocks(sections["Use instead"]) == ["good()\n"]
    assert sections["References"] == "- somewhere"


def test_unknown_page():
    with pytest.raises(PageNotFound):
        load_page("DDP999")
