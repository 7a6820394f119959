"""The preflight's one verdict model: a :class:`Check` with an id, PASS / WARN / FAIL,
a one-line reason and a fix (pure Python). Both modes judge into it (the factory
mode's verdict modules, the script mode's judge) and both reports print it; its
:meth:`Check.to_dict` is the one shape of a check in ``--format json``.

A check is identified by its :class:`CheckId`, never by its prose: code that
upgrades or looks up a check (the last batch of one that this model really
cannot train on, a test, a CI script reading the json) uses the id.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"

    def __str__(self) -> str:
        return self.value


PASS, WARN, FAIL = Status.PASS, Status.WARN, Status.FAIL

_ORDER = {PASS: 0, WARN: 1, FAIL: 2}


class CheckId(Enum):
    """Every check the preflight can report; the value is the stable id in json."""

    # launch and backend
    BACKEND = "backend"
    LAUNCH_ENV = "launch_env"
    GPUS_VS_LAUNCHER = "gpus_vs_launcher"
    # what happened to the ranks
    RANK_FAILED = "rank_failed"  # raised an exception (text and frame known)
    RANK_CRASHED = "rank_crashed"  # died without a result (signal, os._exit)
    RANK_HUNG = "rank_hung"  # made no progress until the deadline
    RANK_ALONE_IN_COLLECTIVE = "rank_alone_in_collective"  # waits in a collective nobody else calls
    RANK_STOPPED = "rank_stopped"  # stopped because another rank failed first
    ALL_HUNG = "all_hung"
    WORKERS_STOPPED = "workers_stopped"
    RUN_DEADLINE = "run_deadline"  # the supervisor killed the whole run at --timeout
    # the process group
    PG_INIT = "pg_init"
    IDENTITY = "identity"
    ONE_GPU_PER_RANK = "one_gpu_per_rank"
    COLLECTIVES = "collectives"
    BARRIER = "barrier"
    BANDWIDTH = "bandwidth"
    # data-set arithmetic
    SAMPLES_PER_RANK = "samples_per_rank"
    SAMPLER_PADDING = "sampler_padding"
    SAMPLER_DROP_LAST = "sampler_drop_last"
    SAMPLER_SPLIT = "sampler_split"
    GLOBAL_BATCH_SPLIT = "global_batch_split"
    BATCH_VS_SHARE = "batch_vs_share"
    LAST_BATCH = "last_batch"
    LAST_BATCH_OF_ONE = "last_batch_of_one"
    GRAD_ACCUM = "grad_accum"
    EFFECTIVE_BATCH = "effective_batch"
    DP_LAST_BATCH = "dp_last_batch"
    DP_EVERY_BATCH = "dp_every_batch"
    DP_INPUTS = "dp_inputs"
    # the model and its memory
    MODEL_FACTORY = "model_factory"
    OPTIMIZER_FACTORY = "optimizer_factory"
    MODEL_STATE_MEMORY = "model_state_memory"
    HOST_MEMORY = "host_memory"
    SYNC_BN = "sync_bn"
    UNUSED_PARAMETERS = "unused_parameters"
    BN_BATCH1 = "bn_batch1"
    MEMORY_FIRST_BATCH = "memory_first_batch"
    MEMORY_TARGET = "memory_target"
    MEMORY_OOM = "memory_oom"
    MEMORY_PREDICTION = "memory_prediction"
    TRAINING_STEP = "training_step"
    # script mode: what running the user's own script showed
    RUN = "run"
    CRASH = "crash"
    HANG = "hang"
    COLLECTIVE_ORDER = "collective_order"
    SET_EPOCH = "set_epoch"
    DISTRIBUTED_SAMPLER = "distributed_sampler"
    CHECKPOINT_WRITES = "checkpoint_writes"
    FILE_WRITES = "file_writes"
    NODE_WRITES = "node_writes"
    DDP_WRAP = "ddp_wrap"
    MEMORY = "memory"
    CPU_STAND_IN = "cpu_stand_in"  # something only a GPU can run: not checked, not the script's fault
    DATA_PARALLEL = "data_parallel"
    SINGLE_PROCESS = "single_process"

    def title(self, rank: Optional[int] = None, batch: Optional[int] = None) -> str:
        text = _TITLES[self]
        return text.format(rank=rank, batch=batch)


_TITLES = {
    CheckId.BACKEND: "backend",
    CheckId.LAUNCH_ENV: "launch environment",
    CheckId.GPUS_VS_LAUNCHER: "--gpus vs launcher",
    CheckId.RANK_FAILED: "rank {rank} failed",
    CheckId.RANK_CRASHED: "rank {rank} crashed",
    CheckId.RANK_HUNG: "rank {rank} hung",
    CheckId.RANK_ALONE_IN_COLLECTIVE: "rank {rank} waits alone",
    CheckId.RANK_STOPPED: "rank {rank} stopped",
    CheckId.ALL_HUNG: "all ranks hung",
    CheckId.WORKERS_STOPPED: "workers stopped",
    CheckId.RUN_DEADLINE: "run ended at --timeout",
    CheckId.PG_INIT: "process group init",
    CheckId.IDENTITY: "rank / world size / local rank",
    CheckId.ONE_GPU_PER_RANK: "one GPU per rank",
    CheckId.COLLECTIVES: "collectives",
    CheckId.BARRIER: "monitored_barrier",
    CheckId.BANDWIDTH: "all_reduce bandwidth",
    CheckId.SAMPLES_PER_RANK: "data: samples per rank",
    CheckId.SAMPLER_PADDING: "data: DistributedSampler padding",
    CheckId.SAMPLER_DROP_LAST: "data: DistributedSampler drop_last",
    CheckId.SAMPLER_SPLIT: "data: DistributedSampler split",
    CheckId.GLOBAL_BATCH_SPLIT: "batch: global batch split",
    CheckId.BATCH_VS_SHARE: "batch: per-GPU batch vs share",
    CheckId.LAST_BATCH: "batch: last batch",
    CheckId.LAST_BATCH_OF_ONE: "batch: last batch",
    CheckId.GRAD_ACCUM: "batch: gradient accumulation",
    CheckId.EFFECTIVE_BATCH: "batch: effective global batch",
    CheckId.DP_LAST_BATCH: "DataParallel: last batch",
    CheckId.DP_EVERY_BATCH: "DataParallel: every batch",
    CheckId.DP_INPUTS: "DataParallel: inputs",
    CheckId.MODEL_FACTORY: "model factory",
    CheckId.OPTIMIZER_FACTORY: "optimizer factory",
    CheckId.MODEL_STATE_MEMORY: "memory: model state",
    CheckId.HOST_MEMORY: "memory",
    CheckId.SYNC_BN: "SyncBatchNorm",
    CheckId.UNUSED_PARAMETERS: "unused parameters",
    CheckId.BN_BATCH1: "batch=1 with BatchNorm",
    CheckId.MEMORY_FIRST_BATCH: "memory at batch {batch}",
    CheckId.MEMORY_TARGET: "memory at the target batch",
    CheckId.MEMORY_OOM: "memory",
    CheckId.MEMORY_PREDICTION: "memory prediction",
    CheckId.TRAINING_STEP: "training step",
    CheckId.RUN: "run",
    CheckId.CRASH: "crash",
    CheckId.HANG: "hang",
    CheckId.COLLECTIVE_ORDER: "collective order",
    CheckId.SET_EPOCH: "set_epoch",
    CheckId.DISTRIBUTED_SAMPLER: "DistributedSampler",
    CheckId.CHECKPOINT_WRITES: "checkpoint writes",
    CheckId.FILE_WRITES: "file writes",
    CheckId.NODE_WRITES: "writes by several nodes",
    CheckId.DDP_WRAP: "DDP wrap",
    CheckId.MEMORY: "memory",
    CheckId.CPU_STAND_IN: "CPU stand-in for CUDA",
    CheckId.DATA_PARALLEL: "DataParallel",
    CheckId.SINGLE_PROCESS: "single process",
}


@dataclass(frozen=True)
class Check:
    """One verdict of either mode.

    ``detail`` says what was found (and why it bites in DDP); ``fix`` says what
    to do about it (empty for a PASS). ``rank`` / ``batch`` fill the title of
    per-rank and per-batch checks; ``headline`` replaces that title where the
    verdict is a sentence about what was seen ("DDP101 confirmed: epoch 2 began
    without set_epoch"). ``rule`` is the ``ddpcheck lint`` rule that predicts the
    check statically; ``ranks`` are the ranks it is about (``rank`` included).
    """

    id: CheckId
    status: Status
    detail: str
    fix: str = ""
    rank: Optional[int] = None
    batch: Optional[int] = None
    headline: Optional[str] = None
    rule: Optional[str] = None
    ranks: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, CheckId):
            raise TypeError(f"check id must be a CheckId, not {self.id!r}")
        object.__setattr__(self, "status", Status(self.status))
        ranks = tuple(sorted(set(self.ranks) | ({self.rank} if self.rank is not None else set())))
        object.__setattr__(self, "ranks", ranks)

    @property
    def name(self) -> str:
        return self.headline or self.id.title(self.rank, self.batch)

    @property
    def confirms(self) -> Optional[str]:
        """The lint rule this run confirmed (a WARN/FAIL carrying a rule code)."""
        return self.rule if self.status != PASS else None

    def to_dict(self) -> dict:
        return {"id": self.id.value, "name": self.name, "status": self.status.value,
                "detail": self.detail, "fix": self.fix, "rank": self.rank,
                "ranks": list(self.ranks), "rule": self.rule}


def worst(checks: Iterable[Check]) -> Status:
    """The worst status among ``checks`` (PASS when there are none)."""
    status = PASS
    for check in checks:
        if _ORDER[check.status] > _ORDER[status]:
            status = check.status
    return status


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed (warnings allowed), 1 when any check FAILed."""
    return 1 if worst(checks) == FAIL else 0
