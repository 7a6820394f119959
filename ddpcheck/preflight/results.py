"""What one rank produced, as one typed record (pure Python, no torch).

A worker fills a :class:`RankResult` as it goes and writes it into its progress
file (json, through :func:`to_json_dict` / :func:`from_json_dict`); the
launcher adds what only it knows (the rank crashed, hung or was stopped, its
exit code, the frame its stack dump shows) to the same record. The verdict
reads nothing else. Script mode (``ddpcheck preflight -- train.py``) fills the
same type.
"""

from __future__ import annotations

import dataclasses
import enum
import traceback
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpcheck.preflight.forensics import Frame
from ddpcheck.preflight.memfit import Confirmation, MemoryFit, StepMemory
from ddpcheck.preflight.writes import Write


class RankStatus(str, enum.Enum):
    OK = "ok"  # finished with a complete result
    RUNNING = "running"  # no final record (yet)
    FAILED = "failed"  # raised an exception: ``failure`` says which, where
    CRASHED = "crashed"  # died without a result (a signal, os._exit, an abort)
    HUNG = "hung"  # no progress until the deadline; killed
    STOPPED = "stopped"  # killed because another rank failed first
    WAITING = "waiting"  # killed while it waited for a peer that never came (not hung)
    NOT_STARTED = "not_started"  # --timeout ended before the launcher would start it


class FailureKind(str, enum.Enum):
    ERROR = "error"  # any exception from the user's code or torch
    OOM = "oom"
    BN_BATCH1 = "bn_batch1"  # BatchNorm cannot train on one value per channel
    UNUSED = "unused"  # DDP: parameters without a gradient
    PEER_LOST = "peer_lost"  # a peer never arrived at a meeting point
    LOSS = "loss"  # no loss could be formed from the output


@dataclass
class RankFailure:
    """An exception one rank raised: its type, text and the frame it came from."""

    kind: FailureKind
    stage: str
    exc_type: str
    message: str
    frame: str = ""  # "path:line in function": the innermost frame of the user's code
    batch: Optional[int] = None
    names: list = field(default_factory=list)  # unused parameters, for UNUSED

    def text(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.exc_type else self.message


@dataclass
class DeviceInfo:
    kind: str = "cpu"
    index: Optional[int] = None
    name: str = ""
    uuid: str = ""
    pci: str = ""
    total_memory: Optional[int] = None


@dataclass
class Identity:
    rank: int
    world_size: int
    env: dict = field(default_factory=dict)  # RANK, WORLD_SIZE, LOCAL_RANK, ... as seen
    host: str = ""
    pid: int = 0
    device: DeviceInfo = field(default_factory=DeviceInfo)


@dataclass
class CollectiveResult:
    name: str
    ok: bool
    expected: Any = None
    got: Any = None
    seconds: Optional[float] = None


@dataclass
class BandwidthResult:
    bytes: int
    iters: int
    seconds: float
    algbw: float
    busbw: float


@dataclass
class StateBytes:
    """Memory a training step needs before any activation, per rank."""

    params: int
    grads: int
    buckets: int  # DDP's gradient buckets (0 with gradient_as_bucket_view)
    optimizer: Optional[int]  # None: a custom optimizer whose state is not known in advance

    @property
    def total(self) -> int:
        return self.params + self.grads + self.buckets + (self.optimizer or 0)


@dataclass
class MemoryResult:
    device: str = "cpu"
    tool: str = ""
    params: int = 0
    param_bytes: int = 0
    trainable_bytes: int = 0
    batchnorm_layers: int = 0
    state: Optional[StateBytes] = None
    factory_error: Optional[RankFailure] = None
    failed_ranks: list = field(default_factory=list)  # ranks on which the factory failed
    host_too_small: Optional[int] = None  # host RAM, when the state of every rank exceeds it
    sync_bn: str = ""  # "", "converted", "not on CPU"
    unused: Optional[RankFailure] = None
    bn_batch1: str = ""
    steps: list[StepMemory] = field(default_factory=list)
    step_error: Optional[RankFailure] = None
    simulated_oom: bool = False  # CPU: the step's tensor memory exceeded --gpu-memory
    budget: Optional[int] = None
    budget_from_device: bool = False
    reserve: int = 0
    outside_allocator: Optional[int] = None
    usable: Optional[int] = None
    fit: Optional[MemoryFit] = None
    largest: Optional[int] = None
    largest_confirmed: bool = False
    confirmations: list[Confirmation] = field(default_factory=list)
    confirm_skipped: str = ""
    amp: str = ""


@dataclass
class RankResult:
    rank: int
    status: RankStatus = RankStatus.RUNNING
    stage: str = "starting the worker process"
    stage_age: Optional[float] = None
    pid: Optional[int] = None
    exitcode: Optional[int] = None
    exit_text: str = ""
    stuck_at: str = ""  # the frame a stack dump showed (hung or stopped ranks)
    collective: str = ""  # the torch.distributed call it was blocked in, if any
    last_words: str = ""  # what a crashed rank said last on stderr
    failure: Optional[RankFailure] = None
    init_seconds: Optional[float] = None
    identity: Optional[Identity] = None
    peers: list[Identity] = field(default_factory=list)  # rank 0: everybody's identity
    collectives: list[CollectiveResult] = field(default_factory=list)
    barrier_ok: bool = False
    bandwidth: Optional[BandwidthResult] = None
    memory: Optional[MemoryResult] = None
    everyone: list[RankResult] = field(default_factory=list)  # under a launcher: every rank's
    writes: list[Write] = field(default_factory=list)  # what the user's code wrote here

    @property
    def finished(self) -> bool:
        return self.status in (RankStatus.OK, RankStatus.FAILED)

    @property
    def ok(self) -> bool:
        return self.status == RankStatus.OK


# -- json ------------------------------------------------------------------------------


def to_json_dict(obj: Any) -> Any:
    """Dataclasses and enums to plain json values (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_json_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_dict(v) for v in obj]
    return obj


_HINTS: dict = {}


def _hints(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def from_json_dict(tp: Any, value: Any) -> Any:
    """The inverse of :func:`to_json_dict` for the annotated type ``tp``."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_json_dict(args[0], value) if len(args) == 1 else value
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        kwargs = {f.name: from_json_dict(hints[f.name], value[f.name])
                  for f in dataclasses.fields(tp) if f.name in value}
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        item = args[0] if args else Any
        items = [from_json_dict(item, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        return dict(value)
    return value


def result_from_dict(value: dict) -> RankResult:
    return from_json_dict(RankResult, value)


# -- failures from exceptions ------------------------------------------------------------


def exception_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def failure_from_exception(exc: BaseException, stage: str, kind: FailureKind = FailureKind.ERROR,
                           batch: Optional[int] = None, limit: int = 300) -> RankFailure:
    """The exception's type, first line and the innermost frame of the user's code
    (else the innermost frame)."""
    frames = [Frame(f.filename, f.lineno or 0, f.name)
              for f in traceback.extract_tb(exc.__traceback__)]
    frame = next((f for f in reversed(frames) if f.is_user), frames[-1] if frames else None)
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > limit:
        message = message[: limit - 3] + "..."
    return RankFailure(kind, stage, exception_name(exc), message, str(frame) if frame else "",
                       batch)
