"""Lint a snippet with every rule and keep one code's findings."""

from __future__ import annotations

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_source
from ddpcheck.rules import REGISTRY

EVERY_RULE = LintSettings(enabled=frozenset(REGISTRY))


def findings(code: str, source: str, path: str = "train.py"):
    return [f for f in lint_source(textwrap.dedent(source), path, EVERY_RULE) if f.code == code]


def lines(code: str, source: str, path: str = "train.py") -> list[int]:
    return [f.line for f in findings(code, source, path)]
