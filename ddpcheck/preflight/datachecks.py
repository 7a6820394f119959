"""Check rows and tables for the data-set arithmetic (pure Python, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId
from ddpcheck.preflight.shardplan import (
    BatchChoice,
    ShardPlan,
    batch_guide,
    lr_suggestion,
    dp_scatter,
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
                CheckId.SAMPLES_PER_RANK, FAIL,
                f"only {n} samples for {w} ranks: DistributedSampler(drop_last=True) gives every "
                f"rank 0 samples, so no rank ever trains",
                f"use at most {n} GPUs, or a larger data set"))
        else:
            dup = [r.rank for r in plan.ranks if r.padded]
            out.append(Check(
                CheckId.SAMPLES_PER_RANK, FAIL,
                f"only {n} samples for {w} ranks: DistributedSampler pads with repeats, so "
                f"{_ranks_text(dup)} train on duplicates only",
                f"use at most {n} GPUs, or a larger data set"))
        return out
    if plan.padded:
        dup = [r.rank for r in plan.ranks if r.padded]
        out.append(Check(
            CheckId.SAMPLER_PADDING, WARN,
            f"{n} samples do not divide by {w} ranks: DistributedSampler repeats "
            f"{_plural(plan.padded, 'sample')} so every rank gets {s} ({_ranks_text(dup)} "
            f"{'gets one duplicate' if len(dup) == 1 else 'one duplicate each'}); an evaluation over this sampler counts {plan.eval_counted} "
            f"samples, not {n}, so all_reduce'd metrics count {plan.padded} twice",
            f"evaluate on an unpadded split (indices range(rank, {n}, {w})) or drop the last "
            f"{plan.padded} gathered predictions; training is unaffected"))
    elif plan.sampler_dropped:
        out.append(Check(
            CheckId.SAMPLER_DROP_LAST, PASS,
            f"DistributedSampler(drop_last=True) cuts {_plural(plan.sampler_dropped, 'sample')} "
            f"per epoch so every rank gets {s} (with shuffle a different set each epoch)"))
    else:
        out.append(Check(
            CheckId.SAMPLER_SPLIT, PASS,
            f"{n} samples split evenly: {s} per rank, no padding"))
    return out


def choice_checks(choice: Optional[BatchChoice], world: int, grad_accum: int) -> list[Check]:
    """A --global-batch-size that does not divide over GPUs x grad-accum."""
    if choice is None or choice.requested_global is None or choice.exact:
        return []
    lo, hi = choice.nearest_globals
    return [Check(
        CheckId.GLOBAL_BATCH_SPLIT, WARN,
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
            what = ("drop_last=True leaves 0 batches per epoch: the loop never runs an "
                    "optimizer step")
        else:
            what = (f"every epoch is one short batch of {s}, so the batch the optimizer "
                    f"sees (and any lr scaled for {b}) is not what you set")
        out.append(Check(
            CheckId.BATCH_VS_SHARE, FAIL,
            f"per-GPU batch {b} is larger than the {s} samples each of the {w} ranks gets: {what}",
            f"use at most {s} per GPU (--batch-size {s}), or fewer GPUs"))
        return out
    out.append(_last_batch_check(plan, b))
    leftover = plan.leftover_micro_batches
    if plan.grad_accum > 1 and leftover:
        out.append(Check(
            CheckId.GRAD_ACCUM, WARN,
            f"{plan.batches_per_rank} batches per epoch is not a multiple of grad-accum "
            f"{plan.grad_accum}: the usual `if (i + 1) % {plan.grad_accum} == 0: step()` loop "
            f"leaves {leftover} micro-batch(es) of gradients that leak into the next epoch's "
            f"first step",
            "zero_grad() at the start of every epoch, or also step on the last batch"))
    out.append(_effective_batch_check(q, choice.effective_global, b))
    return out


def _last_batch_check(plan: ShardPlan, b: int) -> Check:
    """What each rank's last batch of an epoch holds at per-GPU batch ``b``."""
    s, last = plan.samples_per_rank, plan.last_batch
    if plan.drop_last:
        dropped = plan.loader_dropped_per_rank
        if dropped:
            return Check(
                CheckId.LAST_BATCH, PASS,
                f"drop_last=True drops {dropped} samples per rank per epoch "
                f"({plan.loader_dropped_total} in all; with shuffle a different set each "
                f"epoch); every batch holds {b}")
        return Check(CheckId.LAST_BATCH, PASS,
                     f"{s} samples per rank divide by {b}: every batch is full")
    if b == 1:
        return Check(
            CheckId.LAST_BATCH, PASS,
            "per-GPU batch 1: every batch holds one sample (fine for convolutional BatchNorm, "
            "which normalises over the pixels; BatchNorm1d cannot train at batch 1)")
    if last == 1:
        sugg = suggest_batch_sizes(s, b)
        alt = ", ".join(f"--batch-size {c} (last batch {s % c or c})" for c in sugg)
        return Check(
            CheckId.LAST_BATCH_OF_ONE, WARN,
            f"the last batch on every rank holds 1 sample ({s} = {plan.batches_per_rank - 1} x "
            f"{b} + 1): BatchNorm in training raises 'Expected more than 1 value per channel' "
            f"on it, or normalises with a one-sample estimate",
            "drop_last=True in the DataLoader/BatchSampler (drops 1 sample per rank per epoch)"
            + (f", or {alt}" if alt else ""))
    if last != b:
        return Check(
            CheckId.LAST_BATCH, PASS,
            f"last batch on every rank holds {last} of {b} (that step averages over fewer "
            f"samples; drop_last=True would drop them)")
    return Check(CheckId.LAST_BATCH, PASS,
                 f"{s} samples per rank divide by {b}: every batch is full")


