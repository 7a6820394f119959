"""The torch objects rules ask about, as the value engine (model/flow.py)
finds them: DistributedSamplers, DataLoaders, BatchSamplers, DDP and
DataParallel wraps.

An object is known by how it was made, wherever it flows: `sampler =
DistributedSampler(ds) if args.distributed else None`, a builder of the
tree returning the loader, `DataLoader(ds, **kw)` with `kw` built by a
helper, a class of the tree that derives from DistributedSampler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import libcst as cst

from ddpcheck.model.flow import (
    LOADER_NEED, Class, Made, Super, Value, bind, call_argument, call_targets, callee_value, element_of,
    instance_of, is_api_call, library_bases, mro, resolved, value_of,
)
from ddpcheck.model.library import RETURNS_RECEIVER
from ddpcheck.model.memo import query
from ddpcheck.model.names import dotted_name, is_torch_api
from ddpcheck.model.script import CallSite, ClassInfo, FunctionInfo, ScriptModel, call_arg, exclusive
from ddpcheck.model.vocabulary import EVAL_LOADER_NAME, EVAL_NAME

DDP_NAMES = ("DistributedDataParallel",)
DP_NAMES = ("DataParallel",)
# What a module that makes these names (project.Need: one name of every group).
DISTRIBUTED_SAMPLER_NEED = (("DistributedSampler",),)
DDP_NEED = (DDP_NAMES,)
WRAPPER_NEED = (DDP_NAMES + DP_NAMES,)


def call_site(model: ScriptModel, node: cst.Call) -> CallSite | None:
    return model.site_of.get(id(node))


def is_ddp_wrap(model: ScriptModel, site: CallSite) -> bool:
    if is_api_call(model, site, *DDP_NAMES):
        return True
    # apex's DDP behaves the same for every rule that asks
    return bool(site.qual) and site.qual.startswith("apex.") and site.qual.endswith(".DistributedDataParallel")


def is_dp_wrap(model: ScriptModel, site: CallSite) -> bool:
    return is_api_call(model, site, *DP_NAMES)


@query
def key_of(model: ScriptModel, site: CallSite) -> str | None:
    """The name a call's result is assigned to (`train_loader` for
    `train_loader = DataLoader(...)`), through IfExp and method chains: how
    messages name the object."""
    result = None
    for a in model.assigns_in(site.ctx.function):
        if a.value is None:
            continue
        if a.value is site.node or any(s is site.node for s in direct_values(a.value)):
            result = a.key
            break
    return result


def direct_values(expr: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The expressions an assignment's value is made of, as written: both arms
    of `x if c else y`, the receiver of `DDP(m).cuda()`."""
    if isinstance(expr, cst.IfExp):
        yield from direct_values(expr.body)
        yield from direct_values(expr.orelse)
    elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in RETURNS_RECEIVER:
        yield from direct_values(expr.func.value)
    else:
        yield expr


# -- samplers and loaders ------------------------------------------------------

@dataclass(frozen=True)
class SamplerInfo:
    model: ScriptModel
    site: CallSite
    key: str | None
    subclass: bool = False   # an object of a class of the tree deriving from DistributedSampler

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
        if self.subclass:
            position = None   # its own signature: only a keyword says what it passes on
        value = call_argument(self.model, self.site, keyword, position)
        if value is None:
            return None if self.subclass else default
        constant = resolved(self.model, value).constant
        return constant if isinstance(constant, bool) else None


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
    # an object of a class of the tree deriving from DataLoader (values.subclass_loaders): the
    # samplers are those its constructor hands to DataLoader's; its own arguments are not DataLoader's
    subclass: bool = False
    # The function holding `key`: where the DataLoader was built, or, for a
    # loader a local builder returns (`train_loader = build_loader(cfg)`), the caller.
    holder: FunctionInfo | None = None
    held: bool = False   # holder was given (None then means module level)
    via: CallSite | None = None   # for a held loader: the call of the asking file that built it
    # for a held loader: the assignment holding it (one builder called twice, for the training and
    # the evaluation data, makes one object per call: each holder is a loader of its own)
    binding: object = field(default=None, compare=False, repr=False)

    @property
    def scope(self) -> FunctionInfo | None:
        return self.holder if self.held else self.site.ctx.function

    @property
    def batch_size(self) -> cst.BaseExpression | None:
        """The per-process batch: the loader's own, or its BatchSampler's
        (`BatchSampler(sampler, hypes['batch_size'], drop_last=True)`)."""
        if self.subclass:
            return None
        own = self.site.arg("batch_size", 1)
        if own is not None or not self.batch_sampler_sizes:
            return own
        return self.batch_sampler_sizes[0]

    def looks_like_eval(self) -> bool:
        """Named like evaluation data: `val_loader`, `sampler_val`, and the
        tutorial spellings `valloader` / `testloader`."""
        names = [self.key or ""] + [s.key or "" for s in self.samplers]
        return any(looks_like_eval_name(n) for n in names if n)


