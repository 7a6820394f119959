"""Scripts that start their own worker processes (`mp.spawn(main_worker,
...)`, `multiprocessing.Process(target=...)`): the function that spawns runs
in the launching process only, once, and so does the code around its call
under `if __name__ == "__main__":` (the workers re-import the module under
another name). Work done there, a data set downloaded before spawning, is
done by one process, not by every rank."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.names import dotted_name, string_value
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, ScriptModel, owner_class
from ddpcheck.model.flow import argument_expr, resolve_call

_SPAWNERS = {"spawn", "start_processes", "Process"}
_MODULES = ("torch.multiprocessing", "multiprocessing")
# Library launchers that start one worker per GPU and run the function they
# are given in each (ignite's Parallel spawns when given nproc_per_node).
LIBRARY_LAUNCHERS = {
    "detectron2.engine.launch", "detectron2.engine.launch.launch", "accelerate.notebook_launcher",
    "torch.distributed.launcher.api.elastic_launch", "torch.distributed.launcher.elastic_launch",
    "ignite.distributed.Parallel",
}


def is_worker_spawn(site: CallSite) -> bool:
    """`mp.spawn(...)`, `torch.multiprocessing.start_processes(...)`,
    `multiprocessing.Process(...)`, detectron2's `launch(...)`, ..."""
    q = site.qual or ""
    if q in LIBRARY_LAUNCHERS:
        return True
    module, _, last = q.rpartition(".")
    return last in _SPAWNERS and (module in _MODULES or module.startswith(tuple(m + "." for m in _MODULES)))


def spawned_function(site: CallSite) -> cst.BaseExpression | None:
    """The function a worker spawn runs in every worker: `mp.spawn(fn, ...)`,
    `Process(target=fn)`, detectron2's `launch(fn, ...)`."""
    if not is_worker_spawn(site):
        return None
    if (site.qual or "").rpartition(".")[2] == "Process":
        return site.arg("target")
    return site.arg("fn", 0) or site.arg("main_func") or site.arg("function")


@query(on_cycle=frozenset())
def spawned_params(model: ScriptModel, fn: FunctionInfo) -> frozenset[str]:
    """The parameters of `fn` holding a function that `fn` starts in every
    worker process, itself (`def run(fn, cfg): mp.spawn(fn, args=(cfg,),
    nprocs=n)`) or by handing it on to a function of the tree that does."""
    found = set()
    for c in model.calls_in(fn):
        spawned = spawned_function(c)
        if spawned is not None:
            if isinstance(spawned, cst.Name) and spawned.value in fn.params:
                found.add(spawned.value)
            continue
        target = resolve_call(model, c)
        if target is None:
            continue
        for p in spawned_params(*target):
            bound, expr = argument_expr(c, target[1], p)
            if bound and isinstance(expr, cst.Name) and expr.value in fn.params:
                found.add(expr.value)
    return frozenset(found)


@query(on_cycle={})
def calls_by_argument(model: ScriptModel) -> dict[int, CallSite]:
    """The call each argument expression of the file is passed to."""
    return {id(a.value): c for c in model.calls for a in c.node.args}


def runs_in_workers(model: ScriptModel, node: cst.CSTNode) -> bool:
    """`node` (a reference to a function) is handed to a call that runs it
    in every worker process: `mp.spawn(main_worker, ...)`, or a function of
    the tree that spawns its parameter (`ddp.run(cls._run, config)` with
    `def run(fn, config): mp.spawn(fn, ...)` in a helper module). The
    function is then a worker's entry point: every rank runs it at once,
    whoever calls the code that spawns it."""
    call = calls_by_argument(model).get(id(node))
    if call is None:
        return False
    if is_worker_spawn(call):
        return spawned_function(call) is node
    target = resolve_call(model, call)
    return target is not None and any(argument_expr(call, target[1], p)[1] is node
                                      for p in spawned_params(*target))


