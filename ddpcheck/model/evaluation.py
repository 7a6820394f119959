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

from ddpcheck.model.flow import (
    Pass, argument_expr, bindings_seen, called_name, called_qual, every_pass, resolve_call, value_of,
)
from ddpcheck.model.names import dotted_name
from ddpcheck.model.library import NOT_ITERATING
from ddpcheck.model.reads import reads, reads_name
from ddpcheck.model.memo import query
from ddpcheck.model.children import children
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, Loop, ScriptModel
from ddpcheck.model.guards import worlds_from_call
from ddpcheck.model.values import LoaderInfo, sharded_held_loaders
from ddpcheck.model.worlds import DISTRIBUTED

from ddpcheck.model.vocabulary import EVAL_FUNCTION, EVAL_LOADER_NAME, TRAIN_NAME  # noqa: E402


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


@query(on_cycle=())
def loader_loops(model: ScriptModel, loader: LoaderInfo) -> tuple[LoaderLoop, ...]:
    """Every `for` loop over the loader object (model/flow.py's passes: the
    loop next to it, or one in a function of the tree the loader is handed
    to, through any name, container or wrapper), each once, with the call
    of this file that hands the loader to the loop's function."""
    found: dict[int, tuple[tuple, LoaderLoop]] = {}
    for fn, p in every_pass(model):
        if p.loop is None or not p.consumed.holds(loader.model, loader.site):
            continue
        if loader.binding is not None and not _fed_by(model, p, loader.binding):
            continue   # a pass over what another call of the same builder returned
        # the pass seen from the function holding the loader (its first call hands the loader
        # on), else from the function nearest the loop
        rank = (fn is not loader.scope, len(p.via))
        known = found.get(id(p.loop.node))
        if known is None or rank < known[0]:
            found[id(p.loop.node)] = (rank, LoaderLoop(p.loop_model, p.loop, p.via[0] if p.via else None))
    return tuple(loop for _, loop in found.values())


