"""Checkpoint loads without a `map_location` (DDP303): which `torch.load`
calls read weights saved from a GPU, and which such load a function of the
tree performs whatever rank runs it, itself or through the functions it
calls (a model class of a helper module whose `__init__` loads pretrained
weights, made on every rank by the training script)."""

from __future__ import annotations

import functools
import re

import libcst as cst

from ddpcheck.model.flow import derived_from, may_reach_call, names_behind, resolve_call, runs_into, value_of
from ddpcheck.model.guards import function_worlds, relevant_frames, worlds_from_call
from ddpcheck.model.memo import query
from ddpcheck.model.names import dotted_name
from ddpcheck.model.paths import in_memory
from ddpcheck.model.reads import strings_in
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.values import exclusive
from ddpcheck.model.worlds import DN

TORCH_LOAD = ("torch.load", "torch.serialization.load")
# A module holding such a load names it (project.Need).
LOAD_NEED = (("load",),)

WEIGHTS = re.compile(
    r"ckpt|checkpoint|resume|pretrain|weight|snapshot|state|model|best|last|latest|teacher|student|ema"
    r"|backbone|encoder|decoder|generator|discriminator|net\b|\.pth|\.tar|\.bin|\.safetensors", re.I)


def unmapped_loads(model: ScriptModel) -> list[CallSite]:
    """`torch.load(...)` calls with no `map_location` (keyword or second
    argument); a call with `**kwargs` is not judged."""
    return [s for s in model.calls if _is_unmapped_load(model, s)]


def _is_unmapped_load(model: ScriptModel, site: CallSite) -> bool:
    return site.qual in TORCH_LOAD and not site.has_star_args and site.arg("map_location", 1) is None


def mapped_loads(model: ScriptModel) -> list[CallSite]:
    return [s for s in model.calls if s.qual in TORCH_LOAD and s.arg("map_location", 1) is not None]


def looks_like_weights(model: ScriptModel, site: CallSite) -> bool:
    """The load is a checkpoint or weights (what a GPU run saves from cuda:0),
    not a data file (`features = torch.load(cached_features_file)`): it feeds
    `load_state_dict`, or the path, the name it is stored in or the function it
    is in says so."""
    if feeds_load_state_dict(model, site):
        return True
    first = site.arg("f", 0)
    texts = [*names_behind(model, first), *strings_in(first)] if first is not None else []
    keys = [a.key for a in model.assigns_in(site.ctx.function) if a.value is not None and any(v is site.node for v in _values(a.value))]
    texts += keys
    if site.ctx.function is not None:
        texts.append(site.ctx.function.name)
    return any(WEIGHTS.search(t) for t in texts)


def feeds_load_state_dict(model: ScriptModel, site: CallSite) -> bool:
    """What the load returns goes into a `load_state_dict(...)` of the same
    function: in the same statement (`opt.load_state_dict(torch.load(p))`),
    or as a value that holds it or a part of it (`ck = torch.load(p)` ...
    `net.load_state_dict(ck["model"])`, `sd = ck["model"]` ...
    `net.load_state_dict(sd)`, `ck.get("state_dict", ck)`). Such a load
    restores tensors saved from a model or an optimizer: weights, whatever
    the file is called."""
    for c in model.calls_in(site.ctx.function):
        if c.attr != "load_state_dict":
            continue
        if c.stmt is site.stmt or any(derived_from(value_of(model, a.value), site) for a in c.node.args):
            return True
    return False


def _values(expr) -> list:
    """The expression and the calls it is made of (`torch.load(p)["model"]`)."""
    out = [expr]
    while isinstance(expr, (cst.Subscript, cst.Attribute)) or (
            isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        expr = expr.value if not isinstance(expr, cst.Call) else expr.func.value
        out.append(expr)
    return out


def mapped_in_other_arm(model: ScriptModel, site: CallSite) -> bool:
    """`if args.gpu is None: ckpt = torch.load(p) else: ckpt = torch.load(p, map_location=loc)`
    (the ImageNet example): the author maps where the process owns one GPU and
    chose not to in the other arm."""
    first = site.arg("f", 0)
    for m in mapped_loads(model):
        other = m.arg("f", 0)
        if exclusive(site.ctx, m.ctx) and other is not None and first is not None and other.deep_equals(first):
            return True
    return False


def judged_load(model: ScriptModel, site: CallSite) -> bool:
    """An unmapped load of weights from a file, not the author's deliberate
    choice beside a mapped one. A load from a buffer in memory
    (`torch.load(io.BytesIO(data))`) reads what this process received,
    not a file saved from cuda:0."""
    first = site.arg("f", 0)
    if first is not None and (in_memory(model, first) or _tested_in_memory(model, site, first)):
        return False
    return looks_like_weights(model, site) and not mapped_in_other_arm(model, site)


def _tested_in_memory(model: ScriptModel, site: CallSite, first: cst.BaseExpression) -> bool:
    """The load runs only where a test says its source is a buffer in memory:
    `if isinstance(loaded, io.BytesIO): torch.load(loaded)`."""
    name = dotted_name(first)
    if name is None:
        return False
    for b in site.ctx.branches:
        test = b.test
        if b.positive and isinstance(test, cst.Call) and dotted_name(test.func) == "isinstance" \
                and len(test.args) == 2 and dotted_name(test.args[0].value) == name:
            kinds = test.args[1].value
            names = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
            if all((dotted_name(k) or "").rpartition(".")[2] in ("BytesIO", "StringIO") for k in names):
                return True
    return False


def unmapped_load_in(model: ScriptModel, fn: FunctionInfo,
                     frames: tuple[tuple[ScriptModel, CallSite], ...]) -> tuple[ScriptModel, CallSite] | None:
    """An unmapped weights load `fn` performs whatever rank runs it (no guard
    inside, judged under the arguments of `frames`, the calls that run `fn`,
    innermost first), itself or any number of calls down: (its module, the
    load)."""
    return _unmapped_load_in(model, fn, relevant_frames(frames))


@query(on_cycle=None)
def _unmapped_load_in(model: ScriptModel, fn: FunctionInfo,
                      frames: tuple[tuple[ScriptModel, CallSite], ...]) -> tuple[ScriptModel, CallSite] | None:
    if DN not in function_worlds(model, fn):
        return None
    loads = {id(s.node) for s in unmapped_loads(model)}
    for c in model.calls_in(fn):
        target = None
        if id(c.node) not in loads:
            # which ranks run a call is the costly question: asked only of calls that can lead to a load
            target = resolve_call(model, c, LOAD_NEED)
            if target is None or any(call is c for _, call in frames) or \
                    not may_reach_call(*target, _runs_into_loads, _is_unmapped_load):
                continue
        if DN not in worlds_from_call(model, c.ctx, fn, frames):
            continue
        if target is None:
            if judged_load(model, c):
                return model, c
            continue
        inner = _unmapped_load_in(target[0], target[1], relevant_frames(((model, c), *frames)))
        if inner is not None:
            return inner
    return None


# what a call leads to in a module that can reach a load (a module-level object: may_reach_call keys on it)
_runs_into_loads = functools.partial(runs_into, needs=LOAD_NEED)


__all__ = ["LOAD_NEED", "TORCH_LOAD", "feeds_load_state_dict", "judged_load", "looks_like_weights", "mapped_in_other_arm",
           "mapped_loads", "unmapped_load_in", "unmapped_loads"]
