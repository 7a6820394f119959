"""DDP504 lr-not-scaled."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.arguments import options
from ddpcheck.model.batches import derived_from_global, reads_world
from ddpcheck.model.evaluation import is_eval_loader
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.flow import Mapping, Seq, expression_at_call, literal_entry, resolve_call, value_of, visible_bindings
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import reads
from ddpcheck.model.values import held_loaders, loaders
from ddpcheck.model.vocabulary import LR_NAME, LR_SCALING_CALL, WORLD_SIZE
from ddpcheck.model.worlds import D0, DN
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import SCRIPTS_ONLY, library_module
from ddpcheck.model.processes import one_process
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import callees
from ddpcheck.model.guards import worlds

# A module that makes a torch.optim optimizer names `optim` (`torch.optim.SGD`,
# `from torch.optim import AdamW`, `from torch import optim`): a call into a
# module that cannot reach one is not followed (nor its module parsed).
OPTIM_NEED = (("optim",),)
DOCUMENTED = re.compile(r"gpu|world|device|node|total|global|effective|replica|process", re.I)
_PLAIN_CALLS = {"float", "int", "get", "getattr"}


def _code(model: ScriptModel, node: cst.CSTNode) -> str:
    return model.module.code_for_node(node)


@query
def lr_scaled(model: ScriptModel) -> bool:
    """Some lr in the file (or a helper of the tree it calls) is computed with
    the world size, or a scaling helper is called."""
    result = False
    for a in model.assigns:
        if a.value is not None and LR_NAME.search(a.key) and reads_world(model, reads(model, a.value)):
            result = True
            break
    if not result:
        for c in model.calls:
            if LR_SCALING_CALL.search(c.attr or ""):
                result = True
                break
            # `lr=` of an optimizer, `max_lr=` of OneCycleLR, `base_lr=` of a warmup scheduler...
            if any(a.keyword is not None and LR_NAME.search(a.keyword.value) and reads_world(model, reads(model, a.value))
                   for a in c.node.args):
                result = True
                break
    if not result:
        for m, fn, _ in callees(model, model.calls):
            if m is model:
                continue
            for a in m.assigns_in(fn):
                if a.value is not None and LR_NAME.search(a.key) and \
                        any(WORLD_SIZE.search(n) for n in reads(m, a.value)):
                    result = True
                    break
            if result:
                break
    return result


@query(on_cycle=False)
def _plain(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None) -> bool:
    """A value read from config or written as a literal: `args.lr`, `cfg["lr"]`,
    `0.1`, `float(cfg.get("lr", 0.1))`, or a local name assigned one, through
    any number of names (a name that depends on itself is not plain: the
    memo's fixed point from "not plain"). A bare parameter (the caller may
    have scaled it) is not plain."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Subscript):   # `cfg["optimizer"]["lr"]`
        return dotted_name(expr.value) is not None or (
            isinstance(expr.value, cst.Subscript) and _plain(model, expr.value, scope))
    if isinstance(expr, cst.Call):
        name = dotted_name(expr.func) or ""
        if name.rpartition(".")[2] not in _PLAIN_CALLS:
            return False
        return all(_plain(model, a.value, scope) or isinstance(a.value, cst.SimpleString) for a in expr.args)
    key = dotted_name(expr)
    if key is None:
        return False
    if "." in key:
        return True   # `args.lr`, `cfg.SOLVER.BASE_LR`: config (a world-size rescale would have been seen)
    bindings = visible_bindings(model, expr)
    if not bindings or any(b.kind != "assign" for b in bindings):
        return False   # a parameter, a name the file does not assign
    return all(b.value is not None and b.augmented is None and _plain(model, b.value, b.ctx.function)
               for b in bindings)


def _optimizers(model: ScriptModel, fn: FunctionInfo | None = None,
                everywhere: bool = True) -> Iterator[tuple[CallSite, cst.BaseExpression]]:
    """Each optimizer of torch.optim and the learning rates it is given:
    `lr=`, or the `"lr"` of each parameter-group dict (`SGD([{"params": ...,
    "lr": args.lr}, ...])`, the list built anywhere the value engine follows)."""
    for c in (model.calls if everywhere else model.calls_in(fn)):
        q = c.qual or ""
        if not re.fullmatch(r"torch\.optim\.[A-Z]\w*", q) or c.has_star_args:
            continue
        lr = c.arg("lr", 1)
        if lr is not None:
            yield c, lr
            continue
        groups = value_of(model, c.arg("params", 0)) if c.arg("params", 0) is not None else None
        for seq in sorted((a for a in (groups.atoms if groups else ()) if isinstance(a, Seq) and a.items),
                          key=lambda a: a.model.path):
            for item in seq.items:
                for group in item.atoms:
                    expr = literal_entry(group, "lr") if isinstance(group, Mapping) and group.model is model else None
                    if expr is not None:
                        yield c, expr


@query(on_cycle=())
def optimizer_lrs(model: ScriptModel, fn: FunctionInfo) -> tuple[tuple[ScriptModel, cst.BaseExpression], ...]:
    """The learning rates of the torch.optim optimizers that running `fn`
    makes (itself, or a function or a constructor it calls: an optimizer
    factory, a wrapper class creating its optimizer in `__init__`), each
    written where it can be read: a parameter of the function that makes the
    optimizer is followed to what the call passes, up to `fn`'s own
    parameters."""
    found: list[tuple[ScriptModel, cst.BaseExpression]] = [(model, lr) for _, lr in _optimizers(model, fn, False)]
    for c in model.calls_in(fn):
        target = resolve_call(model, c, OPTIM_NEED)
        if target is None or target[1] is fn:
            continue
        found.extend(_lrs_seen_from(model, c, *target))
    return tuple(found)