def _reads_binding(model: ScriptModel, expr: cst.CSTNode, binding) -> bool:
    """Some name or attribute read in `expr` can see `binding`."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)) and id(node) in model.reach and \
                any(b is binding for b in bindings_seen(model, node)):
            return True
        stack.extend(children(node))
    return False


def _fed_by(model: ScriptModel, p: Pass, binding) -> bool:
    """The pass iterates what `binding` (an assignment of this file) holds:
    its loop reads a name bound there, or the call of this file that leads to
    it passes such a name (for the parameter the loop iterates, when the loop
    is in the function that call runs)."""
    if isinstance(binding, cst.BaseExpression):   # a builder call written as the argument of a call
        return bool(p.via) and any(a.value is binding for a in p.via[0].node.args)
    if not p.via:
        return p.loop_model is model and _reads_binding(model, p.loop.iter, binding)
    first = p.via[0]
    if len(p.via) == 1:
        target = resolve_call(model, first)
        if target is not None and target[0] is p.loop_model:
            fn = target[1]
            params = [n.value for n in _names(p.loop.iter) if n.value in fn.params]
            if params:
                for param in params:
                    bound, arg = argument_expr(first, fn, param)
                    if bound and arg is not None and _reads_binding(model, arg, binding):
                        return True
                return False
    return any(not a.star and _reads_binding(model, a.value, binding) for a in first.node.args)


def _names(expr: cst.CSTNode) -> list[cst.Name]:
    out, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            out.append(node)
        elif isinstance(node, cst.Attribute):
            stack.append(node.value)   # `loader.dataset`: the object, not the attribute's name
        else:
            stack.extend(children(node))
    return out


def _eval_function(fn: FunctionInfo | None) -> bool:
    return fn is not None and bool(EVAL_FUNCTION.search(fn.name))


@query
def is_eval_loader(model: ScriptModel, loader: LoaderInfo) -> bool:
    """Named like evaluation data (`val_loader`, `data_loader_test`,
    `testloader`, `sampler_val`), or only iterated without gradients or in an
    evaluation function. A loader named like training data
    (`target_train_loader`) is judged by its use only when every use can be
    seen: each pass over it is such a loop, and every call its name is handed
    to is a function of the tree or a builtin that does not iterate it."""
    names = [n for n in [loader.key or ""] + [s.key or "" for s in loader.samplers] if n]
    if loader.looks_like_eval() or any(EVAL_LOADER_NAME.search(n) for n in names):
        return True
    if any(TRAIN_NAME.search(n) for n in names):
        return _evaluated_only(model, loader)
    loops = loader_loops(model, loader)
    return bool(loops) and all(_evaluating(l.model, l.loop) for l in loops)


def _evaluating(model: ScriptModel, loop: Loop) -> bool:
    """A loop that evaluates: it runs without gradients, sits in an evaluation
    function (`validate`, `test`), or runs its work per batch under `with
    torch.no_grad():` and never trains (`_trains`: no `backward()`, no
    optimizer `step()`, no call that does either or is handed an optimizer)."""
    fn = loop.ctx.function
    if no_grad(model, loop.ctx) or _eval_function(fn):
        return True
    inside = _calls_inside(model, loop)
    return any(c.ctx.no_grad for c in inside) and not _trains(model, inside)


def pass_without_gradients(p: Pass) -> bool:
    """A `for` pass that runs with autograd off and trains nothing: the loop
    is under `torch.no_grad()` / `inference_mode()`, or one of the calls on
    the way down to it is (`with torch.no_grad(): calc_loss_loader(
    train_loader, model, num_batches=5)` inside the step loop: a periodic
    loss estimate over a few training batches), and nothing in the loop
    trains (`_trains`)."""
    if p.loop is None:
        return False
    if not (no_grad(p.loop_model, p.loop.ctx) or any(no_grad(p.loop_model, c.ctx) for c in p.via)):
        return False
    return not _trains(p.loop_model, _calls_inside(p.loop_model, p.loop))


def _calls_inside(model: ScriptModel, loop: Loop) -> list[CallSite]:
    return [c for c in model.calls_in(loop.ctx.function) if any(l is loop for l in c.ctx.loops)]


# what an optimizer or a gradient scaler is called when its value is not followed
_OPTIMIZER_NAME = re.compile(r"(^|_)(optim\w*|opt|scaler)$", re.I)


def _trains(model: ScriptModel, calls: list[CallSite]) -> bool:
    """Some call trains: it runs a backward pass or steps an optimizer
    (`loss.backward()`, `optimizer.step()`), runs a function of the tree
    that does, any number of calls down (`train_step(model, batch, opt)`),
    or is handed an optimizer or a gradient scaler (`loss_scaler(loss,
    optimizer)`: a library's step helper). An EMA update or a teacher's
    forward under `no_grad` in such a loop does not make it an evaluation."""
    for c in calls:
        if c.attr in ("backward", "step"):
            return True
        if any(not a.star and _optimizer(model, a.value) for a in c.node.args):
            return True
        target = resolve_call(model, c)
        if target is not None and _function_trains(*target):
            return True
    return False


@query(on_cycle=False)   # a recursion adds no backward of its own
def _function_trains(model: ScriptModel, fn: FunctionInfo) -> bool:
    return _trains(model, model.calls_in(fn))


def _optimizer(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    """`expr` holds an optimizer or a gradient scaler: one made by torch
    (`torch.optim.*`, `GradScaler`), or, when its value is not followed,
    one named so (`optimizer`, `opt`, `loss_scaler`)."""
    made = value_of(model, expr).made
    if any(_optimizer_qual(called_qual(a.model, a.site) or "") for a in made):
        return True
    name = dotted_name(expr)
    return not made and name is not None and bool(_OPTIMIZER_NAME.search(name.rpartition(".")[2]))


def _optimizer_qual(qual: str) -> bool:
    return (qual.startswith("torch.optim.") and ".lr_scheduler." not in qual) or qual.endswith(".GradScaler")


def _evaluated_only(model: ScriptModel, loader: LoaderInfo) -> bool:
    """Every pass over the loader is a `for` loop without gradients or in an
    evaluation function (no `next(it)` stream, no training loop), and its
    name is handed only to functions of the tree or to builtins that do not
    iterate it (`len(loader)`): a library that might train on it
    (`trainer.fit(train_loader)`) leaves the name's word standing."""
    seen = False
    for _fn, p in every_pass(model):
        if not p.consumed.holds(loader.model, loader.site):
            continue
        if p.loop is None:
            return False   # a stream drained with `next()`: which holder it reads is not told apart here
        if loader.binding is not None and not _fed_by(model, p, loader.binding):
            continue
        if not _evaluating(p.loop_model, p.loop) or _trains(p.loop_model, _calls_inside(p.loop_model, p.loop)):
            return False   # a training loop, whatever its function is called (`_eval_train` doing backward())
        seen = True
    if not seen or loader.key is None:
        return False
    for c in model.calls_in(loader.scope):
        if any(not a.star and reads_name(reads(model, a.value), loader.key) for a in c.node.args) and \
                resolve_call(model, c) is None and called_name(model, c) not in NOT_ITERATING:
            return False
    return True


def _made_in_a_single_process(model: ScriptModel, loader: LoaderInfo, atom) -> bool:
    """The builder the holding call runs makes `atom` (a sampler other than
    a DistributedSampler) only in an arm no rank of a distributed run takes,
    for what the call passes (`if distributed: ... else: RandomSampler(ds)`)."""
    if loader.via is None:
        return False
    target = resolve_call(model, loader.via)
    if target is None or target[0] is not atom.model or atom.site.ctx.function is not target[1]:
        return False
    reached = worlds_from_call(atom.model, atom.site.ctx, target[1], ((model, loader.via),))
    return not (reached & DISTRIBUTED)


def sharded_when_distributed(model: ScriptModel) -> list[LoaderInfo]:
    """The held loaders fed by a DistributedSampler on every path a
    distributed run takes through their builder (values.sharded_held_loaders;
    a sampler the builder makes only for a single process does not count)."""
    return sharded_held_loaders(model, _made_in_a_single_process)


__all__ = ["LoaderLoop", "sharded_when_distributed", "loader_loops", "is_eval_loader", "no_grad", "pass_without_gradients",
           "EVAL_FUNCTION"]
