"""The preflight's options as typed values (pure Python, no torch).

click parses the command line straight into :class:`PreflightOptions`: ranges
are click's own (``IntRange``, ``FloatRange``), sizes, shapes and ``MODULE:FN``
references are click parameter types, so a bad value is one
``ddpcheck: error: ...`` line from click itself. :func:`check_combinations`
only checks what no single option can: options that need or exclude others.
:class:`RunSpec` is what every worker gets (picklable, for spawn); :class:`LaunchSpec`
and :class:`WorkerSpec` name the fields the launcher and a worker's set-up read, which
script mode's spec has too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Protocol

import click

from ddpcheck.errors import fail
from ddpcheck.preflight.envdetect import LaunchedEnv, LaunchEnvError, detect_launched
from ddpcheck.preflight.modelspec import SpecError, parse_input_shape, split_ref
from ddpcheck.preflight.units import parse_size

OPTIMIZERS = ("adamw", "adam", "sgd")
AMP_MODES = ("bf16", "fp16")


def launch_environment() -> Optional[LaunchedEnv]:
    """The torchrun / srun environment the preflight was started in (None: the
    preflight starts the ranks itself); a malformed one is a one-line usage error."""
    try:
        return detect_launched()
    except LaunchEnvError as exc:
        fail(str(exc))


def _without_option(exc: Exception) -> str:
    """click names the option itself: ``--model 'x': ...`` -> ``'x': ...``."""
    text = str(exc)
    return text.split(" ", 1)[1] if text.startswith("--") and " " in text else text


class SizeType(click.ParamType):
    """``24GiB`` / ``24GB`` / ``16G`` / ``512MiB`` -> bytes."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class ShapeType(click.ParamType):
    """``3,224,224`` (or ``3x224x224``) -> ``(3, 224, 224)``: one sample, no batch dimension."""

    name = "C,H,W"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            return parse_input_shape(value)
        except SpecError as exc:
            self.fail(_without_option(exc), param, ctx)


class RefType(click.ParamType):
    """``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (checked for form here;
    imported before any worker starts)."""

    name = "MODULE:FN"

    def convert(self, value, param, ctx):
        try:
            split_ref(str(value), "--option")
        except SpecError as exc:
            self.fail(_without_option(exc), param, ctx)
        return str(value)


