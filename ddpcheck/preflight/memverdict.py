"""Judge one training step's memory: check rows only (pure Python, no torch).

The worker measured, fitted and confirmed (:mod:`memory`, :mod:`memfit`);
this module reads its :class:`~ddpcheck.preflight.results.MemoryResult` and
decides PASS / WARN / FAIL. The tables are drawn by :mod:`report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpcheck.preflight import memfit
from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId
from ddpcheck.preflight.results import FailureKind, MemoryResult
from ddpcheck.preflight.units import format_bytes as fb
from ddpcheck.preflight.verdict import ranks_text

CONFIRM_TOLERANCE = 0.10
SHARD_FIX = ("shard the model: FSDP or DeepSpeed ZeRO (parameters, gradients and optimizer "
             "state split over the GPUs), tensor or pipeline parallel; or bf16 weights, an "
             "8-bit optimizer, a smaller model")


@dataclass(frozen=True)
class MemoryQuestion:
    target_batch: Optional[int] = None  # per-GPU batch the user will train with
    world_size: int = 1
    grad_accum: int = 1
    baseline_global: Optional[int] = None  # --base-batch, else the effective global batch
    safety_margin: float = 0.10
    model: str = ""
    optimizer: str = "adamw"


def state_exceeds_budget(mem: MemoryResult) -> bool:
    return mem.state is not None and mem.usable is not None and mem.state.total > mem.usable


def memory_checks(mem: Optional[MemoryResult], q: MemoryQuestion) -> list[Check]:
    if mem is None:
        return []
    unmeasured = _nothing_measured(mem, q)
    if unmeasured is not None:
        return [unmeasured]
    out = _model_checks(mem, q)
    if mem.step_error is not None:
        failed = _step_failure(mem)
        return out + ([failed] if failed is not None else [])
    if mem.fit is None:
        return out
    return out + _fit_checks(mem, q) + _prediction_checks(mem)


def _nothing_measured(mem: MemoryResult, q: MemoryQuestion) -> Optional[Check]:
    """Why no step was measured, where that is the whole answer: the factory raised,
    the model's state alone exceeds the budget, or the host cannot hold the ranks."""
    if mem.factory_error is not None:
        err = mem.factory_error
        return Check(
            CheckId.MODEL_FACTORY, FAIL,
            f"--model {q.model} raised {err.text()}"
            + (f" at {err.frame}" if err.frame else "") + f" on {ranks_text(mem.failed_ranks)}"
            if err.exc_type != "TypeError" or "returned a" not in err.message else
            f"--model {q.model} {err.message} on {ranks_text(mem.failed_ranks)}",
            "the factory must build the model on every rank with no arguments; try it alone: "
            "python -c \"import m; m.build()\"")
    if state_exceeds_budget(mem):
        s = mem.state
        parts = [f"parameters {fb(s.params)}", f"gradients {fb(s.grads)}"]
        if s.buckets:
            parts.append(f"DDP buckets {fb(s.buckets)}")
        if s.optimizer is not None:
            parts.append(f"{q.optimizer} state {fb(s.optimizer)}")
        unknown = "" if s.optimizer is not None else " (before the optimizer's own state)"
        return Check(
            CheckId.MODEL_STATE_MEMORY, FAIL,
            f"no batch fits: {mem.params:,} parameters need {' + '.join(parts)} = "
            f"{fb(s.total)} per GPU{unknown} before any activation, more than the "
            f"{fb(mem.usable)} usable of {fb(mem.budget)}. Data parallel cannot help: every "
            f"GPU holds all of it", SHARD_FIX)
    if mem.host_too_small:
        return Check(
            CheckId.HOST_MEMORY, WARN,
            f"not measured: parameters, gradients, DDP buckets and optimizer state need "
            f"{fb(mem.state.total)} per rank, {q.world_size} CPU processes more than this "
            f"host's {fb(mem.host_too_small)} of RAM allows; with --gpu-memory the arithmetic "
            f"alone can still say whether it fits",
            "run the preflight on the GPUs, or on CPU with --gpus 1")
    return None


def _model_checks(mem: MemoryResult, q: MemoryQuestion) -> list[Check]:
    """What measuring the step showed about the model itself: SyncBatchNorm, parameters
    without a gradient, BatchNorm at batch 1."""
    out: list[Check] = []
    if mem.sync_bn == "not on CPU":
        out.append(Check(
            CheckId.SYNC_BN, WARN,
            "SyncBatchNorm runs only on GPUs: measured with plain BatchNorm on CPU (SyncBN adds "
            "a small all_reduce of batch statistics per layer, little memory)",
            "run the preflight on the GPUs to measure SyncBN itself"))
    elif mem.sync_bn == "converted":
        out.append(Check(CheckId.SYNC_BN, PASS,
                         f"{mem.batchnorm_layers} BatchNorm layers converted before the DDP wrap"))
    if mem.unused is not None:
        names = mem.unused.names
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        out.append(Check(
            CheckId.UNUSED_PARAMETERS, FAIL,
            f"DDP fails on the second step: {shown or 'some parameters'} got no gradient "
            f"(\"Expected to have finished reduction in the prior iteration\"); memory was then "
            f"measured with find_unused_parameters=True",
            "use them in forward or delete them (or set requires_grad=False); "
            "DDP(find_unused_parameters=True) also works but walks the graph every step"))
    if mem.bn_batch1:
        out.append(Check(
            CheckId.BN_BATCH1, FAIL if q.target_batch == 1 else WARN,
            f"training at batch 1 raises \"{mem.bn_batch1}\": a per-GPU batch of 1, or a "
            f"last batch of 1, crashes this model; measured from batch 2",
            "per-GPU batch of at least 2 and drop_last=True"))
    return out


