"""EpochLoop: a loop that consumes a DataLoader once per iteration, directly
(`for epoch ...: for batch in loader:`) or through a function it calls
(`for epoch ...: train_one_epoch(model, loader)`), in this file or a local
module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from ddpcheck.model.flow import loops_in
from ddpcheck.model.script import CallSite, FunctionInfo, Loop, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import iterated_keys
from ddpcheck.model.flow import resolve_call


@dataclass(frozen=True)
class EpochLoop:
    loop: Loop               # the outer loop, in the loader's file
    via: CallSite | None     # the call that consumes the loader, when it is a function


def param_loops(model: ScriptModel, fn: FunctionInfo, param: str, depth: int = 0) -> list[tuple[ScriptModel, Loop]]:
    """The `for` loops that iterate a function's parameter, in the function
    itself or in a local function it hands the parameter on to
    (`def train(loader): return run_epoch(model, loader)`), two calls deep."""
    found = [(model, loop) for loop in loops_in(model, fn) if loop.is_for and param in iterated_keys(loop.iter)]
    if depth >= 2:
        return found
    for call in model.calls_in(fn):
        idx = arg_index(call, param)
        if idx is None:
            continue
        target = resolve_call(model, call)
        if target is not None:
            p = param_for(target[1], call, idx)
            if p:
                found += param_loops(target[0], target[1], p, depth + 1)
    return found


def function_iterates_param(model: ScriptModel, fn: FunctionInfo, param: str) -> bool:
    return bool(param_loops(model, fn, param))


def arg_index(call: CallSite, name: str) -> int | str | None:
    positional = 0
    for a in call.node.args:
        if a.star:
            return None
        if dotted_name(a.value) == name:
            return a.keyword.value if a.keyword is not None else positional
        if a.keyword is None:
            positional += 1
    return None


def param_for(fn: FunctionInfo, call: CallSite, idx: int | str) -> str | None:
    if isinstance(idx, str):
        return idx if idx in fn.params else None
    params = list(fn.params)
    is_ctor = fn.name == "__init__" and isinstance(call.node.func, cst.Name)   # `Trainer(model, ...)`
    if fn.class_name and params and params[0] in ("self", "cls") and (call.receiver is not None or is_ctor):
        params = params[1:]
    return params[idx] if idx < len(params) else None


def epoch_loops(model: ScriptModel, loader_key: str, scope: FunctionInfo | None) -> Iterator[EpochLoop]:
    """Loops in `scope` that run a full pass over `loader_key` per iteration."""
    for loop in model.loops:
        if loop.ctx.function is not scope or not loop.is_for:
            continue
        if loader_key in iterated_keys(loop.iter) and loop.ctx.loops:
            yield EpochLoop(loop.ctx.loops[-1], None)
    for call in model.calls_in(scope):
        if not call.ctx.loops:
            continue
        idx = arg_index(call, loader_key)
        if idx is None:
            continue
        target = resolve_call(model, call)
        if target is None:
            continue
        tmodel, fn = target
        param = param_for(fn, call, idx)
        if param and function_iterates_param(tmodel, fn, param):
            yield EpochLoop(call.ctx.loops[-1], call)


def instance_epoch_loops(model: ScriptModel, loader_key: str,
                         scope: FunctionInfo | None) -> Iterator[tuple[EpochLoop, str]]:
    """The PyTorch DDP tutorial's layout: the loader is handed to a class of
    the file (`Trainer(model, train_data, ...)`), kept as `self.train_data`,
    iterated in one method (`_run_epoch`) and driven per epoch by another
    (`for epoch in range(max_epochs): self._run_epoch(epoch)`). Yields each
    such epoch loop with the attribute that holds the loader."""
    for call in model.calls_in(scope):
        func = call.node.func
        if not isinstance(func, cst.Name) or func.value not in model.class_names:
            continue
        idx = arg_index(call, loader_key)
        init = model.functions_named("__init__", func.value)
        if idx is None or not init:
            continue
        params = list(init[-1].params)[1:]   # drop `self`
        param = idx if isinstance(idx, str) else (params[idx] if idx < len(params) else None)
        if param is None:
            continue
        for a in model.assigns_in(init[-1]):
            if a.key.startswith("self.") and a.value is not None and dotted_name(a.value) == param:
                yield from ((e, a.key) for e in _method_epoch_loops(model, func.value, a.key))


def _method_epoch_loops(model: ScriptModel, cls: str, attr: str) -> Iterator[EpochLoop]:
    methods = [f for f in model.functions if f.class_name == cls]
    iterating = {id(f) for f in methods
                 if any(l.ctx.function is f and l.is_for and attr in iterated_keys(l.iter) for l in model.loops)}
    for f in methods:
        for loop in model.loops:
            if loop.ctx.function is f and loop.is_for and attr in iterated_keys(loop.iter) and loop.ctx.loops:
                yield EpochLoop(loop.ctx.loops[-1], None)
        for call in model.calls_in(f):
            if not call.ctx.loops:
                continue
            target = resolve_call(model, call)
            if target is not None and target[0] is model and id(target[1]) in iterating:
                yield EpochLoop(call.ctx.loops[-1], call)