class OptimizerType(RefType):
    """``adamw`` / ``adam`` / ``sgd``, or ``MODULE:FN`` where ``FN(params)`` returns
    the optimizer your script builds."""

    name = "adamw|adam|sgd|MODULE:FN"

    def convert(self, value, param, ctx):
        if str(value).lower() in OPTIMIZERS:
            return str(value).lower()
        if ":" not in str(value):
            self.fail(f"{value!r}: use adamw, adam, sgd, or MODULE:FN for your own "
                      f"(FN(params) returns a torch.optim.Optimizer)", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, which lets ``nan`` and ``inf`` through (every comparison
    with nan is false): a number, finite, in range."""

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)  # click's own message
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


SIZE, SHAPE, REF, OPTIMIZER = SizeType(), ShapeType(), RefType(), OptimizerType()

MAX_TIMEOUT = 86400.0  # one day: a preflight is minutes; a typo of a few zeros is not

# How many ranks one machine may run. Each local rank is a process forked from the
# launcher (torch imported once): 90 MiB of its own at rest (PSS, torch 2.13, CPU),
# more with the script's model and data; 256 MiB per rank leaves room for a small
# model. Whatever the memory, at most RANK_CEILING: a node has 8 or 16 GPUs, and more
# processes on one machine than that emulate nothing a real job runs.
RANK_MEMORY = 256 * 2**20
RANK_CEILING = 64


def available_memory(meminfo: str = "/proc/meminfo") -> Optional[int]:
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rank_capacity(meminfo: str = "/proc/meminfo") -> tuple[int, str]:
    """``(the most local ranks this machine may run, why)``."""
    avail = available_memory(meminfo)
    if avail is None:
        return RANK_CEILING, f"at most {RANK_CEILING} ranks on one machine"
    by_memory = max(1, avail // RANK_MEMORY)
    gib = avail / 2**30
    if by_memory < RANK_CEILING:
        return by_memory, (f"{gib:.1f} GiB of memory available here, about "
                           f"{RANK_MEMORY // 2**20} MiB per rank")
    return RANK_CEILING, (f"at most {RANK_CEILING} ranks on one machine ({gib:.1f} GiB "
                          f"available)")


def check_bandwidth_size(size: Optional[int], ranks: Optional[int],
                         meminfo: str = "/proc/meminfo",
                         nvidia: str = "/proc/driver/nvidia/gpus") -> None:
    """``--bandwidth-size``: on a machine without GPUs every rank holds that buffer in
    host memory, and all of them together must fit (one line and exit 2 if not)."""
    if not size or not ranks or os.path.isdir(nvidia):
        return
    avail = available_memory(meminfo)
    if avail is not None and size * ranks > avail:
        fail(f"--bandwidth-size {size / 2**30:.1f} GiB: {ranks} ranks on CPU would hold "
             f"{size * ranks / 2**30:.1f} GiB, and this machine has {avail / 2**30:.1f} GiB "
             f"available")


def check_capacity(gpus: Optional[int], meminfo: str = "/proc/meminfo") -> None:
    """``--gpus N`` processes must fit on this machine (one line and exit 2 if not)."""
    if gpus is None:
        return
    cap, why = rank_capacity(meminfo)
    if gpus > cap:
        fail(f"--gpus {gpus}: this machine can run at most {cap} ranks ({why}); use --gpus "
             f"{cap} or fewer, or run the preflight under torchrun/srun across machines")


@dataclass(frozen=True)
class PreflightOptions:
    gpus: Optional[int] = None
    backend: str = "auto"
    dataset_size: Optional[int] = None
    batch_size: Optional[int] = None
    global_batch_size: Optional[int] = None
    drop_last: bool = False
    sampler_drop_last: bool = False
    grad_accum: int = 1
    base_batch: Optional[int] = None
    base_lr: Optional[float] = None
    data_parallel: bool = False
    model: Optional[str] = None
    input_shape: Optional[tuple] = None
    sample: Optional[str] = None
    loss: Optional[str] = None
    optimizer: str = "adamw"
    amp: Optional[str] = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    sync_bn: bool = False
    gpu_memory: Optional[int] = None
    reserve: Optional[int] = None
    safety_margin: float = 0.10
    timeout: float = 120.0
    bandwidth_size: Optional[int] = None
    output_format: str = "text"
    allow_unsandboxed: bool = False  # run even where no OS sandbox can be set up

    @property
    def custom_optimizer(self) -> bool:
        return self.optimizer not in OPTIMIZERS


def check_combinations(opts: PreflightOptions) -> None:
    """Options that need or exclude each other (single values are click's job)."""
    if opts.batch_size is not None and opts.global_batch_size is not None:
        fail("give either --batch-size (per GPU) or --global-batch-size (all GPUs), not both")
    if opts.base_lr is not None and opts.base_batch is None:
        fail("--base-lr needs --base-batch (the global batch that lr was tuned at)")
    model_only = {"input_shape": opts.input_shape, "sample": opts.sample, "loss": opts.loss,
                  "gpu_memory": opts.gpu_memory, "reserve": opts.reserve, "amp": opts.amp}
    flags = {"sync_bn": opts.sync_bn, "find_unused_parameters": opts.find_unused_parameters,
             "gradient_as_bucket_view": opts.gradient_as_bucket_view,
             "static_graph": opts.static_graph}
    if opts.model is None:
        for key, value in {**model_only, **flags}.items():
            if value:
                fail(f"--{key.replace('_', '-')} needs --model MODULE:FACTORY")
        if opts.optimizer != "adamw":
            fail("--optimizer needs --model MODULE:FACTORY")
        return
    if opts.input_shape is None and opts.sample is None:
        fail("--model needs an input: --input-shape C,H,W or --sample MODULE:FN")
    if opts.input_shape is not None and opts.sample is not None:
        fail("give --input-shape or --sample, not both")
    if opts.static_graph and opts.find_unused_parameters:
        # DDP accepts both, but static_graph already handles unused parameters
        fail("--static-graph already handles unused parameters: drop --find-unused-parameters")


@dataclass(frozen=True)
class ModelSpec:
    """What to build and how to train it for the memory step."""

    factory: str
    input_shape: Optional[tuple] = None
    sample: Optional[str] = None
    loss: Optional[str] = None
    optimizer: str = "adamw"
    amp: Optional[str] = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    sync_bn: bool = False


class LaunchSpec(Protocol):
    """What :func:`~ddpcheck.preflight.launch.run_local` reads and fills in a worker's
    spec: a frozen dataclass (:class:`RunSpec`, or script mode's ``ScriptSpec``)."""

    timeout: float  # seconds the whole run may take
    results_dir: Optional[str]  # the progress files (filled by the launcher)
    deadline: float  # time.time() at which the watchdog stops the run (filled)
    launched_by: str  # "ddpcheck" here; "torchrun" / "slurm" when this process is the rank


class WorkerSpec(LaunchSpec, Protocol):
    """What every worker's set-up reads (:func:`ddpcheck.preflight.worker.prepare_process`)."""

    threads: Optional[int]  # torch threads per rank; None: the cores shared out


@dataclass(frozen=True)
class RunSpec:
    """Everything one worker needs (picklable: spawned workers get it too)."""

    backend: str
    device: str
    timeout: float
    bandwidth_bytes: int
    bandwidth_iters: int
    model: Optional[ModelSpec] = None
    gpu_memory: Optional[int] = None
    reserve: Optional[int] = None
    safety_margin: float = 0.10
    batch_size: Optional[int] = None
    results_dir: Optional[str] = None
    deadline: float = 0.0
    launched_by: str = "ddpcheck"  # or "torchrun" / "slurm": this process is the rank
    gather: bool = False  # under a launcher: gather every rank's result on every rank
    threads: Optional[int] = None
    box: Optional[str] = None  # the run's own folder: its writes are not the user's
    redirect: bool = False  # no OS sandbox: redirect Python-level writes into box/scratch


def model_spec(opts: PreflightOptions) -> Optional[ModelSpec]:
    if opts.model is None:
        return None
    return ModelSpec(opts.model, opts.input_shape, opts.sample, opts.loss, opts.optimizer,
                     opts.amp, opts.find_unused_parameters, opts.gradient_as_bucket_view,
                     opts.static_graph, opts.sync_bn)