def _step_failure(mem: MemoryResult) -> Optional[Check]:
    """The training step failed: out of memory at the first batch (data parallel cannot
    help), out of memory later, or another error (unused parameters have their own
    check)."""
    err = mem.step_error
    steps = mem.steps
    first = steps[0].batch if steps else 1
    if err.kind == FailureKind.OOM and err.batch == first and len(steps) <= 1:
        where = (f"the model's tensor memory at batch {first} is "
                 f"{fb(steps[0].peak) if steps else '?'}, more than --gpu-memory "
                 f"{fb(mem.budget or 0)}" if mem.simulated_oom else
                 f"CUDA out of memory at batch {err.batch}")
        return Check(
            CheckId.MEMORY_FIRST_BATCH, FAIL,
            f"batch={first} does not fit: {where}. Data parallel cannot help: every GPU "
            f"holds the whole model, its gradients and optimizer state",
            "make batch 1 fit first: " + SHARD_FIX + "; or activation checkpointing",
            batch=first)
    if err.kind == FailureKind.OOM:
        return Check(
            CheckId.MEMORY_OOM, FAIL, f"out of memory at batch {err.batch}: {err.message}",
            f"the largest per-GPU batch is below {err.batch}; use --grad-accum or more "
            f"GPUs for the global batch")
    if err.kind != FailureKind.UNUSED:
        return Check(
            CheckId.TRAINING_STEP, FAIL,
            f"the training step at batch {err.batch} failed on every rank: {err.text()}"
            + (f" at {err.frame}" if err.frame else ""),
            "the model, its --sample/--input-shape, --loss and --optimizer must run one "
            "forward, backward and optimizer step; rerun with --gpus 1 to see it alone")
    return None


def _fit_checks(mem: MemoryResult, q: MemoryQuestion) -> list[Check]:
    """The measured steps against the usable memory: the first batch, and the target
    batch (measured, or predicted from the fit) with the way out when it does not fit."""
    out: list[Check] = []
    usable = mem.usable
    steps = mem.steps
    if usable is not None and steps:
        first = steps[0]
        out.append(Check(
            CheckId.MEMORY_FIRST_BATCH, PASS,
            f"batch={first.batch} fits: a full training step peaks at {fb(first.peak)} of "
            f"{fb(usable)} usable", batch=first.batch))
    target = q.target_batch
    if not target or usable is None:
        return out
    measured = {c.batch: c.measured for c in mem.confirmations if c.measured is not None}
    measured.update({s.batch: s.peak for s in steps})
    peak = measured.get(target)
    figure = peak if peak is not None else mem.fit.predict(target)
    how = "measured" if peak is not None else "predicted"
    if figure <= usable:
        out.append(Check(
            CheckId.MEMORY_TARGET, PASS,
            f"batch {target} per GPU: {how} peak {fb(figure)} of {fb(usable)} usable "
            f"({fb(mem.budget)} less {q.safety_margin:.0%} margin"
            + (f" and {fb(mem.reserve)} reserve" if mem.reserve else "") + ")"))
        return out
    largest = mem.largest
    n = memfit.fewest_gpus(target * q.world_size * q.grad_accum, largest, q.grad_accum)
    fix = (f"largest per-GPU batch that fits: {largest}" if largest else
           "not even batch 1 fits with this margin")
    if largest:
        accum = -(-target // largest)
        fix += (f"; keep the global batch with --grad-accum {accum * q.grad_accum} at "
                f"batch {largest}" + (f", or {n} GPUs" if n else ""))
    out.append(Check(
        CheckId.MEMORY_TARGET, FAIL,
        f"batch {target} per GPU peaks at {fb(figure)} ({how}), more than the "
        f"{fb(usable)} usable of {fb(mem.budget)}: it will run out of memory", fix))
    return out


def _prediction_checks(mem: MemoryResult) -> list[Check]:
    if not mem.confirmations:
        return []
    first = mem.confirmations[0]
    if first.measured is None:
        return [Check(
            CheckId.MEMORY_PREDICTION, FAIL,
            f"a real step at batch {first.batch} (predicted {fb(first.predicted)}) failed: "
            f"{first.failed}",
            "use a smaller batch than predicted; the fit underestimates this model")]
    error = first.error
    text = (f"a real step at batch {first.batch} peaked at {fb(first.measured)}, predicted "
            f"{fb(first.predicted)} from batches {', '.join(map(str, _fit_batches(mem, first)))} "
            f"({error:+.1%})")
    last = mem.confirmations[-1]
    if last.purpose == "largest" and len(mem.confirmations) > 1:
        text += (f"; refitted with each confirmation, the largest batch that fits is "
                 f"{last.batch if mem.largest_confirmed else mem.largest} "
                 f"(its own step: {fb(last.measured)})" if last.measured is not None else "")
    if mem.largest_confirmed and last.purpose == "largest":
        text += f", within the {fb(mem.usable)} usable"
    status = PASS if abs(error) <= CONFIRM_TOLERANCE else WARN
    return [Check(
        CheckId.MEMORY_PREDICTION, status, text,
        "" if status == PASS else "the model's memory is not linear in the batch (dynamic "
        "shapes, cudnn workspaces): trust the measured figure and keep a wider margin")]


def _fit_batches(mem: MemoryResult, first) -> list[int]:
    """The batches the first prediction rested on: the measured steps."""
    return sorted({s.batch for s in mem.steps})
