"""DDP301 unguarded-save."""

from __future__ import annotations

import os
from typing import Iterator

from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.launchers import runs_in_launcher_only
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.reach import several_ranks_reach, unguarded_caller
from ddpcheck.model.rankfirst import ordered_first
from ddpcheck.model.writes import WRITE_NEED, per_rank_target, write_kind, writes_on_every_rank
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import LIBRARY_TRAINER, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call

_WHY = {
    "save": "every rank writes the same checkpoint to the same path at once: N-fold I/O and, when the writes interleave, a corrupt file",
    "SummaryWriter": "every rank opens its own TensorBoard event file, so each curve appears once per GPU",
    "wandb": "every rank starts or logs to its own W&B run (or fails: wandb.log before wandb.init on the other ranks)",
    "save_pretrained": ("every rank writes the same weights and config files into the same folder at once: N-fold "
                        "I/O and, when the writes interleave, a corrupt checkpoint (guard it, or pass "
                        "`is_main_process=` as Hugging Face's examples do)"),
}


@register
class UnguardedSave(Rule):
    code = "DDP301"
    triggers = (USES_DISTRIBUTED, LIBRARY_TRAINER)
    name = "unguarded-save"
    short = "checkpoint/log written by every rank: guard it with a rank-0 check"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    message = "checkpoint/log write reached on every rank"
    fix = ("guard it so only rank 0 writes: `if dist.get_rank() == 0:` (or your `is_main_process()` helper), "
           "or call a `save_on_master(...)` helper")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not runs_distributed(model):
            return
        for site in model.calls:
            if runs_in_launcher_only(model, site.ctx):
                continue   # `wandb.init()` before `mp.spawn(...)`: the launching process, once
            kind = write_kind(model, site)
            if kind is not None:
                if several_ranks_reach(model, site.ctx) and not per_rank_target(model, site, kind) \
                        and not ordered_first(model, site):
                    what = site.func or "this call"
                    fn = site.ctx.function
                    via = ""
                    if fn is not None and unguarded_caller(model, fn) is not None:
                        caller = unguarded_caller(model, fn).ctx.function
                        via = f" (`{fn.name}()` is called without a rank guard" + (
                            f" in `{caller.name}()`)" if caller is not None else " at module level)")
                    yield Hit(site.node, message=f"`{what}(...)` runs on every rank{via}: {_WHY[kind]}")
                continue
            target = resolve_call(model, site, WRITE_NEED)
            if target is None or target[0] is model:
                continue   # same-file helpers are reported at their own write
            found = writes_on_every_rank(*target, frames=((model, site),))
            if found is not None and several_ranks_reach(model, site.ctx) and not ordered_first(model, site):
                inner, kind = found
                fn = target[1]
                runs = f"runs `{fn.class_name}.{fn.name}`, " if fn.name in ("__call__", "__init__") and fn.class_name else ""
                yield Hit(site.node, message=(
                    f"`{site.func}(...)` ({runs}{os.path.relpath(target[0].path)}) writes with `{inner.func}(...)` without a rank guard, "
                    f"and this call runs on every rank: {_WHY[kind]}"
                ))
