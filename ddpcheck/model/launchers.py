"""Scripts that start their own worker processes (`mp.spawn(main_worker,
...)`, `multiprocessing.Process(target=...)`): the function that spawns runs
in the launching process only, once, and so does the code around its call
under `if __name__ == "__main__":` (the workers re-import the module under
another name). Work done there, a data set downloaded before spawning, is
done by one process, not by every rank."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.names import dotted_name, string_value
from ddpcheck.model.query import query
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, ScriptModel

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


@query(on_cycle=False)
def spawns_workers(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """`fn` (None: module level) starts worker processes itself."""
    return any(is_worker_spawn(c) for c in model.calls_in(fn))


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
        target = model.resolve_call(c)
        if target is not None and target[0] is model and spawns_workers(model, target[1]):
            return True
    return False


__all__ = ["is_worker_spawn", "spawns_workers", "runs_in_launcher_only", "launches_from_module_level"]
