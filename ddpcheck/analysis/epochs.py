"""EpochLoop: a loop that consumes a DataLoader once per iteration, directly
(`for epoch ...: for batch in loader:`) or through a function it calls
(`for epoch ...: train_one_epoch(model, loader)`), in this file or a local
module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ddpcheck.analysis.model import CallSite, FunctionInfo, Loop, ScriptModel
from ddpcheck.analysis.names import dotted_name
from ddpcheck.analysis.values import iterated_keys


@dataclass(frozen=True)
class EpochLoop:
    loop: Loop               # the outer loop, in the loader's file
    via: CallSite | None     # the call that consumes the loader, when it is a function


def param_loops(model: ScriptModel, fn: FunctionInfo, param: str, depth: int = 0) -> list[tuple[ScriptModel, Loop]]:
    """The `for` loops that iterate a function's parameter, in the function
    itself or in a local function it hands the parameter on to
    (`def train(loader): return run_epoch(model, loader)`), two calls deep."""
    found = [(model, loop) for loop in model.loops
             if loop.ctx.function is fn and loop.is_for and param in iterated_keys(loop.iter)]
    if depth >= 2:
        return found
    for call in model.calls_in(fn):
        idx = arg_index(call, param)
        if idx is None:
            continue
        target = model.resolve_call(call)
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
    if fn.class_name and params and params[0] in ("self", "cls") and call.receiver is not None:
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
        target = model.resolve_call(call)
        if target is None:
            continue
        tmodel, fn = target
        param = param_for(fn, call, idx)
        if param and function_iterates_param(tmodel, fn, param):
            yield EpochLoop(call.ctx.loops[-1], call)
