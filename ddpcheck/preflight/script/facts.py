"""What one rank saw while the user's script ran (plain data, no torch).

Every rank fills one :class:`RankFacts` inside its worker process and the
launcher reads it back from the rank's progress file (JSON), so each type
converts to and from plain dicts. Judging happens later, in
:mod:`ddpcheck.preflight.script.judge`, across ranks.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Optional


class Ending(str, enum.Enum):
    """How the script's run on one rank ended."""

    STOPPED = "stopped"  # the preflight's steering stopped it on schedule
    FINISHED = "finished"  # the script returned on its own
    EXITED = "exited"  # sys.exit(0) / sys.exit(None)
    CRASHED = "crashed"  # an exception escaped the script (or sys.exit(non-zero))
    MISMATCH = "mismatch"  # the collective sequence diverged from a peer's
    REFUSED = "refused"  # the preflight cannot run this script (mp.spawn mismatch, ...)
    NOT_STARTED = "not started"


def _load(cls, data):
    """A dataclass from its ``asdict`` form (nested types via ``_nested``)."""
    if data is None:
        return None
    nested = getattr(cls, "_nested", {})
    kwargs = {}
    names = {f.name for f in fields(cls)}
    for key, value in data.items():
        if key not in names:
            continue
        sub = nested.get(key)
        if sub is not None and isinstance(value, list):
            value = [_load(sub, v) for v in value]
        elif sub is not None and isinstance(value, dict):
            value = _load(sub, value)
        kwargs[key] = value
    if "ending" in kwargs and cls is RankFacts:
        kwargs["ending"] = Ending(kwargs["ending"])
    return cls(**kwargs)


@dataclass
class EpochFact:
    """One pass over a DataLoader (one ``iter(loader)``)."""

    number: int  # 1 for the first pass
    sampler_epoch: Optional[int]  # the sampler's ``epoch`` when the pass began
    set_epoch_calls: int  # set_epoch calls on its sampler since the previous pass
    order_digest: str  # hash of the full epoch's index order on this rank
    head: list[int] = field(default_factory=list)  # first indices, for the report
    batches_total: int = 0  # batches the real epoch has
    batches_served: int = 0  # batches the preflight let through
    first_batch: int = 0  # size of the first batch served (the epoch's last batch)
    steps: int = 0  # optimizer steps while this pass was the one serving batches
    ended_run: bool = False  # the steering stopped the run in this pass (the next epoch)

    @property
    def training(self) -> bool:
        """A training epoch: the optimizer stepped during the pass, or the steering
        stopped the run in it. A peek (``next(iter(loader))``), an evaluation pass or a
        ``len()`` is not one."""
        return self.steps > 0 or self.ended_run


@dataclass
class LoaderFact:
    """One ``DataLoader(...)`` the script built, with its real sizes."""

    index: int  # creation order on this rank
    where: str  # the script line that built it
    dataset_type: str
    dataset_len: Optional[int]  # len(dataset); None for an IterableDataset without len
    batch_size: Optional[int]
    drop_last: bool
    sampler: str  # class name of the sampler
    distributed: bool  # a DistributedSampler (or subclass)
    shuffle: Optional[bool]  # DistributedSampler.shuffle, or RandomSampler -> True
    sampler_drop_last: Optional[bool]
    num_replicas: Optional[int]
    sampler_rank: Optional[int]
    num_workers: int
    batches: Optional[int]  # len(loader)
    steered: bool  # batches served in the preflight's order
    training: bool = False  # an optimizer stepped while it was being iterated
    epochs: list[EpochFact] = field(default_factory=list)  # one per pass

    _nested = {"epochs": EpochFact}

    @property
    def training_epochs(self) -> list:
        """The passes the optimizer stepped in, in order (what the sampler calls epochs)."""
        return [e for e in self.epochs if e.training]


@dataclass
class WrapFact:
    """A DistributedDataParallel / DataParallel construction."""

    kind: str
    where: str
    device_ids: Optional[list[str]]
    output_device: Optional[str]
    find_unused_parameters: bool
    broadcast_buffers: bool
    batchnorms: int  # plain BatchNorm layers inside
    syncbatchnorms: int  # SyncBatchNorm layers inside (converted before the wrap)
    parameters: int
    parameter_bytes: int
    device_ids_dropped: bool = False  # CUDA stand-in: device_ids removed for the CPU module


