"""Check rows: PASS / WARN / FAIL, a one-line reason and a fix (pure Python)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

PASS = "PASS"
WARN = "WARN"
FAIL = "FAIL"

_ORDER = {PASS: 0, WARN: 1, FAIL: 2}


@dataclass(frozen=True)
class Check:
    """One line of the checks table.

    ``detail`` says what was found (and why it bites in DDP); ``fix`` says what
    to do about it (empty for a PASS).
    """

    name: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in _ORDER:
            raise ValueError(f"unknown check status {self.status!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def worst(checks: Iterable[Check]) -> str:
    """The worst status among ``checks`` (PASS when there are none)."""
    status = PASS
    for check in checks:
        if _ORDER[check.status] > _ORDER[status]:
            status = check.status
    return status


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed (warnings allowed), 1 when any check FAILed."""
    return 1 if worst(checks) == FAIL else 0
