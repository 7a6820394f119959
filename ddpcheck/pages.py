"""Rule reference pages: rules/<CODE>.md in the repository, shipped in the
wheel as the package data folder ddpcheck/rule_pages (in a checkout, a symlink
to rules/, so editable installs and wheels read them the same way).

A page has the sections `## What it does`, `## Why it bites in DDP`,
`## Example`, `## Use instead` and `## References` (optionally
`## Precision notes`); Example and Use instead hold ```python blocks that the
tests lint."""

from __future__ import annotations

import importlib.resources
import re

REQUIRED_SECTIONS = ("What it does", "Why it bites in DDP", "Example", "Use instead", "References")
_HEADING = re.compile(r"^##\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)
_PYTHON_BLOCK = re.compile(r"^```(?:python|py)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


# Where the rule pages are published (SARIF's helpUri, the full output): the
# repository's rules/ folder. Change HOME_URL when the project moves.
HOME_URL = "https://github.com/ddpcheck/ddpcheck"
PAGE_URL = HOME_URL + "/blob/main/rules/{code}.md"


def page_url(code: str) -> str:
    return PAGE_URL.format(code=code.upper())


class PageNotFound(Exception):
    pass


def load_page(code: str) -> str:
    resource = importlib.resources.files("ddpcheck").joinpath("rule_pages", f"{code.upper()}.md")
    try:
        return resource.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise PageNotFound(code) from None


def page_sections(text: str) -> dict[str, str]:
    """`## Title` -> the text under it, up to the next `## ` heading. Headings
    inside fenced code blocks are not headings."""
    fences = [(m.start(), m.end()) for m in re.finditer(r"^```.*?^```", text, re.MULTILINE | re.DOTALL)]
    headings = [m for m in _HEADING.finditer(text) if not any(a <= m.start() < b for a, b in fences)]
    sections = {}
    for i, match in enumerate(headings):
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        sections[match["title"]] = text[match.end():end].strip("\n")
    return sections


def python_blocks(section: str) -> list[str]:
    return [m["code"] for m in _PYTHON_BLOCK.finditer(section)]


def page_examples(code: str) -> tuple[list[str], list[str]]:
    """(bad, good): the python blocks under `## Example` and `## Use instead`."""
    sections = page_sections(load_page(code))
    return python_blocks(sections.get("Example", "")), python_blocks(sections.get("Use instead", ""))
