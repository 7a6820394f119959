"""Collectives: the calls every rank of a process group must make together.

- `collective_kind(model, site)`: `dist.barrier()` -> "barrier",
  `dist.all_reduce(t)` -> "all_reduce", detectron2's `comm.synchronize()` ->
  "barrier", `accelerator.wait_for_everyone()` -> "barrier"; None otherwise.
- `ddp_forward(model, site)`: the call runs a DistributedDataParallel
  model's forward (`model(x)` where `model` holds a DDP wrap), which
  broadcasts buffers from rank 0 unless the wrap says `broadcast_buffers=False`.
- `function_events(model, fn)`: the collective events a function performs
  (direct collectives, DDP forwards, and calls to helpers in the file or a
  local module that perform one for every rank that calls them), each with the
  worlds (rank 0 / other ranks / single process) that reach it.
- `needs_process_group(model, site)`: `get_rank()`, `get_world_size()`, a
  collective... calls that raise when no process group exists yet.
- `initialized_guarded(model, site)`: the call only runs when the process
  group already exists (`if dist.is_initialized():`, `x if
  dist.is_initialized() else 0`, `not dist.is_initialized() or ...`), or sits
  in a `try:` body or a lambda (we cannot tell when it runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.distributed import INIT_NEED, is_init_call
from ddpcheck.model.guards import function_worlds, worlds, worlds_from_call
from ddpcheck.model.evaluation import no_grad
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.withblocks import with_items_around
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import DDP_NAMES, DDP_NEED, call_site, exclusive, is_ddp_wrap
from ddpcheck.model.buffers import holds_buffers
from ddpcheck.model.flow import Made, binds_receiver, bindings_seen, called_qual, instance_of, value_of
from ddpcheck.model.worlds import DISTRIBUTED, only_some_ranks
from ddpcheck.model.flow import functions_reached, resolve_call

# torch.distributed collectives -> their kind (barrier and monitored_barrier are one kind)
COLLECTIVES = {
    "barrier": "barrier", "monitored_barrier": "barrier",
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_coalesced": "all_gather", "all_gather_object": "all_gather_object",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast_object_list",
    "reduce": "reduce",
    "gather": "gather", "gather_object": "gather_object",
    "scatter": "scatter", "scatter_object_list": "scatter_object_list",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
}
# Calls that need an initialised default process group (besides collectives).
PROCESS_GROUP_QUERIES = {"get_rank", "get_world_size", "get_backend", "new_group", "get_process_group_ranks"}

# Well-known library helpers that are collectives (every rank must call them).
# Only qualified names are trusted: `from detectron2.utils import comm` then
# `comm.synchronize()`.
LIBRARY_COLLECTIVES = {
    "detectron2.utils.comm": {"synchronize": "barrier", "all_gather": "all_gather_object",
                              "gather": "gather_object", "reduce_dict": "reduce"},
    "classy_vision.generic.distributed_util": {
        "barrier": "barrier", "all_reduce_mean": "all_reduce", "all_reduce_sum": "all_reduce",
        "all_reduce_min": "all_reduce", "all_reduce_max": "all_reduce", "all_reduce_op": "all_reduce",
        "gather_from_all": "all_gather", "gather_tensors_from_all": "all_gather",
        "broadcast": "broadcast", "broadcast_object": "broadcast_object_list",
    },
    "fairseq.distributed_utils": {"all_reduce": "all_reduce", "all_gather_list": "all_gather_object",
                                  "all_reduce_dict": "all_reduce", "broadcast_object": "broadcast_object_list",
                                  "broadcast_tensors": "broadcast", "all_to_all": "all_to_all"},
    "fairseq.distributed.utils": {"all_reduce": "all_reduce", "all_gather_list": "all_gather_object",
                                  "all_reduce_dict": "all_reduce", "broadcast_object": "broadcast_object_list",
                                  "broadcast_tensors": "broadcast", "all_to_all": "all_to_all"},
}
ACCELERATE_COLLECTIVES = {"wait_for_everyone": "barrier", "gather": "all_gather",
                          "gather_for_metrics": "all_gather", "reduce": "reduce"}

# A module with a collective event (function_events) names a collective and
# the library it comes from (`reduce` alone is functools'), or a DDP wrap
# (project.Need: one name of every group).
_COLLECTIVE_NAMES = {*COLLECTIVES, *(n for t in LIBRARY_COLLECTIVES.values() for n in t), *ACCELERATE_COLLECTIVES}
_COLLECTIVE_LIBRARIES = {"distributed", "c10d", "comm", "deepspeed", "accelerate", "Accelerator",
                         *(m.rpartition(".")[2] for m in LIBRARY_COLLECTIVES)}
EVENT_NEED = (tuple(sorted(_COLLECTIVE_LIBRARIES | set(DDP_NAMES))), tuple(sorted(_COLLECTIVE_NAMES | set(DDP_NAMES))))

# A module that calls torch.distributed's group-needing functions or starts
# the group names torch.distributed and one of those functions.
PROCESS_GROUP_NEED = (("distributed", "c10d"),
                      tuple(sorted({*COLLECTIVES, *PROCESS_GROUP_QUERIES, "init_process_group"})))

# Predicates that are true only once the default process group exists.
INITIALIZED_PREDICATES = {"is_initialized", "is_dist_avail_and_initialized", "dist_is_initialized",
                          "is_dist_initialized"}


def _torch_distributed(site: CallSite) -> str | None:
    """The function name for a call of torch.distributed.<name> (however imported)."""
    q = site.qual or ""
    return q.rpartition(".")[2] if q.startswith("torch.distributed.") else None


@query
def collective_kind(model: ScriptModel, site: CallSite) -> str | None:
    result = None
    name = _torch_distributed(site)
    if name in COLLECTIVES:
        result = COLLECTIVES[name]
    elif site.qual:
        module, _, last = site.qual.rpartition(".")
        table = LIBRARY_COLLECTIVES.get(module)
        if table and last in table:
            result = table[last]
        elif module.startswith("deepspeed.comm") and last in COLLECTIVES:
            result = COLLECTIVES[last]
        elif last in ACCELERATE_COLLECTIVES and site.receiver is not None and _is_accelerator(model, site):
            result = ACCELERATE_COLLECTIVES[last]
    return result


def _is_accelerator(model: ScriptModel, site: CallSite) -> bool:
    """The call's receiver holds an `accelerate.Accelerator` (or a subclass)."""
    return any((called_qual(a.model, a.site) or "").startswith("accelerate.") and
               (called_qual(a.model, a.site) or "").endswith("Accelerator") or instance_of(a, "Accelerator")
               for a in value_of(model, site.receiver).made)


