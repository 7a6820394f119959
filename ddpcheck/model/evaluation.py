"""Evaluation loaders and the loops that consume a loader.

Shared by the rules about evaluation under DDP (DDP105 padding of the eval
sampler, DDP106 metrics that are never reduced) and the training-loader rule
(DDP104). A loader is consumed by a `for` loop in the function that builds it
or, handed on as an argument, by a loop in a function of this file or of a
local module (`evaluate(model, val_loader)` -> `for x, y in data_loader:`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.epochs import arg_index, param_for, param_loops
from ddpcheck.model.flow import assignments_anywhere, loops_in
from ddpcheck.model.memo import query
from ddpcheck.model.reads import reads, reads_name
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, Loop, ScriptModel
from ddpcheck.model.values import LoaderInfo, iterated_keys

from ddpcheck.model.vocabulary import EVAL_FUNCTION, EVAL_LOADER_NAME, TRAIN_NAME  # noqa: E402
from ddpcheck.model.flow import resolve_call


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


def _param_loops(model: ScriptModel, fn: FunctionInfo, param: str, via: CallSite, depth: int) -> list[LoaderLoop]:
    return [LoaderLoop(m, loop, via) for m, loop in param_loops(model, fn, param, depth)]


def _receiving_scopes(model: ScriptModel, loader: LoaderInfo) -> list[FunctionInfo | None]:
    """Functions that get the loader back from the builder it is made in, by
    the same name: `train_loader, val_loader = build_loader(config)`."""
    fn, key = loader.site.ctx.function, loader.key
    if fn is None or key is None or "." in key:
        return []
    if not any(reads_name(reads(model, v), key) for v, _ in fn.returns):
        return []
    scopes = []
    for a in assignments_anywhere(model, key):
        if a.ctx.function is fn or not isinstance(a.node, cst.Assign):
            continue
        value = a.node.value
        site = model.site_of.get(id(value)) if isinstance(value, cst.Call) else None
        target = resolve_call(model, site) if site is not None else None
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


def _scopes_sharing(model: ScriptModel, key: str, scope: FunctionInfo | None) -> list[FunctionInfo | None]:
    """The functions where `key` names the same object as in `scope`: `scope`
    itself, or every method of its class for `self.x`."""
    if not key.startswith("self."):
        return [scope]
    if scope is None or scope.class_name is None:
        return []
    return [f for f in model.functions if f.class_name == scope.class_name]


def _loops_in(model: ScriptModel, key: str, scope: FunctionInfo | None) -> list[LoaderLoop]:
    found = []
    scopes = _scopes_sharing(model, key, scope)
    for fn in scopes:
        for loop in loops_in(model, fn):
            if loop.is_for and key in iterated_keys(loop.iter):
                found.append(LoaderLoop(model, loop, None))
    for call in (c for fn in scopes for c in model.calls_in(fn)):
        idx = arg_index(call, key)
        if idx is None:
            continue
        target = resolve_call(model, call)
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
