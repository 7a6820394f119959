"""DDP301 unguarded-save."""

from __future__ import annotations

import os
from typing import Iterator

import libcst as cst

from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.guards import after_wandb_init, function_worlds, worlds_from_call
from ddpcheck.model.launchers import runs_in_launcher_only
from ddpcheck.model.paths import in_memory, per_rank_path
from ddpcheck.model.sharding import is_distributed_checkpoint_save
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.reach import other_ranks_reach, unguarded_caller
from ddpcheck.model.worlds import DN
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import LIBRARY_TRAINER, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import Lib, called_qual_from, resolve_call, resolved_atoms, value_of

_WHY = {
    "save": "every rank writes the same checkpoint to the same path at once: N-fold I/O and, when the writes interleave, a corrupt file",
    "SummaryWriter": "every rank opens its own TensorBoard event file, so each curve appears once per GPU",
    "wandb": "every rank starts or logs to its own W&B run (or fails: wandb.log before wandb.init on the other ranks)",
    "save_pretrained": ("every rank writes the same weights and config files into the same folder at once: N-fold "
                        "I/O and, when the writes interleave, a corrupt checkpoint (guard it, or pass "
                        "`is_main_process=` as Hugging Face's examples do)"),
}


# A module with such a write names one of these (project.Need).
WRITE_NEED = (("save", "SummaryWriter", "wandb", "save_pretrained"),)


def checkpoint_write(site: CallSite, qual: str | None = None) -> str | None:
    """The kind of every-rank write a call is, or None (`qual`: what the call
    runs, when known better than as written)."""
    q = qual or site.qual or ""
    if q.startswith("torch.") and q.rpartition(".")[2] == "save" and not is_distributed_checkpoint_save(q):
        return "save"
    if q.rpartition(".")[2] == "SummaryWriter" and ("tensorboard" in q or "tensorboardX" in q):
        return "SummaryWriter"
    if q in ("wandb.init", "wandb.log"):
        return "wandb"
    if site.attr == "save_pretrained" and site.receiver is not None and site.node.args \
            and not site.has_keyword("is_main_process") and not site.has_star_args:
        # Hugging Face models, tokenizers, PEFT adapters, pipelines: `is_main_process=` is their own guard
        return "save_pretrained"
    return None


def write_kind(model: ScriptModel, site: CallSite, caller: tuple[ScriptModel, CallSite] | None = None) -> str | None:
    """The kind of every-rank write a call is, or None; with `caller`, a call
    of a parameter runs what that call passes (a context helper handed
    `wandb.init`). A `wandb.log` that runs only where `wandb.run` is set logs
    into the run its process started: the `wandb.init` is the write judged
    (once), not each log that follows it."""
    qual = called_qual_from(model, site, caller) if caller is not None else site.qual
    kind = checkpoint_write(site, qual)
    if kind == "wandb" and qual == "wandb.log" and after_wandb_init(model, site.ctx):
        return None
    return kind


def _hands_a_write(model: ScriptModel, site: CallSite) -> bool:
    """The call hands a writing function on (`optional(flag, wandb.init)`):
    the function it lands in writes without naming the write itself."""
    for a in site.node.args:
        if isinstance(a.value, (cst.Name, cst.Attribute)) and \
                any(checkpoint_write(site, atom.qual) for atom in resolved_atoms(value_of(model, a.value)).atoms
                    if isinstance(atom, Lib)):
            return True
    return False


def per_rank_target(model: ScriptModel, site: CallSite, kind: str) -> bool:
    """The write goes to a path of its own on each rank (`f"queue{rank}.pth"`,
    `log_dir=f"runs/rank{args.rank}"`)."""
    if kind == "save":
        target = site.arg("f", 1)
        if in_memory(model, target):
            return True   # `torch.save(obj, io.BytesIO())`: a buffer of this process
    elif kind == "SummaryWriter":
        target = site.arg("log_dir", 0)
    elif kind == "save_pretrained":
        target = site.arg("save_directory", 0)
    else:
        return False
    return per_rank_path(model, target, site.ctx.function)


def writes_on_every_rank(model: ScriptModel, fn: FunctionInfo, depth: int = 0,
                         frames: tuple[tuple[ScriptModel, CallSite], ...] = ()) -> tuple[CallSite, str] | None:
    """A write a function performs whatever rank calls it (no guard inside):
    the call of `fn` that leads to it, and the kind of write. `frames`: the
    calls that run `fn`, innermost first; a guard on one of its parameters is
    judged by what they pass, and a call of a parameter runs what the
    innermost passes."""
    if DN not in function_worlds(model, fn):
        return None
    for c in model.calls_in(fn):
        if DN not in worlds_from_call(model, c.ctx, fn, frames):
            continue
        kind = write_kind(model, c, frames[0] if frames else None)
        if kind and not per_rank_target(model, c, kind):
            return c, kind
        if depth < 2:
            target = resolve_call(model, c, () if _hands_a_write(model, c) else WRITE_NEED)
            inner = writes_on_every_rank(target[0], target[1], depth + 1, ((model, c), *frames)) \
                if target is not None else None
            if inner is not None:
                return c, inner[1]
    return None


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
                if other_ranks_reach(model, site.ctx) and not per_rank_target(model, site, kind):
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
            if found is not None and other_ranks_reach(model, site.ctx):
                inner, kind = found
                yield Hit(site.node, message=(
                    f"`{site.func}(...)` ({os.path.relpath(target[0].path)}) writes with `{inner.func}(...)` without a rank guard, "
                    f"and this call runs on every rank: {_WHY[kind]}"
                ))
