"""Can a non-zero rank reach this line? The worlds of the line's own branches,
then, up the call graph, the worlds of every place its function is called from
(in the same file; a function nobody in the file calls is a library entry
point we cannot judge, so it counts as unreached). A function the file hands
to a worker spawn (`mp.spawn(worker, ...)`, or a helper that spawns its
parameter) is a worker's entry point: every rank runs it."""

from __future__ import annotations

import re

from ddpcheck.model.guards import function_worlds, one_rank_only, worlds
from ddpcheck.model.launchers import runs_in_workers
from ddpcheck.model.memo import query
from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.worlds import ALL, DN, NONE


# A call that registers a function to be run later, by whatever runs the hook
# (`accelerator.register_save_state_pre_hook(save_hook)`, `module.register_forward_hook(fn)`,
# `atexit.register(fn)`, `trainer.add_callback(cb)`): the function does not run at the registration.
_REGISTRATION = re.compile(r"(^|_)register($|_)|hook|callback", re.I)


@query
def registered_for_later(model: ScriptModel) -> frozenset[int]:
    """The argument nodes of registration calls: a function named there runs
    where the hook runs, which the registration does not say."""
    found = set()
    for c in model.calls:
        name = c.attr or (c.func or "").rpartition(".")[2]
        if name and _REGISTRATION.search(name):
            found.update(id(a.value) for a in c.node.args)
    return frozenset(found)


def _runs_there(model: ScriptModel, ref) -> bool:
    return id(ref.node) not in registered_for_later(model)


def other_ranks_reach(model: ScriptModel, ctx: Ctx) -> bool:
    if DN not in worlds(model, ctx):
        return False
    return _other_ranks_reach_function(model, ctx.function, False)


def reaching_worlds(model: ScriptModel, ctx: Ctx) -> frozenset[str]:
    """The worlds (rank 0, other ranks, one process) that run `ctx`: those
    its own branches let through, narrowed to those in which some call of
    its function is reached (`if args.world_size == 1: show(model)` as the
    only call of `show`: one process). A function the file does not call
    (an entry point, a library helper) runs in every world."""
    return worlds(model, ctx) & _function_worlds_reached(model, ctx.function)


@query(on_cycle=NONE)   # a call from inside the function itself adds no world
def _function_worlds_reached(model: ScriptModel, fn: FunctionInfo | None) -> frozenset[str]:
    if fn is None:
        return ALL
    refs = [ref for ref in model.refs_to(fn) if ref.ctx.function is not fn]
    if not refs:
        return function_worlds(model, fn)
    found = NONE
    for ref in refs:
        if runs_in_workers(model, ref.node) or not _runs_there(model, ref):
            return function_worlds(model, fn)   # handed on: runs wherever the spawn or hook runs it
        found |= reaching_worlds(model, ref.ctx)
    return found & function_worlds(model, fn)


def several_ranks_reach(model: ScriptModel, ctx: Ctx) -> bool:
    """Non-zero ranks reach `ctx`, and not one process alone: neither a
    test around it nor every path of calls into its function lets one rank
    only through (`if args.rank == args.world_size - 1:`)."""
    if DN not in worlds(model, ctx) or one_rank_only(model, ctx):
        return False
    return _other_ranks_reach_function(model, ctx.function, True)


@query(on_cycle=False)   # a caller that is only reached through `fn` itself adds no path
def _other_ranks_reach_function(model: ScriptModel, fn: FunctionInfo | None, several: bool) -> bool:
    """Some call path lets ranks other than 0 run `fn`; `several`: one that
    no test narrows to one specific rank (`rank == world_size - 1`)."""
    if fn is None:
        return True
    if DN not in function_worlds(model, fn):
        return False
    return any(DN in worlds(model, ref.ctx) and not (several and one_rank_only(model, ref.ctx)) and (
                   runs_in_workers(model, ref.node) or (
                   _runs_there(model, ref) and _other_ranks_reach_function(model, ref.ctx.function, several)))
               for ref in model.refs_to(fn))


def unguarded_caller(model: ScriptModel, fn: FunctionInfo | None):
    """The first unguarded reference through which other ranks reach `fn`
    (for messages: "reached on every rank through save_checkpoint(...)")."""
    if fn is None:
        return None
    for ref in model.refs_to(fn):
        if ref.ctx.function is fn or not _runs_there(model, ref):
            continue   # recursion, or a local variable of the same name; a hook registered
        if DN in worlds(model, ref.ctx) and not one_rank_only(model, ref.ctx) and \
                _other_ranks_reach_function(model, ref.ctx.function, True):
            return ref
    return None


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
