"""The one way to memoise a question asked of a ScriptModel.

    @query(on_cycle=False)
    def function_reached(model: ScriptModel, fn: FunctionInfo) -> bool: ...

The answer is cached on the model, keyed on the query function itself and its
arguments (cst nodes, FunctionInfo, Loop, ... hash by identity; str, int and
tuples by value), so two queries can never collide on a string tag.

Recursion: a query that re-enters itself with the same arguments (a helper
that calls itself, `a = b; b = a`) gets `on_cycle` back for the inner call,
the conservative "not known" answer. Every answer computed *below* the
re-entered frame depended on that cut-short value, so it is not cached: it is
recomputed when asked again from outside the cycle, and results never depend
on the order queries were asked in. The re-entered frame itself is cached: its
answer already accounts for every path out of the cycle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_NOT_CUT = 1 << 62   # a frame that depended on no cut-short recursion


@dataclass
class _Frame:
    key: tuple
    depth: int
    # the shallowest stack depth of a frame whose in-progress value this frame
    # (or a frame it called) read; _NOT_CUT when none
    depends_on: int = _NOT_CUT


@dataclass
class QueryCache:
    """Per-model store of answers."""

    answers: dict[tuple, Any] = field(default_factory=dict)


# The queries in progress, for every model of the process: a cycle can run
# through several files (a helper in utils.py calling back into train.py).
_STACK: list[_Frame] = []
_ACTIVE: dict[tuple, int] = {}   # (model id, key) -> its depth on the stack


_MISSING = object()


def query(fn: F | None = None, *, on_cycle: Any = None) -> F:
    """Memoise `fn(model, *args, **kwargs)` on the model's QueryCache.

    `model` must have a `queries: QueryCache` attribute (ScriptModel does)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(model, *args, **kwargs):
            key = (func, args, tuple(sorted(kwargs.items())) if kwargs else ())
            answers = model.queries.answers
            found = answers.get(key, _MISSING)
            if found is not _MISSING:
                return found
            active_key = (id(model), key)
            depth = _ACTIVE.get(active_key)
            if depth is not None:
                # Re-entered: answer conservatively and remember that every frame
                # from `depth` down is provisional.
                top = _STACK[-1]
                top.depends_on = min(top.depends_on, depth)
                return on_cycle
            frame = _Frame(key, len(_STACK))
            _STACK.append(frame)
            _ACTIVE[active_key] = frame.depth
            try:
                result = func(model, *args, **kwargs)
            finally:
                _STACK.pop()
                del _ACTIVE[active_key]
            if frame.depends_on >= frame.depth:
                answers[key] = result                # complete: no cut-short value above it
            elif _STACK:
                parent = _STACK[-1]
                parent.depends_on = min(parent.depends_on, frame.depends_on)
            return result

        wrapper.uncached = func  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    if fn is not None:
        return decorate(fn)
    return decorate  # type: ignore[return-value]
