"""Can a non-zero rank reach this line? The worlds of the line's own branches,
then, up the call graph, the worlds of every place its function is called from
(in the same file; a function nobody in the file calls is a library entry
point we cannot judge, so it counts as unreached)."""

from __future__ import annotations

from ddpcheck.model.guards import function_worlds, worlds
from ddpcheck.model.memo import query
from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.worlds import DN


def other_ranks_reach(model: ScriptModel, ctx: Ctx) -> bool:
    if DN not in worlds(model, ctx):
        return False
    return _function_reached(model, ctx.function)


def unguarded_caller(model: ScriptModel, fn: FunctionInfo | None):
    """The first unguarded reference through which other ranks reach `fn`
    (for messages: "reached on every rank through save_checkpoint(...)")."""
    if fn is None:
        return None
    for ref in model.refs_to(fn):
        if ref.ctx.function is fn:
            continue   # recursion, or a local variable of the same name
        if DN in worlds(model, ref.ctx) and _function_reached(model, ref.ctx.function):
            return ref
    return None


@query(on_cycle=False)   # a caller that is only reached through `fn` itself adds no path
def _function_reached(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    if fn is None:
        return True
    if DN not in function_worlds(model, fn):
        return False
    return any(DN in worlds(model, ref.ctx) and _function_reached(model, ref.ctx.function)
               for ref in model.refs_to(fn))


def script_reaches(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """The script itself runs `fn`: module-level code, or a function called
    or handed to a call (`mp.spawn(main_worker, ...)`, `fire.Fire(main)`)
    from code the script runs. A function nobody in the file calls is a
    library entry point (a helper in utils.py); a bare mention (a type
    annotation, `__all__`) does not run anything."""
    return _used(model, fn)


@query
def _call_parts(model: ScriptModel) -> set[int]:
    parts: set[int] = set()
    for c in model.calls:
        parts.add(id(c.node.func))
        parts.update(id(a.value) for a in c.node.args)
    return parts


@query(on_cycle=False)   # used only from inside itself: not used
def _used(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    if fn is None:
        return True
    parts = _call_parts(model)
    return any(id(ref.node) in parts and _used(model, ref.ctx.function) for ref in model.refs_to(fn))
