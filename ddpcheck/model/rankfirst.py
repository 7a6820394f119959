"""Does every rank run this line at the same moment, or does rank 0 go first?

Writing the same files from every rank at once (a data set download, a
`makedirs` after an `exists` check) races; the same line is fine when rank 0
runs it first and the others only after a barrier, because by then the work
is done (torchvision's `download=True` sees the verified archive and returns,
`exists` is true). The idioms that order the ranks:

- a rank-0-first context manager: yolov5's `with
  torch_distributed_zero_first(LOCAL_RANK):`, accelerate's `with
  accelerator.main_process_first():` (and transformers'
  `training_args.main_process_first()`), or a local `@contextmanager` whose
  non-zero ranks wait at a barrier before the `yield`; a file lock (`with
  FileLock(path):`) serialises them as well;
- the barrier sandwich: `if rank != 0: dist.barrier()` earlier in the same
  function (ignite's `if local_rank > 0: idist.barrier()`);
- rank 0 does the same work under a guard, then a barrier on every rank,
  then the line: `if rank == 0: CIFAR10(root, download=True)`,
  `dist.barrier()`, `CIFAR10(root, download=True)`.

The same question is asked of every call that leads to the line, up the call
graph of the file: `with torch_distributed_zero_first(rank): ds =
build_dataset(cfg)` orders whatever `build_dataset` downloads. Code that runs
in the launching process of an `mp.spawn` script (before it spawns the
workers) runs once, not on every rank.
"""

from __future__ import annotations

import re
from typing import Callable

import libcst as cst

from ddpcheck.model.collectives import function_events
from ddpcheck.model.guards import function_worlds, relevant_frames, worlds, worlds_from_call
from ddpcheck.model.launchers import runs_in_launcher_only, runs_in_workers, spawns_workers
from ddpcheck.model.names import dotted_name
from ddpcheck.model.memo import query
from ddpcheck.model.reach import other_ranks_reach
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.withblocks import with_items_around
from ddpcheck.model.worlds import D0, DISTRIBUTED, DN
from ddpcheck.model.flow import call_sites_of, may_reach_call, resolve_call, runs_into

# Context managers that let rank 0 (or each node's local rank 0) run the body
# first and the other ranks after it: yolov5/ultralytics, accelerate,
# transformers' TrainingArguments, lightning fabric (`rank_zero_first`), YOLOX
# (`wait_for_the_master`), ColossalAI (`barrier_context`, and its
# DistCoordinator's `priority_execution`, documented for downloads).
RANK_ZERO_FIRST = re.compile(
    r"^(torch_distributed_zero_first|distributed_zero_first|main_process_first|local_main_process_first"
    r"|rank_zero_first|zero_rank_first|rank0_first|rank_0_first|master_first|main_first"
    r"|local_rank_zero_first|zero_first|wait_for_the_master|wait_for_master|barrier_context|priority_execution)$"
)
# File locks: every rank runs the body, one at a time.
FILE_LOCKS = {"FileLock", "SoftFileLock", "UnixFileLock", "WindowsFileLock", "InterProcessLock", "flock"}

SameWork = Callable[[ScriptModel, CallSite], bool]


def _call_of(model: ScriptModel, node: cst.CSTNode) -> CallSite | None:
    return model.site_of.get(id(node)) if isinstance(node, cst.Call) else None


@query(on_cycle=False)
def waits_for_rank_zero(model: ScriptModel, fn: FunctionInfo) -> bool:
    """A local context manager whose non-zero ranks wait at a collective
    before its `yield` (yolov5's torch_distributed_zero_first)."""
    body = model.module.code_for_node(fn.node)
    if "yield" not in body:
        return False
    return any(e.worlds & DISTRIBUTED == {DN} and "barrier" in e.kinds for e in function_events(model, fn))


def _ordering_manager(model: ScriptModel, item: cst.WithItem) -> bool:
    call = item.item
    if not isinstance(call, cst.Call):
        return False
    name = dotted_name(call.func)
    last = model.imports.qualify(name).rpartition(".")[2] if name else None
    if last and (RANK_ZERO_FIRST.match(last) or last in FILE_LOCKS):
        return True
    site = _call_of(model, call)
    target = resolve_call(model, site) if site is not None else None
    return target is not None and waits_for_rank_zero(*target)


