"""DDP302 wrapped-state-dict."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.reads import reads
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import wraps
from ddpcheck.model.flow import argument_expr, params_handed_on, sole_binding
from ddpcheck.model.memo import query
from ddpcheck.model.positions import line_of
from ddpcheck.model.saves import STRIPS_MODULE_PREFIX, is_save_sink, saved_state_dicts
from ddpcheck.model.wrappers import (
    kinds_told_apart, project_strips_prefix, strips_prefix, tells_kinds_apart, tells_wrapper_apart, unwrapped_fallback,
    wrapper_in,
)
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import unwrap_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call


def _told_apart(model: ScriptModel, node: cst.IfExp) -> bool:
    """`m.module.state_dict() if args.distributed else m.state_dict()`: the author tells them apart."""
    arms = reads(model, node.body) | reads(model, node.orelse)
    return tells_wrapper_apart(model, node.test) or any(n.endswith(".module") for n in arms)


def _is_sink(model: ScriptModel, site: CallSite) -> bool:
    return is_save_sink(model, site, STRIPS_MODULE_PREFIX, strips_prefix)


def _saved(model: ScriptModel, sink: CallSite) -> list[CallSite]:
    return saved_state_dicts(model, sink, _told_apart, strips_prefix)


@register
class WrappedStateDict(Rule):
    code = "DDP302"
    triggers = (USES_DISTRIBUTED,)
    name = "wrapped-state-dict"
    short = "wrapper's state_dict saved: keys get a `module.` prefix"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    fixable = True
    message = ("the state_dict of the DDP/DataParallel wrapper is saved: every key gets a `module.` prefix, "
               "so the checkpoint does not load into the plain model")
    fix = "save `model.module.state_dict()` (keep `model_without_ddp = model.module` after wrapping)"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not wraps(model) or project_strips_prefix(model):
            return   # no wrapper; or the project reads its checkpoints back through a renaming of the keys
        reported: set[int] = set()
        for sink in model.calls:
            if not _is_sink(model, sink):
                continue
            for sd in _saved(model, sink):
                if id(sd.node) in reported:
                    continue
                key = dotted_name(sd.receiver)
                if key is None or unwrapped_fallback(model, sd.node, key):
                    continue   # the `except AttributeError:` fallback for a plain object
                found = wrapper_in(model, sd.receiver, sd.ctx)
                if found is None or found[0].overrides("state_dict"):
                    continue
                w, via = found
                if any(tells_kinds_apart(model, b.test, _kinds(model, w)) for b in sd.ctx.branches):
                    continue   # told apart (`isinstance(m, DataParallel)` tells only DataParallel apart)
                reported.add(id(sd.node))
                yield self._hit(model, sd.node, key, w, via,
                                edit=unwrap_edit(model, sd, key, w.site) if via is None else None)
            yield from self._through_helper(model, sink, reported)

    def _through_helper(self, model: ScriptModel, sink: CallSite, reported: set[int]) -> Iterator[Hit]:
        """`save_checkpoint(model, path)` into a helper module whose body saves
        `model.state_dict()`: the wrapper crosses the module as an argument."""
        target = resolve_call(model, sink)
        if target is None or target[0] is model:
            return
        tmodel, fn = target
        for param, where, sd, told in saved_params(tmodel, fn):
            bound, expr = argument_expr(sink, fn, param)
            if not bound or expr is None or id(expr) in reported:
                continue
            found = wrapper_in(model, expr, sink.ctx)
            if found is None or found[0].overrides("state_dict") or _kinds(model, found[0]) <= told:
                continue   # the helper tells every kind the argument may hold apart
            reported.add(id(expr))
            yield self._hit(model, expr, dotted_name(expr) or "model", found[0], found[1],
                            helper=_helper_place(tmodel, fn, where, sd))

    def _hit(self, model: ScriptModel, node: cst.CSTNode, key: str, w, via: CallSite | None,
             helper: str | None = None, edit=None) -> Hit:
        kinds = _kinds(model, w)
        kind = "DistributedDataParallel or DataParallel" if len(kinds) > 1 else w.kind
        shown = w.key or key
        if helper is not None:
            what = f"`{key}` is handed to {helper}, which saves `.state_dict()` of it, while it holds the {kind} wrapper"
        elif via is not None:
            caller = via.ctx.function.name + "()" if via.ctx.function is not None else "module-level code"
            what = (f"`{key}.state_dict()` is saved and `{key}` is the {kind} wrapper that "
                    f"`{via.func or 'a call'}(...)` in {caller} passes in")
        else:
            what = f"`{key}.state_dict()` is saved while `{key}` holds the {kind} wrapper"
        return Hit(node, message=(
            f"{what}: every key is prefixed with `module.` (`module.conv1.weight`), so the checkpoint does not "
            "load into an unwrapped model (single-GPU evaluation, export, fine-tuning) without renaming its keys, "
            "and loading it back needs the same wrapper"
        ), fix=(f"save `{shown}.module.state_dict()`, or keep `{shown}_without_ddp = {shown}.module` right after "
                "wrapping and save (and load) through it, as torchvision's references do"), edit=edit)


def _kinds(model: ScriptModel, w) -> frozenset[str]:
    """The wrapper kinds the name holding `w` may hold (`model = DataParallel(model)` on one arm,
    `model = DDP(model)` on the other)."""
    return frozenset({x.kind for x in wraps(model) if x.key == w.key} | {w.kind})


def _helper_place(tmodel: ScriptModel, fn: FunctionInfo, where: ScriptModel, sd: CallSite) -> str:
    """`save_checkpoint() (checkpoint.py)`, naming the line of the save when it
    is in a function the helper calls: `end_of_epoch() (bookkeeping.py; saved at storage.py:6)`."""
    place = f"{fn.name}() ({tmodel.file_name}"
    if where is not tmodel or sd.ctx.function is not fn:
        line = line_of(where, sd.node)
        place += f"; saved at {where.file_name}:{line}" if line is not None else ""
    return place + ")"


@query(on_cycle=())
def saved_params(model: ScriptModel, fn: FunctionInfo
                 ) -> tuple[tuple[str, ScriptModel, CallSite, frozenset[str]], ...]:
    """The parameters of `fn` whose `.state_dict()` it saves, unrenamed
    (`def save_checkpoint(model, path): torch.save({"model": model.state_dict()}, path)`),
    itself or in a function of the tree it hands the parameter on to, in
    any module (`end_of_epoch(net, ...)` -> `write_state(net, path)`), each
    with the `.state_dict()` call that saves it, that call's model, and the
    wrapper kinds the tests around it tell apart (`if isinstance(model,
    DataParallel): ... else: model.state_dict()` saves a DDP wrapper's keys)."""
    found: dict[str, tuple[str, ScriptModel, CallSite, frozenset[str]]] = {}
    for sink in model.calls_in(fn):
        if not _is_sink(model, sink):
            continue
        for sd in _saved(model, sink):
            key = dotted_name(sd.receiver)
            bound = sole_binding(model, sd.receiver)
            told = [kinds_told_apart(model, b.test) for b in sd.ctx.branches]
            if key in fn.params and key not in found and None not in told and \
                    not unwrapped_fallback(model, sd.node, key) and \
                    bound is not None and bound.kind == "param" and bound.ctx.function is fn:
                found[key] = (key, model, sd, frozenset().union(*told))
    for param, call, tmodel, callee, tparam in params_handed_on(model, fn):
        if param in found or any(tells_wrapper_apart(model, b.test) for b in call.ctx.branches) or \
                unwrapped_fallback(model, call.node, param):
            continue   # `if hasattr(net, "module"): ... else: write_state(net, path)`
        inner = next((x for x in saved_params(tmodel, callee) if x[0] == tparam), None)
        if inner is not None:
            found[param] = (param, inner[1], inner[2], inner[3])
    return tuple(found.values())
