"""DDP205 wrapper-attribute."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.findings import Severity
from ddpcheck.model.module_api import on_wrapper
from ddpcheck.model.names import dotted_name
from ddpcheck.model.script import Ctx, ScriptModel
from ddpcheck.model.values import WrapInfo, wraps
from ddpcheck.model.wrappers import UNWRAP_TEST, wrapper_held
from ddpcheck.rules.base import Hit, Rule, register


def _shadowed(model: ScriptModel, key: str, ctx: Ctx) -> bool:
    """The name is a parameter (never reassigned in its function) or a loop
    variable where it is read: it need not hold what other code wrapped."""
    root = key.partition(".")[0]
    if root == "self":
        return False
    if any(root in loop.targets for loop in ctx.loops):
        return True
    fn = ctx.function
    while fn is not None:
        if any(a.key == root for a in model.assigns_in(fn)):
            return False   # assigned here: wrapper_held judges the assignments
        if root in fn.params:
            return True
        fn = fn.ctx.function
    return False


def _told_apart(model: ScriptModel, ctx: Ctx) -> bool:
    """Inside `if isinstance(model, DDP):` / `if hasattr(model, "module"):` / `try:`."""
    return ctx.opaque or any(UNWRAP_TEST.search(model.module.code_for_node(b.test)) for b in ctx.branches)


def _is_torch_wrapper(w: WrapInfo) -> bool:
    # apex's DDP has an API of its own; only torch's wrappers are judged
    q = w.site.qual or ""
    return not q.startswith("apex.")


@register
class WrapperAttribute(Rule):
    code = "DDP205"
    name = "wrapper-attribute"
    severity = Severity.ERROR
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
                if key not in wrapped or f"{key}.{attr}" in set_on:
                    continue
                if _shadowed(model, key, r.ctx) or _told_apart(model, r.ctx):
                    continue
                w = wrapper_held(model, key, r.ctx)
                if w is None or not _is_torch_wrapper(w) or not model.worlds(w.site.ctx) & model.worlds(r.ctx):
                    continue
                kind = "DistributedDataParallel" if w.kind == "DistributedDataParallel" else "DataParallel"
                yield Hit(node, message=(
                    f"`{key}.{attr}`: `{key}` holds the {kind} wrapper here, and `{attr}` is not one of its "
                    f"attributes (it belongs to the wrapped model): AttributeError: '{kind}' object has no "
                    f"attribute '{attr}'"
                ), fix=f"use `{key}.module.{attr}` (or keep `{key}_without_ddp = {key}.module` after wrapping "
                       "and call it through that)")