@dataclass
class SyncBNFact:
    where: str
    after_wrap: bool  # convert_sync_batchnorm was given a module DDP already wraps
    converted: bool  # False on CPU: recorded, not converted (SyncBatchNorm needs a GPU)


@dataclass
class CollectiveFact:
    """One collective call (or DDP step) in this rank's sequence."""

    seq: int
    op: str
    where: str
    shapes: list = field(default_factory=list)
    dtype: Optional[str] = None
    compared: bool = True  # on the default group: compared across ranks


@dataclass
class PeerPosition:
    """Where a peer was at the sequence number this rank stopped on."""

    rank: int
    op: Optional[str] = None  # what it entered at that position
    where: str = ""
    shapes: list = field(default_factory=list)
    dtype: Optional[str] = None
    ended: Optional[str] = None  # it never got there: how its run ended
    ended_where: str = ""


@dataclass
class MismatchFact:
    seq: int
    mine: CollectiveFact
    peers: list[PeerPosition] = field(default_factory=list)
    reason: str = ""  # "op" / "shape" / "dtype" / "ended"

    _nested = {"mine": CollectiveFact, "peers": PeerPosition}


@dataclass
class WriteFact:
    """A file write the script made (redirected into the preflight's scratch)."""

    kind: str  # torch.save / open / makedirs / rename / remove
    path: str  # the path the script named (absolute)
    where: str  # the script line
    redirected: bool  # True: went to scratch; False: a temp path left alone
    count: int = 1


@dataclass
class CrashFact:
    type: str
    message: str
    where: str  # innermost line of the user's code
    traceback: str = ""  # the last frames, for the report's json
    frames: list = field(default_factory=list)  # the script's own frames, outermost first
    last_line: str = ""  # the traceback's last line (a wrapped exception's own cause)


@dataclass
class MemoryFact:
    """Tensor memory of one training step at the script's own batch size."""

    batch: Optional[int]
    peak_bytes: int
    baseline_bytes: int  # parameters, gradients, optimizer state before the step
    tool: str


@dataclass
class RankFacts:
    rank: int
    world_size: int
    local_rank: int = 0
    pid: int = 0
    target: str = ""
    backend_asked: Optional[str] = None  # what the script passed to init_process_group
    backend_used: Optional[str] = None
    init_where: str = ""
    init_notes: list[str] = field(default_factory=list)
    cuda_stand_in: bool = False  # .cuda()/set_device/... ran on CPU
    stand_in_used: list[str] = field(default_factory=list)  # CUDA calls the stand-in answered
    node: int = 0  # the rank's node (GROUP_RANK under torchrun, or --nodes emulation)
    nodes: int = 1
    one_process: bool = False  # ran as the script's only process (DataParallel / plain)
    devices: int = 1  # CUDA devices this process sees (emulated on CPU)
    wants_ranks: bool = False  # one-process run: the script started a process group
    data_parallel: list = field(default_factory=list)  # DataParallel scatters (first few)
    uncompared: int = 0  # forwards and sub-group collectives that meet no peer
    first_divergence: str = ""  # the first matched step the ranks reached from different lines
    set_device: list[Optional[int]] = field(default_factory=list)  # indices asked for
    loaders: list[LoaderFact] = field(default_factory=list)
    wraps: list[WrapFact] = field(default_factory=list)
    syncbn: list[SyncBNFact] = field(default_factory=list)
    collectives: list[CollectiveFact] = field(default_factory=list)  # first ones, in order
    collective_count: int = 0
    writes: list[WriteFact] = field(default_factory=list)
    optimizer_steps: int = 0
    memory: Optional[MemoryFact] = None
    ending: Ending = Ending.NOT_STARTED
    ending_detail: str = ""
    exit_code: Optional[int] = None
    crash: Optional[CrashFact] = None
    mismatch: Optional[MismatchFact] = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    _nested = {"loaders": LoaderFact, "wraps": WrapFact, "syncbn": SyncBNFact,
               "collectives": CollectiveFact, "writes": WriteFact, "memory": MemoryFact,
               "crash": CrashFact, "mismatch": MismatchFact}

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ending"] = self.ending.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RankFacts":
        return _load(cls, data)
