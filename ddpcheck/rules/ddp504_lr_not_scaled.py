"""DDP504 lr-not-scaled."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.arguments import options
from ddpcheck.model.evaluation import is_eval_loader
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import LoaderInfo, loaders
from ddpcheck.model.worlds import D0, DN
from ddpcheck.findings import Severity
from ddpcheck.rules.base import Hit, Rule, register

WORLD = re.compile(
    r"world_size|get_world_size|world|nprocs?|n_?procs?|ngpus?|num_gpus?|n_gpus?|gpus|gpu_count|device_count"
    r"|num_replicas|num_processes|num_devices|n_devices", re.I)
GLOBAL_BATCH = re.compile(r"(global|total|effective|eff|overall)_?(train_?)?batch|batch_?size_?(total|global|all)", re.I)
LR_KEY = re.compile(r"(^|[._\['\"])(\w*lr\w*|\w*learning_rate\w*)(['\"\]]*)$", re.I)
SCALING_CALL = re.compile(r"scale\w*_lr|lr\w*_scal|scal\w*_learning_rate|linear_scal|sqrt_scal|scale_learning_rate", re.I)
DOCUMENTED = re.compile(r"gpu|world|device|node|total|global|effective|replica|process", re.I)
_PLAIN_CALLS = {"float", "int", "get", "getattr"}


def _code(model: ScriptModel, node: cst.CSTNode) -> str:
    return model.module.code_for_node(node)


def world_tokens(model: ScriptModel) -> set[str]:
    """Names that carry the world size: `eff_batch_size = args.batch_size * misc.get_world_size()`."""
    memo = ("world_tokens",)
    if memo in model._memo:
        return model._memo[memo]
    tokens: set[str] = set()
    texts = [(a.key, _code(model, a.value)) for a in model.assigns
             if a.value is not None and not WORLD.search(a.key)]
    for _ in range(3):
        grown = False
        for key, text in texts:
            if key not in tokens and _world(model, text, tokens):
                tokens.add(key)
                grown = True
        if not grown:
            break
    model._memo[memo] = tokens
    return tokens


def _world(model: ScriptModel, text: str, tokens: set[str]) -> bool:
    if WORLD.search(text):
        return True
    return any(re.search(r"(?<![\w.])" + re.escape(t) + r"(?![\w])", text) for t in tokens)


def lr_scaled(model: ScriptModel, depth: int = 0) -> bool:
    """Some lr in the file (or a helper of the tree it calls) is computed with
    the world size, or a scaling helper is called."""
    memo = ("lr_scaled",)
    if memo in model._memo:
        return model._memo[memo]
    tokens = world_tokens(model)
    result = False
    for a in model.assigns:
        if a.value is not None and LR_KEY.search(a.key) and _world(model, _code(model, a.value), tokens):
            result = True
            break
    if not result:
        for c in model.calls:
            if SCALING_CALL.search(c.attr or ""):
                result = True
                break
            # `lr=` of an optimizer, `max_lr=` of OneCycleLR, `base_lr=` of a warmup scheduler...
            if any(a.keyword is not None and LR_KEY.search(a.keyword.value) and _world(model, _code(model, a.value), tokens)
                   for a in c.node.args):
                result = True
                break
    if not result and depth == 0:
        for m, fn, _ in model.callees(model.calls, depth=2):
            if m is model:
                continue
            for a in m.assigns_in(fn):
                if a.value is not None and LR_KEY.search(a.key) and WORLD.search(_code(m, a.value)):
                    result = True
                    break
            if result:
                break
    model._memo[memo] = result
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
    assigns = model.assignments(key, scope)
    if "." not in key:
        if not assigns:
            return False   # a parameter or a global we cannot see
        return all(a.value is not None and a.augmented is None and _plain(model, a.value, a.ctx.function, depth + 1)
                   for a in assigns)
    return True   # `args.lr`, `cfg.SOLVER.BASE_LR`: config (a world-size rescale would have been seen)


def _divided(model: ScriptModel, expr: cst.BaseExpression, loader: LoaderInfo) -> bool:
    """The per-rank batch is derived from a global one."""
    tokens = world_tokens(model)
    text = _code(model, expr)
    if GLOBAL_BATCH.search(text) or ("/" in text and _world(model, text, tokens)):
        return True
    key = dotted_name(expr)
    if key is None:
        return False
    last = key.rpartition(".")[2]
    for a in model.assigns:
        if a.value is None or a.key.rpartition(".")[2] != last:
            continue
        value = _code(model, a.value)
        if a.augmented in ("DivideAssign", "FloorDivideAssign") and _world(model, value, tokens):
            return True
        if "/" in value and _world(model, value, tokens):
            return True
        if GLOBAL_BATCH.search(value):
            return True
    return False


def _optimizers(model: ScriptModel) -> Iterator[tuple[CallSite, cst.BaseExpression]]:
    for c in model.calls:
        q = c.qual or ""
        if not re.fullmatch(r"torch\.optim\.[A-Z]\w*", q) or c.has_star_args:
            continue
        lr = c.arg("lr", 1)
        if lr is not None:
            yield c, lr


@register
class LrNotScaled(Rule):
    code = "DDP504"
    name = "lr-not-scaled"
    short = "batch grows with the GPU count but the learning rate is not scaled"
    severity = Severity.INFO
    message = ("the effective batch grows with the number of GPUs (per-GPU batch x world size) but the learning "
               "rate is used unchanged from the config")
    fix = ("scale it with the world size: linear `lr = base_lr * world_size` (with warmup; the usual choice for "
           "SGD) or square root `lr = base_lr * world_size ** 0.5` (often better for Adam); or keep the global "
           "batch fixed by dividing the per-GPU batch by the world size")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        optimizers = list(_optimizers(model))
        if not optimizers:
            return
        train = [l for l in loaders(model) if l.samplers and l.batch_size is not None
                 and not is_eval_loader(model, l)]
        if not train or any(_divided(model, l.batch_size, l) for l in train):
            return
        # the per-rank batch must visibly come from config (a parameter may have been divided by the caller)
        plain = [l for l in train if _plain(model, l.batch_size, l.site.ctx.function)]
        if not plain:
            return
        loader = plain[0]
        if lr_scaled(model):
            return
        for opt, lr in optimizers:
            if not (model.worlds(opt.ctx) & {D0, DN}):
                continue
            if not _plain(model, lr, opt.ctx.function):
                return
            if _documented(model, lr):
                return
            lr_text = _code(model, lr)
            batch = _code(model, loader.batch_size)
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
