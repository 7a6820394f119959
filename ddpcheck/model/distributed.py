"""Summaries of what code does to the process group, shared by rules:
does the script run distributed at all, does a function start the group.
Helpers in local modules are followed (init_distributed_mode in utils.py)."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.memo import query
from ddpcheck.model.names import dotted_name
from ddpcheck.model.script import FunctionInfo, ScriptModel
from ddpcheck.model.flow import Class, Func, callee_value, called_qual, library_bases, resolved_atoms, value_of
from ddpcheck.model.launchers import spawned_function
from ddpcheck.model.values import distributed_samplers, is_api_call, wraps
from ddpcheck.model.flow import callees, functions_reached, resolve_call, runs_into

# A helper we cannot see whose name says it starts the process group.
INIT_HELPER_NAME = re.compile(r"(init|setup|set_up|start).*(dist|ddp|process_group)|(dist|ddp).*(init|setup)", re.I)


# A module that starts the group names init_process_group (project.Need).
INIT_NEED = (("init_process_group",),)


def is_init_call(model: ScriptModel, site) -> bool:
    return is_api_call(model, site, "init_process_group")


def starts_only_once(model: ScriptModel, site) -> bool:
    """The group start runs only where no group exists yet (`if
    dist.is_initialized(): return` before it, `if dist.is_available() and
    dist.is_initialized(): return ...`, or `if not dist.is_initialized():`
    around it): calling its function again starts nothing more."""
    return any(_once_a_group_exists(model, b.test) not in (None, b.positive) for b in site.ctx.branches)


def _once_a_group_exists(model: ScriptModel, test) -> bool | None:
    """What `test` says once a process group exists: `is_initialized()`
    and `is_available()` are true then; None: anything else decides it."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _once_a_group_exists(model, test.expression)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = _once_a_group_exists(model, test.left), _once_a_group_exists(model, test.right)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else None if None in (left, right) else True
        return True if True in (left, right) else None if None in (left, right) else False
    if isinstance(test, cst.Call) and not test.args:
        last = model.imports.qualify(dotted_name(test.func) or "").rpartition(".")[2]
        if last in ("is_initialized", "is_available"):
            return True
    return None


@query(on_cycle=None)
def group_start_in(model: ScriptModel, fn: FunctionInfo) -> tuple[ScriptModel, object] | None:
    """The init_process_group call that running `fn` makes: in its own body,
    or in a function of the tree it calls, any number of calls down and
    across modules (a trainer's base-class `__init__` -> `setup()` -> a
    helper module's `init_dist()`), the nearest first: (the model it is in,
    the call). Calls are followed only into modules that can reach
    init_process_group (themselves or through their imports), and the walk
    is iterative (`flow.functions_reached`): a framework whose call chains
    run hundreds of calls deep is walked to its end without growing Python's
    stack, each function once."""
    if not model.may_reach(INIT_NEED):
        return None
    for m, reached in functions_reached(model, fn, runs_reaching_init):
        found = next((c for c in m.calls_in(reached) if is_init_call(m, c)), None)
        if found is not None:
            return m, found
    return None


def runs_reaching_init(model: ScriptModel, site) -> list[tuple[ScriptModel, FunctionInfo]]:
    """The functions a call runs that can lead to init_process_group: in a
    module that can reach it (a worker spawn's target included)."""
    return [t for t in _runs(model, site, INIT_NEED) if t[0].may_reach(INIT_NEED)]


def _runs(model: ScriptModel, site, needs=()) -> list[tuple[ScriptModel, FunctionInfo]]:
    """The functions of the tree a call runs (`callees`' `runs`): the one it calls, or, for a
    worker spawn (`mp.start_processes(_worker, ...)`, `mp.spawn(fn, ...)`,
    `Process(target=fn)`), the function every worker it starts runs."""
    spawned = spawned_function(site)
    if spawned is not None:
        # the worker as a module's attribute (`mp.spawn(mpu.run, ...)`, `import pkg.utils.multiprocessing
        # as mpu`): its import looked up, as a call's function is
        return [(a.model, a.fn) for a in resolved_atoms(value_of(model, spawned), needs).atoms if isinstance(a, Func)]
    return runs_into(model, site, needs)


def function_inits(model: ScriptModel, fn: FunctionInfo) -> bool:
    """The function (or one it calls, any number of calls down: group_start_in) calls init_process_group."""
    return group_start_in(model, fn) is not None


