"""DDP205 wrapper-attribute."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.findings import Severity
from ddpcheck.model.module_api import on_wrapper
from ddpcheck.model.flow import argument_expr
from ddpcheck.model.names import dotted_name
from ddpcheck.model.positions import line_of
from ddpcheck.model.memo import query
from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.values import WrapInfo, wraps
from ddpcheck.model.wrappers import tells_wrapper_apart, wrapper_in
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call
from ddpcheck.model.guards import reached_from_call, worlds
from ddpcheck.model.reach import reaching_worlds


def _loop_variable(key: str, ctx: Ctx) -> bool:
    """`for model in models:`: the loop rebinds the name."""
    root = key.partition(".")[0]
    return any(root in loop.targets for loop in ctx.loops)


def _told_apart(model: ScriptModel, ctx: Ctx) -> bool:
    """Inside `if isinstance(model, DDP):` / `if hasattr(model, "module"):` / `try:`."""
    return ctx.opaque or any(tells_wrapper_apart(model, b.test) for b in ctx.branches)


def _is_torch_wrapper(w: WrapInfo) -> bool:
    # apex's DDP, and a class of the tree deriving from torch's wrapper, have an API of their own;
    # only torch's wrappers are judged
    q = w.site.qual or ""
    return not q.startswith("apex.") and w.subclass is None


def _same_process(model: ScriptModel, w: WrapInfo, read: Ctx, via) -> bool:
    """Some process both makes the wrap and runs the read with it: the
    worlds the read runs in (through the call that passes the wrapper in,
    when it is passed) meet those that reach the wrap. `if args.distributed:
    model = DDP(model)` and a read only under `if args.world_size == 1:`
    (or in a helper whose only call sits there) never meet."""
    here = worlds(model, read) & (reaching_worlds(model, via.ctx) if via is not None else
                                  reaching_worlds(model, read))
    return bool(here & reaching_worlds(model, w.site.ctx))


@query(on_cycle=())
def user_attributes(model: ScriptModel, fn: FunctionInfo, param: str) -> tuple[tuple[str, cst.Attribute, Ctx], ...]:
    """`param.X` reads in `fn` (never reassigned there) with X not on the
    wrapper, outside code that tells wrapper and model apart."""
    if any(a.key == param for a in model.assigns_in(fn)):
        return ()
    set_on = {a.key for a in model.assigns}
    found = []
    for attr, refs in model.references.items():
        if on_wrapper(attr) or f"{param}.{attr}" in set_on:
            continue
        for r in refs:
            if r.via_attribute and isinstance(r.node, cst.Attribute) and r.ctx.function is fn and \
                    dotted_name(r.node.value) == param and not _loop_variable(param, r.ctx) and \
                    not _told_apart(model, r.ctx):
                found.append((attr, r.node, r.ctx))
    return tuple(found)


@register
class WrapperAttribute(Rule):
    code = "DDP205"
    triggers = (USES_DISTRIBUTED,)
    name = "wrapper-attribute"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    short = "user attribute reached through the DDP wrapper: AttributeError"
    message = ("a method or attribute of the model is reached through the DDP/DataParallel wrapper, which does "
               "not forward it: AttributeError at run time")
    fix = "reach it through the wrapped model: `model.module.X` (or keep `model_without_ddp = model.module`)"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        wrapped = {w.key for w in wraps(model) if w.key and _is_torch_wrapper(w)}
        if not wrapped:
            return
        # attributes the script sets on the wrapper itself are there
        set_on = {a.key for a in model.assigns}
        for attr, refs in model.references.items():
            if on_wrapper(attr):
                continue
            for r in refs:
                node = r.node
                if not r.via_attribute or not isinstance(node, cst.Attribute):
                    continue
                key = dotted_name(node.value)
                if key is None or f"{key}.{attr}" in set_on:
                    continue
                fn = r.ctx.function
                if key not in wrapped and not (fn is not None and key in fn.params):
                    continue
                if _loop_variable(key, r.ctx) or _told_apart(model, r.ctx):
                    continue
                found = wrapper_in(model, node.value, r.ctx)
                if found is None:
                    continue
                w, via = found
                if not _is_torch_wrapper(w) or not _same_process(model, w, r.ctx, via):
                    continue
                kind = "DistributedDataParallel" if w.kind == "DistributedDataParallel" else "DataParallel"
                if via is not None:
                    caller = via.ctx.function.name + "()" if via.ctx.function is not None else "module-level code"
                    holds = f"`{key}` is the {kind} wrapper that `{via.func or 'a call'}(...)` in {caller} passes in"
                else:
                    holds = f"`{key}` holds the {kind} wrapper here"
                yield Hit(node, message=(
                    f"`{key}.{attr}`: {holds}, and `{attr}` is not one of its "
                    f"attributes (it belongs to the wrapped model): AttributeError: '{kind}' object has no "
                    f"attribute '{attr}'"
                ), fix=f"use `{key}.module.{attr}` (or keep `{key}_without_ddp = {key}.module` after wrapping "
                       "and call it through that)")
        yield from self._through_helper(model)

    def _through_helper(self, model: ScriptModel) -> Iterator[Hit]:
        """`train_one_epoch(model, ...)` into a helper module whose body calls
        `model.freeze_bn()`: the wrapper crosses the module as an argument;
        reported at the argument, naming the helper."""
        reported: set[int] = set()
        for call in model.calls:
            target = resolve_call(model, call)
            if target is None or target[0] is model:
                continue
            tmodel, fn = target
            for param in fn.params:
                if param in ("self", "cls"):
                    continue
                # only the reads this call can reach (`if loss_scaler is None:` never taken when it passes one)
                attrs = [a for a in user_attributes(tmodel, fn, param)
                         if reached_from_call(tmodel, a[2], fn, ((model, call),))]
                if not attrs:
                    continue
                bound, expr = argument_expr(call, fn, param)
                if not bound or expr is None or id(expr) in reported:
                    continue
                found = wrapper_in(model, expr, call.ctx)
                if found is None or not _is_torch_wrapper(found[0]) or \
                        not reaching_worlds(model, call.ctx) & reaching_worlds(model, found[0].site.ctx):
                    continue   # the helper is called only where no wrap was made (`if world_size == 1:`)
                reported.add(id(expr))
                w = found[0]
                attr, node, _ = attrs[0]
                name = dotted_name(expr) or "the model"
                helper = f"{fn.name}() ({tmodel.file_name}:{line_of(tmodel, node)})"
                yield Hit(expr, message=(
                    f"`{name}` holds the {w.kind} wrapper and is handed to {helper}, which reads "
                    f"`{param}.{attr}`: `{attr}` belongs to the wrapped model, not the wrapper: AttributeError: "
                    f"'{w.kind}' object has no attribute '{attr}'"
                ), fix=(f"in {fn.name}(), reach it through the wrapped model: `{param}.module.{attr}` (keep handing "
                        "the wrapper itself to the training loop: its forward is what synchronises gradients)"))
