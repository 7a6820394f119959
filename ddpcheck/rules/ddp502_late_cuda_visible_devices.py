"""DDP502 late-cuda-visible-devices."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.devices import function_cuda_init, initialises_cuda
from ddpcheck.model.env import env_writes
from ddpcheck.model.script import CallSite, Ctx, ScriptModel
from ddpcheck.model.positions import where
from ddpcheck.model.values import exclusive
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call


def cuda_initialised_before(model: ScriptModel, ctx: Ctx, depth: int = 0, seen=None) -> CallSite | None:
    """A call that initialises CUDA and certainly runs before `ctx` on the
    same path: earlier in the same function (not in the other arm of an
    `if`), through a helper called there, or, up the call graph, before a call
    of the enclosing function in this file."""
    fn = ctx.function
    for c in model.calls_in(fn):
        if c.ctx.order >= ctx.order:
            break
        if exclusive(c.ctx, ctx):
            continue
        if initialises_cuda(model, c):
            return c
        target = resolve_call(model, c)
        if target is not None and target[1] is not fn and function_cuda_init(*target) is not None:
            return c
    if fn is None or depth >= 3:
        return None
    seen = seen if seen is not None else set()
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    for c in model.calls:
        target = resolve_call(model, c)
        if target is not None and target[0] is model and target[1] is fn:
            found = cuda_initialised_before(model, c.ctx, depth + 1, seen)
            if found is not None:
                return found
    return None


# Calls that start new processes: they read the environment when they start,
# so a write just before them is meant for them and does take effect there.
_LAUNCHERS = {
    "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes", "torch.multiprocessing.Process",
    "multiprocessing.Process", "subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "os.system", "os.popen", "os.execv", "os.execve", "os.execvp", "os.execvpe",
    "os.execl", "os.execle", "os.execlp", "os.execlpe", "os.spawnv", "os.spawnve", "os.spawnl", "os.spawnle",
    "torch.distributed.launcher.api.elastic_launch", "torch.distributed.run.run",
}


def launches_processes_after(model: ScriptModel, ctx: Ctx, depth: int = 0) -> CallSite | None:
    """A process launch after `ctx` (`mp.spawn`, `subprocess.run`, a spawn
    context's `Process`), later in the same function or, up the call graph,
    after a call of the enclosing function in this file."""
    for c in model.calls_in(ctx.function):
        if c.ctx.order <= ctx.order:
            continue
        q = c.qual or ""
        if q in _LAUNCHERS or (c.attr in ("Process", "spawn") and q.startswith(("multiprocessing.", "torch.multiprocessing."))):
            return c
        if c.attr == "Process" and c.receiver is not None:   # ctx = mp.get_context("spawn"); ctx.Process(...)
            return c
    fn = ctx.function
    if fn is None or depth >= 3:
        return None
    for c in model.calls:
        target = resolve_call(model, c)
        if target is not None and target[0] is model and target[1] is fn and c.ctx.function is not fn:
            found = launches_processes_after(model, c.ctx, depth + 1)
            if found is not None:
                return found
    return None


@register
class LateCudaVisibleDevices(Rule):
    code = "DDP502"
    triggers = (USES_DISTRIBUTED,)
    name = "late-cuda-visible-devices"
    short = "CUDA_VISIBLE_DEVICES set after CUDA initialised: it has no effect"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    message = ("CUDA_VISIBLE_DEVICES is set after CUDA was initialised: the driver reads it once, at "
               "initialisation, so this assignment changes nothing")
    fix = ("set it before anything touches CUDA (first lines of the script, before `import torch` to be safe), "
           "or on the command line: `CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 train.py`; "
           "inside the script, pick the GPU with `torch.cuda.set_device(local_rank)` instead")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for w in env_writes(model, "CUDA_VISIBLE_DEVICES"):
            init = cuda_initialised_before(model, w.ctx)
            if init is None or launches_processes_after(model, w.ctx) is not None:
                continue
            what = f"`{init.func}(...)`" if init.func else "a `.cuda()`/`.to(device)` call"
            yield Hit(w.node, message=(
                f"CUDA_VISIBLE_DEVICES is set here, but CUDA was already initialised by {what} "
                f"({where(model, init.node)}): the CUDA driver reads the variable once, when it initialises, so "
                "this process keeps the GPUs it saw then: `device_count()`, the device numbering and the GPU "
                "each rank lands on ignore this line"
            ))