# Where torch.distributed's collectives take their `group` positionally
# (`dist.all_gather_object(out, obj, pp_group)`).
_GROUP_POSITION = {
    "barrier": 0, "monitored_barrier": 0,
    "all_reduce": 2, "all_gather": 2, "all_gather_object": 2, "all_gather_into_tensor": 2, "broadcast": 2,
    "broadcast_object_list": 2, "all_to_all": 2, "all_to_all_single": 4,
    "reduce": 3, "gather": 3, "scatter": 3, "gather_object": 3, "scatter_object_list": 3,
    "reduce_scatter": 3, "reduce_scatter_tensor": 3,
}


def is_subgroup_call(site: CallSite) -> bool:
    """A collective over an explicit subgroup (`group=g`, or positional):
    only the group's members call it, so a rank test around it is expected."""
    group = site.arg("group", _GROUP_POSITION.get(site.attr or ""))
    if group is None:
        return False
    d = dotted_name(group) or ""
    return not (isinstance(group, cst.Name) and group.value == "None") and not d.endswith("group.WORLD")


def needs_process_group(model: ScriptModel, site: CallSite) -> bool:
    """torch.distributed calls that raise without a default process group."""
    name = _torch_distributed(site)
    return name in COLLECTIVES or name in PROCESS_GROUP_QUERIES


# -- DDP forwards ------------------------------------------------------------------

def _wrap_broadcasts(site: CallSite) -> bool:
    bb = site.arg("broadcast_buffers", 3)
    return not (isinstance(bb, cst.Name) and bb.value == "False")


def holds_ddp(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None = None,
              before: int | None = None) -> CallSite | None:
    """The DDP wrap (with broadcast_buffers on) that `expr` holds where it
    is read, if any (a parameter: the caller decides, see `calls_param`)."""
    made = _ddp_made(model, expr)
    return made.site if made is not None else None


def _ddp_made(model: ScriptModel, expr: cst.BaseExpression) -> Made | None:
    """The DDP wrap (with broadcast_buffers on) `expr` holds, as the object made there."""
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    wrapped = sorted((a for a in value_of(model, expr).made
                      if is_ddp_wrap(a.model, a.site) and not (a.site.qual or "").startswith("apex.")),
                     key=lambda a: a.site.ctx.order)
    return next((a for a in wrapped if _wrap_broadcasts(a.site)), None)