def _lrs_seen_from(model: ScriptModel, c: CallSite, tmodel: ScriptModel,
                   fn: FunctionInfo) -> Iterator[tuple[ScriptModel, cst.BaseExpression]]:
    """The learning rates of the optimizers call `c` of `model` makes by
    running `fn` (of `tmodel`): one read in the callee's own module is
    written as the argument of `c` that it comes from, when it comes from one."""
    for m, lr in optimizer_lrs(tmodel, fn):
        if m is tmodel:
            here = expression_at_call(model, c, tmodel, lr)
            if here is not None:
                yield model, here
                continue
        yield m, lr


def _optimizers_through_calls(model: ScriptModel) -> Iterator[tuple[CallSite, ScriptModel, cst.BaseExpression]]:
    """Optimizers made in another module by a call of this file
    (`opt = build_optimizer(model, cfg.lr)`): the call and the learning rate,
    written in this file where it is an argument of the call."""
    for c in model.calls:
        target = resolve_call(model, c, OPTIM_NEED)
        if target is None or target[0] is model:
            continue
        for m, lr in _lrs_seen_from(model, c, *target):
            yield c, m, lr


@register
class LrNotScaled(Rule):
    code = "DDP504"
    triggers = (USES_DISTRIBUTED,)
    name = "lr-not-scaled"
    short = "batch grows with the GPU count but the learning rate is not scaled"
    severity = Severity.INFO
    kinds = SCRIPTS_ONLY
    needs_ranks = True
    message = ("the effective batch grows with the number of GPUs (per-GPU batch x world size) but the learning "
               "rate is used unchanged from the config")
    fix = ("scale it with the world size: linear `lr = base_lr * world_size` (with warmup; the usual choice for "
           "SGD) or square root `lr = base_lr * world_size ** 0.5` (often better for Adam); or keep the global "
           "batch fixed by dividing the per-GPU batch by the world size")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        optimizers = [(opt, model, lr, lr) for opt, lr in _optimizers(model)] + [
            (call, m, lr, lr if m is model else call.node) for call, m, lr in _optimizers_through_calls(model)
            if _reported_in_own_module(m) is not lr]   # that module's own lint reports it at its `lr=`
        if not optimizers:
            return
        # loaders built here, and loaders built by a helper (in the file or a helper module) that a
        # name here holds: `loader, sampler = build_loader(args)`
        train = [l for l in loaders(model) + held_loaders(model) if l.samplers and l.batch_size is not None
                 and not is_eval_loader(model, l)]
        if not train or any(derived_from_global(l.model, l.batch_size) for l in train):
            return
        # the per-rank batch must visibly come from config (a parameter may have been divided by the caller)
        plain = [(l, b) for l, b in ((l, _batch_read_here(model, l)) for l in train) if b is not None]
        if not plain:
            return
        loader, (batch_model, batch_expr) = plain[0]
        if lr_scaled(model):
            return
        for opt, lr_model, lr, node in optimizers:
            if not (worlds(model, opt.ctx) & {D0, DN}):
                continue
            if not _plain(lr_model, lr, opt.ctx.function):
                return
            if lr_model is model and _documented(model, lr):
                return
            lr_text = _code(lr_model, lr)
            batch = _code(batch_model, batch_expr)
            made = "" if lr_model is model and node is lr else \
                f" by `{opt.func or 'this call'}(...)` ({lr_model.file_name})"
            yield Hit(node, message=(
                f"`{lr_text}`{made} is used unchanged although each rank loads `{batch}` samples per step from "
                f"`{loader.key or 'the DistributedSampler loader'}`: the effective batch is {batch} x world size "
                "(8x on 8 GPUs) and nothing in the script scales the learning rate with it, so a value tuned on "
                "one GPU under-trains on many (or the run depends on the GPU count)"
            ), fix=(
                f"scale with the world size W: linear `{lr_text} * W` (Goyal et al.; add warmup), or square root "
                f"`{lr_text} * W ** 0.5` (gentler, common with Adam); or keep the global batch fixed by dividing "
                f"`{batch}` by W"
            ))
            return


def _batch_read_here(model: ScriptModel, loader) -> tuple[ScriptModel, cst.BaseExpression] | None:
    """The loader's per-rank batch where it is plain config or a literal: as
    the builder writes it, or, a parameter of a builder (of this file or
    another module), as the call of this file passes it
    (`build_loader(ds, cfg.batch_size)`)."""
    expr = loader.batch_size
    if loader.held and loader.via is not None:
        here = expression_at_call(model, loader.via, loader.model, expr)
        if here is not None:
            return (model, here) if _plain(model, here, loader.via.ctx.function) else None
    return (loader.model, expr) if _plain(loader.model, expr, loader.site.ctx.function) else None


def _documented(model: ScriptModel, lr: cst.BaseExpression) -> bool:
    """The lr option's help ties it to a GPU count or a global batch
    ("0.02 for 8 GPUs and 2 images per GPU"): the author chose it for that setup."""
    key = dotted_name(lr)
    if key is None:
        return False
    last = key.rpartition(".")[2]
    return any(o.dest == last and DOCUMENTED.search(o.help) for o in options(model))


@query(on_cycle=None)
def _reported_in_own_module(model: ScriptModel) -> cst.CSTNode | None:
    """The learning rate this rule reports when `model`, a helper module that
    makes an optimizer a script's call asks for, is linted itself (it builds
    its own sharded training loaders too): one optimizer is reported once."""
    if library_module(model) or one_process(model) is not None:
        return None
    hit = next(iter(LrNotScaled().check(model)), None)
    return hit.node if hit is not None else None
