"""DDP101 missing-set-epoch."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.flow import Made, Pass, Value, argument_expr, call_sites_of, constant_of, every_pass, instance_of, value_at
from ddpcheck.model.evaluation import pass_without_gradients
from ddpcheck.model.script import CallSite, Loop, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import DISTRIBUTED_SAMPLER_NEED, LoaderInfo, SamplerInfo, loaders, looks_like_eval_name, subclass_loaders
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import set_epoch_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import callees, resolve_call

_SAMPLER_ATTRS = ("sampler", "batch_sampler")


def _runs_once(model: ScriptModel, loop) -> bool:
    """`for epoch in range(1)` (or `range(0, 1)`, `range(start, start + 1)`,
    a name certainly holding 1): one epoch, so the sampler's epoch never
    changes and there is no order to replay."""
    if not loop.is_for or not isinstance(loop.iter, cst.Call) or dotted_name(loop.iter.func) != "range":
        return False
    args = [a.value for a in loop.iter.args if a.keyword is None and not a.star]
    if len(args) == 1:
        return constant_of(model, args[0]) in (0, 1)
    if len(args) == 2:
        low, high = constant_of(model, args[0]), constant_of(model, args[1])
        if isinstance(low, int) and isinstance(high, int) and not isinstance(low, bool):
            return high - low <= 1
        end = args[1]
        return (isinstance(end, cst.BinaryOperation) and isinstance(end.operator, cst.Add)
                and constant_of(model, end.right) == 1
                and model.module.code_for_node(end.left) == model.module.code_for_node(args[0]))
    return False


@register
class MissingSetEpoch(Rule):
    code = "DDP101"
    triggers = (USES_DISTRIBUTED,)
    name = "missing-set-epoch"
    short = "DistributedSampler never gets `set_epoch()`: every epoch replays the same order"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    fixable = True
    message = (
        "DistributedSampler is iterated every epoch but set_epoch() is never called: "
        "its shuffle is seeded with the epoch, so every epoch replays the same order"
    )
    fix = "call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating the loader"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not model.may_reach(DISTRIBUTED_SAMPLER_NEED):
            return
        reported: set[int] = set()
        for _fn, p in every_pass(model):
            if p.epoch is None or _runs_once(p.epoch_model, p.epoch) or pass_without_gradients(p):
                continue   # once; or an evaluation over the loader, whose order changes no metric
            for atom in [a for a in p.consumed.made if instance_of(a, "DataLoader")]:
                loader = _loader_info(atom)
                if loader is None:
                    continue
                shuffling = [s for s in loader.samplers if s.shuffle is True]
                if not shuffling or loader.looks_like_eval() or _eval_name(model, p, atom):
                    continue
                node = p.epoch.node if p.epoch_model is model else _call_leaving(model, p)
                if node is None or id(node) in reported:
                    continue
                if _sets_epoch(p.epoch_model, p.epoch, atom, shuffling):
                    continue
                handed = _held_as(model, p, atom)
                if p.epoch_model is not model and handed is None and loader.model is not model \
                        and not _comes_out(model, p, atom):
                    continue   # made and looped over in the other module, which reports it at its own loop
                reported.add(id(node))
                held = handed or loader.key
                sampler = next((s.key for s in shuffling if s.key and s.model is model
                                and p.epoch_model is model and _visible(model, s, p.epoch)),
                               f"{held}.sampler" if held else "sampler")
                loader_text = f"`{held}`" if held else "the loader"
                if p.epoch_model is model:
                    what = f"{loader_text} draws from a shuffling DistributedSampler but this epoch loop never calls"
                else:
                    callee = p.epoch.ctx.function.name + "()" if p.epoch.ctx.function is not None else "code"
                    if handed is None and loader.model is not model:
                        # nothing of this file's goes in: the loader is made where it is looped over
                        what = (f"{callee} ({p.epoch_model.file_name}) loops over a loader drawing from a shuffling "
                                "DistributedSampler and its epoch loop never calls")
                    else:
                        what = (f"{loader_text} draws from a shuffling DistributedSampler and is handed to {callee} "
                                f"({p.epoch_model.file_name}), whose epoch loop never calls")
                yield Hit(
                    node,
                    message=(
                        f"{what} `{sampler}.set_epoch(...)`: the sampler seeds its shuffle with the epoch, so "
                        "every epoch replays the epoch-0 order on every rank"
                    ),
                    fix=(f"call `{sampler}.set_epoch(epoch)` at the top of the epoch loop, before iterating {loader_text}"
                         if p.iter_call is None else
                         f"call `{sampler}.set_epoch(n)` with a counter that grows each time `iter({held or 'loader'})` is "
                         "remade, right before remaking it"),
                    edit=(set_epoch_edit(model, p.epoch, sampler, loader.site.arg("sampler", 3))
                          if p.epoch_model is model and p.iter_call is None and loader.model is model else None),
                )



def _call_leaving(model: ScriptModel, p: Pass) -> cst.CSTNode | None:
    """For an epoch loop in another module: the call of this file that
    lands in that module (reported there, once)."""
    if not p.via:
        return None
    target = resolve_call(model, p.via[0])
    return p.via[0].node if target is not None and target[0] is not model else None


def _comes_out(model: ScriptModel, p: Pass, atom: Made) -> bool:
    """The call of this file that leads to the pass returns the loader, or a
    generator whose body runs the epoch loop (`create_loader(...)` returning
    `sample_data(loader)`, then `next(...)` here): this file drives it."""
    call = p.via[0]
    value = value_at(model, call.node, call.ctx.function, call.stmt)
    if not value.known:
        return False
    for made in value.made:
        if made == atom:
            return True
        target = resolve_call(made.model, made.site)
        if target is not None and p.epoch is not None and target[1] is p.epoch.ctx.function:
            return True
    return False


def _loader_info(atom: Made) -> LoaderInfo | None:
    """The loader made at `atom`: a DataLoader, or an object of a class of the tree deriving from it."""
    made = loaders(atom.model) if atom.is_api("DataLoader") else subclass_loaders(atom.model)
    return next((l for l in made if l.site is atom.site), None)


def _eval_name(model: ScriptModel, p: Pass, atom: Made) -> bool:
    """The loop iterates something named like an evaluation loader (`val_loader`
    handed to `evaluate(model, loader)`)."""
    name = _held_as(model, p, atom)
    return bool(name and looks_like_eval_name(name)) or _handed_in_as_eval(model, p, atom)


def _handed_in_as_eval(model: ScriptModel, p: Pass, atom: Made) -> bool:
    """The pass iterates a parameter of its function (an endless-stream
    helper `def forever(loader): ...`), and every call of the function in
    the file that hands it this loader names it like evaluation data
    (`forever(valid_loader_)`): one builder making both loaders gives them
    one allocation site, so the caller's name tells them apart."""
    source = p.source
    ctx = p.loop.ctx if p.loop is not None else p.iter_call.ctx if p.iter_call is not None else None
    fn = ctx.function if ctx is not None else None
    if p.loop_model is not model or fn is None or not isinstance(source, cst.Name) or source.value not in fn.params:
        return False
    names = []
    for call in call_sites_of(model, fn) or ():
        bound, arg = argument_expr(call, fn, source.value)
        name = _holding_name(model, arg, call.ctx.function, call.stmt, atom) if bound and arg is not None else None
        if bound and arg is not None and name is None and atom in value_at(model, arg, call.ctx.function, call.stmt).atoms:
            return False   # handed in by an expression with no name
        if name is not None:
            names.append(name)
    return bool(names) and all(looks_like_eval_name(n) for n in names)


