"""Sharded models and the checkpoint calls that are collectives.

A sharded value is known by how it was made, never by its name:
- FSDP (FSDP1): `FSDP(model, ...)` / `FullyShardedDataParallel(...)` from
  `torch.distributed.fsdp` (or fairscale's);
- FSDP2: `fully_shard(model)` (in place or assigned);
- a DeepSpeed engine: the first element of `deepspeed.initialize(...)`
  (`model_engine, optimizer, _, _ = deepspeed.initialize(...)`).

Checkpoint calls that every rank must make together (checked in torch 2.13's
source and DeepSpeed's documentation):
- FSDP1 `model.state_dict()`: its pre-state-dict hook unshards (all-gathers)
  the parameters under FULL_STATE_DICT (the default) and SHARDED_STATE_DICT;
  only LOCAL_STATE_DICT, and NO_SHARD with `use_orig_params`, skip that;
- `FSDP.full_optim_state_dict` / `FSDP.optim_state_dict` /
  `FSDP.sharded_optim_state_dict` ("needs to be called on all ranks since it
  uses collective communications"), and `FSDP.summon_full_params(model)`
  (it all-gathers the parameters for the `with` body);
- `torch.distributed.checkpoint.state_dict.get_state_dict` /
  `get_model_state_dict` / `get_optimizer_state_dict` on an FSDP1 model (it
  enters FSDP's state-dict context), or with
  `StateDictOptions(full_state_dict=True)` on an FSDP/FSDP2 model (it gathers
  the DTensors); on a plain or DDP model they communicate nothing;
- `torch.distributed.checkpoint.save` / `async_save` / `save_state_dict`
  (planning is a gather + scatter over the group), unless `no_dist=True` or
  `use_collectives=False`;
- DeepSpeed's `engine.save_checkpoint(...)` ("all processes must call this
  method", it syncs inside).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import libcst as cst

from ddpcheck.model.collectives import site_worlds
from ddpcheck.model.flow import Item, Made, argument_expr, arguments_for, call_argument, is_param, value_at, value_of
from ddpcheck.model.reads import reads
from ddpcheck.model.names import dotted_name
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.values import is_api_call
from ddpcheck.model.withblocks import with_items_around
from ddpcheck.model.worlds import DISTRIBUTED
from ddpcheck.model.flow import resolve_call


class Sharded(Enum):
    FSDP = "FSDP"
    FSDP2 = "FSDP2 (fully_shard)"
    DEEPSPEED = "DeepSpeed engine"


# FSDP static methods that gather over the group (optimizer state; the
# full parameters inside `with FSDP.summon_full_params(model):`)
FSDP_COLLECTIVE_APIS = ("full_optim_state_dict", "optim_state_dict", "sharded_optim_state_dict", "summon_full_params")
DCP_STATE_DICT_APIS = ("get_state_dict", "get_model_state_dict", "get_optimizer_state_dict")
DCP_MODULES = ("torch.distributed.checkpoint.state_dict.",)
DCP_SAVE = {
    "torch.distributed.checkpoint.save", "torch.distributed.checkpoint.async_save",
    "torch.distributed.checkpoint.save_state_dict", "torch.distributed.checkpoint.state_dict_saver.save",
    "torch.distributed.checkpoint.state_dict_saver.async_save",
    "torch.distributed.checkpoint.state_dict_saver.save_state_dict",
}


def is_distributed_checkpoint_save(qual: str | None) -> bool:
    """`torch.distributed.checkpoint.save` and friends: every rank must call
    them (each writes its own shard), unlike `torch.save`."""
    return (qual or "") in DCP_SAVE


def _is_fsdp_wrap(model: ScriptModel, site: CallSite) -> bool:
    if is_api_call(model, site, "FullyShardedDataParallel"):
        return (site.qual or "").startswith("torch.")
    q = site.qual or ""
    return q.startswith("fairscale.") and q.endswith(".FullyShardedDataParallel")


def _fsdp_communicates(site: CallSite) -> bool:
    """An FSDP1 wrap whose state_dict() unshards: not NO_SHARD with use_orig_params."""
    no_shard = any(a.keyword is not None and a.keyword.value == "sharding_strategy"
                   and (dotted_name(a.value) or "").endswith("NO_SHARD") for a in site.node.args)
    orig = any(a.keyword is not None and a.keyword.value == "use_orig_params"
               and isinstance(a.value, cst.Name) and a.value.value == "True" for a in site.node.args)
    return not (no_shard and orig)


def _is_fully_shard(site: CallSite) -> bool:
    q = site.qual or ""
    return q.rpartition(".")[2] == "fully_shard" and q.startswith("torch.distributed.")


def _is_deepspeed_initialize(site: CallSite | None) -> bool:
    return site is not None and (site.qual or "") == "deepspeed.initialize"


def param_root(expr: cst.BaseExpression | None, scope: FunctionInfo | None) -> str | None:
    """The parameter of `scope` an expression is (`model` in `model.state_dict()`)."""
    if not isinstance(expr, cst.Name):
        return None
    return expr.value if is_param(scope, expr.value) is scope and scope is not None and \
        expr.value not in ("self", "cls") else None


def _is_deepspeed_engine(atom) -> bool:
    """The first element of what `deepspeed.initialize(...)` returns
    (`engine, optimizer, _, _ = deepspeed.initialize(...)`)."""
    return isinstance(atom, Item) and atom.key == 0 and isinstance(atom.receiver, Made) and \
        _is_deepspeed_initialize(atom.receiver.site)


@query(on_cycle=None)
def sharded_kind(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None) -> Sharded | None:
    """What kind of sharded value `expr` holds, from how it was made (the
    value engine: assignments, builders' returns, `self` attributes, what
    the file passes to a parameter, tuple unpacking); None when not known."""
    value = value_at(model, expr)
    for atom in sorted(value.made, key=lambda a: a.site.ctx.order):
        if _is_fsdp_wrap(atom.model, atom.site):
            return Sharded.FSDP if _fsdp_communicates(atom.site) else None
        if _is_fully_shard(atom.site):
            return Sharded.FSDP2
    if any(_is_deepspeed_engine(a) for a in value.atoms):
        return Sharded.DEEPSPEED
    # `fully_shard(model)` in place, in the same function: the object it was given
    for c in model.calls_in(scope):
        target = c.arg("module", 0)
        if _is_fully_shard(c) and target is not None and value.atoms & value_of(model, target).atoms:
            return Sharded.FSDP2
    return None


def _full_state_dict(model: ScriptModel, site: CallSite) -> bool:
    """`options=StateDictOptions(full_state_dict=True)`, built there or in what is passed."""
    options = site.arg("options")
    if options is None:
        return False
    for atom in value_at(model, options).made:
        flag = call_argument(atom.model, atom.site, "full_state_dict")
        if flag is not None and flag.constant is True:
            return True
    return False


def _local_state_dict_context(model: ScriptModel, site: CallSite) -> bool:
    """Inside `with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):`."""
    return any(any(n.endswith("LOCAL_STATE_DICT") for n in reads(model, item.item))
               for item in with_items_around(model, site))


@dataclass(frozen=True)
class Need:
    """A checkpoint collective: a call that needs every rank."""

    site: CallSite                        # the innermost call that communicates
    api: str                              # how to name it: "`model.state_dict()`"
    accepts: frozenset[Sharded] = frozenset()   # kinds of `param` for which it is a collective
    param: str | None = None              # a parameter decides whether it communicates
    kind: Sharded | None = None           # the sharded value's kind, when known
    via: tuple[str, ...] = ()             # helper calls leading to it, outermost first

    @property
    def known(self) -> bool:
        return self.param is None


def _decide(need: Need, kind: Sharded | None) -> Need | None:
    return Need(need.site, need.api, kind=kind, via=need.via) if kind in need.accepts else None


def direct_need(model: ScriptModel, site: CallSite) -> Need | None:
    """The call is itself a checkpoint collective (known), may be one depending
    on a parameter (param set), or neither (None)."""
    scope = site.ctx.function
    q = site.qual or ""
    label = f"`{site.func}(...)`" if site.func else "this call"
    if site.attr == "state_dict" and site.receiver is not None and not site.node.args:
        if _local_state_dict_context(model, site):
            return None
        need = Need(site, f"`{site.func}()`", frozenset({Sharded.FSDP}))
        return _with_value(model, need, site.receiver, scope)
    if site.attr == "save_checkpoint" and site.receiver is not None:
        need = Need(site, label, frozenset({Sharded.DEEPSPEED}))
        return _with_value(model, need, site.receiver, scope)
    if site.attr in FSDP_COLLECTIVE_APIS and "FullyShardedDataParallel" in q and q.startswith("torch."):
        return Need(site, label, kind=Sharded.FSDP)
    if site.attr == "summon_full_params" and site.receiver is not None:   # `model.summon_full_params(model)`
        return _with_value(model, Need(site, label, frozenset({Sharded.FSDP})), site.receiver, scope)
    if site.attr in DCP_STATE_DICT_APIS and q.startswith(DCP_MODULES):
        accepts = {Sharded.FSDP}
        if _full_state_dict(model, site):
            accepts.add(Sharded.FSDP2)
        return _with_value(model, Need(site, label, frozenset(accepts)), site.arg("model", 0), scope)
    if q in DCP_SAVE:
        for keyword in ("no_dist", "use_collectives"):
            if site.arg(keyword) is not None:
                value = site.arg(keyword)
                if not (isinstance(value, cst.Name) and value.value == ("False" if keyword == "no_dist" else "True")):
                    return None
        return Need(site, label)
    return None


def _with_value(model: ScriptModel, need: Need, expr: cst.BaseExpression | None,
                scope: FunctionInfo | None) -> Need | None:
    if expr is None:
        return None
    param = param_root(expr, scope)
    if param is not None:
        return Need(need.site, need.api, need.accepts, param=param, via=need.via)
    return _decide(need, sharded_kind(model, expr, scope))


def through_call(model: ScriptModel, call: CallSite, target: FunctionInfo, inner: Need) -> Need | None:
    """A need of `target` as seen from `call` in its caller: decided by the
    argument for its parameter, or still open on a parameter of the caller."""
    via = (f"`{call.func}(...)`" if call.func else "this call",) + inner.via
    lifted = Need(inner.site, inner.api, inner.accepts, inner.param, inner.kind, via)
    if inner.known:
        return lifted
    bound, arg = argument_expr(call, target, inner.param)
    if not bound or arg is None:
        return None
    return _with_value(model, Need(inner.site, inner.api, inner.accepts, via=via), arg, call.ctx.function)


@query(on_cycle=())
def function_needs(model: ScriptModel, fn: FunctionInfo) -> tuple[Need, ...]:
    """The checkpoint collectives a function makes on every rank that calls
    it (directly, or in the local helpers it calls, three deep)."""
    found: list[Need] = []
    for c in model.calls_in(fn):
        if site_worlds(model, c) & DISTRIBUTED != DISTRIBUTED:
            continue   # a rank-only call inside: judged where it is
        need = call_need(model, c)
        if need is not None:
            found.append(need)
    return tuple(found)


def call_need(model: ScriptModel, site: CallSite) -> Need | None:
    """The checkpoint collective a call makes: itself, or a helper it calls."""
    need = direct_need(model, site)
    if need is not None:
        return need
    target = resolve_call(model, site)
    if target is None or target[1] is site.ctx.function:
        return None
    tmodel, tfn = target
    for inner in function_needs(tmodel, tfn):
        lifted = through_call(model, site, tfn, inner)
        if lifted is not None:
            return lifted
    return None


def decided_by_callers(model: ScriptModel, fn: FunctionInfo, need: Need) -> Need | None:
    """A need open on a parameter of `fn`, decided by what the file's calls
    of `fn` pass (`save(fsdp_model)`): the first argument of a known kind."""
    for arg in arguments_for(model, fn, need.param) or ():
        decided = _decide(need, sharded_kind(arg.model, arg.expr, arg.scope))
        if decided is not None:
            return decided
    return None


__all__ = ["is_distributed_checkpoint_save", "Sharded", "Need", "sharded_kind", "direct_need", "call_need", "function_needs", "decided_by_callers"]
