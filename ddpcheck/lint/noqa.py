"""`# noqa` suppression with flake8 / ruff semantics.

- `# noqa` on its own suppresses every finding reported on that line;
- `# noqa: DDP101,DDP301`, `# noqa:DDP101 DDP301` suppress only those codes;
- `noqa` is case-insensitive, codes are compared upper-cased;
- `# noqa:` followed by no valid code list acts as a bare `# noqa` (as in
  flake8), so a typo never turns a suppression into a surprise failure.

The comment must be on the reported line; for a statement spanning several
lines that is its first line (where the engine reports it).
"""

from __future__ import annotations

import io
import re
import tokenize
from typing import Iterable

from ddpcheck.findings import Finding

# `#`, optional spaces, `noqa`, then either end/space/`#` (bare) or `:` and a
# comma- or space-separated list of codes such as DDP101.
NOQA_DIRECTIVE = re.compile(
    r"#\s*noqa(?::\s?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?(?=[\s,:#]|$)",
    re.IGNORECASE,
)
_CODE = re.compile(r"[A-Z]+[0-9]+", re.IGNORECASE)

# A line's suppressions: None means "every code" (bare noqa).
Suppressions = dict[int, "frozenset[str] | None"]


def parse_directive(comment: str) -> "frozenset[str] | None | bool":
    """The codes a comment suppresses: a frozenset, None for all, False for none."""
    matches = list(NOQA_DIRECTIVE.finditer(comment))
    if not matches:
        return False
    if any(not m.group("codes") for m in matches):
        return None
    return frozenset(code.upper() for m in matches for code in _CODE.findall(m.group("codes")))


def _comments(text: str) -> Iterable[tuple[int, str]]:
    """(line, comment text) for every real comment, so a `# noqa` inside a
    string literal does not count. Falls back to scanning physical lines when
    the tokenizer disagrees with libcst about an exotic construct."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        for number, line in enumerate(text.splitlines(), start=1):
            if "#" in line:
                yield number, line[line.index("#"):]


def suppressions(text: str) -> Suppressions:
    result: Suppressions = {}
    for line, comment in _comments(text):
        directive = parse_directive(comment)
        if directive is False:
            continue
        if directive is None or result.get(line, frozenset()) is None:
            result[line] = None
        else:
            result[line] = result.get(line, frozenset()) | directive
    return result


def is_suppressed(finding: Finding, table: Suppressions) -> bool:
    if finding.line not in table:
        return False
    codes = table[finding.line]
    return codes is None or finding.code.upper() in codes


def apply_noqa(findings: list[Finding], text: str) -> list[Finding]:
    """Drop the findings a `# noqa` comment on their line suppresses."""
    # Cheap guard: most files have no noqa at all, skip tokenizing them.
    if not findings or "noqa" not in text.lower():
        return findings
    table = suppressions(text)
    return [f for f in findings if not is_suppressed(f, table)]