def samplers_in(model: ScriptModel, value: Value | None) -> list[SamplerInfo]:
    """The DistributedSamplers (or objects of classes of the tree deriving
    from it) a value may hold, its parameters resolved through the file's calls."""
    if value is None:
        return []
    found = []
    seen = set()
    for atom in resolved(model, value).made:
        if id(atom.site) in seen or not instance_of(atom, "DistributedSampler"):
            continue
        seen.add(id(atom.site))
        found.append(SamplerInfo(atom.model, atom.site, key_of(atom.model, atom.site),
                                 subclass=not atom.is_api("DistributedSampler")))
    return found


def distributed_samplers(model: ScriptModel, expr, scope=None) -> list[SamplerInfo]:
    """The DistributedSamplers `expr` may hold."""
    return samplers_in(model, value_of(model, expr) if expr is not None else None)


@query
def loaders(model: ScriptModel) -> list[LoaderInfo]:
    """The DataLoaders made in this file, with the DistributedSamplers that
    feed them (`sampler=`, or inside `batch_sampler=`; through `**kwargs`
    whose contents are known)."""
    result = []
    for site in model.calls:
        if not is_api_call(model, site, "DataLoader"):
            continue
        samplers = samplers_in(model, call_argument(model, site, "sampler", 3))
        batch_keys, batch_sizes = [], []
        batch_sampler = call_argument(model, site, "batch_sampler", 4)
        if batch_sampler is not None:
            for atom in resolved(model, batch_sampler).made:
                m, bs = atom.model, atom.site
                if atom.is_api("BatchSampler"):
                    samplers += samplers_in(m, call_argument(m, bs, "sampler", 0))
                    size = bs.arg("batch_size", 1)
                    if size is not None and m is model:
                        batch_sizes.append(size)
                    k = key_of(m, bs)
                    if k:
                        batch_keys.append(k)
                elif instance_of(atom, "DistributedSampler"):
                    samplers.append(SamplerInfo(m, bs, key_of(m, bs), subclass=not atom.is_api("DistributedSampler")))
        result.append(LoaderInfo(model, site, key_of(model, site), tuple(samplers), tuple(batch_keys),
                                 tuple(batch_sizes)))
    return result


@query
def subclass_loaders(model: ScriptModel) -> list[LoaderInfo]:
    """The objects of classes of the tree deriving from DataLoader made in
    this file (`MNISTDataLoader(root, batch_size, train=True)`), with the
    DistributedSamplers their constructor hands to DataLoader's own
    (`super().__init__(dataset, sampler=sampler, ...)`), seen from this call
    (the constructor's parameters bound to its arguments). A subclass whose
    constructor reaches DataLoader's through another class of the tree, or
    not through `super()`, is not known here (no entry). `batch_size` is left
    unknown: the constructor's own signature says nothing of DataLoader's."""
    result = []
    for site in model.calls:
        if is_api_call(model, site, "DataLoader") or not instance_of(Made(model, site), "DataLoader"):
            continue
        targets = call_targets(model, site)
        if len(targets) != 1:
            continue
        imodel, init = targets[0]
        base = _base_constructor_call(imodel, init)
        if base is None:
            continue
        handed = call_argument(imodel, base, "sampler", 3)
        samplers = samplers_in(model, bind(model, site, handed)) if handed is not None else []
        result.append(LoaderInfo(model, site, key_of(model, site), tuple(samplers), (), (), subclass=True))
    return result


def _base_constructor_call(model: ScriptModel, init: FunctionInfo) -> CallSite | None:
    """The `super().__init__(...)` (or `super(Cls, self).__init__(...)`) call of a
    constructor, when it runs a library class's constructor (no `__init__` of
    the tree between)."""
    for c in model.calls_in(init):
        func = c.node.func
        if c.attr != "__init__" or not isinstance(func, cst.Attribute) or call_targets(model, c):
            continue
        if any(isinstance(a, Super) for a in value_of(model, func.value).atoms):
            return c
    return None


