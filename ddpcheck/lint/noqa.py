"""`# noqa` suppression with flake8 / ruff semantics.

- `# noqa` on its own suppresses every finding reported on that line;
- `# noqa: DDP101,DDP301`, `# noqa:DDP101 DDP301` suppress only those codes;
- `noqa` is case-insensitive, codes are compared upper-cased;
- `# noqa:` followed by no valid code list acts as a bare `# noqa` (as in
  flake8), so a typo never turns a suppression into a surprise failure.

The comment must be on the reported line; for a statement spanning several
lines that is its first line (where the engine reports it).

A comment `# ddpcheck: noqa` on a line of its own turns ddpcheck off for the
whole file; `# ddpcheck: noqa: DDP101, DDP301` only those rules (ruff's
`# ruff: noqa`).

noqa hygiene (DDP001 unused-noqa, ruff's RUF100): a `# noqa: DDPnnn` naming a
code that is not a ddpcheck rule, or an enabled rule that reports nothing on
that line, is itself reported. Codes of other tools (`# noqa: E501`) are
theirs, and a bare `# noqa` may be for another linter: neither is judged.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import Iterable

from ddpcheck.findings import Finding

# `#`, optional spaces, `noqa`, then either end/space/`#` (bare) or `:` and a
# comma- or space-separated list of codes such as DDP101.
NOQA_DIRECTIVE = re.compile(
    r"#\s*noqa(?::\s?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?(?=[\s,:#]|$)",
    re.IGNORECASE,
)
_CODE = re.compile(r"[A-Z]+[0-9]+", re.IGNORECASE)
# `# ddpcheck: noqa` (whole file) or `# ddpcheck: noqa: DDP101, DDP301`.
FILE_DIRECTIVE = re.compile(
    r"#\s*ddpcheck\s*:\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?(?=[\s,:#]|$)",
    re.IGNORECASE,
)
OWN_PREFIX = "DDP"
# A superset of the comments DDP001 can judge in a file without findings: a
# noqa that names a code starting with our prefix, or a file-level directive.
OWN_DIRECTIVE_HINT = re.compile(r"noqa[^\n]*" + OWN_PREFIX + r"|ddpcheck\s*:\s*noqa", re.IGNORECASE)
UNUSED_NOQA = "DDP001"

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


@dataclass(frozen=True)
class Directive:
    """One `# noqa: ...` comment that names codes."""

    line: int
    col: int
    codes: tuple[str, ...]   # as written, upper-cased, in order
    file_level: bool = False


def directives(text: str) -> list[Directive]:
    """The noqa comments that list codes (line-level and file-level)."""
    found = []
    for (line, col), comment in _comments_at(text):
        whole = FILE_DIRECTIVE.search(comment)
        if whole is not None:
            if whole.group("codes"):
                codes = tuple(dict.fromkeys(c.upper() for c in _CODE.findall(whole.group("codes"))))
                found.append(Directive(line, col, codes, file_level=True))
            continue
        matches = list(NOQA_DIRECTIVE.finditer(comment))
        if matches and all(m.group("codes") for m in matches):
            codes = tuple(dict.fromkeys(c.upper() for m in matches for c in _CODE.findall(m.group("codes"))))
            found.append(Directive(line, col, codes))
    return found


def file_exemption(text: str) -> "frozenset[str] | None | bool":
    """What `# ddpcheck: noqa` comments turn off for the file: None for
    everything, a set of codes, False when there is none."""
    if "ddpcheck" not in text:
        return False
    result: frozenset[str] | None | bool = False
    for _, comment in _comments_at(text):
        m = FILE_DIRECTIVE.search(comment)
        if m is None:
            continue
        if not m.group("codes"):
            return None
        codes = frozenset(c.upper() for c in _CODE.findall(m.group("codes")))
        result = codes if result is False else result | codes
    return result


def _comments_at(text: str) -> Iterable[tuple[tuple[int, int], str]]:
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield (tok.start[0], tok.start[1] + 1), tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        for number, line in enumerate(text.splitlines(), start=1):
            if "#" in line:
                yield (number, line.index("#") + 1), line[line.index("#"):]


def apply_noqa(findings: list[Finding], text: str, enabled: frozenset[str] | None = None,
               path: str | None = None) -> list[Finding]:
    """Drop the findings a `# noqa` comment on their line (or a file-level
    `# ddpcheck: noqa`) suppresses. With `enabled` (the rules run on this
    file) and DDP001 among them, add a DDP001 finding for each `# noqa:`
    naming an unknown ddpcheck code or one that suppressed nothing."""
    # Cheap guards: most files have no noqa at all, and in the rest (other
    # tools' `# noqa: F401`) a comment can only matter here if the file has
    # findings to suppress or names a ddpcheck code. Tokenizing is what costs.
    if "noqa" not in text.lower():
        return findings
    if not findings and OWN_DIRECTIVE_HINT.search(text) is None:
        return findings
    exempt = file_exemption(text)
    if exempt is None:
        return []
    table = suppressions(text)
    kept = [f for f in findings if not is_suppressed(f, table) and not (exempt and f.code in exempt)]
    if enabled is not None and UNUSED_NOQA in enabled and not (exempt and UNUSED_NOQA in exempt):
        used = {(f.line, f.code) for f in findings}
        kept += _hygiene(text, path or (findings[0].path if findings else "-"), used, enabled)
        kept.sort()
    return kept


def _hygiene(text: str, path: str, used: set[tuple[int, str]], enabled: frozenset[str]) -> list[Finding]:
    from ddpcheck.lint.config import known_codes
    from ddpcheck.rules.base import REGISTRY

    known = set(known_codes())
    rule = REGISTRY[UNUSED_NOQA]
    out = []
    for d in directives(text):
        own = [c for c in d.codes if c.startswith(OWN_PREFIX)]
        unknown = [c for c in own if c not in known]
        # A file-level directive is used if its rule reports anything in the file.
        unused = [c for c in own if c in known and c in enabled and c != UNUSED_NOQA
                  and not any(code == c and (d.file_level or line == d.line) for line, code in used)]
        if not unknown and not unused:
            continue
        parts = []
        if unused:
            parts.append("unused: " + ", ".join(f"`{c}`" for c in unused))
        if unknown:
            parts.append("unknown: " + ", ".join(f"`{c}`" for c in unknown))
        what = "; ".join(parts)
        kind = "`# ddpcheck: noqa`" if d.file_level else "`# noqa`"
        out.append(Finding(
            path=path, line=d.line, col=d.col, code=UNUSED_NOQA, name=rule.name, severity=rule.severity,
            message=(f"{kind} directive that suppresses nothing ({what}): a stale suppression hides the next real "
                     "finding on this line, and an unknown code suppresses nothing at all"),
            fix="remove the codes that are not needed, and fix the misspelt ones (`ddpcheck rules` lists them)",
            short=f"unused {kind} directive ({what})",
        ))
    return out


# --- --add-noqa ------------------------------------------------------------------

def add_noqa(text: str, findings: list[Finding]) -> tuple[str, int]:
    """`text` with a `# noqa: CODE` on each reported line (merged into an
    existing `# noqa: ...`), and how many lines changed. A line that ends
    inside a multi-line string cannot take a comment and is left alone."""
    by_line: dict[int, set[str]] = {}
    for f in findings:
        by_line.setdefault(f.line, set()).add(f.code)
    if not by_line:
        return text, 0
    in_string = _lines_ending_in_strings(text)
    table = suppressions(text) if "noqa" in text.lower() else {}
    comments = {line: (col, c) for (line, col), c in _comments_at(text)}
    lines = text.splitlines(keepends=True)
    changed = 0
    for number, codes in sorted(by_line.items()):
        if number > len(lines) or number in in_string:
            continue
        if number in table and (table[number] is None or codes <= table[number]):
            continue   # already suppressed
        raw = lines[number - 1]
        body = raw.rstrip("\r\n")
        ending = raw[len(body):]
        existing = comments.get(number)
        if existing is not None and NOQA_DIRECTIVE.search(existing[1]):
            comment = existing[1]
            m = NOQA_DIRECTIVE.search(comment)
            have = list(dict.fromkeys(c.upper() for c in _CODE.findall(m.group("codes") or "")))
            merged = ", ".join(have + sorted(codes - set(have)))
            new_comment = comment[: m.start()] + f"# noqa: {merged}" + comment[m.end():]
            start = existing[0] - 1
            body = body[:start] + new_comment + body[start + len(comment):]
        else:
            body = body.rstrip() + f"  # noqa: {', '.join(sorted(codes))}"
        lines[number - 1] = body + ending
        changed += 1
    return "".join(lines), changed


def _lines_ending_in_strings(text: str) -> set[int]:
    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0], tok.end[0]))
            elif getattr(tokenize, "FSTRING_START", None) is not None and tok.type == tokenize.FSTRING_MIDDLE \
                    and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0], tok.end[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return inside
