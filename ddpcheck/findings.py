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


class ErrorKind(enum.Enum):
    """Why an input could not be (fully) analysed; JSON shows the value."""

    UNREADABLE = "unreadable"      # missing, a directory, permission denied, binary, I/O error
    ENCODING = "encoding"          # not valid in its declared (or default UTF-8) encoding
    SYNTAX = "syntax"              # Python's own parser refuses it
    TOO_COMPLEX = "too-complex"    # nested deeper than Python (or ddpcheck) can follow
    PARSER = "parser"              # valid Python that ddpcheck's parser (libcst) cannot read
    CRASHED = "crashed"            # the process linting it died (the native parser crashed)
    TIMED_OUT = "timed-out"        # took longer than the per-file time limit
    INTERNAL = "internal"          # a bug in ddpcheck (a rule crashed); other findings kept


@dataclass(frozen=True)
class FileError:
    """One input's problem, as fields: the report decides how to show it.

    `message` is one line for the user, without the path or the position."""

    kind: ErrorKind
    message: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        return f"{self.line}:{self.col}: {self.message}" if self.line is not None else self.message

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "line": self.line, "col": self.col, "message": self.message}


class SourceError(Exception):
    """An input that cannot be analysed (syntax error, bad encoding, binary...),
    raised by the readers and parsers; carries the typed FileError."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.UNREADABLE, line: int | None = None,
                 col: int | None = None) -> None:
        super().__init__(message)
        self.error = FileError(kind, message, line, col)

    @classmethod
    def of(cls, error: FileError) -> "SourceError":
        return cls(error.message, error.kind, error.line, error.col)


@dataclass(frozen=True)
class FileResult:
    path: str
    findings: tuple[Finding, ...] = ()
    error: FileError | None = None   # why the file could not be (fully) analysed
    # Local helper modules the analysis read (absolute paths): a cached result
    # is only reused while they are unchanged too.
    helpers: tuple[str, ...] = ()