@query(on_cycle=False)
def spawns_workers(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """`fn` (None: module level) starts worker processes, itself or through a
    function of the file it calls (`main()` -> `trainer.run()` -> `mp.spawn`),
    any number of calls down; a recursion is the memo's fixed point (a
    function reaches a spawn only through a call that does)."""
    if any(is_worker_spawn(c) for c in model.calls_in(fn)):
        return True
    if fn is None:
        return False
    for c in model.calls_in(fn):
        target = resolve_call(model, c)
        if target is not None and target[0] is model and spawns_workers(model, target[1]):
            return True
    return False


# Calls that start new processes: they read the environment when they start,
# so a write just before them is meant for them and does take effect there.
_LAUNCHERS = {
    "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes", "torch.multiprocessing.Process",
    "multiprocessing.Process", "subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "os.system", "os.popen", "os.execv", "os.execve", "os.execvp", "os.execvpe",
    "os.execl", "os.execle", "os.execlp", "os.execlpe", "os.spawnv", "os.spawnve", "os.spawnl", "os.spawnle",
    "torch.distributed.launcher.api.elastic_launch", "torch.distributed.run.run",
}


@query(on_cycle=None)
def launches_processes_after(model: ScriptModel, ctx: Ctx) -> CallSite | None:
    """A process launch after `ctx` (`mp.spawn`, `subprocess.run`, a spawn
    context's `Process`), later in the same function or, up the call graph of
    the file (any number of calls up; callers calling each other are the
    memo's fixed point), after a call of the enclosing function."""
    for c in model.calls_in(ctx.function):
        if c.ctx.order <= ctx.order:
            continue
        q = c.qual or ""
        if q in _LAUNCHERS or (c.attr in ("Process", "spawn") and q.startswith(("multiprocessing.", "torch.multiprocessing."))):
            return c
        if c.attr == "Process" and c.receiver is not None:   # ctx = mp.get_context("spawn"); ctx.Process(...)
            return c
    fn = ctx.function
    if fn is None:
        return None
    for c in model.calls:
        target = resolve_call(model, c)
        if target is not None and target[0] is model and target[1] is fn and c.ctx.function is not fn:
            found = launches_processes_after(model, c.ctx)
            if found is not None:
                return found
    return None


def _main_guard(test: cst.BaseExpression) -> bool:
    """`__name__ == "__main__"`."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return isinstance(test.comparisons[0].operator, cst.Equal) and \
        any(dotted_name(s) == "__name__" for s in sides) and any(string_value(s) == "__main__" for s in sides)


def runs_in_launcher_only(model: ScriptModel, ctx: Ctx) -> bool:
    """Code in a function that spawns the workers, or module-level code under
    `if __name__ == "__main__":` of a script whose module level spawns them."""
    fn = ctx.function
    if fn is not None:
        return spawns_workers(model, fn)
    return any(b.positive and _main_guard(b.test) for b in ctx.branches) and launches_from_module_level(model)


@query(on_cycle=False)
def launches_from_module_level(model: ScriptModel) -> bool:
    """The module-level code spawns the workers, or calls a function of the
    file that does (`if __name__ == "__main__": main()` with `mp.spawn` in `main`)."""
    if spawns_workers(model, None):
        return True
    for c in model.calls_in(None):
        target = resolve_call(model, c)
        if target is not None and target[0] is model and spawns_workers(model, target[1]):
            return True
    return False


_INDEX_SPAWNERS = {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                   "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.spawn.start_processes"}


@query(on_cycle=frozenset())
def spawn_index_params(model: ScriptModel) -> frozenset[tuple[int, str]]:
    """(id of the function's node, parameter) for the functions of the file
    handed to `mp.spawn(fn, ...)` / `start_processes(fn, ...)`: torch calls
    `fn(i, *args)` with the process index `i` first, so that parameter is the
    worker's rank, whatever it is called (`gpu`, `device`, `proc_id`)."""
    found = set()
    for c in model.calls:
        if (c.qual or "") not in _INDEX_SPAWNERS:
            continue
        target = c.arg("fn", 0)
        name = dotted_name(target) if target is not None else None
        if name is None:
            continue
        method = name.startswith("self.") and name.count(".") == 1   # `mp.spawn(self.main_worker, ...)`
        if "." in name and not method:
            continue
        for fn in model.functions_named(name.rpartition(".")[2]):
            params = list(fn.params)
            if method and fn.class_name is not None and owner_class(c.ctx) == fn.class_name and len(params) > 1:
                found.add((id(fn.node), params[1]))
            elif not method and fn.class_name is None and params:
                found.add((id(fn.node), params[0]))
    return frozenset(found)


def is_spawn_index(model: ScriptModel, name: str, scope: FunctionInfo | None) -> bool:
    """`name` is the process index mp.spawn passes to the function `scope`."""
    return scope is not None and (id(scope.node), name) in spawn_index_params(model)


__all__ = ["spawned_function", "spawned_params", "runs_in_workers", "calls_by_argument", "spawn_index_params", "is_spawn_index", "is_worker_spawn", "spawns_workers", "runs_in_launcher_only", "launches_from_module_level", "launches_processes_after"]