def wraps_module_with_buffers(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    """`expr` holds a DDP wrap whose module has buffers on every path
    (model/buffers.py): its forward broadcasts them even under no_grad."""
    made = _ddp_made(model, expr)
    return made is not None and holds_buffers(made.model, made.site.arg("module", 0))


def ddp_forward(model: ScriptModel, site: CallSite) -> CallSite | None:
    """`model(x)` on a name holding a DDP wrap: the wrap's CallSite."""
    func = site.node.func
    if not isinstance(func, (cst.Name, cst.Attribute)):
        return None
    if isinstance(func, cst.Attribute) and func.attr.value == "module":
        return None
    return holds_ddp(model, func, site.ctx.function, site.ctx.order)


def param_for_arg(fn: FunctionInfo, call: CallSite, arg: cst.Arg) -> str | None:
    if arg.star:
        return None
    if arg.keyword is not None:
        return arg.keyword.value if arg.keyword.value in fn.params else None
    positional = [a for a in call.node.args if a.keyword is None]
    idx = next((i for i, a in enumerate(positional) if a is arg), None)
    if idx is None or any(a.star for a in positional[: idx + 1]):
        return None
    params = list(fn.params)
    if binds_receiver(call, fn):   # `Trainer(model, ...)`, `trainer.fit(model)`, `callback(model)`
        params = params[1:]
    return params[idx] if idx < len(params) else None


@query(on_cycle=None)
def calls_param(model: ScriptModel, fn: FunctionInfo, param: str, grad: bool = False) -> CallSite | None:
    """The function calls its parameter `param` (`model(images)`), directly or
    by handing it to another function of the tree that does, any number of
    calls down (a recursion is the memo's fixed point). With `grad`, only a
    call made with autograd on counts (an adversarial evaluation's
    `loss = model(x).loss; loss.backward()` after its `no_grad` forward)."""
    for c in model.calls_in(fn):
        if isinstance(c.node.func, cst.Name) and c.node.func.value == param:
            if grad and no_grad(model, c.ctx):
                continue
            return c
    for c in model.calls_in(fn):
        if grad and no_grad(model, c.ctx):
            continue
        for a in c.node.args:
            if isinstance(a.value, cst.Name) and a.value.value == param:
                target = resolve_call(model, c)
                if target is None:
                    continue
                p = param_for_arg(target[1], c, a)
                if p and calls_param(target[0], target[1], p, grad) is not None:
                    return c
    return None


# -- collective events ------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """A point in a function where the ranks must meet."""

    site: CallSite                 # the call in this function
    kinds: frozenset[str]          # collective kinds ("barrier", "all_reduce", "forward", ...)
    worlds: frozenset[str]         # worlds reaching the call within its function
    what: str                      # `dist.barrier()`, `model(...)` (DDP forward)
    via: str | None = None         # for helper calls: what the helper does, and where


_RAISES = ("assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "raises")


def expects_failure(model: ScriptModel, site: CallSite) -> bool:
    """The call sits inside `with self.assertRaises(...)` / `with
    pytest.raises(...)`: a test that makes a collective fail on purpose."""
    return any(isinstance(i.item, cst.Call) and (dotted_name(i.item.func) or "").rpartition(".")[2] in _RAISES
               for i in with_items_around(model, site))


def site_worlds(model: ScriptModel, site: CallSite) -> frozenset[str]:
    fn = site.ctx.function
    w = worlds(model, site.ctx)
    return w & function_worlds(model, fn) if fn is not None else w


def _label(site: CallSite) -> str:
    return f"`{site.func}(...)`" if site.func else "this call"


@query(on_cycle=[])
def function_events(model: ScriptModel, fn: FunctionInfo | None) -> list[Event]:
    """Collective events of `fn` (None: module level), in source order."""
    events: list[Event] = []
    for c in model.calls_in(fn):
        worlds = site_worlds(model, c)
        if not worlds & DISTRIBUTED:
            continue
        kind = collective_kind(model, c)
        if kind is not None:
            if not is_subgroup_call(c):
                events.append(Event(c, frozenset({kind}), worlds, _label(c)))
            continue
        wrap = ddp_forward(model, c)
        if wrap is not None:
            # Without autograd, DDP's forward only communicates to broadcast
            # buffers (BatchNorm statistics); a no_grad forward is judged only
            # when the wrapped model has some on every path (nanoGPT's rank-0
            # estimate_loss has none).
            if not no_grad(model, c.ctx) or wraps_module_with_buffers(model, c.node.func):
                events.append(Event(c, frozenset({"forward"}), worlds, f"`{c.func}(...)` (DDP forward)"))
            continue
        # A callee communicates if its module (or one it imports) names a
        # collective or a DDP wrap, or if it is handed a DDP model and runs its
        # forward; any other module is not parsed to find out.
        target = resolve_call(model, c, EVENT_NEED)
        if target is None and model.may_reach(DDP_NEED) and any(
                not a.star and holds_ddp(model, a.value, fn, c.ctx.order) is not None for a in c.node.args):
            target = resolve_call(model, c)
        if target is None or target[1] is fn:
            continue
        tmodel, tfn = target
        where = _where(model, tmodel, tfn)
        # the model handed to a local function that runs its forward
        for a in c.node.args:
            if a.star or holds_ddp(model, a.value, fn, c.ctx.order) is None:
                continue
            p = param_for_arg(tfn, c, a)
            if not p or calls_param(tmodel, tfn, p) is None:
                continue
            # evaluation forwards (under no_grad there or here) are judged only with buffers: see above
            if wraps_module_with_buffers(model, a.value):
                inner = calls_param(tmodel, tfn, p)
            else:
                inner = None if no_grad(model, c.ctx) else calls_param(tmodel, tfn, p, True)
            if inner is not None:
                events.append(Event(c, frozenset({"forward"}), worlds, _label(c),
                                    via=f"runs the DDP forward of `{dotted_name(a.value)}` "
                                        f"(`{inner.func}(...)` in `{tfn.qualname}`{where})"))
            break
        else:
            # a helper's collective under a test of one of its parameters runs only when this call
            # passes a true value (`TempNamedDir(path, sync=False)`: no barrier)
            unguarded = [e for e in function_events(tmodel, tfn) if e.worlds & DISTRIBUTED == DISTRIBUTED
                         and worlds_from_call(tmodel, e.site.ctx, tfn, ((model, c),)) & DISTRIBUTED == DISTRIBUTED]
            if unguarded:
                first = unguarded[0]
                desc = first.what if first.via is None else f"{first.what}, which {first.via}"
                events.append(Event(c, frozenset().union(*(e.kinds for e in unguarded)), worlds, _label(c),
                                    via=f"calls {desc} in `{tfn.qualname}`{where}"))
    return events


def _where(model: ScriptModel, tmodel: ScriptModel, tfn: FunctionInfo) -> str:
    if tmodel is model:
        return ""
    return f", {tmodel.file_name}"


def unbalanced(events: list[Event], model: ScriptModel | None = None) -> list[Event]:
    """Events only some ranks reach, with no partner of the same kind reached
    by the complementary ranks in the same function (`if rank != 0: barrier()`
    ... `if rank == 0: barrier()` is balanced)."""
    partial = sorted((e for e in events if only_some_ranks(e.worlds)), key=lambda e: e.site.ctx.order)
    if model is not None:   # the events' model: skip collectives a test expects to fail
        partial = [e for e in partial if e.via is not None or not expects_failure(model, e.site)]
    # the other arm of the same `if` does the same collective (`if rank == src: barrier() elif ...:
    # barrier()` with a rank test we cannot evaluate): balanced by construction
    partial = [e for e in partial if not any(
        p is not e and p.kinds & e.kinds and exclusive(p.site.ctx, e.site.ctx) for p in events)]
    # one-to-one, in source order: each event pairs with the earliest unpaired
    # event of the same kind reached by the complementary ranks
    waiting: list[Event] = []
    for e in partial:
        side = e.worlds & DISTRIBUTED
        partner = next((p for p in waiting if p.kinds & e.kinds and (p.worlds & DISTRIBUTED) != side), None)
        if partner is not None:
            waiting.remove(partner)
        else:
            waiting.append(e)
    return waiting


# -- "the process group already exists here" ---------------------------------------

@query(on_cycle=True)
def implies_initialized(model: ScriptModel, expr: cst.BaseExpression, positive: bool, scope) -> bool:
    """`expr` being `positive` means the default process group exists.
    Followed through any number of names and returns; this holds of a value
    when it holds of every value it can come from, so a value that depends
    on itself (`ready = ready and dist.is_initialized()` in a loop) is the
    greatest fixed point: it is decided by the values it comes from."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return implies_initialized(model, expr.expression, not positive, scope)
    if isinstance(expr, cst.BooleanOperation):
        left = lambda p: implies_initialized(model, expr.left, p, scope)  # noqa: E731
        right = lambda p: implies_initialized(model, expr.right, p, scope)  # noqa: E731
        if isinstance(expr.operator, cst.And):
            return (left(True) or right(True)) if positive else (left(False) and right(False))
        return (left(True) and right(True)) if positive else (left(False) or right(False))
    if isinstance(expr, cst.Call):
        if not positive:
            return False
        name = dotted_name(expr.func)
        if name and model.imports.qualify(name).rpartition(".")[2] in INITIALIZED_PREDICATES:
            return True
        site = call_site(model, expr)
        target = resolve_call(model, site) if site is not None else None
        if target is not None and target[1].returns:
            tmodel, tfn = target
            return all(implies_initialized(tmodel, v, True, tfn) for v, _ in tfn.returns
                       if not (isinstance(v, cst.Name) and v.value == "False"))
        return False
    if isinstance(expr, cst.Name) and expr.value not in ("True", "False"):
        assigns = bindings_seen(model, expr)
        return bool(assigns) and all(
            a.kind == "assign" and a.value is not None and a.augmented is None
            and implies_initialized(model, a.value, positive, a.ctx.function) for a in assigns
        )
    return False


@query(on_cycle=None)
def tests_initialized(model: ScriptModel, expr: cst.BaseExpression, scope) -> bool | None:
    """True when `expr` is "the default group exists" (`dist.is_initialized()`,
    a flag holding it, through any number of names), False when it is the
    negation, None otherwise (a flag that depends on itself: None)."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        inner = tests_initialized(model, expr.expression, scope)
        return None if inner is None else not inner
    if isinstance(expr, cst.Call):
        name = dotted_name(expr.func)
        return True if name and model.imports.qualify(name).rpartition(".")[2] in INITIALIZED_PREDICATES else None
    if isinstance(expr, cst.Name) and expr.value not in ("True", "False"):
        assigns = bindings_seen(model, expr)
        found = {tests_initialized(model, a.value, a.ctx.function)
                 for a in assigns if a.kind == "assign" and a.value is not None and a.augmented is None}
        return found.pop() if len(found) == 1 and len(assigns) == 1 else None
    return None


def runs_only_uninitialized(model: ScriptModel, site: CallSite) -> bool:
    """`if not dist.is_initialized(): init_process_group()`: the call runs
    only where no default group exists yet (an "ensure" helper)."""
    return any(tests_initialized(model, b.test, b.function) is (not b.positive) for b in site.ctx.branches)


@query(on_cycle=False)
def starts_group(model: ScriptModel, fn: FunctionInfo) -> bool:
    """`fn` (or a function it calls, any number of calls down) starts the
    default group on every call: an init that runs only when none exists
    (`DeviceMesh(...)`, an `ensure_initialized()` helper) says nothing about
    the code before it, and neither does what a call made only then runs."""
    for m, reached in functions_reached(model, fn, _runs_unless_initialized):
        if any(is_init_call(m, c) and not runs_only_uninitialized(m, c) for c in m.calls_in(reached)):
            return True
    return False


def _runs_unless_initialized(model: ScriptModel, site: CallSite) -> list[tuple[ScriptModel, FunctionInfo]]:
    """What a call that runs whether or not a group exists leads to, in a
    module that can reach init_process_group."""
    if runs_only_uninitialized(model, site):
        return []
    target = resolve_call(model, site, INIT_NEED)
    return [target] if target is not None and target[0].may_reach(INIT_NEED) else []


def initialized_guarded(model: ScriptModel, site: CallSite) -> bool:
    """The call only runs where the default process group already exists."""
    if site.ctx.opaque:   # a try body or a lambda: its timing is not judged
        return True
    return any(implies_initialized(model, b.test, b.positive, b.function) for b in site.ctx.branches)


__all__ = [
    "COLLECTIVES", "collective_kind", "ddp_forward", "holds_ddp", "function_events", "unbalanced",
    "needs_process_group", "PROCESS_GROUP_NEED", "initialized_guarded", "implies_initialized", "tests_initialized",
    "runs_only_uninitialized", "starts_group", "Event", "site_worlds",
    "is_subgroup_call", "calls_param", "param_for_arg",
]
