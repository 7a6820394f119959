"""Evaluation loaders and the loops that consume a loader.

Shared by the rules about evaluation under DDP (DDP105 padding of the eval
sampler, DDP106 metrics that are never reduced) and the training-loader rule
(DDP104). A loader is consumed by a `for` loop in the function that builds it
or, handed on as an argument, by a loop in a function of this file or of a
local module (`evaluate(model, val_loader)` -> `for x, y in data_loader:`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.epochs import arg_index, param_for, param_loops
from ddpcheck.model.query import query
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, Loop, ScriptModel, owner_class
from ddpcheck.model.values import LoaderInfo, iterated_keys

# `testloader`, `valloader`, `val_dl` (tutorial spellings EVAL_NAME leaves out)
EVAL_LOADER_NAME = re.compile(r"(^|[_.])(val|valid|validation|test|testing|eval|evaluation|dev)(loader|dl|iter|set|data)", re.I)
EVAL_FUNCTION = re.compile(
    r"(^|_)(val|valid|validate|validation|test|testing|eval|evaluate|evaluation|evaluator|infer|inference|predict)(_|\d|$)",
    re.I,
)
TRAIN_NAME = re.compile(r"train", re.I)


@dataclass(frozen=True)
class LoaderLoop:
    """A `for` loop over a loader: `model` is the file it is in (the loader's,
    or a local module's), `via` the call in the loader's file that hands the
    loader to the loop's function (None when the loop is next to the loader)."""

    model: ScriptModel
    loop: Loop
    via: CallSite | None

    @property
    def function(self) -> FunctionInfo | None:
        return self.loop.ctx.function


def no_grad(model: ScriptModel, ctx: Ctx) -> bool:
    """Inside `with torch.no_grad()` / `inference_mode()`, or in a function
    decorated with either."""
    if ctx.no_grad:
        return True
    fn = ctx.function
    return fn is not None and any(d.rpartition(".")[2] in ("no_grad", "inference_mode") for d in fn.decorators)


def _same_scope(a: Ctx, scope: FunctionInfo | None, key: str) -> bool:
    if key.startswith("self."):
        cls = owner_class(a)
        return cls is not None and scope is not None and cls == scope.class_name
    return a.function is scope


def _param_loops(model: ScriptModel, fn: FunctionInfo, param: str, via: CallSite, depth: int) -> list[LoaderLoop]:
    return [LoaderLoop(m, loop, via) for m, loop in param_loops(model, fn, param, depth)]


def _receiving_scopes(model: ScriptModel, loader: LoaderInfo) -> list[FunctionInfo | None]:
    """Functions that get the loader back from the builder it is made in, by
    the same name: `train_loader, val_loader = build_loader(config)`."""
    fn, key = loader.site.ctx.function, loader.key
    if fn is None or key is None or "." in key:
        return []
    if not any(re.search(r"(?<![\w.])" + re.escape(key) + r"\b", model.module.code_for_node(v)) for v, _ in fn.returns):
        return []
    scopes = []
    for a in model.assigns:
        if a.key != key or a.ctx.function is fn or not isinstance(a.node, cst.Assign):
            continue
        value = a.node.value
        site = model.site_of.get(id(value)) if isinstance(value, cst.Call) else None
        target = model.resolve_call(site) if site is not None else None
        if target is not None and target[1] is fn and a.ctx.function not in scopes:
            scopes.append(a.ctx.function)
    return scopes


@query
def loader_loops(model: ScriptModel, loader: LoaderInfo) -> list[LoaderLoop]:
    """Every `for` loop over `loader` (by the name it is assigned to, where it
    is built or where its builder function returns it)."""
    found: list[LoaderLoop] = []
    key = loader.key
    if key is not None:
        for scope in [loader.site.ctx.function] + _receiving_scopes(model, loader):
            found += _loops_in(model, key, scope)
    return found


def _loops_in(model: ScriptModel, key: str, scope: FunctionInfo | None) -> list[LoaderLoop]:
    found = []
    for loop in model.loops:
        if loop.is_for and _same_scope(loop.ctx, scope, key) and key in iterated_keys(loop.iter):
            found.append(LoaderLoop(model, loop, None))
    for call in model.calls:
        if not _same_scope(call.ctx, scope, key):
            continue
        idx = arg_index(call, key)
        if idx is None:
            continue
        target = model.resolve_call(call)
        if target is None:
            continue
        param = param_for(target[1], call, idx)
        if param:
            found += _param_loops(target[0], target[1], param, call, 0)
    return found


def _eval_function(fn: FunctionInfo | None) -> bool:
    return fn is not None and bool(EVAL_FUNCTION.search(fn.name))


@query
def is_eval_loader(model: ScriptModel, loader: LoaderInfo) -> bool:
    """Named like evaluation data (`val_loader`, `data_loader_test`,
    `testloader`, `sampler_val`), or not named like training data and only
    iterated without gradients or in an evaluation function."""
    names = [n for n in [loader.key or ""] + [s.key or "" for s in loader.samplers] if n]
    if loader.looks_like_eval() or any(EVAL_LOADER_NAME.search(n) for n in names):
        result = True
    elif any(TRAIN_NAME.search(n) for n in names):
        result = False
    else:
        loops = loader_loops(model, loader)
        result = bool(loops) and all(
            no_grad(l.model, l.loop.ctx) or _eval_function(l.function) for l in loops
        )
    return result


__all__ = ["LoaderLoop", "loader_loops", "is_eval_loader", "no_grad", "EVAL_FUNCTION"]
