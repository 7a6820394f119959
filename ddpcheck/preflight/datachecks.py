"""Check rows and tables for the data-set arithmetic (pure Python, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check
from ddpcheck.preflight.shardplan import (
    BatchChoice,
    ShardPlan,
    batch_guide,
    lr_suggestion,
    plan_data_parallel,
    suggest_batch_sizes,
    suggest_dp_batch,
)


@dataclass(frozen=True)
class DataQuestion:
    """What the user asked the arithmetic about."""

    plan: ShardPlan
    batch: Optional[BatchChoice] = None
    base_batch: Optional[int] = None
    base_lr: Optional[float] = None
    data_parallel: bool = False


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def sampler_checks(plan: ShardPlan) -> list[Check]:
    n, w, s = plan.dataset_size, plan.world_size, plan.samples_per_rank
    out: list[Check] = []
    if n < w:
        if plan.sampler_drop_last:
            out.append(Check(
                "data: samples per rank", FAIL,
                f"only {n} samples for {w} ranks: DistributedSampler(drop_last=True) gives every "
                f"rank 0 samples, so no rank ever trains",
                f"use at most {n} GPUs, or a larger data set"))
        else:
            dup = [r.rank for r in plan.ranks if r.padded]
            out.append(Check(
                "data: samples per rank", FAIL,
                f"only {n} samples for {w} ranks: DistributedSampler pads with repeats, so "
                f"{_ranks_text(dup)} train on duplicates only",
                f"use at most {n} GPUs, or a larger data set"))
        return out
    if plan.padded:
        dup = [r.rank for r in plan.ranks if r.padded]
        out.append(Check(
            "data: DistributedSampler padding", WARN,
            f"{n} samples do not divide by {w} ranks: DistributedSampler repeats "
            f"{_plural(plan.padded, 'sample')} so every rank gets {s} ({_ranks_text(dup)} "
            f"{'gets one duplicate' if len(dup) == 1 else 'one duplicate each'}); an evaluation over this sampler counts {plan.eval_counted} "
            f"samples, not {n}, so all_reduce'd metrics count {plan.padded} twice",
            f"evaluate on an unpadded split (indices range(rank, {n}, {w})) or drop the last "
            f"{plan.padded} gathered predictions; training is unaffected"))
    elif plan.sampler_dropped:
        out.append(Check(
            "data: DistributedSampler drop_last", PASS,
            f"DistributedSampler(drop_last=True) cuts {_plural(plan.sampler_dropped, 'sample')} "
            f"per epoch so every rank gets {s} (with shuffle a different set each epoch)"))
    else:
        out.append(Check(
            "data: DistributedSampler split", PASS,
            f"{n} samples split evenly: {s} per rank, no padding"))
    return out


def choice_checks(choice: Optional[BatchChoice], world: int, grad_accum: int) -> list[Check]:
    """A --global-batch-size that does not divide over GPUs x grad-accum."""
    if choice is None or choice.requested_global is None or choice.exact:
        return []
    lo, hi = choice.nearest_globals
    return [Check(
        "batch: global batch split", WARN,
        f"--global-batch-size {choice.requested_global} does not divide over {world} GPUs x "
        f"grad-accum {grad_accum}: using {choice.per_gpu} per GPU, so the optimizer sees "
        f"{choice.effective_global}, not {choice.requested_global}",
        f"use a global batch of {lo} or {hi}, or a GPU count that divides "
        f"{choice.requested_global}")]


def batch_checks(q: DataQuestion) -> list[Check]:
    plan, choice = q.plan, q.batch
    if choice is None or plan.dataset_size < plan.world_size:
        return []
    out: list[Check] = choice_checks(choice, plan.world_size, plan.grad_accum)
    b, s, w = choice.per_gpu, plan.samples_per_rank, plan.world_size
    if b > s:
        if plan.drop_last:
            what = (f"drop_last=True leaves 0 batches per epoch: the loop never runs an "
                    f"optimizer step")
        else:
            what = (f"every epoch is one short batch of {s}, so the batch the optimizer "
                    f"sees (and any lr scaled for {b}) is not what you set")
        out.append(Check(
            "batch: per-GPU batch vs share", FAIL,
            f"per-GPU batch {b} is larger than the {s} samples each of the {w} ranks gets: {what}",
            f"use at most {s} per GPU (--batch-size {s}), or fewer GPUs"))
        return out
    last = plan.last_batch
    if plan.drop_last:
        dropped = plan.loader_dropped_per_rank
        if dropped:
            out.append(Check(
                "batch: last batch", PASS,
                f"drop_last=True drops {dropped} samples per rank per epoch "
                f"({plan.loader_dropped_total} in all; with shuffle a different set each "
                f"epoch); every batch holds {b}"))
        else:
            out.append(Check("batch: last batch", PASS,
                             f"{s} samples per rank divide by {b}: every batch is full"))
    elif b == 1:
        out.append(Check(
            "batch: last batch", PASS,
            "per-GPU batch 1: every batch holds one sample (fine for convolutional BatchNorm, "
            "which normalises over the pixels; BatchNorm1d cannot train at batch 1)"))
    elif last == 1:
        sugg = suggest_batch_sizes(s, b)
        alt = ", ".join(f"--batch-size {c} (last batch {s % c or c})" for c in sugg)
        out.append(Check(
            "batch: last batch", WARN,
            f"the last batch on every rank holds 1 sample ({s} = {plan.batches_per_rank - 1} x "
            f"{b} + 1): BatchNorm in training raises 'Expected more than 1 value per channel' "
            f"on it, or normalises with a one-sample estimate",
            "drop_last=True in the DataLoader/BatchSampler (drops 1 sample per rank per epoch)"
            + (f", or {alt}" if alt else "")))
    elif last != b:
        out.append(Check(
            "batch: last batch", PASS,
            f"last batch on every rank holds {last} of {b} (that step averages over fewer "
            f"samples; drop_last=True would drop them)"))
    else:
        out.append(Check("batch: last batch", PASS,
                         f"{s} samples per rank divide by {b}: every batch is full"))

    leftover = plan.leftover_micro_batches
    if plan.grad_accum > 1 and leftover:
        out.append(Check(
            "batch: gradient accumulation", WARN,
            f"{plan.batches_per_rank} batches per epoch is not a multiple of grad-accum "
            f"{plan.grad_accum}: the usual `if (i + 1) % {plan.grad_accum} == 0: step()` loop "
            f"leaves {leftover} micro-batch(es) of gradients that leak into the next epoch's "
            f"first step",
            "zero_grad() at the start of every epoch, or also step on the last batch"))

    eff = choice.effective_global
    if q.base_batch is not None and eff != q.base_batch:
        ratio = eff / q.base_batch
        per = q.base_batch / (w * plan.grad_accum)
        how = (f"set the per-GPU batch to baseline / (GPUs x accum) = {q.base_batch} / "
               f"{w * plan.grad_accum}" + (f" = {int(per)} (--batch-size {int(per)})"
                                           if per == int(per) and per >= 1 else
                                           f" = {per:g}, which is not a whole batch"))
        if q.base_lr is not None:
            lr = lr_suggestion(q.base_lr, q.base_batch, eff)
            how += f"; or keep {b} and scale the lr: linear {lr.linear:.3g}, sqrt {lr.sqrt:.3g}"
        out.append(Check(
            "batch: effective global batch", WARN,
            f"the optimizer sees {b} per GPU x {w} GPUs x {plan.grad_accum} accum = {eff} "
            f"samples per step, {ratio:.3g}x the baseline {q.base_batch} (the batch a DDP "
            f"script sets is per process)", how))
    else:
        note = (f", equal to the baseline {q.base_batch}" if q.base_batch is not None else
                " (the batch a DDP script sets is per process)")
        out.append(Check(
            "batch: effective global batch", PASS,
            f"{b} per GPU x {w} GPUs x {plan.grad_accum} accum = {eff} samples per optimizer "
            f"step{note}"))
    if q.data_parallel:
        out.extend(data_parallel_checks(plan.dataset_size, w, b * w, plan.drop_last))
    return out


def data_parallel_checks(dataset_size: int, gpus: int, global_batch: int,
                         drop_last: bool) -> list[Check]:
    """nn.DataParallel: one loader, each batch chunked over the GPUs (seed 004)."""
    dp = plan_data_parallel(dataset_size, gpus, global_batch, drop_last)
    if dp.batches == 0:
        return [Check("DataParallel: last batch", FAIL,
                      f"batch {global_batch} is larger than the {dataset_size} samples and "
                      f"drop_last=True: no batches at all", "use a smaller batch")]
    chunks = list(dp.last_chunks)
    if dp.idle_replicas:
        sugg = suggest_dp_batch(dataset_size, gpus, global_batch)
        fix = "drop_last=True in the DataLoader"
        if sugg:
            fix += f", or a batch of {sugg} ({sugg // gpus} per GPU)"
        return [Check(
            "DataParallel: last batch", FAIL,
            f"the last batch holds {dp.last_batch} samples for {gpus} GPUs: chunked as {chunks}, "
            f"so {_plural(dp.idle_replicas, 'replica')} "
            f"{'gets' if dp.idle_replicas == 1 else 'get'} no data and the forward can fail "
            f"(seed 004: 'Caught TypeError in replica 3 on device 3', after 7 hours at 99 %)",
            fix)]
    if min(chunks) < 2 and global_batch >= 2 * gpus:
        return [Check(
            "DataParallel: last batch", WARN,
            f"the last batch of {dp.last_batch} is chunked over {gpus} GPUs as {chunks}: a "
            f"replica with 1 sample breaks BatchNorm in training",
            "drop_last=True in the DataLoader")]
    return [Check("DataParallel: last batch", PASS,
                  f"the last batch of {dp.last_batch} is chunked over {gpus} GPUs as {chunks}")]


def data_checks(q: DataQuestion) -> list[Check]:
    return sampler_checks(q.plan) + batch_checks(q)


# -- tables -------------------------------------------------------------------


def arithmetic_rows(q: DataQuestion) -> list[tuple[str, str]]:
    """Key/value rows for the arithmetic table."""
    p = q.plan
    rows = [
        ("data set", f"{p.dataset_size} samples"),
        ("ranks (GPUs)", str(p.world_size)),
        ("samples per rank", f"{p.samples_per_rank} (len(DistributedSampler))"),
        ("padded duplicates", f"{p.padded}" + (" (DistributedSampler repeats the first "
                                                "indices)" if p.padded else "")),
        ("samples per epoch, all ranks", f"{p.total_size}"
         + (f" (evaluation counts {p.eval_counted}, {p.padded} twice)" if p.padded else "")),
    ]
    if p.sampler_drop_last:
        rows.append(("cut by DistributedSampler(drop_last)", str(p.sampler_dropped)))
    if q.batch is None:
        return rows
    b = q.batch.per_gpu
    rows += [
        ("per-GPU batch", str(b) + (f" (from --global-batch-size {q.batch.requested_global})"
                                     if q.batch.requested_global is not None else "")),
        ("DataLoader drop_last", str(p.drop_last)),
        ("batches per rank per epoch", str(p.batches_per_rank)),
        ("last batch per rank", str(p.last_batch)),
        ("dropped by drop_last", f"{p.loader_dropped_per_rank} per rank, "
                                 f"{p.loader_dropped_total} in all"),
        ("gradient accumulation", str(p.grad_accum)),
        ("optimizer steps per epoch", str(p.optimizer_steps_per_epoch)
         + (f" (+{p.leftover_micro_batches} leftover micro-batches)"
            if p.leftover_micro_batches else "")),
        ("effective global batch", f"{p.effective_global_batch} = {b} x {p.world_size} x "
                                   f"{p.grad_accum}"),
    ]
    if q.base_batch is not None and q.base_lr is not None:
        lr = lr_suggestion(q.base_lr, q.base_batch, p.effective_global_batch)
        rows += [
            ("baseline", f"lr {q.base_lr:g} at batch {q.base_batch}"),
            ("lr, linear scaling", f"{lr.linear:.4g} (x{p.effective_global_batch / q.base_batch:.3g})"),
            ("lr, sqrt scaling", f"{lr.sqrt:.4g} (search between the two)"),
        ]
    elif q.base_batch is not None:
        rows.append(("baseline batch", str(q.base_batch)))
    if q.data_parallel:
        dp = plan_data_parallel(p.dataset_size, p.world_size, b * p.world_size, p.drop_last)
        rows += [
            ("DataParallel batch (all GPUs)", str(dp.global_batch)),
            ("DataParallel last batch chunks", str(list(dp.last_chunks))),
        ]
    return rows


def rank_rows(plan: ShardPlan) -> list[tuple]:
    """Per-rank rows; consecutive ranks with identical numbers share one row."""
    rows: list[tuple] = []
    groups: list[list] = []
    for r in plan.ranks:
        key = (r.samples, r.unique, r.padded, r.batches, r.last_batch, r.dropped)
        if groups and groups[-1][1] == key:
            groups[-1][0].append(r.rank)
        else:
            groups.append([[r.rank], key])
    for ranks, key in groups:
        label = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
        samples, unique, padded, batches, last, dropped = key
        rows.append((label, samples, unique, padded,
                     "-" if batches is None else batches,
                     "-" if last is None else last,
                     "-" if dropped is None else dropped))
    return rows


RANK_HEADERS = ("rank", "samples", "unique", "padded", "batches", "last batch", "dropped")


def guide_rows(plan: ShardPlan) -> list[tuple]:
    """For a run without --batch-size: what common per-GPU batch sizes leave over."""
    rows = []
    for size, batches, last, rest in batch_guide(plan.samples_per_rank):
        note = ""
        if size == 1:
            note = "BatchNorm1d cannot train at batch 1"
        elif last == 1:
            note = "last batch of 1: BatchNorm fails; use drop_last"
        elif rest == 0:
            note = "every batch full"
        rows.append((size, batches, last, rest, note))
    return rows


GUIDE_HEADERS = ("per-GPU batch", "batches/rank", "last batch", "dropped w/ drop_last", "")
