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

Recursion is a fixed point, not a depth limit. A question that re-enters
itself (a helper that calls itself, `a = b; b = a`, two methods reading each
other's attributes) gets the re-entered question's current answer, `on_cycle`
at first (the conservative "nothing known yet"). Every answer computed below
it depends on that answer: it is kept as provisional, reused (not recomputed)
while the cycle is being solved, and the question at the head of the cycle is
asked again with its new answer until its answer stops changing; then every
provisional answer of the cycle is kept for good. Answers grow with each
round (sets of objects, sets of worlds), so a few rounds reach the fixed
point; a cycle still changing after `MAX_ROUNDS` rounds answers `on_cycle`.

A budget bounds the work done for one linted file: every evaluation of a
question costs a unit, and so does each step of the work a question does
outside the memo that can grow with the answers it reads (rebuilding a
value for a call's arguments: `Memo.charge`). The budget starts afresh when
the run builds the model of a file it lints (`Memo.new_budget`, from
Project.build), so all the questions the rules ask of one file share it
(each rule's within a slice of it, `Memo.new_slice`, so that one rule's
questions cannot spend what the rules after it need), and
a cycle whose answers keep growing (a value rebuilt one level deeper every
round) is cut after a bounded amount of work whatever its shape. Past
`Memo.budget` units, or for a chain of questions deeper than Python's stack,
the question in progress is unknown and its asker gets `TooComplex`; so does
every later question of that file that is not already answered. Answers
completed on the way are kept (they are right); the ones in progress are
not. Unknown stays unknown: a rule never reports from it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_NOT_CUT = 1 << 62   # a frame that depended on no question in progress
_MISSING = object()

# Units of work (evaluations and charged steps) the questions about one
# linted file may take before they are answered "unknown". Real training code
# needs a few thousand; the limit is there for the pathological (a value
# flowing through thousands of wrappers, a cycle rebuilding a value one level
# deeper every round).
DEFAULT_BUDGET = 200_000
# Units one rule's questions may take of them (a slice, Memo.new_slice): a
# rule whose questions are too much work for the engine answers "unknown"
# on that file and leaves the rest of the file's budget to the other rules.
DEFAULT_SLICE = 50_000
# Rounds a cycle's head may take before its answer is declared unknown.
MAX_ROUNDS = 8


class OverBudget(Exception):
    """Raised through the frames of a question that ran out of budget."""


class TooComplex(Exception):
    """What the outermost question raises to its asker (a rule) when it ran
    out of budget, or needed a chain of questions deeper than Python's stack:
    its answer is unknown, and a rule reports nothing from it (the driver
    drops that rule for that file, see lint/analyze.py)."""


class _Frame:
    __slots__ = ("depth", "depends_on", "answer", "reentered")

    def __init__(self, depth: int, on_cycle: Any) -> None:
        self.depth = depth
        # the shallowest stack depth of a frame in progress whose answer this
        # frame (or a frame it called) read; _NOT_CUT when none
        self.depends_on = _NOT_CUT
        self.answer = on_cycle      # what a re-entry reads: the answer of the last round
        self.reentered = False


class Memo:
    """The questions in progress for one run, across every model of it (a
    cycle can run through several files: a helper in utils.py calling back
    into train.py), their provisional answers, and the budget of the file
    being linted."""

    def __init__(self, budget: int = DEFAULT_BUDGET, slice_: int = DEFAULT_SLICE) -> None:
        self.budget = budget
        self.slice = slice_
        self.limit = budget                  # where the work in progress is cut: the file's or the slice's end
        self.stack: list[_Frame] = []
        self.active: dict[tuple, int] = {}   # (id(model), key) -> depth of its frame
        # answers that depend on a frame in progress: (id(model), key) ->
        # (answer, the depth it depends on, model, key); and per depth the keys depending on it
        self.provisional: dict[tuple, tuple] = {}
        self.pending: dict[int, list[tuple]] = {}
        self.spent = 0                       # units of work since the budget was started
        self.evaluations = 0                 # all evaluations of the run (for profiles and tests)

    def new_budget(self) -> None:
        """Start a fresh budget: the questions asked from now on (those about
        the next file linted) may take `budget` units between them."""
        self.spent = 0
        self.limit = self.budget

    def new_slice(self) -> None:
        """The questions asked from now on (those of the next rule on the
        file) may take `slice` more units, within what is left of the file's
        budget; answers computed before stay known to them."""
        self.limit = min(self.budget, self.spent + self.slice)

    def charge(self, units: int = 1) -> None:
        """Count `units` of work done for the question in progress outside the
        memo; past the budget the question is unknown (TooComplex to its asker)."""
        self.spent += units
        if self.spent > self.limit:
            if self.stack:
                raise OverBudget     # unwound by the outermost question, which raises TooComplex
            raise TooComplex(OverBudget.__name__)

    def ask(self, func, model, args: tuple, kwargs: dict, key: tuple, on_cycle: Any) -> Any:
        active_key = (id(model), key)
        stack = self.stack
        depth = self.active.get(active_key)
        if depth is not None:
            # Re-entered: read the answer of its last round and mark every frame
            # from `depth` down as depending on it.
            frame = stack[depth]
            frame.reentered = True
            top = stack[-1]
            if depth < top.depends_on:
                top.depends_on = depth
            return frame.answer
        found = self.provisional.get(active_key)
        if found is not None:
            # solved in this round of an enclosing cycle: reuse it
            answer, dep = found[0], found[1]
            if stack and dep < stack[-1].depends_on:
                stack[-1].depends_on = dep
            return answer
        outermost = not stack
        frame = _Frame(len(stack), on_cycle)
        stack.append(frame)
        self.active[active_key] = frame.depth
        try:
            rounds = 0
            while True:
                self.spent += 1
                self.evaluations += 1
                if self.spent > self.limit:
                    raise OverBudget
                result = func(model, *args, **kwargs)
                if not frame.reentered or _same(result, frame.answer):
                    break
                # the cycle's head: go round again with the new answer, forgetting
                # what was computed from the old one
                rounds += 1
                self._forget(frame.depth)
                if rounds >= MAX_ROUNDS:
                    result = on_cycle
                    break
                frame.answer = result
                frame.reentered = False
                frame.depends_on = _NOT_CUT
        except BaseException as exc:
            # out of budget (or interrupted): nothing in progress is kept
            self._forget(frame.depth)
            if outermost:
                self.provisional.clear()
                self.pending.clear()
            if outermost and isinstance(exc, (OverBudget, RecursionError)):
                raise TooComplex(type(exc).__name__) from None
            raise
        finally:
            stack.pop()
            del self.active[active_key]
        if frame.depends_on >= frame.depth:
            # complete: so is every answer that waited on this frame
            model.answers[key] = result
            for waiting in self.pending.pop(frame.depth, ()):
                entry = self.provisional.pop(waiting, None)
                if entry is not None:
                    entry[2].answers[entry[3]] = entry[0]
        else:
            dep = frame.depends_on
            self.provisional[active_key] = (result, dep, model, key)
            waiting = self.pending.setdefault(dep, [])
            waiting.append(active_key)
            waiting.extend(self.pending.pop(frame.depth, ()))
            if stack and dep < stack[-1].depends_on:
                stack[-1].depends_on = dep
        return result

    def _forget(self, depth: int) -> None:
        """Drop the provisional answers that depend on the frame at `depth` or deeper."""
        for d in [d for d in self.pending if d >= depth]:
            for waiting in self.pending.pop(d):
                self.provisional.pop(waiting, None)

    def settled(self) -> bool:
        """Nothing the question in progress has read so far depends on a
        question still in progress (a cycle being solved): what it computed
        may be kept for good."""
        return not self.stack or self.stack[-1].depends_on == _NOT_CUT



def _same(a: Any, b: Any) -> bool:
    try:
        return a == b
    except Exception:   # pragma: no cover - answers that cannot be compared: another round decides
        return a is b


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


def known(question: Callable, model, *args: Any) -> Any:
    """The answer `question(model, *args)` already has, or None when it has
    none yet (`question`: a function decorated with @query, whose answers
    are never None)."""
    return model.answers.get((question.uncached, args, ()))


def keep(question: Callable, model, *args: Any, answer: Any) -> None:
    """Keep `answer` as the answer of `question(model, *args)`, computed by
    another question in one walk that answers many at once (everything a
    search for a write visited and found none in answers "no"). Kept only
    when what it was computed from is settled (Memo.settled); asked later,
    the question is computed as usual."""
    if model.project.memo.settled():
        model.answers.setdefault((question.uncached, args, ()), answer)



__all__ = ["Memo", "query", "known", "keep", "OverBudget", "TooComplex", "DEFAULT_BUDGET", "MAX_ROUNDS"]
