"""DDP102 sampler-shuffle-conflict."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import exclusive, is_api_call, loaders, origins
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import shuffle_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _always_true(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None, depth: int = 0) -> bool:
    """`shuffle=True`, or a name only ever assigned True."""
    if expr is None or depth > 3:
        return False
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return expr.value == "True"
    key = dotted_name(expr)
    if key is None:
        return False
    assigns = model.assignments(key, scope)
    return bool(assigns) and all(
        a.value is not None and a.augmented is None and _always_true(model, a.value, a.ctx.function, depth + 1)
        for a in assigns
    )


def _may_hold(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
              at: Ctx, depth: int = 0) -> cst.BaseExpression | None:
    """A sampler `expr` can visibly hold at `at` (a constructor call, or a
    helper of the tree that returns one), else None. `None`, parameters,
    helpers we cannot see and assignments in the other arm of an `if` do not count."""
    if expr is None or depth > 3 or _is_none(expr):
        return None
    if isinstance(expr, cst.IfExp):
        return (_may_hold(model, expr.body, scope, at, depth + 1)
                or _may_hold(model, expr.orelse, scope, at, depth + 1))
    if isinstance(expr, cst.Call):
        site = model.site_of.get(id(expr))
        if site is None:
            return None
        last = (site.qual or site.func or "").rpartition(".")[2]
        if last[:1].isupper():
            return expr   # a class: a constructor never returns None
        target = resolve_call(model, site)
        if target is not None:
            tmodel, fn = target
            if any(_may_hold(tmodel, v, fn, ctx, depth + 1) is not None for v, ctx in fn.returns):
                return expr
        return None
    key = dotted_name(expr)
    if key is None:
        return None
    for a in model.assignments(key, scope):
        if a.value is None or a.augmented is not None or exclusive(a.ctx, at):
            continue
        if a.ctx.function is at.function and a.ctx.order > at.order:
            continue
        found = _may_hold(model, a.value, a.ctx.function, at, depth + 1)
        if found is not None:
            return found
    return None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


@register
class SamplerShuffleConflict(Rule):
    code = "DDP102"
    name = "sampler-shuffle-conflict"
    short = "`shuffle=True` with a sampler: DataLoader raises ValueError"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    fixable = True
    message = ("DataLoader gets both a sampler and shuffle=True: it raises "
               "`ValueError: sampler option is mutually exclusive with shuffle`")
    fix = "pass `shuffle=(sampler is None)`: the sampler (a DistributedSampler shuffles by itself) decides the order"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for loader in loaders(model):
            site = loader.site
            if site.has_star_args:
                continue
            shuffle = site.arg("shuffle", 2)
            scope = site.ctx.function
            if not _always_true(model, shuffle, scope):
                continue
            for kw, pos in (("sampler", 3), ("batch_sampler", 4)):
                expr = site.arg(kw, pos)
                value = _may_hold(model, expr, scope, site.ctx)
                if value is None:
                    continue
                yield Hit(shuffle, message=self._message(model, kw, expr, value), fix=self._fix(model, kw, expr),
                          edit=shuffle_edit(site, shuffle, expr))
                break

    def _message(self, model: ScriptModel, kw: str, expr, value) -> str:
        name = dotted_name(expr) or _short(model.module.code_for_node(expr))
        site = model.site_of.get(id(value))
        distributed = site is not None and any(
            is_api_call(m, o, "DistributedSampler") for m, o in origins(model, value, site.ctx.function))
        error = ("sampler option is mutually exclusive with shuffle" if kw == "sampler" else
                 "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
        when = ("in the distributed run, where it holds a DistributedSampler" if distributed
                else "whenever it is not None")
        return (f"`{kw}={name}` and `shuffle=True` on one DataLoader: the loader raises `ValueError: {error}` "
                f"{when}; the order is the sampler's job (a DistributedSampler shuffles its shard itself, "
                "reseeded by set_epoch)")

    def _fix(self, model: ScriptModel, kw: str, expr) -> str:
        name = dotted_name(expr)
        if kw == "batch_sampler":
            return ("remove `shuffle=True` (a loader with a batch_sampler takes no shuffle, batch_size, sampler or "
                    "drop_last): shuffle in the sampler the BatchSampler wraps, e.g. a DistributedSampler reseeded "
                    "by `set_epoch(epoch)`")
        if name:
            return f"pass `shuffle=({name} is None)` (and call `{name}.set_epoch(epoch)` each epoch)"
        return f"drop `shuffle=True`: the {kw} decides the order"