@query
def held_loaders(model: ScriptModel) -> list[LoaderInfo]:
    """Loaders built elsewhere (another function of the file, a helper module)
    that a name of this file holds, followed through the value flow:
    `loader, sampler = build_loader(args)` with the DataLoader made in data.py.
    `key` is the name here, `holder` the function it is held in, `via` the call."""
    return list(_held_loaders(model))


@query(on_cycle=())
def _held_loaders(model: ScriptModel) -> tuple[LoaderInfo, ...]:
    result: list[LoaderInfo] = []
    seen: set[int] = set()
    for a in model.assigns:
        value = a.value if a.value is not None else (a.unpacked[0] if a.unpacked else None)
        if not isinstance(value, cst.Call) or a.augmented is not None:
            continue
        site = call_site(model, value)
        if site is None or is_api_call(model, site, "DataLoader") or not call_targets(model, site, LOADER_NEED):
            continue
        held = value_of(model, a.value) if a.value is not None else element_of(model, a.unpacked[0], a.unpacked[1])
        for atom in held.made_by("DataLoader"):
            if (id(atom.site), id(a)) in seen or (atom.model is model and atom.site.ctx.function is a.ctx.function):
                continue
            inner = next((l for l in loaders(atom.model) if l.site is atom.site), None)
            if inner is not None:
                seen.add((id(atom.site), id(a)))
                result.append(LoaderInfo(atom.model, atom.site, a.key, inner.samplers, inner.batch_sampler_keys,
                                         inner.batch_sampler_sizes, holder=a.ctx.function, held=True, via=site,
                                         binding=a))
    return tuple(result)


def sharded_held_loaders(model: ScriptModel, single_only=None) -> list[LoaderInfo]:
    """The held loaders (held_loaders, and those built by a builder call
    written as an argument: `evaluate(model, make_loader(ds, mode="test"))`)
    that held_sharded_for_sure keeps (`single_only`: see there)."""
    return [h for h in held_loaders(model) + list(_argument_loaders(model))
            if held_sharded_for_sure(model, h, single_only)]


@query(on_cycle=())
def _argument_loaders(model: ScriptModel) -> tuple[LoaderInfo, ...]:
    """Loaders a builder of another module returns straight into an argument
    of a call of this file; `binding` is the argument expression."""
    result: list[LoaderInfo] = []
    for c in model.calls:
        for arg in c.node.args:
            value = arg.value
            if arg.star or not isinstance(value, cst.Call):
                continue
            site = call_site(model, value)
            if site is None or is_api_call(model, site, "DataLoader") or not call_targets(model, site, LOADER_NEED):
                continue
            for atom in value_of(model, value).made_by("DataLoader"):
                if atom.model is model:
                    continue
                inner = next((l for l in loaders(atom.model) if l.site is atom.site), None)
                if inner is not None:
                    result.append(LoaderInfo(atom.model, atom.site, None, inner.samplers, inner.batch_sampler_keys,
                                             inner.batch_sampler_sizes, holder=c.ctx.function, held=True, via=site,
                                             binding=value))
    return tuple(result)


def held_sharded_for_sure(model: ScriptModel, loader: LoaderInfo, single_only=None) -> bool:
    """A loader a name of this file holds from a builder (held_loaders) that is
    this DataLoader and no other on every path, fed by a DistributedSampler on
    every path of the builder: `build_loader(ds, mode="val")` whose body
    always makes `DistributedSampler(ds, shuffle=(mode == "train"))`. A
    builder that picks its loader or its sampler by an argument (`if mode ==
    "train": ... else: ...`) leaves which one this call gets unknown.
    `single_only(model, loader, atom)`: the other sampler `atom` is made only where
    the process runs alone (`if distributed: DistributedSampler(ds) else:
    RandomSampler(ds)`, judged by the caller, which knows the guards)."""
    a = loader.binding
    if not loader.held or a is None:
        return False
    if isinstance(a, cst.BaseExpression):
        held = value_of(model, a)   # built straight into a call's argument
    else:
        held = value_of(model, a.value) if a.value is not None else element_of(model, a.unpacked[0], a.unpacked[1])
    if not held.known or len(held.made_by("DataLoader")) != 1:
        return False
    m, site = loader.model, loader.site
    alone = (lambda atom: single_only(model, loader, atom)) if single_only is not None else None
    sampler = call_argument(m, site, "sampler", 3)
    if sampler is None:
        batch = call_argument(m, site, "batch_sampler", 4)
        if batch is None:
            return False
        batch = resolved(m, batch)
        if not batch.known or not batch.atoms or not all(isinstance(x, Made) and x.is_api("BatchSampler")
                                                         for x in batch.atoms):
            return False
        return all(_only_distributed(x.model, call_argument(x.model, x.site, "sampler", 0), alone)
                   for x in batch.atoms)
    return _only_distributed(m, sampler, alone)


