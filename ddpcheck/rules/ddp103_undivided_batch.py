"""DDP103 undivided-batch."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.arguments import options
from ddpcheck.model.batches import divided_by_world, is_global_batch_name
from ddpcheck.model.launch import launch_commands
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import expression_at_call, sole_binding
from ddpcheck.model.values import held_loaders, loaders
from ddpcheck.model.vocabulary import GLOBAL_HELP, PER_RANK_HELP
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _name(expr: cst.BaseExpression) -> str | None:
    """`args.batch_size`, `cfg["global_batch_size"]` and
    `cfg.get("global_batch_size", 256)` (the key), through `int(...)`."""
    expr = _unwrapped(expr)
    d = dotted_name(expr)
    if d:
        return d
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        idx = expr.slice[0].slice
        if isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString):
            value = idx.value.evaluated_value
            return value if isinstance(value, str) else None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get" \
            and expr.args and isinstance(expr.args[0].value, cst.SimpleString) and expr.args[0].keyword is None:
        value = expr.args[0].value.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _unwrapped(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`int(x)` is x."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "int" \
            and len(expr.args) == 1 and not expr.args[0].keyword and not expr.args[0].star:
        expr = expr.args[0].value
    return expr


def _names_behind(model: ScriptModel, expr: cst.BaseExpression) -> list[str]:
    """The names the batch is read from: the name written, then, while it is a
    local name bound once on every path by a plain assignment of another
    name, that name (`per_gpu = global_batch` ... `batch_size=per_gpu`). A
    value computed from others (`global_batch // world_size`) ends the chain."""
    names: list[str] = []
    seen: set[int] = set()
    while True:
        name = _name(expr)
        if name is None:
            break
        names.append(name)
        expr = _unwrapped(expr)
        if not isinstance(expr, cst.Name):
            break
        b = sole_binding(model, expr)
        if b is None or b.kind != "assign" or b.value is None or b.augmented is not None or id(b.value) in seen:
            break
        seen.add(id(b.value))
        expr = b.value
    return names


def _divided_by_launch(model: ScriptModel, flags: tuple[str, ...]) -> bool:
    """A documented launch command passes the option a value its shell
    script divides (`--train_batch_size $((TOTAL / NGPU))`): the division is
    done outside Python, and what the script receives is per GPU."""
    return any(flag in c.divided for c in launch_commands(model) for flag in flags)


@register
class UndividedBatch(Rule):
    code = "DDP103"
    triggers = (USES_DISTRIBUTED,)
    name = "undivided-batch"
    short = "global batch size used as the per-process batch"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    message = "a global batch size is used as the per-process batch of a DistributedSampler loader"
    fix = "divide it by the world size: `batch_size = global_batch_size // dist.get_world_size()`"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        documented = {o.dest: o for o in options(model) if GLOBAL_HELP.search(o.help) and not PER_RANK_HELP.search(o.help)}
        for loader in loaders(model) + held_loaders(model):
            if not loader.samplers or loader.looks_like_eval():
                continue   # an evaluation batch does not change the training batch
            expr = loader.batch_size
            if expr is not None and loader.held:
                # built by a helper: the batch is what this file passes for the helper's parameter
                expr = expression_at_call(model, loader.via, loader.model, expr) if loader.via is not None else None
            if expr is None:
                continue
            behind = _names_behind(model, expr)
            if not behind:
                continue
            name = behind[0]
            last = name.rpartition(".")[2]
            why = None
            for source in behind:
                source_last = source.rpartition(".")[2]
                held = "" if source is name else f"`{name}` holds `{source}`, and "
                if is_global_batch_name(source_last):
                    why = f"{held}its name says `{source_last}` is the global batch"
                elif source_last in documented:
                    option = documented[source_last]
                    if _divided_by_launch(model, option.flags):
                        break   # the launch script passes a per-GPU value: its help text is stale
                    flag = next((f for f in option.flags if f.startswith("--")), option.flags[0])
                    why = f"{held}`{flag}` is documented as \"{option.help.strip()}\""
                if why is not None:
                    break
            if why is None or any(divided_by_world(model, n) for n in behind):
                continue
            yield Hit(expr, message=(
                f"`batch_size={name}` feeds a DistributedSampler loader, but {why}: each of the W ranks loads "
                f"{last} samples per step, so the effective batch is {last} x W (2x on 2 GPUs, 8x on 8) "
                "and the learning rate and schedule tuned for it no longer match"
            ), fix=f"divide it: `batch_size={name} // world_size` (check it divides evenly), "
                   "or make the option per-GPU and say so in its help")
