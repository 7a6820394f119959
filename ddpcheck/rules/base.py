"""A rule is one small, self-describing unit: code, name, severity, a message,
the fix, and a query over the ScriptModel. Its long-form reference page (What it
does / Why it bites in DDP / Example / Use instead / References) lives in
rules/<CODE>.md and its examples are run by the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterator

import libcst as cst

from ddpcheck.findings import Severity

if TYPE_CHECKING:  # pragma: no cover
    from ddpcheck.model.script import ScriptModel


@dataclass(frozen=True)
class Hit:
    """Where a rule fires. `message` / `fix` override the rule's defaults when
    the rule can say something more specific (names, arithmetic); `severity`
    when this case is milder than the rule's usual one (DDP501: an option
    nobody reads breaks one launcher, not every run)."""

    node: cst.CSTNode
    message: str | None = None
    fix: str | None = None
    severity: Severity | None = None


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    message: ClassVar[str]   # what is wrong and why it bites in DDP (one sentence or two)
    fix: ClassVar[str]       # how to fix it (shown on the `help:` line)

    def check(self, model: "ScriptModel") -> Iterator[Hit]:
        raise NotImplementedError


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule known to the CLI, config validation and docs."""
    if cls.code in REGISTRY:
        raise RuntimeError(f"duplicate rule code {cls.code}")
    REGISTRY[cls.code] = cls
    return cls
