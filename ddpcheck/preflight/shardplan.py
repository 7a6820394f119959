"""Data-set arithmetic for data-parallel training (pure Python, no torch).

It reproduces exactly what torch does, so the preflight can answer "what will
every rank see?" before any process starts:

* ``torch.utils.data.distributed.DistributedSampler`` (``num_replicas=W``):
  without ``drop_last`` every rank gets ``ceil(N / W)`` indices and the total is
  padded up to a multiple of ``W`` by repeating the first indices; rank ``r``
  takes positions ``r, r + W, r + 2W, ...`` so the padded positions
  ``N .. W*ceil(N/W)-1`` land on the last ``pad`` ranks, one each. With
  ``drop_last=True`` every rank gets ``floor(N / W)`` and the tail is cut.
* ``torch.utils.data.DataLoader(batch_size=B, drop_last=...)`` over that
  sampler: ``ceil(s / B)`` batches (``floor`` with ``drop_last``), the last one
  holding ``s % B`` samples when it does not divide.
* ``nn.DataParallel`` splits each batch with ``Tensor.chunk(W)``: chunks of
  ``ceil(n / W)``, so a short last batch can leave replicas with no data at
  all (8607 samples, batch 4 on 4 GPUs: a last batch of 3, replica 3
  gets nothing and the forward crashes after 7 hours at 99 %).

The tests compare all of this against torch's real classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

# Batch sizes shown when the user gave none: what each would leave over.
GUIDE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class PlanError(ValueError):
    """Bad numbers for the arithmetic (a usage error for the command)."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise PlanError(message)


@dataclass(frozen=True)
class RankShare:
    """What one rank sees in one epoch."""

    rank: int
    samples: int  # len(DistributedSampler) on this rank
    unique: int  # of which are real samples
    padded: int  # of which are DistributedSampler padding duplicates
    batches: Optional[int]  # len(DataLoader) on this rank (None: no batch size)
    last_batch: Optional[int]  # size of the last batch (0 when no batches)
    dropped: Optional[int]  # samples the DataLoader's drop_last throws away


@dataclass(frozen=True)
class ShardPlan:
    dataset_size: int
    world_size: int
    batch_size: Optional[int]
    drop_last: bool  # DataLoader / BatchSampler drop_last
    sampler_drop_last: bool  # DistributedSampler drop_last
    grad_accum: int
    samples_per_rank: int
    total_size: int  # indices handed out per epoch over all ranks (with padding)
    padded: int  # duplicates added by DistributedSampler padding
    sampler_dropped: int  # samples DistributedSampler(drop_last=True) cuts
    ranks: tuple = field(default_factory=tuple)

    # -- per-rank DataLoader numbers (all ranks get the same count) --------
    @property
    def batches_per_rank(self) -> Optional[int]:
        return self.ranks[0].batches if self.ranks else None

    @property
    def last_batch(self) -> Optional[int]:
        return self.ranks[0].last_batch if self.ranks else None

    @property
    def loader_dropped_per_rank(self) -> Optional[int]:
        return self.ranks[0].dropped if self.ranks else None

    @property
    def loader_dropped_total(self) -> Optional[int]:
        if self.batch_size is None:
            return None
        return sum(r.dropped for r in self.ranks)

    @property
    def optimizer_steps_per_epoch(self) -> Optional[int]:
        """Full optimizer steps: ``batches // grad_accum`` (the usual
        ``if (i + 1) % accum == 0: step()`` loop)."""
        if self.batch_size is None:
            return None
        return self.batches_per_rank // self.grad_accum

    @property
    def leftover_micro_batches(self) -> Optional[int]:
        """Batches at the end of an epoch that do not complete an accumulation."""
        if self.batch_size is None:
            return None
        return self.batches_per_rank % self.grad_accum

    @property
    def effective_global_batch(self) -> Optional[int]:
        """Samples per optimizer step over all ranks: B x W x grad_accum."""
        if self.batch_size is None:
            return None
        return self.batch_size * self.world_size * self.grad_accum

    @property
    def eval_counted(self) -> int:
        """Samples an evaluation over this sampler visits (sum over ranks)."""
        return self.total_size

    @property
    def samples_trained_per_epoch(self) -> Optional[int]:
        """Sample visits per epoch over all ranks after every drop (duplicates included)."""
        if self.batch_size is None:
            return None
        return sum(r.samples - r.dropped for r in self.ranks)


