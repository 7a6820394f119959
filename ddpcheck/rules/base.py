"""A rule is one small, self-describing unit: code, name, severity, a message,
the fix, and a query over the ScriptModel. Its long-form reference page (What it
does / Why it bites in DDP / Example / Use instead / References) lives in
rules/<CODE>.md and its examples are run by the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterator

import libcst as cst

from ddpcheck.findings import Severity
from ddpcheck.triggers import Trigger
from ddpcheck.model.filekind import ALL_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from ddpcheck.model.script import ScriptModel


# --- edits: what an autofix changes, described on the nodes the rule holds ------
#
# A rule that knows the mechanical fix attaches one of these to its Hit; the
# driver (ddpcheck/lint/fixes.py) applies them with libcst, so comments and
# formatting survive, and re-lints the result. `safe` says whether the edit
# keeps the program's meaning in every run the rule cannot see (ruff's
# applicability): unsafe edits need `--unsafe-fixes`.


@dataclass(frozen=True)
class Edit:
    safe: bool = True

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        """The nodes this edit rewrites: two edits on one node conflict."""
        raise NotImplementedError


@dataclass(frozen=True)
class InsertAtBodyStart(Edit):
    """Insert the statement `code` as the first statement of `block_owner`'s
    indented body (a For / While / FunctionDef)."""

    block_owner: cst.CSTNode | None = None
    code: str = ""

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.block_owner,)


@dataclass(frozen=True)
class InsertAfter(Edit):
    """Insert the statement `code` right after the statement `anchor`."""

    anchor: cst.CSTNode | None = None
    code: str = ""

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.anchor,)


@dataclass(frozen=True)
class MoveBefore(Edit):
    """Move the statement `statement` (rewritten as `code` when given) to just
    before the statement `anchor` of the same block."""

    statement: cst.CSTNode | None = None
    anchor: cst.CSTNode | None = None
    code: str | None = None

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.statement, self.anchor)


@dataclass(frozen=True)
class RemoveArg(Edit):
    """Drop the keyword argument `keyword` from `call`."""

    call: cst.Call | None = None
    keyword: str = ""

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.call,)


@dataclass(frozen=True)
class AddArg(Edit):
    """Add an argument to `call`: `keyword=code`, or with no keyword the
    positional `code` right after positional argument number `after` (0-based)."""

    call: cst.Call | None = None
    code: str = ""
    keyword: str | None = None
    after: int | None = None

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.call,)


@dataclass(frozen=True)
class ReplaceExpr(Edit):
    """Replace the expression `node` with `code`."""

    node: cst.BaseExpression | None = None
    code: str = ""

    @property
    def nodes(self) -> tuple[cst.CSTNode, ...]:
        return (self.node,)


@dataclass(frozen=True)
class Hit:
    """Where a rule fires. `message` / `fix` override the rule's defaults when
    the rule can say something more specific (names, arithmetic); `severity`
    when this case is milder than the rule's usual one (DDP501: an option
    nobody reads breaks one launcher, not every run); `edit` is the autofix,
    when the rule knows a mechanical one."""

    node: cst.CSTNode
    message: str | None = None
    fix: str | None = None
    severity: Severity | None = None
    edit: Edit | None = None


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    message: ClassVar[str]   # what is wrong and why it bites in DDP (one sentence or two)
    short: ClassVar[str]     # the concise form: one line, under ~80 characters
    fix: ClassVar[str]       # how to fix it (shown on the `help:` line)
    # Some findings carry an autofix (`ddpcheck lint --fix`); the rule's page says so.
    fixable: ClassVar[bool] = False
    # The words a file must contain for the rule to fire (ddpcheck/triggers.py):
    # the prefilter of a run is built from the enabled rules' declarations.
    triggers: ClassVar[tuple[Trigger, ...]] = ()
    # The kinds of file the rule looks at (model/filekind.py: "script", "test",
    # "library"); its page says which and why (Precision notes).
    kinds: ClassVar[frozenset[str]] = ALL_KINDS
    # The harm needs two processes or more (a race, a hang, a batch times the
    # world size): a script whose own evidence shows one process is not
    # checked (model/processes.py); its page says so.
    needs_ranks: ClassVar[bool] = False

    def check(self, model: "ScriptModel") -> Iterator[Hit]:
        raise NotImplementedError


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule known to the CLI, config validation and docs."""
    if cls.code in REGISTRY:
        raise RuntimeError(f"duplicate rule code {cls.code}")
    REGISTRY[cls.code] = cls
    return cls