@query
def init_calls(model: ScriptModel) -> list:
    """Calls in this file that start the process group: init_process_group
    itself or a helper (resolved, or unresolvable but named like one)."""
    found = []
    for c in model.calls:
        if is_init_call(model, c):
            found.append(c)
            continue
        named_like_init = bool(c.attr and INIT_HELPER_NAME.search(c.attr))
        # A call named like an init helper is resolved whatever its module
        # says (unresolved, its name is the evidence); any other only into a
        # module that can reach init_process_group.
        target = resolve_call(model, c) if named_like_init else resolve_call(model, c, INIT_NEED)
        if target is not None:
            if function_inits(*target):
                found.append(c)
        elif named_like_init:
            found.append(c)
    return found


# Library classes and functions that start the process group themselves when
# the launcher's environment (torchrun's RANK / WORLD_SIZE) is set: a script
# built on them runs as several processes under torchrun without a word of
# torch.distributed of its own.
TRAINER_NEED = (("Trainer", "Accelerator", "Fabric", "deepspeed"),)
LIBRARY_TRAINERS = (
    ("transformers.", "Trainer"), ("trl.", "Trainer"), ("accelerate.", "Accelerator"),
    ("lightning.", "Trainer"), ("pytorch_lightning.", "Trainer"), ("lightning.", "Fabric"),
    ("deepspeed.initialize", ""), ("deepspeed.init_distributed", ""),
)


def starts_group_itself(model: ScriptModel, site) -> bool:
    """A call of a library trainer that starts the process group on its own
    (`transformers.Trainer(...)`, `Accelerator()`, Lightning's `Trainer` or
    `Fabric`, `deepspeed.initialize`), or of a class of the tree deriving from one."""
    qual = called_qual(model, site) or ""
    names = {qual} if qual else set()
    if not qual:
        # a class of the tree deriving from one: only a module naming them is read
        for atom in callee_value(model, site, TRAINER_NEED).atoms:
            if isinstance(atom, Class):
                names |= library_bases(atom.model, atom.cls)
    return any(q.startswith(prefix) and q.endswith(suffix) for q in names for prefix, suffix in LIBRARY_TRAINERS)


@query
def runs_distributed(model: ScriptModel) -> bool:
    """The script starts a process group (itself, or through a library
    trainer that does it under torchrun), wraps in DDP or shards with a
    DistributedSampler: it runs as several processes."""
    result = bool(init_calls(model)) or any(w.kind == "DistributedDataParallel" for w in wraps(model)) or any(
        is_api_call(model, c, "DistributedSampler") or starts_group_itself(model, c) for c in model.calls
    )
    return result


__all__ = ["runs_reaching_init", "starts_only_once", "runs_distributed", "init_calls", "function_inits", "group_start_in", "distributed_samplers"]


# A helper we cannot see whose name says it tears the process group down.
DESTROY_HELPER_NAME = re.compile(r"destroy|cleanup|clean_up|teardown|tear_down|finalize|shutdown", re.I)


def is_destroy_call(model: ScriptModel, site) -> bool:
    return is_api_call(model, site, "destroy_process_group")


@query
def script_destroys(model: ScriptModel, runs=lambda fn: True) -> bool | None:
    """The script tears its process group down: `destroy_process_group` is
    called or referenced (`atexit.register(dist.destroy_process_group)`) in
    code of the file that runs (`runs(function)`: a `cleanup()` defined but
    never called tears nothing down) or in a local helper that code calls.
    None: it may, in a helper we cannot see (`cleanup()` from a package)."""
    calls = [c for c in model.calls if runs(c.ctx.function)]
    result: bool | None = False
    if any(runs(ref.ctx.function) for ref in model.references.get("destroy_process_group", ())):
        result = True
    elif any(is_destroy_call(m, c) for m, fn, _ in callees(model, calls, _runs) for c in m.calls_in(fn)):
        result = True
    elif any(resolve_call(model, c) is None and c.attr and DESTROY_HELPER_NAME.search(c.attr)
             and not (c.qual or "").startswith("torch.") for c in calls):
        result = None
    return result


_SPAWNERS = {"spawn", "start_processes", "Process"}


def starts_own_workers(model: ScriptModel) -> bool:
    """`mp.spawn(main_worker, ...)` / `multiprocessing.Process(target=...)`:
    the script launches its workers itself and hands them their rank."""
    for c in model.calls:
        q = c.qual or ""
        module, _, last = q.rpartition(".")
        if last in _SPAWNERS and (module in ("torch.multiprocessing", "multiprocessing")
                                  or module.startswith("multiprocessing.") or module.startswith("torch.multiprocessing.")):
            return True
        if last == "get_context" and module in ("torch.multiprocessing", "multiprocessing"):
            return True
    return False
