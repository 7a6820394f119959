"""What a name or expression holds: a DistributedSampler, a DataLoader, a
BatchSampler, a DDP/DataParallel-wrapped model.

Follows assignments (`sampler = DistributedSampler(ds) if args.distributed else
None`), method chains (`DDP(model).cuda()`), and local builder functions
(`train_loader = build_loader(args)` whose `return` is a DataLoader)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel, call_arg
from ddpcheck.model.names import dotted_name

_CHAIN_METHODS = {"cuda", "to", "float", "half", "bfloat16", "train", "eval", "cpu", "double", "requires_grad_"}
from ddpcheck.model.vocabulary import EVAL_LOADER_NAME, EVAL_NAME  # noqa: E402
from ddpcheck.model.flow import is_api_call, resolve_call

DDP_NAMES = ("DistributedDataParallel",)
DP_NAMES = ("DataParallel",)
# What a module that makes these names (project.Need: one name of every group).
DISTRIBUTED_SAMPLER_NEED = (("DistributedSampler",),)
DDP_NEED = (DDP_NAMES,)


def call_site(model: ScriptModel, node: cst.Call) -> CallSite | None:
    return model.site_of.get(id(node))


def is_ddp_wrap(model: ScriptModel, site: CallSite) -> bool:
    if is_api_call(model, site, *DDP_NAMES):
        return True
    # apex's DDP behaves the same for every rule that asks
    return bool(site.qual) and site.qual.startswith("apex.") and site.qual.endswith(".DistributedDataParallel")


def is_dp_wrap(model: ScriptModel, site: CallSite) -> bool:
    return is_api_call(model, site, *DP_NAMES)


def origins(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
            depth: int = 0) -> Iterator[tuple[ScriptModel, CallSite]]:
    """The calls whose result `expr` can hold (in this model or a helper's)."""
    if expr is None or depth > 4:
        return
    if isinstance(expr, cst.IfExp):
        yield from origins(model, expr.body, scope, depth + 1)
        yield from origins(model, expr.orelse, scope, depth + 1)
        return
    if isinstance(expr, cst.BooleanOperation):   # `sampler or None`
        yield from origins(model, expr.left, scope, depth + 1)
        yield from origins(model, expr.right, scope, depth + 1)
        return
    if isinstance(expr, cst.Call):
        site = call_site(model, expr)
        if site is None:
            return
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in _CHAIN_METHODS:
            yield from origins(model, func.value, scope, depth + 1)
            return
        yield model, site
        target = resolve_call(model, site)
        if target is not None:
            tmodel, fn = target
            for value, _ctx in fn.returns:
                yield from origins(tmodel, value, fn, depth + 1)
        return
    if isinstance(expr, cst.Subscript):
        # `avg_meters["val_loss"]` with `avg_meters = {"loss": AverageMeter(), "val_loss": AverageMeter()}`
        yield from _entry_origins(model, expr, scope)
        return
    key = dotted_name(expr)
    if key is None:
        return
    for a in model.assignments(key, scope):
        if a.value is not None and a.augmented is None:
            yield from origins(model, a.value, a.ctx.function, depth + 1)
        elif a.unpacked is not None:
            yield from _unpacked_origins(model, *a.unpacked, a.ctx.function, depth + 1)


def _entry_origins(model: ScriptModel, expr: cst.Subscript, scope: FunctionInfo | None) -> Iterator[tuple[ScriptModel, CallSite]]:
    """What the value flow says the entry holds (flow.entry_of: dict literals,
    `dict(...)`, a builder's returned dict), as the calls that made it."""
    from ddpcheck.model.flow import Made, value_of

    for atom in value_of(model, expr, scope).atoms:
        if isinstance(atom, Made):
            yield atom.model, atom.site


def _unpacked_origins(model: ScriptModel, value: cst.BaseExpression, index: int,
                      scope: FunctionInfo | None, depth: int) -> Iterator[tuple[ScriptModel, CallSite]]:
    """`train_set, val_set, train_loader, val_loader = build_loader(cfg)`: the
    index-th element of a tuple literal, or of what a local builder returns."""
    if isinstance(value, (cst.Tuple, cst.List)):
        if index < len(value.elements):
            yield from origins(model, value.elements[index].value, scope, depth)
        return
    if isinstance(value, cst.Call):
        site = call_site(model, value)
        target = resolve_call(model, site) if site is not None else None
        if target is None:
            return
        tmodel, fn = target
        for ret, _ctx in fn.returns:
            if isinstance(ret, (cst.Tuple, cst.List)) and index < len(ret.elements):
                yield from origins(tmodel, ret.elements[index].value, fn, depth)


@query
def key_of(model: ScriptModel, site: CallSite) -> str | None:
    """The name a call's result is assigned to (`train_loader` for
    `train_loader = DataLoader(...)`), through IfExp and method chains."""
    result = None
    for a in model.assigns_in(site.ctx.function):
        if a.value is None:
            continue
        if a.value is site.node or any(s is site.node for s in _direct_values(a.value)):
            result = a.key
            break
    return result


def _direct_values(expr: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(expr, cst.IfExp):
        yield from _direct_values(expr.body)
        yield from _direct_values(expr.orelse)
    elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _CHAIN_METHODS:
        yield from _direct_values(expr.func.value)
    else:
        yield expr


# -- samplers and loaders ------------------------------------------------------

@dataclass(frozen=True)
class SamplerInfo:
    model: ScriptModel
    site: CallSite
    key: str | None

    @property
    def shuffle(self) -> bool | None:
        """True (the default), False, or None when it is computed at run time.
        Followed through names and parameters: `data_sampler(ds, shuffle=True,
        ...)` whose body makes `DistributedSampler(ds, shuffle=shuffle)`."""
        return self._flag("shuffle", 3, True)

    @property
    def drop_last(self) -> bool | None:
        return self._flag("drop_last", 5, False)

    def _flag(self, keyword: str, position: int, default: bool) -> bool | None:
        from ddpcheck.model.flow import constant_of

        if self.site.has_star_args:
            return None
        arg = self.site.arg(keyword, position)
        if arg is None:
            return default
        value = constant_of(self.model, arg, self.site.ctx.function)
        return value if isinstance(value, bool) else None


def looks_like_eval_name(name: str) -> bool:
    return bool(EVAL_NAME.search(name) or EVAL_LOADER_NAME.search(name))


@dataclass(frozen=True)
class LoaderInfo:
    model: ScriptModel
    site: CallSite
    key: str | None
    samplers: tuple[SamplerInfo, ...]      # DistributedSamplers feeding it
    batch_sampler_keys: tuple[str, ...]     # names of BatchSamplers in between
    batch_sampler_sizes: tuple[cst.BaseExpression, ...] = ()   # their batch_size arguments
    # The function holding `key`: where the DataLoader was built, or, for a
    # loader a local builder returns (`train_loader = build_loader(cfg)`), the caller.
    holder: FunctionInfo | None = None
    held: bool = False   # holder was given (None then means module level)

    @property
    def scope(self) -> FunctionInfo | None:
        return self.holder if self.held else self.site.ctx.function

    @property
    def batch_size(self) -> cst.BaseExpression | None:
        """The per-process batch: the loader's own, or its BatchSampler's
        (`BatchSampler(sampler, hypes['batch_size'], drop_last=True)`)."""
        own = self.site.arg("batch_size", 1)
        if own is not None or not self.batch_sampler_sizes:
            return own
        return self.batch_sampler_sizes[0]

    def looks_like_eval(self) -> bool:
        """Named like evaluation data: `val_loader`, `sampler_val`, and the
        tutorial spellings `valloader` / `testloader`."""
        names = [self.key or ""] + [s.key or "" for s in self.samplers]
        return any(looks_like_eval_name(n) for n in names if n)


def distributed_samplers(model: ScriptModel, expr, scope) -> list[SamplerInfo]:
    """The DistributedSamplers `expr` may hold (model/flow.py: through names,
    parameters, returns, either-or helpers)."""
    from ddpcheck.model.flow import value_at

    found = []
    seen = set()
    for m, site in origins(model, expr, scope):
        if is_api_call(m, site, "DistributedSampler") and id(site) not in seen:
            seen.add(id(site))
            found.append(SamplerInfo(m, site, key_of(m, site)))
    for atom in value_at(model, expr, scope).made_by("DistributedSampler"):
        if id(atom.site) not in seen:
            seen.add(id(atom.site))
            found.append(SamplerInfo(atom.model, atom.site, key_of(atom.model, atom.site)))
    return found


@query
def loaders(model: ScriptModel) -> list[LoaderInfo]:
    result = []
    for site in model.calls:
        if not is_api_call(model, site, "DataLoader"):
            continue
        scope = site.ctx.function
        samplers = distributed_samplers(model, site.arg("sampler", 3), scope)
        batch_keys, batch_sizes = [], []
        bs_expr = site.arg("batch_sampler", 4)
        if bs_expr is not None:
            for m, bs in origins(model, bs_expr, scope):
                if is_api_call(m, bs, "BatchSampler"):
                    samplers += distributed_samplers(m, bs.arg("sampler", 0), bs.ctx.function)
                    size = bs.arg("batch_size", 1)
                    if size is not None and m is model:
                        batch_sizes.append(size)
                    k = key_of(m, bs)
                    if k:
                        batch_keys.append(k)
                elif is_api_call(m, bs, "DistributedSampler"):
                    samplers.append(SamplerInfo(m, bs, key_of(m, bs)))
        result.append(LoaderInfo(model, site, key_of(model, site), tuple(samplers), tuple(batch_keys),
                                 tuple(batch_sizes)))
    return result


@query
def held_loaders(model: ScriptModel) -> list[LoaderInfo]:
    """Loaders built elsewhere (another function of the file, a helper module)
    that a name of this file holds, followed through the value flow:
    `loader, sampler = build_loader(args)` with the DataLoader made in data.py.
    `key` is the name here, `holder` the function it is held in."""
    return list(_held_loaders(model))


@query(on_cycle=())
def _held_loaders(model: ScriptModel) -> tuple[LoaderInfo, ...]:
    from ddpcheck.model.flow import element_of, value_of

    result: list[LoaderInfo] = []
    seen: set[int] = set()
    for a in model.assigns:
        value = a.value if a.value is not None else (a.unpacked[0] if a.unpacked else None)
        if not isinstance(value, cst.Call) or a.augmented is not None:
            continue
        site = call_site(model, value)
        if site is None or is_api_call(model, site, "DataLoader") or resolve_call(model, site) is None:
            continue
        held = value_of(model, a.value, a.ctx.function) if a.value is not None else \
            element_of(model, a.unpacked[0], a.unpacked[1], a.ctx.function)
        for atom in held.made_by("DataLoader"):
            if id(atom.site) in seen or (atom.model is model and atom.site.ctx.function is a.ctx.function):
                continue
            inner = next((l for l in loaders(atom.model) if l.site is atom.site), None)
            if inner is not None:
                seen.add(id(atom.site))
                result.append(LoaderInfo(atom.model, atom.site, a.key, inner.samplers, inner.batch_sampler_keys,
                                         inner.batch_sampler_sizes, holder=a.ctx.function, held=True))
    return tuple(result)


# -- wrapped models --------------------------------------------------------------

@dataclass(frozen=True)
class WrapInfo:
    site: CallSite
    kind: str             # "DistributedDataParallel" or "DataParallel"
    key: str | None       # the name holding the wrapper
    inner: str | None     # the name of the module that was wrapped

    @property
    def order(self) -> int:
        return self.site.ctx.order


@query
def wraps(model: ScriptModel) -> list[WrapInfo]:
    result = []
    for site in model.calls:
        if is_ddp_wrap(model, site):
            kind = "DistributedDataParallel"
        elif is_dp_wrap(model, site):
            kind = "DataParallel"
        else:
            continue
        inner = site.arg("module", 0)
        result.append(WrapInfo(site, kind, key_of(model, site), dotted_name(inner) if inner is not None else None))
    return result


def wraps_before(model: ScriptModel, key: str, site: CallSite, kind: str | None = None) -> list[WrapInfo]:
    """Wraps of `key` earlier on the same path as `site`: same function, before
    it in source order, not in the other arm of an `if`."""
    return [
        w for w in wraps(model)
        if w.key == key and (kind is None or w.kind == kind) and w.order < site.ctx.order
        and w.site.ctx.function is site.ctx.function and not exclusive(w.site.ctx, site.ctx)
    ]


def iterated_keys(expr: cst.BaseExpression | None, depth: int = 0) -> Iterator[str]:
    """Names an iteration runs over: `loader` in `enumerate(tqdm(loader))`,
    `metric_logger.log_every(loader, 10)`, `zip(a, b)`."""
    if expr is None or depth > 3:
        return
    key = dotted_name(expr)
    if key:
        yield key
        return
    if isinstance(expr, cst.Call):
        for a in expr.args:
            if a.keyword is None or a.keyword.value in ("iterable", "loader", "data_loader"):
                yield from iterated_keys(a.value, depth + 1)


def exclusive(a, b) -> bool:
    """Two contexts sit in different arms of the same `if`: never both run."""
    arms = {id(br.test): br.positive for br in a.branches}
    return any(id(br.test) in arms and arms[id(br.test)] != br.positive for br in b.branches)


__all__ = [
    "call_arg", "loaders", "held_loaders", "wraps", "origins", "distributed_samplers", "iterated_keys",
    "is_api_call", "exclusive", "key_of", "call_site", "EVAL_NAME",
]
