"""Which rank a value is: the global rank of the job, or a rank local to the node.

On one node the two are equal, which is why a script that picks its GPU with
the global rank works until it runs on two: rank 8 of 2 x 8 GPUs asks for GPU
8. This module answers "is this expression certainly the global rank?" and
nothing weaker: a name called `rank` is not enough (it is mp.spawn's process
index in the PyTorch DDP tutorial, local by construction), and anything not
traced to a global source stays unknown.

  GLOBAL  `dist.get_rank()`, `os.environ["RANK"]` (also SLURM_PROCID,
          OMPI_COMM_WORLD_RANK, PMI_RANK), `node_rank * gpus_per_node + i`,
          a local helper that returns one of them (torchvision's
          `utils.get_rank()`), and names assigned only from such values.
  LOCAL   `LOCAL_RANK`, `SLURM_LOCALID`, `x % torch.cuda.device_count()`,
          `x % ngpus_per_node` (any remainder: it is folded onto the node).
  UNKNOWN everything else: parameters whose callers are not all seen
          (a function handed to mp.spawn gets the spawn index), loop
          indices, attributes set where the linter cannot see.
A parameter is what the file's calls pass for it (model/flow.py's
`arguments_for`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.distributed import init_calls, starts_own_workers
from ddpcheck.model.env import env_writes
from ddpcheck.model.flow import arguments_for, bindings_seen
from ddpcheck.model.guards import RANK_ENV
from ddpcheck.model.names import dotted_name, environ_key, string_value
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.flow import argument_expr, params_handed_on, resolve_call, store_before_call
from ddpcheck.model.devices import GpuChoice, gpu_choices

# Environment variables that hold a rank local to the node; the other rank
# variables guards.RANK_ENV knows are global.
LOCAL_RANK_ENV = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
GLOBAL_RANK_ENV = frozenset(RANK_ENV) - LOCAL_RANK_ENV
GLOBAL_RANK_FUNCTIONS = ("torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank")
# Names of the node index in `node_rank * gpus_per_node + gpu` (ImageNet's
# `args.rank * ngpus_per_node + gpu`, where `--rank` is the node's rank).
NODE_INDEX_NAMES = frozenset({"node_rank", "nr", "node", "node_id", "node_idx", "node_index", "machine_rank",
                              "rank", "group_rank"})

_ENV_GET = frozenset({"os.environ.get", "os.getenv", "os.environ.setdefault"})


class RankKind(enum.Enum):
    GLOBAL = "global"
    LOCAL = "local"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RankOrigin:
    kind: RankKind
    source: str = ""          # how the global rank was obtained: "`dist.get_rank()`", "`RANK`"
    literal: bool = False     # a constant (`rank = 0` in a single-process arm): neutral when merging


UNKNOWN = RankOrigin(RankKind.UNKNOWN)
LOCAL = RankOrigin(RankKind.LOCAL)
_CONSTANT = RankOrigin(RankKind.UNKNOWN, literal=True)


def _merge(origins: list[RankOrigin]) -> RankOrigin:
    """Several values a name can hold: global only when every non-constant one is."""
    real = [o for o in origins if not o.literal]
    if not real:
        return _CONSTANT if origins else UNKNOWN
    if all(o.kind is RankKind.GLOBAL for o in real):
        return real[0]
    if all(o.kind is RankKind.LOCAL for o in real):
        return LOCAL
    return UNKNOWN


def _last_name(expr: cst.BaseExpression) -> str | None:
    d = dotted_name(expr)
    return d.rpartition(".")[2] if d else None


@query(on_cycle=UNKNOWN)
def rank_origin(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None) -> RankOrigin:
    """Whether `expr`, read in `scope`, is the global rank, a local rank, or
    unknown. Followed through any number of names, returns and callers; a
    value that depends on itself (`rank = rank + 0` in a loop, two functions
    returning each other's result) is the memo's fixed point from UNKNOWN,
    which never becomes GLOBAL by itself."""
    if isinstance(expr, (cst.Integer, cst.SimpleString)) or (
            isinstance(expr, cst.UnaryOperation) and isinstance(expr.expression, cst.Integer)):
        return _CONSTANT
    if isinstance(expr, cst.Subscript):
        return _env_origin(model, environ_key(model.imports, expr))
    if isinstance(expr, cst.IfExp):
        return _merge([rank_origin(model, expr.body, scope),
                       rank_origin(model, expr.orelse, scope)])
    if isinstance(expr, cst.BinaryOperation):
        return _binary_origin(model, expr, scope)
    if isinstance(expr, cst.Call):
        return _call_origin(model, expr, scope)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _name_origin(model, expr, scope)
    return UNKNOWN


def _env_origin(model: ScriptModel, name: str | None) -> RankOrigin:
    if name in LOCAL_RANK_ENV:
        return LOCAL
    if name in GLOBAL_RANK_ENV and not env_writes(model, name) and init_calls(model):
        # set by the launcher (a script that writes RANK itself decides what it
        # holds). A module that does not start the group itself (a Trainer class
        # built by the entry script) is not judged: its caller may have written
        # RANK from mp.spawn's index.
        return RankOrigin(RankKind.GLOBAL, f"the `{name}` environment variable")
    return UNKNOWN


def _binary_origin(model: ScriptModel, expr: cst.BinaryOperation, scope) -> RankOrigin:
    if isinstance(expr.operator, cst.Modulo):
        # `rank % torch.cuda.device_count()`, `rank % ngpus_per_node`: folded onto the node
        return LOCAL if not isinstance(expr.left, (cst.SimpleString, cst.ConcatenatedString)) else UNKNOWN
    if isinstance(expr.operator, cst.Add):
        for product, other in ((expr.left, expr.right), (expr.right, expr.left)):
            if isinstance(product, cst.BinaryOperation) and isinstance(product.operator, cst.Multiply):
                names = {_last_name(product.left), _last_name(product.right)}
                if names & NODE_INDEX_NAMES and not isinstance(other, cst.Integer):
                    text = model.module.code_for_node(expr)
                    return RankOrigin(RankKind.GLOBAL, f"`{text}` (node index x GPUs per node + local index)")
    return UNKNOWN


def _call_origin(model: ScriptModel, expr: cst.Call, scope) -> RankOrigin:
    site = model.site_of.get(id(expr))
    if site is None:
        return UNKNOWN
    q = site.qual or ""
    if q in GLOBAL_RANK_FUNCTIONS and not expr.args:
        if _spawned_single_node(model):
            return UNKNOWN
        return RankOrigin(RankKind.GLOBAL, f"`{site.func}()`")
    if q in ("int", "str") and len(expr.args) == 1:
        return rank_origin(model, expr.args[0].value, scope)
    if q in _ENV_GET and expr.args:
        return _env_origin(model, string_value(expr.args[0].value))
    target = resolve_call(model, site)
    if target is not None and not expr.args:
        tmodel, fn = target
        if fn.returns:
            origin = _merge([rank_origin(tmodel, value, fn) for value, _ in fn.returns])
            if origin.kind is RankKind.GLOBAL:
                return RankOrigin(RankKind.GLOBAL, f"`{site.func}()`, which returns {origin.source}")
            return origin if not origin.literal else UNKNOWN
    return UNKNOWN


def _name_origin(model: ScriptModel, expr: cst.BaseExpression, scope) -> RankOrigin:
    key = dotted_name(expr)
    if key is None:
        return UNKNOWN
    seen = bindings_seen(model, expr)
    if seen and all(b.kind == "param" for b in seen) and isinstance(expr, cst.Name):
        return _param_origin(model, seen[0].ctx.function, key)
    assigns = list(seen)
    if any(b.kind != "assign" for b in assigns):
        return UNKNOWN
    values = [_assigned_value(a) for a in assigns]
    if not assigns or any(v is None or a.augmented is not None for a, v in zip(assigns, values)):
        return UNKNOWN
    origins = [rank_origin(model, v, a.ctx.function) for a, v in zip(assigns, values)]
    merged = _merge(origins)
    if merged.literal:
        return UNKNOWN
    return merged


def _assigned_value(a) -> cst.BaseExpression | None:
    """The value an assignment gives its name: `rank, ws = dist.get_rank(), dist.get_world_size()`
    gives `rank` the first element (a tuple a call returns is not split here)."""
    if a.value is not None:
        return a.value
    if a.unpacked is not None:
        value, index = a.unpacked
        if isinstance(value, (cst.Tuple, cst.List)) and index < len(value.elements):
            element = value.elements[index]
            return None if isinstance(element, cst.StarredElement) else element.value
    return None


def _param_origin(model: ScriptModel, fn: FunctionInfo, name: str) -> RankOrigin:
    """A parameter is what the file's callers pass (`setup(rank, world_size)`
    called with `int(os.environ["RANK"])`). Unknown when the function is also
    handed on (`mp.spawn(demo_basic, ...)`: the spawn index), has no caller
    here, or is reassigned inside."""
    if any(a.key == name for a in model.assigns_in(fn)):
        return UNKNOWN
    args = arguments_for(model, fn, name)
    if args is None:
        return UNKNOWN
    origin = _merge([rank_origin(a.model, a.expr, a.scope) for a in args])
    if origin.kind is RankKind.GLOBAL:
        callers = sorted({f"`{a.call.func}(...)`" for a in args if a.call.func})
        via = f", passed in by {', '.join(callers)}" if callers else ""
        return RankOrigin(RankKind.GLOBAL, f"{origin.source}{via}")
    return origin if not origin.literal else UNKNOWN


def _spawned_single_node(model: ScriptModel) -> bool:
    """mp.spawn scripts give each worker its rank themselves; unless they
    build it as `node_rank * gpus + i` (then the arithmetic is what is
    reported), `dist.get_rank()` there is the spawn index: local."""
    return starts_own_workers(model)


@dataclass(frozen=True)
class HandedRank:
    """A GPU picked in a helper of another module by a number this file's call hands it
    (`run_training(model, args)` whose body runs `.cuda(args.rank)`): where, and what it is here."""

    model: ScriptModel           # the helper's module
    choice: GpuChoice            # the GPU choice there
    origin: RankOrigin           # what the number is, as this file's call hands it


def ranks_handed_to_helpers(model: ScriptModel, call: CallSite) -> list[HandedRank]:
    """The GPU choices a call of this file into a function of another module
    makes with a number the call hands it, any number of calls down while
    each hands its parameter on unchanged: a parameter itself (`cuda(rank)`
    for `train(net, args.rank)`), or an attribute of one (`cuda(args.rank)`
    for `train(net, args)`, judged by the last store of `args.rank` this
    file's function makes before the call on every path)."""
    target = resolve_call(model, call)
    if target is None or target[0] is model:
        return []
    found: list[HandedRank] = []
    start = {name: expr for name in target[1].params
             for bound, expr in [argument_expr(call, target[1], name)] if bound and expr is not None}
    todo = [(target[0], target[1], start)]
    seen: set[int] = set()
    while todo:
        tmodel, fn, handed = todo.pop()
        if id(fn.node) in seen or not handed:
            continue
        seen.add(id(fn.node))
        for choice in gpu_choices(tmodel):
            if choice.ctx.function is not fn:
                continue
            origin = _handed_origin(model, call, choice.index, handed)
            if origin is not None:
                found.append(HandedRank(tmodel, choice, origin))
        for param, _c, cmodel, callee, cparam in params_handed_on(tmodel, fn):
            if param in handed:
                todo.append((cmodel, callee, {cparam: handed[param]}))
    return found


def _handed_origin(model: ScriptModel, call: CallSite, index: cst.BaseExpression, handed: dict) -> RankOrigin | None:
    if isinstance(index, cst.Name) and index.value in handed:
        return rank_origin(model, handed[index.value], call.ctx.function)
    if isinstance(index, cst.Attribute) and isinstance(index.value, cst.Name) and index.value.value in handed:
        head = dotted_name(handed[index.value.value])
        if head is None:
            return None
        known, store = store_before_call(model, call, f"{head}.{index.attr.value}")
        if known and store is not None and store.value is not None:
            return rank_origin(model, store.value, store.ctx.function)
    return None


__all__ = ["RankKind", "RankOrigin", "rank_origin", "HandedRank", "ranks_handed_to_helpers", "GLOBAL_RANK_ENV", "LOCAL_RANK_ENV"]
