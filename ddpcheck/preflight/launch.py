"""Start the preflight workers on torch's own elastic launcher, or act as one.

* Not launched yet: :func:`run_local` starts ``nproc`` workers with
  ``torch.distributed.launcher.api.elastic_launch`` (c10d rendezvous on
  ``localhost:0``: a free port every time, ``max_restarts=0``). Workers are
  forked from this process, which has imported torch but never touched CUDA,
  so they do not import torch again (that is most of torchrun's start-up).
  Every worker writes its progress and result to a file, so a rank that
  crashes or hangs is named with the stage it was in, and a watchdog kills
  whatever is left at ``--timeout``.
* Already inside a launched job (torchrun's RANK / WORLD_SIZE / LOCAL_RANK,
  or srun's SLURM_PROCID with MASTER_ADDR/PORT set): :func:`detect_launched`
  says so and the command runs the worker in this very process, so
  multi-node runs use the user's own launcher.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Optional

PROGRESS_NAME = "rank{rank}.json"


class LaunchEnvError(ValueError):
    """The environment looks half-launched (a usage error)."""


# -- already launched? ---------------------------------------------------------


@dataclass(frozen=True)
class LaunchedEnv:
    launcher: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    def export(self, environ=None) -> None:
        """Make the env:// variables torch reads agree with the launcher's."""
        env = os.environ if environ is None else environ
        env["RANK"] = str(self.rank)
        env["WORLD_SIZE"] = str(self.world_size)
        env["LOCAL_RANK"] = str(self.local_rank)
        env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)