def sampler_num_samples(dataset_size: int, world_size: int, drop_last: bool) -> int:
    """``len(DistributedSampler(...))`` for a data set of ``dataset_size``."""
    if drop_last and dataset_size % world_size != 0:
        return dataset_size // world_size
    return -(-dataset_size // world_size)


def loader_batches(samples: int, batch_size: int, drop_last: bool) -> tuple[int, int, int]:
    """``(len(DataLoader), size of its last batch, samples dropped)`` for ``samples``."""
    if drop_last:
        batches = samples // batch_size
        return batches, (batch_size if batches else 0), samples % batch_size
    batches = -(-samples // batch_size)
    if batches == 0:
        return 0, 0, 0
    rest = samples % batch_size
    return batches, (rest if rest else batch_size), 0


def plan_shards(
    dataset_size: int,
    world_size: int,
    batch_size: Optional[int] = None,
    drop_last: bool = False,
    sampler_drop_last: bool = False,
    grad_accum: int = 1,
) -> ShardPlan:
    """Everything a DistributedSampler + DataLoader pair does to ``dataset_size`` samples."""
    _require(isinstance(dataset_size, int) and dataset_size >= 1,
             f"--dataset-size must be a positive number of samples, got {dataset_size}")
    _require(isinstance(world_size, int) and world_size >= 1,
             f"--gpus must be at least 1 (one process per GPU), got {world_size}")
    _require(batch_size is None or (isinstance(batch_size, int) and batch_size >= 1),
             f"--batch-size must be at least 1, got {batch_size}")
    _require(isinstance(grad_accum, int) and grad_accum >= 1,
             f"--grad-accum must be at least 1, got {grad_accum}")

    num_samples = sampler_num_samples(dataset_size, world_size, sampler_drop_last)
    total = num_samples * world_size
    padded = max(0, total - dataset_size)
    sampler_dropped = max(0, dataset_size - total)

    ranks = []
    for rank in range(world_size):
        # positions rank, rank+W, ... < total; those >= dataset_size are padding
        if padded:
            pad_here = 1 if rank >= world_size - padded else 0
        else:
            pad_here = 0
        if batch_size is None:
            batches = last = dropped = None
        else:
            batches, last, dropped = loader_batches(num_samples, batch_size, drop_last)
        ranks.append(RankShare(rank, num_samples, num_samples - pad_here, pad_here,
                               batches, last, dropped))
    return ShardPlan(dataset_size, world_size, batch_size, drop_last, sampler_drop_last,
                     grad_accum, num_samples, total, padded, sampler_dropped, tuple(ranks))


# -- global batch -> per-GPU batch -------------------------------------------


@dataclass(frozen=True)
class BatchChoice:
    per_gpu: int
    requested_global: Optional[int]  # --global-batch-size when given
    effective_global: int  # per_gpu * W * grad_accum
    exact: bool  # the requested global batch divided evenly
    nearest_globals: tuple = ()  # clean global batches around the request


def resolve_batch_size(world_size: int, batch_size: Optional[int] = None,
                       global_batch_size: Optional[int] = None,
                       grad_accum: int = 1) -> Optional[BatchChoice]:
    """Per-GPU batch from ``--batch-size`` or ``--global-batch-size``.

    The batch a DDP script sets is per process: with W GPUs the optimizer sees
    ``B x W x grad_accum`` (set baseline/nprocs or the batch doubles).
    """
    _require(world_size >= 1, f"--gpus must be at least 1, got {world_size}")
    _require(grad_accum >= 1, f"--grad-accum must be at least 1, got {grad_accum}")
    if batch_size is not None and global_batch_size is not None:
        raise PlanError(
            "give either --batch-size (per GPU) or --global-batch-size (all GPUs), not both")
    if batch_size is not None:
        _require(batch_size >= 1, f"--batch-size must be at least 1, got {batch_size}")
        return BatchChoice(batch_size, None, batch_size * world_size * grad_accum, True)
    if global_batch_size is None:
        return None
    _require(global_batch_size >= 1,
             f"--global-batch-size must be at least 1, got {global_batch_size}")
    unit = world_size * grad_accum
    per_gpu = global_batch_size // unit
    _require(per_gpu >= 1,
             f"--global-batch-size {global_batch_size} is smaller than {world_size} GPUs x "
             f"grad-accum {grad_accum} = {unit}: every GPU needs at least one sample per step")
    exact = global_batch_size % unit == 0
    nearest = ()
    if not exact:
        nearest = (per_gpu * unit, (per_gpu + 1) * unit)
    return BatchChoice(per_gpu, global_batch_size, per_gpu * unit, exact, nearest)


# -- nn.DataParallel ----------------------------------------------------------


def chunk_sizes(n: int, parts: int) -> list[int]:
    """Sizes ``torch.Tensor.chunk(parts)`` gives for a dimension of ``n``."""
    if n <= 0:
        return []
    size = -(-n // parts)
    full, rest = divmod(n, size)
    return [size] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class DataParallelPlan:
    dataset_size: int
    gpus: int
    global_batch: int  # the DataLoader batch; DataParallel splits it over the GPUs
    drop_last: bool
    batches: int
    last_batch: int
    last_chunks: tuple  # per-replica sizes of the last batch
    idle_replicas: int  # replicas that get no data in the last batch
    batch_chunks: tuple = ()  # per-replica sizes of a full batch


def plan_data_parallel(dataset_size: int, gpus: int, global_batch: int,
                       drop_last: bool = False) -> DataParallelPlan:
    """One DataLoader over the whole set; ``nn.DataParallel`` scatters each batch."""
    _require(dataset_size >= 1, f"--dataset-size must be positive, got {dataset_size}")
    _require(gpus >= 1, f"--gpus must be at least 1, got {gpus}")
    _require(global_batch >= 1, f"batch must be at least 1, got {global_batch}")
    batches, last, _dropped = loader_batches(dataset_size, global_batch, drop_last)
    chunks = tuple(chunk_sizes(last, gpus))
    idle = gpus - len(chunks) if last else gpus
    return DataParallelPlan(dataset_size, gpus, global_batch, drop_last, batches, last,
                            chunks, idle, tuple(chunk_sizes(global_batch, gpus)))


# -- learning rate -----------------------------------------------------------


@dataclass(frozen=True)
class LrSuggestion:
    base_lr: float
    base_batch: int
    batch: int
    linear: float  # lr * batch / base_batch   (Goyal et al.)
    sqrt: float  # lr * sqrt(batch / base_batch) (search between the two)


def lr_suggestion(base_lr: float, base_batch: int, batch: int) -> LrSuggestion:
    _require(base_lr > 0, f"--base-lr must be positive, got {base_lr}")
    _require(base_batch >= 1, f"--base-batch must be at least 1, got {base_batch}")
    ratio = batch / base_batch
    return LrSuggestion(base_lr, base_batch, batch, base_lr * ratio,
                        base_lr * math.sqrt(ratio))


# -- cleaner settings --------------------------------------------------------


def last_batch_of(samples: int, batch_size: int) -> int:
    rest = samples % batch_size
    return rest if rest else (batch_size if samples else 0)


def suggest_batch_sizes(samples_per_rank: int, batch_size: int, min_last: int = 2,
                        spread: float = 0.5) -> list[int]:
    """Batch sizes near ``batch_size`` whose last batch holds ``>= min_last`` samples.

    Looks within ``batch_size * (1 +- spread)`` (at least +-2), nearest first;
    a size that divides the per-rank share exactly wins a tie. Returns at most
    one size below and one above.
    """
    reach = max(2, int(batch_size * spread))
    lo = max(1, batch_size - reach)
    hi = min(samples_per_rank, batch_size + reach)
    below = above = None
    for cand in range(batch_size - 1, lo - 1, -1):
        if last_batch_of(samples_per_rank, cand) >= min_last:
            below = cand
            break
    for cand in range(batch_size + 1, hi + 1):
        if last_batch_of(samples_per_rank, cand) >= min_last:
            above = cand
            break
    out = [c for c in (below, above) if c is not None]
    out.sort(key=lambda c: (abs(c - batch_size), samples_per_rank % c != 0, c))
    return out


def suggest_dp_batch(dataset_size: int, gpus: int, global_batch: int) -> Optional[int]:
    """Nearest global batch (a multiple of ``gpus``) whose last batch feeds every replica.

    Prefers one where every replica gets at least 2 samples (BatchNorm), within
    four times the current batch; otherwise the nearest that leaves no replica idle.
    """
    fallback = None
    for delta in range(0, 4 * global_batch + 1):
        for cand in (global_batch - delta, global_batch + delta):
            if cand < gpus or cand % gpus:
                continue
            plan = plan_data_parallel(dataset_size, gpus, cand)
            if plan.idle_replicas:
                continue
            if min(plan.last_chunks) >= 2:
                return cand
            if fallback is None:
                fallback = cand
    return fallback


def batch_guide(samples_per_rank: int, sizes=GUIDE_BATCH_SIZES) -> list[tuple[int, int, int, int]]:
    """``(B, batches, last batch, dropped with drop_last)`` for common batch sizes."""
    rows = []
    for size in sizes:
        if size > samples_per_rank:
            break
        batches, last, _ = loader_batches(samples_per_rank, size, False)
        rows.append((size, batches, last, samples_per_rank % size))
    return rows


# -- what nn.DataParallel's scatter does with a batch ------------------------------


@dataclass(frozen=True)
class TensorLeaf:
    """A tensor in the model's inputs, by its size along the scatter dimension (0)."""

    size: int


@dataclass(frozen=True)
class DpScatter:
    inputs: int  # scattered positional-argument tuples, after torch's padding
    kwargs: int  # scattered keyword dicts, after torch's padding
    data_replicas: int  # replicas whose positional inputs hold a chunk of the batch
    keyword_only_replicas: tuple  # replicas called with keyword arguments and no positional input
    mismatch: bool  # len(inputs) != len(kwargs): parallel_apply's length assertion fails

    @property
    def replicas(self) -> int:
        return self.inputs


def _scatter_count(obj, gpus: int) -> int:
    """How many pieces ``torch.nn.parallel.scatter_gather.scatter``'s ``scatter_map``
    makes of ``obj`` (torch 2.x): a tensor gives ``len(tensor.chunk(gpus))``; a
    non-empty tuple/list zips its items (the shortest wins); a non-empty dict zips
    its ``(key, value)`` items (a key alone is copied ``gpus`` times); anything else
    is copied once per GPU."""
    if isinstance(obj, TensorLeaf):
        return len(chunk_sizes(obj.size, gpus))
    if isinstance(obj, (tuple, list)) and obj:
        return min(_scatter_count(x, gpus) for x in obj)
    if isinstance(obj, dict) and obj:
        return min(min(gpus, _scatter_count(v, gpus)) for v in obj.values())
    return gpus


def dp_scatter(args: tuple, kwargs: dict, gpus: int) -> DpScatter:
    """``scatter_kwargs(inputs, kwargs, device_ids)`` and the replicas
    ``DataParallel.forward`` then runs (torch 2.x,
    ``torch/nn/parallel/scatter_gather.py`` and ``data_parallel.py``)."""
    si = _scatter_count(args, gpus) if args else 0
    sk = _scatter_count(kwargs, gpus) if kwargs else 0
    data = si
    keyword_only: tuple = ()
    if si < sk:
        # torch pads the positional inputs with () up to the kwargs' length: the
        # padded replicas lose the positional inputs the others get
        keyword_only = tuple(range(si, sk)) if args else ()
        si = sk
    elif sk < len(args):  # torch compares with the unscattered tuple's length
        sk = si
    if si == 0 and sk == 0:
        si = sk = 1  # a forward without inputs runs once, on the first device
    return DpScatter(si, sk, data, keyword_only, si != sk)
