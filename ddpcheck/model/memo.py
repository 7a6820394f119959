"""The one way a question asked of the engine is memoised.

    @query(on_cycle=False)
    def function_reached(model: ScriptModel, fn: FunctionInfo) -> bool: ...

An answer is computed once and kept on the model it was asked of, keyed on
the query function itself and its arguments (cst nodes, FunctionInfo, Loop,
... hash by identity; str, int and tuples by value), so two queries can never
collide on a string tag. The bookkeeping of the questions in progress belongs
to one `Memo`, owned by the run's `Project` (model/project.py): nothing is
kept process-wide, and two runs in one process never see each other's
answers.

Recursion is a fixed point, not a depth limit. A query that re-enters itself
with the same arguments (a helper that calls itself, `a = b; b = a`) gets
`on_cycle` back for the inner call: the conservative "not known" answer.
Every answer computed *below* the re-entered frame depended on that cut-short
value, so it is not kept: it is recomputed when asked again from outside the
cycle, and answers never depend on the order questions were asked in. The
re-entered frame itself is kept: its answer already accounts for every path
out of the cycle.

A budget bounds the work of one question: past `Memo.budget` evaluations
below one outermost query, that query answers `on_cycle` ("unknown") and
keeps nothing it computed on the way. Unknown stays unknown: rules never
report from it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_NOT_CUT = 1 << 62   # a frame that depended on no cut-short recursion
_MISSING = object()

# Evaluations one outermost question may take before it is answered
# "unknown". Real training code needs a few thousand; the limit is there for
# the pathological (a value flowing through thousands of wrappers).
DEFAULT_BUDGET = 200_000


class OverBudget(Exception):
    """Raised through the frames of a question that ran out of budget; the
    outermost frame turns it into its `on_cycle` answer."""


class _Frame:
    __slots__ = ("depth", "depends_on")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        # the shallowest stack depth of a frame whose in-progress value this
        # frame (or a frame it called) read; _NOT_CUT when none
        self.depends_on = _NOT_CUT


class Memo:
    """The questions in progress for one run, across every model of it (a
    cycle can run through several files: a helper in utils.py calling back
    into train.py), and the budget of the outermost one."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self.stack: list[_Frame] = []
        self.active: dict[tuple, int] = {}   # (id(model), key) -> depth of its frame
        self.spent = 0                       # evaluations below the outermost frame
        self.evaluations = 0                 # all evaluations of the run (for profiles and tests)

    def ask(self, func, model, args: tuple, kwargs: dict, key: tuple, on_cycle: Any) -> Any:
        answers = model.answers
        active_key = (id(model), key)
        depth = self.active.get(active_key)
        stack = self.stack
        if depth is not None:
            # Re-entered: answer conservatively and remember that every frame
            # from `depth` down is provisional.
            top = stack[-1]
            if depth < top.depends_on:
                top.depends_on = depth
            return on_cycle
        outermost = not stack
        if outermost:
            self.spent = 0
        self.spent += 1
        self.evaluations += 1
        if self.spent > self.budget:
            raise OverBudget
        frame = _Frame(len(stack))
        stack.append(frame)
        self.active[active_key] = frame.depth
        try:
            result = func(model, *args, **kwargs)
        except OverBudget:
            if outermost:
                return on_cycle
            raise
        finally:
            stack.pop()
            del self.active[active_key]
        if frame.depends_on >= frame.depth:
            answers[key] = result                # complete: no cut-short value above it
        elif stack:
            parent = stack[-1]
            if frame.depends_on < parent.depends_on:
                parent.depends_on = frame.depends_on
        return result


def query(fn: F | None = None, *, on_cycle: Any = None) -> F:
    """Memoise `fn(model, *args, **kwargs)` on `model.answers`, with the
    in-progress bookkeeping of `model.project.memo`."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(model, *args, **kwargs):
            key = (func, args, tuple(sorted(kwargs.items())) if kwargs else ())
            found = model.answers.get(key, _MISSING)
            if found is not _MISSING:
                return found
            return model.project.memo.ask(func, model, args, kwargs, key, on_cycle)

        wrapper.uncached = func  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    if fn is not None:
        return decorate(fn)
    return decorate  # type: ignore[return-value]


__all__ = ["Memo", "query", "OverBudget", "DEFAULT_BUDGET"]