def _only_distributed(model: ScriptModel, value: Value | None, alone) -> bool:
    if value is None:
        return False
    value = resolved(model, value)
    sharded = [x for x in value.atoms if isinstance(x, Made) and instance_of(x, "DistributedSampler")]
    return value.known and bool(sharded) and all(
        (isinstance(x, Made) and instance_of(x, "DistributedSampler"))
        or (alone is not None and isinstance(x, Made) and alone(x)) for x in value.atoms)


# -- wrapped models --------------------------------------------------------------

@dataclass(frozen=True)
class WrapInfo:
    site: CallSite
    kind: str             # "DistributedDataParallel" or "DataParallel"
    key: str | None       # the name holding the wrapper
    inner: str | None     # the name of the module that was wrapped
    # the class of the tree instantiated when it derives from torch's wrapper
    # (`class DistributedDataParallel(nn.parallel.DistributedDataParallel, Model)` in a helper module)
    subclass: tuple[ScriptModel, ClassInfo] | None = None

    def overrides(self, name: str) -> bool:
        """A class of the tree between the object and torch's wrapper defines
        `name` (a `state_dict` of its own): the wrapper's is not what runs."""
        return self.subclass is not None and any(name in c.methods for _, c in mro(*self.subclass))

    @property
    def order(self) -> int:
        return self.site.ctx.order


@query
def wraps(model: ScriptModel) -> list[WrapInfo]:
    """The DDP / DataParallel wraps made in this file: torch's classes (and
    apex's DDP), and classes of the tree deriving from them."""
    result = []
    subclassing = model.may_reach(WRAPPER_NEED)
    for site in model.calls:
        if is_ddp_wrap(model, site):
            kind = "DistributedDataParallel"
        elif is_dp_wrap(model, site):
            kind = "DataParallel"
        elif subclassing and (found := wrapper_subclass(model, site)) is not None:
            kind, subclass = found
            inner = site.arg("module", 0)
            result.append(WrapInfo(site, kind, key_of(model, site), dotted_name(inner) if inner is not None else None,
                                   subclass))
            continue
        else:
            continue
        inner = site.arg("module", 0)
        result.append(WrapInfo(site, kind, key_of(model, site), dotted_name(inner) if inner is not None else None))
    return result


def wrapper_subclass(model: ScriptModel, site: CallSite) -> tuple[str, tuple[ScriptModel, ClassInfo]] | None:
    """A call that instantiates a class of the tree deriving from torch's
    DistributedDataParallel or DataParallel (directly or through other
    classes of the tree, across modules): the wrapper's kind and the class.
    An object of that class is the wrapper (its `state_dict()` keys carry
    `module.`), with whatever methods the class adds."""
    func = site.node.func
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name) or (func is not root and not model.imports.is_imported(root.value)):
        return None   # a method of an object, not a class
    classes = [a for a in callee_value(model, site, WRAPPER_NEED).atoms if isinstance(a, Class)]
    if len(classes) != 1:
        return None
    bases = library_bases(classes[0].model, classes[0].cls)
    for kind, names in (("DistributedDataParallel", DDP_NAMES), ("DataParallel", DP_NAMES)):
        if any(is_torch_api(q, *names) for q in bases):
            return kind, (classes[0].model, classes[0].cls)
    return None


def wraps_before(model: ScriptModel, key: str, site: CallSite, kind: str | None = None) -> list[WrapInfo]:
    """Wraps of `key` earlier on the same path as `site`: same function, before
    it in source order, not in the other arm of an `if`."""
    return [
        w for w in wraps(model)
        if w.key == key and (kind is None or w.kind == kind) and w.order < site.ctx.order
        and w.site.ctx.function is site.ctx.function and not exclusive(w.site.ctx, site.ctx)
    ]


__all__ = [
    "call_arg", "loaders", "subclass_loaders", "held_loaders", "held_sharded_for_sure", "sharded_held_loaders", "wraps", "distributed_samplers", "samplers_in", "is_api_call",
    "exclusive", "key_of", "call_site", "EVAL_NAME", "direct_values",
]
