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
from ddpcheck.model.flow import Mapping, Seq, literal_entry, value_of, visible_bindings
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import reads
from ddpcheck.model.values import held_loaders, loaders
from ddpcheck.model.vocabulary import LR_NAME, LR_SCALING_CALL, WORLD_SIZE
from ddpcheck.model.worlds import D0, DN
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import SCRIPTS_ONLY
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import callees
from ddpcheck.model.guards import worlds

DOCUMENTED = re.compile(r"gpu|world|device|node|total|global|effective|replica|process", re.I)
_PLAIN_CALLS = {"float", "int", "get", "getattr"}


def _code(model: ScriptModel, node: cst.CSTNode) -> str:
    return model.module.code_for_node(node)


@query
def lr_scaled(model: ScriptModel, depth: int = 0) -> bool:
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
    if not result and depth == 0:
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


def _plain(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None, depth: int = 0) -> bool:
    """A value read from config or written as a literal: `args.lr`, `cfg["lr"]`,
    `0.1`, `float(cfg.get("lr", 0.1))`, or a local name assigned one. A bare
    parameter (the caller may have scaled it) is not plain."""
    if depth > 3:
        return False
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Subscript):   # `cfg["optimizer"]["lr"]`
        return dotted_name(expr.value) is not None or (
            isinstance(expr.value, cst.Subscript) and _plain(model, expr.value, scope, depth + 1))
    if isinstance(expr, cst.Call):
        name = dotted_name(expr.func) or ""
        if name.rpartition(".")[2] not in _PLAIN_CALLS:
            return False
        return all(_plain(model, a.value, scope, depth + 1) or isinstance(a.value, cst.SimpleString) for a in expr.args)
    key = dotted_name(expr)
    if key is None:
        return False
    if "." in key:
        return True   # `args.lr`, `cfg.SOLVER.BASE_LR`: config (a world-size rescale would have been seen)
    bindings = visible_bindings(model, expr)
    if not bindings or any(b.kind != "assign" for b in bindings):
        return False   # a parameter, a name the file does not assign
    return all(b.value is not None and b.augmented is None and _plain(model, b.value, b.ctx.function, depth + 1)
               for b in bindings)


def _optimizers(model: ScriptModel) -> Iterator[tuple[CallSite, cst.BaseExpression]]:
    """Each optimizer of torch.optim and the learning rates it is given:
    `lr=`, or the `"lr"` of each parameter-group dict (`SGD([{"params": ...,
    "lr": args.lr}, ...])`, the list built anywhere the value engine follows)."""
    for c in model.calls:
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
        optimizers = list(_optimizers(model))
        if not optimizers:
            return
        # loaders built here, and loaders built by a helper (in the file or a helper module) that a
        # name here holds: `loader, sampler = build_loader(args)`
        train = [l for l in loaders(model) + held_loaders(model) if l.samplers and l.batch_size is not None
                 and not is_eval_loader(model, l)]
        if not train or any(derived_from_global(l.model, l.batch_size) for l in train):
            return
        # the per-rank batch must visibly come from config (a parameter may have been divided by the caller)
        plain = [l for l in train if _plain(l.model, l.batch_size, l.site.ctx.function)]
        if not plain:
            return
        loader = plain[0]
        if lr_scaled(model):
            return
        for opt, lr in optimizers:
            if not (worlds(model, opt.ctx) & {D0, DN}):
                continue
            if not _plain(model, lr, opt.ctx.function):
                return
            if _documented(model, lr):
                return
            lr_text = _code(model, lr)
            batch = _code(loader.model, loader.batch_size)
            yield Hit(lr, message=(
                f"`{lr_text}` is used unchanged although each rank loads `{batch}` samples per step from "
                f"`{loader.key or 'the DistributedSampler loader'}`: the effective batch is {batch} x world size "
                "(8x on 8 GPUs) and nothing in the script scales the learning rate with it, so a value tuned on "
                "one GPU under-trains on many (or the run depends on the GPU count)"
            ), fix=(
                f"scale with the world size W: linear `{lr_text} * W` (Goyal et al.; add warmup), or square root "
                f"`{lr_text} * W ** 0.5` (gentler, common with Adam); or keep the global batch fixed by dividing "
                f"`{batch}` by W"
            ))
            return


def _documented(model: ScriptModel, lr: cst.BaseExpression) -> bool:
    """The lr option's help ties it to a GPU count or a global batch
    ("0.02 for 8 GPUs and 2 images per GPU"): the author chose it for that setup."""
    key = dotted_name(lr)
    if key is None:
        return False
    last = key.rpartition(".")[2]
    return any(o.dest == last and DOCUMENTED.search(o.help) for o in options(model))