def _held_as(model: ScriptModel, p: Pass, atom: Made) -> str | None:
    """The name the loader has at the epoch loop: the argument of the call
    under the epoch loop that leads to the pass, or what the loop itself
    iterates."""
    for call in p.via:
        if p.epoch_model is model and p.epoch not in call.ctx.loops:
            continue
        for a in call.node.args:
            name = _holding_name(model, a.value, call.ctx.function, call.stmt, atom)
            if name:
                return name
        break
    if p.loop_model is model and p.source is not None:
        ctx = p.loop.ctx if p.loop is not None else p.iter_call.ctx
        stmt = p.loop.node if p.loop is not None else p.iter_call.stmt
        return _holding_name(model, p.source, ctx.function, stmt, atom)
    return None


def _holding_name(model: ScriptModel, expr: cst.BaseExpression, scope, stmt, atom: Made) -> str | None:
    """A name inside `expr` (`zip(a, cycle(b))`, calls nested however deeply) that holds `atom`."""
    name = dotted_name(expr)
    if name:
        return name if atom in value_at(model, expr, scope, stmt).atoms else None
    if isinstance(expr, cst.Call):
        for a in expr.args:
            found = _holding_name(model, a.value, scope, stmt, atom)
            if found:
                return found
    return None


def _visible(model: ScriptModel, sampler: SamplerInfo, loop: Loop) -> bool:
    return sampler.site.ctx.function is loop.ctx.function


def _sets_epoch(model: ScriptModel, loop: Loop, loader: Made, samplers: list[SamplerInfo]) -> bool:
    """A `set_epoch` call inside `loop` (or a helper it calls) on this loader's
    sampler, or on something we cannot tell apart from it."""
    inside = model.calls_inside(loop)
    for m, call in [(model, c) for c in inside] + [(m, c) for m, fn, _ in callees(model, inside) for c in m.calls_in(fn)]:
        if call.attr != "set_epoch" or call.receiver is None:
            continue
        if _may_be(m, call, call.receiver, loader, samplers):
            return True
    return False


def _may_be(model: ScriptModel, call: CallSite, receiver: cst.BaseExpression, loader: Made,
            samplers: list[SamplerInfo]) -> bool:
    """`receiver` may be the sampler: it holds the sampler (or a BatchSampler
    over it), it is `<the loader>.sampler` / `.batch_sampler.sampler`, or its
    value is not known."""
    expr = receiver
    through_loader = False
    while isinstance(expr, cst.Attribute) and expr.attr.value in _SAMPLER_ATTRS:
        expr = expr.value
        through_loader = True
    value = value_at(model, expr, call.ctx.function, call.stmt)
    if not value.known:
        return True
    sampler_sites = {id(s.site) for s in samplers}
    for atom in value.made:
        if atom == loader or id(atom.site) in sampler_sites:
            return True
        if atom.is_api("BatchSampler") and _holds_sampler(atom, sampler_sites):
            return True
        if through_loader and not atom.is_api("DataLoader"):
            return True   # `.sampler` of something that is not a torch DataLoader: cannot tell
        if not through_loader and not atom.is_api("DataLoader", "DistributedSampler", "BatchSampler"):
            return True   # a custom sampler class we cannot see into
    return False


def _holds_sampler(batch_sampler: Made, sampler_sites: set[int]) -> bool:
    arg = batch_sampler.site.arg("sampler", 0)
    v: Value = value_at(batch_sampler.model, arg, batch_sampler.site.ctx.function)
    return not v.known or any(id(a.site) in sampler_sites for a in v.made)
