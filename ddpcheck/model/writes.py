"""Writes every rank must not all do: a checkpoint (`torch.save`,
`save_pretrained`), a TensorBoard `SummaryWriter`, a W&B run. Which calls are
such writes, whether a write goes to a path of its own on each rank, and
which write a function of the tree performs whatever rank runs it, itself or
through the functions it calls (DDP301 asks these)."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.flow import (
    Lib, called_qual, called_qual_from, is_param, may_reach_call, resolve_call, resolved_atoms, runs_into, value_of,
)
from ddpcheck.model.guards import after_wandb_init, function_worlds, one_rank_only, relevant_frames, worlds_from_call
from ddpcheck.model.memo import query
from ddpcheck.model.rankfirst import ordered_first
from ddpcheck.model.paths import in_memory, per_rank_path
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.sharding import is_distributed_checkpoint_save
from ddpcheck.model.worlds import DN

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


def writes_on_every_rank(model: ScriptModel, fn: FunctionInfo,
                         frames: tuple[tuple[ScriptModel, CallSite], ...] = ()) -> tuple[CallSite, str] | None:
    """A write a function performs whatever rank calls it (no guard inside),
    itself or any number of calls down: the call of `fn` that leads to it,
    and the kind of write. `frames`: the calls that run `fn`, innermost
    first; a guard on one of its parameters is judged by what they pass, and
    a call of a parameter runs what the innermost passes."""
    return _writes_on_every_rank(model, fn, relevant_frames(frames))


@query(on_cycle=None)
def _writes_on_every_rank(model: ScriptModel, fn: FunctionInfo,
                          frames: tuple[tuple[ScriptModel, CallSite], ...]) -> tuple[CallSite, str] | None:
    """writes_on_every_rank, asked with `guards.relevant_frames`: a recursion
    whose calls hand nothing on comes back to the same question and is the
    memo's fixed point. One that keeps handing its parameters on would ask a
    new question at every turn: a call already in `frames` is not followed
    again, so each call is unrolled once, and a write reached only deeper
    than that is not proven. Only calls that can lead to a write are judged
    (`may_write`): which ranks run a call is the costly question, and in a
    framework most calls lead to no write at all."""
    if DN not in function_worlds(model, fn):
        return None
    for c in model.calls_in(fn):
        kind = write_kind(model, c, frames[0] if frames else None)
        direct = bool(kind) and not per_rank_target(model, c, kind)
        target = None
        if not direct:
            target = resolve_call(model, c, () if _hands_a_write(model, c) else WRITE_NEED)
            if target is None or any(call is c for _, call in frames) or not may_write(*target):
                continue
        if DN not in worlds_from_call(model, c.ctx, fn, frames) or one_rank_only(model, c.ctx):
            continue   # not a non-zero rank, or one process alone (`if args.rank == args.world_size - 1:`)
        if ordered_first(model, c):
            continue   # rank 0 writes first, the others after it (a cache they then find made)
        if direct:
            return c, kind
        inner = _writes_on_every_rank(target[0], target[1], relevant_frames(((model, c), *frames)))
        if inner is not None:
            return c, inner[1]
    return None


def may_write(model: ScriptModel, fn: FunctionInfo) -> bool:
    """Running `fn` may reach a write of any kind, whatever rank runs it and
    whatever its guards say (`flow.may_reach_call`)."""
    return may_reach_call(model, fn, _runs_into_writers, _may_be_a_write)


def _runs_into_writers(model: ScriptModel, site: CallSite) -> list[tuple[ScriptModel, FunctionInfo]]:
    return runs_into(model, site, () if _hands_a_write(model, site) else WRITE_NEED)


def _may_be_a_write(model: ScriptModel, site: CallSite) -> bool:
    """A write whatever the caller: one by what it calls (as written, or
    followed through aliases), a call of a parameter (it runs what a caller
    passes), or a call handing a writing function on."""
    if checkpoint_write(site) or checkpoint_write(site, called_qual(model, site)) or _hands_a_write(model, site):
        return True
    func = site.node.func
    return isinstance(func, cst.Name) and is_param(site.ctx.function, func.value) is not None


__all__ = ["may_write", "WRITE_NEED", "checkpoint_write", "write_kind", "per_rank_target", "writes_on_every_rank"]