def inside_rank_zero_first(model: ScriptModel, site: CallSite) -> bool:
    """The call runs inside a `with` that lets rank 0 through first and the
    other ranks after it (`with torch_distributed_zero_first(rank):`,
    accelerate's `main_process_first()`, a local manager whose non-zero ranks
    wait at a barrier before its `yield`), or one rank at a time (a file lock)."""
    return any(_ordering_manager(model, item) for item in with_items_around(model, site))


@query(on_cycle=False)
def runs_rank_zero_first(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """Every call of `fn` in its file runs rank 0 first: inside a
    rank-0-first `with`, itself or through the calls of the function it is
    in (`flow.call_sites_of`: a constructor's are the calls of its class).
    False when some caller is not known."""
    if fn is None:
        return False
    calls = call_sites_of(model, fn)   # a constructor's: the calls of its class
    if not calls:
        return False
    return all(inside_rank_zero_first(model, c) or runs_rank_zero_first(model, c.ctx.function) for c in calls)


def ordered_first(model: ScriptModel, site: CallSite) -> bool:
    """The call runs rank 0 first and the other ranks after it (`inside_rank_zero_first`,
    or every call of its function does)."""
    return inside_rank_zero_first(model, site) or runs_rank_zero_first(model, site.ctx.function)


def _only_rank_zero(worlds: frozenset[str]) -> bool:
    return worlds & DISTRIBUTED == {D0}


def ordered_here(model: ScriptModel, site: CallSite, same_work: SameWork) -> bool:
    """Within its own function, the call runs on rank 0 before the others:
    inside a rank-0-first `with`, after a barrier only the non-zero ranks
    reach, or after rank 0 did the same work first (alone, or itself ordered)
    and the ranks met since. `same_work(model, call)` says whether a call is
    of the work in question (a download, a folder creation); an earlier call
    does the same work when it calls the same function or class (the test
    split of CIFAR10 after its train split: one archive)."""
    if inside_rank_zero_first(model, site):
        return True
    fn = site.ctx.function
    events = [e for e in function_events(model, fn) if e.site.ctx.order < site.ctx.order]
    # the barrier sandwich: the non-zero ranks wait at a barrier rank 0 joins
    # only after the work; the site is ordered while the sandwich is open
    sandwich_open = False
    for e in sorted(events, key=lambda e: e.site.ctx.order):
        side = e.worlds & DISTRIBUTED
        if side == {DN}:
            sandwich_open = True
        elif side == {D0}:
            sandwich_open = False
    if sandwich_open:
        return True
    # rank 0 did the same work first (alone, or itself ordered), and the ranks
    # have met since: a barrier on every rank, or the closing half of a sandwich
    meetings = [e.site.ctx.order for e in events if e.worlds & DISTRIBUTED in (DISTRIBUTED, {D0})]
    if not meetings:
        return False
    for c in model.calls_in(fn):
        if c is site or c.ctx.order >= site.ctx.order or not any(c.ctx.order < m for m in meetings):
            continue
        if not (_same_callee(model, c, site) or (c.qual is not None and c.qual == site.qual and same_work(model, c))):
            continue
        if _only_rank_zero(worlds(model, c.ctx)) or ordered_here(model, c, same_work):
            return True
    return False


def _same_callee(model: ScriptModel, a: CallSite, b: CallSite) -> bool:
    ta, tb = resolve_call(model, a), resolve_call(model, b)
    if ta is not None:
        return tb is not None and ta[1] is tb[1]
    return a.qual is not None and a.qual == b.qual


@query(on_cycle={})
def _calls_by_callee(model: ScriptModel) -> dict[int, CallSite]:
    return {id(c.node.func): c for c in model.calls}


@query(on_cycle=False)
def reached_at_once(model: ScriptModel, fn: FunctionInfo | None, same_work: SameWork) -> bool:
    """Every rank can enter `fn` at the same time: some place the script
    reaches it from is reached by the non-zero ranks and not ordered
    rank-0-first (a function nobody in the file calls is not judged)."""
    if fn is None:
        return True
    if DN not in function_worlds(model, fn) or spawns_workers(model, fn):
        return False
    callers = _calls_by_callee(model)
    for ref in model.refs_to(fn):
        if ref.ctx.function is fn or DN not in worlds(model, ref.ctx):
            continue
        if runs_in_workers(model, ref.node):
            return True   # `mp.spawn(main_worker, ...)`: every worker starts it at once
        call = callers.get(id(ref.node))
        if call is not None and (ordered_here(model, call, same_work) or runs_in_launcher_only(model, call.ctx)):
            continue
        if reached_at_once(model, ref.ctx.function, same_work):
            return True
    return False


def every_rank_at_once(model: ScriptModel, site: CallSite, same_work: SameWork) -> bool:
    """The non-zero ranks reach the call, and nothing makes rank 0 run it first."""
    if not other_ranks_reach(model, site.ctx) or runs_in_launcher_only(model, site.ctx):
        return False
    if ordered_here(model, site, same_work):
        return False
    return reached_at_once(model, site.ctx.function, same_work)


def unordered_work(model: ScriptModel, fn: FunctionInfo, is_work: SameWork,
                   frames: tuple = ()) -> CallSite | None:
    """The call in `fn` that does the work on every rank entering `fn`, with
    nothing inside `fn` making rank 0 go first: the work itself, or a call of
    a helper that does it, any number of calls down. For helpers in another
    module, reported at the call that reaches them. `frames`: the calls that
    run `fn`, innermost first (a test of its parameters is judged by what
    they pass)."""
    found = _unordered_work(model, fn, is_work, relevant_frames(frames))
    return found[0] if found is not None else None


@query(on_cycle=None)
def _unordered_work(model: ScriptModel, fn: FunctionInfo, is_work: SameWork,
                    frames: tuple) -> tuple[CallSite, ScriptModel, CallSite] | None:
    """(the call in `fn` that leads to the work, the model of the work, the
    call doing it), asked with `guards.relevant_frames`: a recursion whose
    calls hand nothing on comes back to the same question and is the memo's
    fixed point. One that keeps handing its parameters on would ask a new
    question at every turn: a call already in `frames` is not followed again,
    so each call is unrolled once, and work reached only deeper than that is
    not proven."""
    if DN not in function_worlds(model, fn) or spawns_workers(model, fn):
        return None
    for c in model.calls_in(fn):
        work = is_work(model, c)
        target = None
        if not work:
            # which ranks run a call is the costly question: asked only of calls that can lead to the work
            target = resolve_call(model, c)
            if target is None or any(call is c for _, call in frames) or \
                    not may_reach_call(*target, runs_into, is_work):
                continue
        if DN not in worlds_from_call(model, c.ctx, fn, frames) or c.ctx.opaque or ordered_here(model, c, is_work):
            continue
        if work:
            return c, model, c
        inner = _unordered_work(target[0], target[1], is_work, relevant_frames(((model, c), *frames)))
        if inner is not None:
            return c, inner[1], inner[2]
    return None


def helper_work_at_once(model: ScriptModel, site: CallSite, is_work: SameWork) -> tuple[ScriptModel, CallSite] | None:
    """A call of this file that lands in a helper module whose function does
    the work unordered, while every rank runs the call at once: (the model
    the work is in, the call doing the work), at the end of the chain of
    calls that leads there (`open_session(...)` -> `Records(...)` in another
    module -> its `os.mkdir(...)`). Same-file helpers are reported at their
    own work."""
    target = resolve_call(model, site)
    if target is None or target[0] is model:
        return None
    found = _unordered_work(target[0], target[1], is_work, relevant_frames(((model, site),)))
    if found is None or not every_rank_at_once(model, site, is_work):
        return None
    return found[1], found[2]


__all__ = ["inside_rank_zero_first", "runs_rank_zero_first", "ordered_first", "every_rank_at_once", "unordered_work", "helper_work_at_once", "ordered_here", "reached_at_once", "waits_for_rank_zero", "RANK_ZERO_FIRST"]