def _effective_batch_check(q: DataQuestion, eff: int, b: int) -> Check:
    """The samples per optimizer step against the baseline's, with the per-GPU batch
    or the learning rate that keeps it."""
    plan = q.plan
    w = plan.world_size
    if q.base_batch is None or eff == q.base_batch:
        note = (f", equal to the baseline {q.base_batch}" if q.base_batch is not None else
                " (the batch a DDP script sets is per process)")
        return Check(
            CheckId.EFFECTIVE_BATCH, PASS,
            f"{b} per GPU x {w} GPUs x {plan.grad_accum} accum = {eff} samples per optimizer "
            f"step{note}")
    ratio = eff / q.base_batch
    per = q.base_batch / (w * plan.grad_accum)
    how = (f"set the per-GPU batch to baseline / (GPUs x accum) = {q.base_batch} / "
           f"{w * plan.grad_accum}" + (f" = {int(per)} (--batch-size {int(per)})"
                                       if per == int(per) and per >= 1 else
                                       f" = {per:g}, which is not a whole batch"))
    if q.base_lr is not None:
        lr = lr_suggestion(q.base_lr, q.base_batch, eff)
        how += f"; or keep {b} and scale the lr: linear {lr.linear:.3g}, sqrt {lr.sqrt:.3g}"
    return Check(
        CheckId.EFFECTIVE_BATCH, WARN,
        f"the optimizer sees {b} per GPU x {w} GPUs x {plan.grad_accum} accum = {eff} "
        f"samples per step, {ratio:.3g}x the baseline {q.base_batch} (the batch a DDP "
        f"script sets is per process)", how)


def _replicas_text(replicas) -> str:
    replicas = list(replicas)
    if len(replicas) == 1:
        return f"replica {replicas[0]} (GPU {replicas[0]})"
    return f"replicas {', '.join(map(str, replicas))} (GPUs {', '.join(map(str, replicas))})"


