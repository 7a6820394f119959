"""What a lint run produces: findings with a severity, and the errors for inputs
that could not be analysed. Plain, picklable data so results cross the process
pool unchanged."""

from __future__ import annotations

import enum
from dataclasses import dataclass, asdict, field


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected error, warning or info)") from None

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    name: str
    severity: Severity
    message: str
    fix: str
    # The one-line form (concise output, GitHub annotations); "" when none.
    short: str = field(default="", compare=False)
    # An autofix is available: "safe" (applied by --fix) or "unsafe" (needs
    # --unsafe-fixes); None when the rule has none for this finding.
    applicability: "Applicability | None" = field(default=None, compare=False)

    @property
    def summary(self) -> str:
        return self.short or self.message

    def to_json(self) -> dict:
        data = asdict(self)
        data["severity"] = str(self.severity)
        data["applicability"] = str(self.applicability) if self.applicability else None
        return data


class Applicability(enum.Enum):
    SAFE = "safe"
    UNSAFE = "unsafe"

    def __str__(self) -> str:
        return self.value


class SourceError(Exception):
    """An input that cannot be analysed (syntax error, not UTF-8, binary...).

    The message is one line, meant for the user, without the path: the caller
    prefixes it."""


class PartialAnalysis(Exception):
    """A rule crashed on this file (a bug in ddpcheck): the other rules'
    findings are still good and are kept; the crash is reported as an error."""

    def __init__(self, findings: list, message: str) -> None:
        super().__init__(message)
        self.findings = findings


@dataclass(frozen=True)
class FileResult:
    path: str
    findings: tuple[Finding, ...] = ()
    error: str | None = None   # one-line reason when the file could not be analysed
    # Local helper modules the analysis read (absolute paths): a cached result
    # is only reused while they are unchanged too.
    helpers: tuple[str, ...] = ()