def _int_env(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchEnvError(f"{key}={env[key]!r} is not an integer") from None


def _first_int(text: Optional[str]) -> Optional[int]:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def detect_launched(environ: Optional[Mapping[str, str]] = None) -> Optional[LaunchedEnv]:
    """The launcher's view of this process, or None when nothing launched it."""
    env = os.environ if environ is None else environ
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    present = [k for k in keys if k in env]
    if present:
        missing = [k for k in keys if k not in env]
        if missing:
            raise LaunchEnvError(
                f"{', '.join(present)} set but {', '.join(missing)} not: start with torchrun "
                f"(which sets all three) or unset them to let ddpcheck launch the workers")
        rank, world, local = (_int_env(env, k) for k in keys)
        local_world = _int_env(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        if not 0 <= rank < world:
            raise LaunchEnvError(f"RANK={rank} is outside WORLD_SIZE={world}")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise LaunchEnvError(f"RANK/WORLD_SIZE are set but {key} is not: env:// "
                                     f"initialisation needs MASTER_ADDR and MASTER_PORT")
        return LaunchedEnv("torchrun", rank, world, local, local_world)
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        world = _first_int(env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")) or 1
        if world <= 1:
            return None
        rank = _int_env(env, "SLURM_PROCID")
        local = _first_int(env.get("SLURM_LOCALID")) or 0
        local_world = (_first_int(env.get("SLURM_NTASKS_PER_NODE"))
                       or _first_int(env.get("SLURM_TASKS_PER_NODE")) or world)
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise LaunchEnvError(
                    f"running as SLURM task {rank} of {world} but {key} is not set: export "
                    f"MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) "
                    f"and MASTER_PORT=29500 before srun")
        return LaunchedEnv("slurm", rank, world, local, local_world)
    return None


# -- GPUs without poisoning fork -------------------------------------------------


def visible_gpus() -> tuple[int, bool]:
    """``(CUDA devices visible, fork still safe)``.

    Counts through NVML first, which does not initialise CUDA; only when NVML is
    unavailable does it ask the CUDA runtime, after which forked workers could
    not use CUDA, so the caller must spawn them instead.
    """
    import torch

    if not hasattr(torch._C, "_cuda_getDeviceCount"):
        return 0, True
    nvml = getattr(torch.cuda, "_device_count_nvml", None)
    if nvml is not None:
        try:
            count = nvml()
        except Exception:  # pragma: no cover - depends on the driver
            count = -1
        if count >= 0:
            return count, True
    return torch.cuda.device_count(), False


# -- per-rank progress files -------------------------------------------------------


def write_record(results_dir: Optional[str], rank: int, record: dict) -> None:
    """Atomically replace this rank's progress file (a no-op without a directory)."""
    if not results_dir:
        return
    path = os.path.join(results_dir, PROGRESS_NAME.format(rank=rank))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh, default=str)
    os.replace(tmp, path)


def read_records(results_dir: str) -> dict[int, dict]:
    out = {}
    for path in glob.glob(os.path.join(results_dir, "rank*.json")):
        match = re.search(r"rank(\d+)\.json$", path)
        if not match:
            continue
        try:
            with open(path) as fh:
                out[int(match.group(1))] = json.load(fh)
        except (OSError, ValueError):  # being replaced right now: next poll
            continue
    return out


# -- launching ---------------------------------------------------------------------


@dataclass
class RankOutcome:
    rank: int
    record: Optional[dict] = None  # last progress record the rank wrote
    exitcode: Optional[int] = None
    crashed: bool = False  # died on its own (signal, os._exit, interpreter abort)
    hung: bool = False  # killed by the watchdog: no result by the deadline
    stopped: bool = False  # stopped by the launcher because another rank failed
    stderr_tail: str = ""

    @property
    def result(self) -> Optional[dict]:
        if self.record and self.record.get("final"):
            return self.record.get("result")
        return None

    @property
    def stage(self) -> str:
        return (self.record or {}).get("stage", "starting the worker process")

    @property
    def stage_age(self) -> Optional[float]:
        since = (self.record or {}).get("since")
        return None if since is None else max(0.0, time.time() - since)


@dataclass
class LaunchOutcome:
    ranks: list = field(default_factory=list)
    elapsed: float = 0.0
    start_method: str = "fork"
    timed_out: bool = False
    interrupted: bool = False
    launcher_error: Optional[str] = None
    log_dir: Optional[str] = None  # the workers' logs, kept when something failed


def _quiet_torch_loggers() -> list:
    """Silence torchelastic's own logging for the launch (we report ourselves)."""
    silenced = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith(("torch.distributed", "torch.multiprocessing")) and \
                isinstance(logger, logging.Logger) and not logger.disabled:
            logger.disabled = True
            silenced.append(logger)
    return silenced


def _signal_name(exitcode: Optional[int]) -> str:
    if exitcode is None or exitcode >= 0:
        return ""
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _stderr_lines(log_dir: str, local_rank: int) -> list:
    paths = glob.glob(os.path.join(log_dir, "**", "attempt_*", str(local_rank), "stderr.log"),
                      recursive=True)
    for path in paths:
        try:
            with open(path, errors="replace") as fh:
                return [ln.rstrip() for ln in fh.read().splitlines() if ln.strip()]
        except OSError:
            continue
    return []


def stuck_at(text: list) -> str:
    """Where a hung rank was, from the stack faulthandler dumped on SIGUSR1: the
    innermost frame of the user's code, else the innermost frame."""
    starts = [i for i, ln in enumerate(text) if ln.startswith("Current thread")]
    if not starts:
        return ""
    frames = []
    for line in text[starts[-1] + 1:]:
        line = line.strip()
        if not line.startswith("File "):
            break
        frames.append(line)
    mine = [f for f in frames
            if "site-packages" not in f and f"{os.sep}ddpcheck{os.sep}preflight{os.sep}" not in f
            and "<frozen" not in f and "/lib/python" not in f]
    return (mine or frames or [""])[0]


def summarize_stderr(text: list, lines: int = 3) -> str:
    """What a dead rank said last, in one line: Python's fatal-error line and the
    innermost frame faulthandler printed, else its last lines."""
    for i, line in enumerate(text):
        if line.startswith("Fatal Python error"):
            frame = next((ln.strip() for ln in text[i + 1:] if ln.strip().startswith("File ")),
                         "")
            return f"{line.strip()}" + (f" at {frame}" if frame else "")
    # skip torch's own log lines; keep what the rank said last
    kept = [ln for ln in text if not ln.startswith(("[W", "[I", "Extension modules"))] or text
    return " | ".join(ln.strip() for ln in kept[-lines:])


class _Watchdog(threading.Thread):
    """Kills ranks that have no result at the deadline, or shortly after a peer
    gave up on them (a monitored_barrier named them missing)."""

    def __init__(self, results_dir: str, nproc: int, deadline: float, grace: float):
        super().__init__(name="ddpcheck-preflight-watchdog", daemon=True)
        self.results_dir = results_dir
        self.nproc = nproc
        self.deadline = deadline
        self.grace = grace
        self.stop = threading.Event()
        self.killed: dict[int, int] = {}  # rank -> pid
        self.fired_at_deadline = False

    def run(self) -> None:
        first_final = None
        while not self.stop.wait(0.05):
            records = read_records(self.results_dir)
            finals = {r for r, rec in records.items() if rec.get("final")}
            now = time.time()
            if finals and first_final is None:
                first_final = now
            if len(finals) == self.nproc:
                return
            late = first_final is not None and now - first_final > self.grace
            if now >= self.deadline or late:
                self.fired_at_deadline = now >= self.deadline
                doomed = {rank: (records.get(rank) or {}).get("pid")
                           for rank in range(self.nproc) if rank not in finals}
                # SIGUSR1 first: the worker's faulthandler writes every thread's
                # stack to its log, so the report can say where it was stuck
                for pid in doomed.values():
                    if pid:
                        self._signal(pid, signal.SIGUSR1)
                time.sleep(0.5)
                for rank, pid in doomed.items():
                    if pid and self._signal(pid, signal.SIGKILL):
                        self.killed[rank] = pid
                if len(self.killed) + len(finals) < self.nproc:
                    # a rank that never wrote its pid: kill every worker child
                    for child in multiprocessing.active_children():
                        self._signal(child.pid, signal.SIGKILL)
                return

    @staticmethod
    def _signal(pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False


@contextlib.contextmanager
def _real_std_streams():
    """torchelastic redirects a worker's stdout/stderr at the fd level through
    ``sys.stdout.fileno()``; under click's CliRunner, Jupyter or pytest capture
    that is not a real file, so hand the launch the process's real streams."""
    saved = sys.stdout, sys.stderr
    try:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            try:
                stream.fileno()
            except (AttributeError, OSError, ValueError):
                real = getattr(sys, f"__{name}__", None)
                setattr(sys, name, real if real is not None else open(os.devnull, "w"))
        yield
    finally:
        sys.stdout, sys.stderr = saved


def run_local(nproc: int, spec: dict, timeout: float, start_method: str = "fork",
              grace: float = 3.0, entrypoint=None) -> LaunchOutcome:
    """Run ``entrypoint(spec)`` (default :func:`ddpcheck.preflight.worker.run_rank`) on
    ``nproc`` local workers."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddpcheck.preflight.worker import run_rank

    workdir = tempfile.mkdtemp(prefix="ddpcheck-preflight-")
    results_dir = os.path.join(workdir, "results")
    log_dir = os.path.join(workdir, "logs")
    os.makedirs(results_dir)
    start = time.time()
    spec = dict(spec, results_dir=results_dir, deadline=start + timeout, launched_by="ddpcheck")
    outcome = LaunchOutcome(start_method=start_method)

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"ddpcheck-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"timeout": max(30, int(timeout))},
        max_restarts=0,
        monitor_interval=0.02,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL),
        shutdown_timeout=3,
    )
    saved_signals = {sig: signal.getsignal(sig) for sig in
                     (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    silenced = _quiet_torch_loggers()
    watchdog = _Watchdog(results_dir, nproc, start + timeout, grace)
    watchdog.start()
    failures: dict = {}
    try:
        with _real_std_streams():
            elastic_launch(config, entrypoint or run_rank)(spec)
    except ChildFailedError as exc:
        failures = dict(exc.failures)
    except KeyboardInterrupt:
        outcome.interrupted = True
    except Exception as exc:  # SignalException, rendezvous errors, ...
        if type(exc).__name__ == "SignalException":
            outcome.interrupted = True
        else:
            outcome.launcher_error = f"{type(exc).__name__}: {exc}"
    finally:
        watchdog.stop.set()
        watchdog.join()
        for logger in silenced:
            logger.disabled = False
        for sig, handler in saved_signals.items():
            if handler is not None:
                signal.signal(sig, handler)
        if saved_env is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
        # nothing of ours may outlive the preflight
        for child in multiprocessing.active_children():
            child.kill()
            child.join(5)
    outcome.elapsed = time.time() - start
    outcome.timed_out = watchdog.fired_at_deadline

    records = read_records(results_dir)
    failed_ranks = set(failures)
    for rank in range(nproc):
        ro = RankOutcome(rank, records.get(rank))
        fail = failures.get(rank)
        if ro.result is not None:
            pass
        elif rank in watchdog.killed:
            ro.hung = True
        elif fail is not None:
            ro.crashed = True
            ro.exitcode = fail.exitcode
        elif failed_ranks:
            ro.stopped = True
        elif outcome.interrupted or outcome.launcher_error:
            ro.stopped = True
        else:
            ro.hung = True
        if ro.result is None:
            text = _stderr_lines(log_dir, rank)
            ro.stderr_tail = stuck_at(text) if ro.hung else summarize_stderr(text)
        outcome.ranks.append(ro)
    if any(ro.result is None or ro.result.get("error") for ro in outcome.ranks):
        outcome.log_dir = log_dir  # kept: the full story of what went wrong
        shutil.rmtree(results_dir, ignore_errors=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def describe_exit(exitcode: Optional[int]) -> str:
    name = _signal_name(exitcode)
    if name:
        return f"killed by {name}"
    return f"exit code {exitcode}" if exitcode is not None else "died"