def data_parallel_checks(dp, call: Optional[Callable[[int], tuple]] = None) -> list[Check]:
    """``nn.DataParallel``: one process, one DataLoader, each batch scattered over
    the GPUs by ``Tensor.chunk`` (torch 2.x ``scatter_kwargs``). ``call(n)`` gives
    the model's inputs at batch ``n`` as ``(args, kwargs)`` skeletons
    (:class:`TensorLeaf` for tensors), or None when it is not known."""
    gpus = dp.gpus
    if dp.batches == 0:
        return [Check(CheckId.DP_LAST_BATCH, FAIL,
                      f"batch {dp.global_batch} is larger than the {dp.dataset_size} samples and "
                      f"drop_last=True: no batches at all", "use a smaller batch")]
    out: list[Check] = []
    sugg = suggest_dp_batch(dp.dataset_size, gpus, dp.global_batch)
    better = f"a batch of {sugg} ({sugg // gpus} per GPU)" if sugg else "a multiple of the GPUs"
    for label, n, chunks, cid in (("every batch", dp.global_batch, dp.batch_chunks,
                                   CheckId.DP_EVERY_BATCH),
                                  ("the last batch", dp.last_batch, dp.last_chunks,
                                   CheckId.DP_LAST_BATCH)):
        if cid == CheckId.DP_LAST_BATCH and (dp.last_batch == dp.global_batch):
            continue
        chunks = list(chunks)
        scatter = dp_scatter(*call(n), gpus) if call else None
        if scatter is not None and (scatter.keyword_only_replicas or scatter.mismatch):
            who = _replicas_text(scatter.keyword_only_replicas) if \
                scatter.keyword_only_replicas else "the replicas"
            out.append(Check(
                CheckId.DP_INPUTS, FAIL,
                f"{label} ({n} samples) is chunked as {chunks} over {gpus} GPUs, but the "
                f"keyword arguments hold no tensor, so scatter_kwargs copies them to all "
                f"{gpus} GPUs and pads the positional inputs with (): {who} "
                f"{'is' if len(scatter.keyword_only_replicas) == 1 else 'are'} called with the "
                f"keyword arguments only and forward raises TypeError ('Caught TypeError in "
                f"replica {gpus - 1} on device {gpus - 1}')",
                f"drop_last=True in the DataLoader, or {better}; or pass the non-tensor "
                f"options another way (a module attribute, or a tensor)"))
            continue
        idle = list(range(len(chunks), gpus))
        if idle:
            known = "" if call else (
                "; if forward also takes keyword arguments that are not tensors "
                "(model(x, return_loss=True)), those replicas get them without x and raise "
                "TypeError: pass --model with --sample to check your call")
            out.append(Check(
                cid, WARN,
                f"{label} ({n} samples) is chunked as {chunks} over {gpus} GPUs: "
                f"{_replicas_text(idle)} get{'s' if len(idle) == 1 else ''} no data and "
                f"DataParallel runs that step on {len(chunks)} replicas, so "
                f"{'that GPU idles' if len(idle) == 1 else 'those GPUs idle'}{known}",
                ("drop_last=True in the DataLoader, or " + better) if cid == CheckId.DP_LAST_BATCH
                else f"use a DataLoader batch that is a multiple of {gpus}: {better}"))
        elif min(chunks) < 2 and dp.global_batch >= 2 * gpus:
            out.append(Check(
                cid, WARN,
                f"{label} ({n} samples) is chunked over {gpus} GPUs as {chunks}: a replica "
                f"with 1 sample breaks BatchNorm in training", "drop_last=True in the DataLoader"))
        else:
            out.append(Check(cid, PASS,
                             f"{label} ({n} samples) is chunked over {gpus} GPUs as {chunks}: "
                             f"every replica gets data"))
    return out


def dp_arithmetic_rows(dp) -> list[tuple[str, str]]:
    return [
        ("data set", f"{dp.dataset_size} samples (one DataLoader, no DistributedSampler)"),
        ("GPUs (DataParallel replicas)", str(dp.gpus)),
        ("DataLoader batch (all GPUs)", str(dp.global_batch)),
        ("a full batch, chunked", str(list(dp.batch_chunks))),
        ("DataLoader drop_last", str(dp.drop_last)),
        ("batches per epoch", str(dp.batches)),
        ("last batch", str(dp.last_batch)),
        ("last batch, chunked", str(list(dp.last_chunks))),
    ]


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


GUIDE_HEADERS = ("per-GPU batch", "batches/rank", "last batch", "dropped", "")
