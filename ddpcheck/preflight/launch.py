"""Start the preflight workers on torch's own elastic launcher.

:func:`run_local` starts ``nproc`` workers with
``torch.distributed.launcher.api.elastic_launch`` (c10d rendezvous on
``localhost:0``: a free port every time, ``max_restarts=0``). Workers are
forked from this process, which has imported torch but never touched CUDA, so
they do not import torch again (that is most of torchrun's start-up). The
progress protocol (:mod:`progress`) and the watchdog (:mod:`watchdog`) name a
rank that fails, crashes or hangs with the stage it was in; :mod:`forensics`
reads where from its log. The result is one
:class:`~ddpcheck.preflight.results.RankResult` per rank. Script mode
(``ddpcheck preflight -- train.py``) starts its ranks through the same
:func:`run_local`, with its own entry point.

Launcher detection lives in :mod:`envdetect`, GPU counting in :mod:`gpus`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from ddpcheck.preflight import forensics
from ddpcheck.preflight.options import LaunchSpec
from ddpcheck.preflight.progress import read_records
from ddpcheck.preflight.results import RankResult, RankStatus
from ddpcheck.preflight.watchdog import StopReason, Watchdog


@dataclass
class LaunchOutcome:
    ranks: list[RankResult] = field(default_factory=list)
    elapsed: float = 0.0
    start_method: str = "fork"
    stop_reason: StopReason = StopReason.NONE
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


@contextlib.contextmanager
def _launcher_state_restored():
    """Put back what torch's launcher changes in this process (signal handlers,
    TORCHELASTIC_SIGNALS_TO_HANDLE, the torch loggers silenced here) and leave no
    child of ours running."""
    saved_signals = {sig: signal.getsignal(sig) for sig in
                     (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    silenced = _quiet_torch_loggers()
    try:
        yield
    finally:
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


def run_local(nproc: int, spec: LaunchSpec, start_method: str = "fork",
              grace: float = 3.0, entrypoint: Optional[Callable] = None,
              workdir: Optional[str] = None, deadline: Optional[float] = None) -> LaunchOutcome:
    """Run ``entrypoint(spec)`` on ``nproc`` local workers: the factory worker
    (:func:`ddpcheck.preflight.worker.run_rank`, the default) or script mode's rank.

    ``spec`` is a frozen dataclass with the fields of :class:`LaunchSpec`; the
    launcher fills ``results_dir``, ``deadline`` and ``launched_by`` with
    :func:`dataclasses.replace` and hands the copy to every worker.
    ``workdir``: the folder for the progress files and the workers' logs (the
    sandbox's box, where the supervisor reads them; a new private temp folder when
    None); ``deadline``: ``time.time()`` at which the ranks are stopped (default:
    now + ``spec.timeout``).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from ddpcheck.preflight.worker import run_rank

    start = time.time()
    deadline = deadline if deadline is not None else start + spec.timeout
    if start >= deadline:
        # --timeout ended during the start-up (sandbox, torch, the user's modules): a
        # worker started now would run past it, so none is started
        return LaunchOutcome(
            ranks=[RankResult(rank, RankStatus.NOT_STARTED, stage="not started")
                   for rank in range(nproc)],
            start_method=start_method, stop_reason=StopReason.DEADLINE)
    own_workdir = workdir is None
    if own_workdir:
        workdir = tempfile.mkdtemp(prefix="ddpcheck-preflight-")
    results_dir = os.path.join(workdir, "results")
    log_dir = os.path.join(workdir, "logs")
    os.makedirs(results_dir, exist_ok=True)
    spec = dataclasses.replace(spec, results_dir=results_dir, deadline=deadline,
                               launched_by="ddpcheck")
    outcome = LaunchOutcome(start_method=start_method)
    config = _launch_config(nproc, start_method, log_dir, max(1.0, deadline - start))
    failures: dict = {}
    with _launcher_state_restored():
        watchdog = Watchdog(results_dir, log_dir, nproc, deadline, grace)
        watchdog.start()
        try:
            with _real_std_streams():
                elastic_launch(config, entrypoint or run_rank)(spec)
        except ChildFailedError as exc:
            failures = dict(exc.failures)
        except (KeyboardInterrupt, SignalException):
            # the watchdog's own stop of an agent left waiting by workers that are all
            # gone is not the user's interrupt
            outcome.interrupted = not watchdog.agent_interrupted
        except Exception as exc:  # rendezvous errors, ...
            outcome.launcher_error = f"{type(exc).__name__}: {exc}"
        finally:
            watchdog.stop.set()
            watchdog.join()
    outcome.elapsed = time.time() - start
    outcome.stop_reason = watchdog.reason
    outcome.ranks = _rank_results(nproc, results_dir, log_dir, watchdog, failures, outcome)
    if any(not r.ok for r in outcome.ranks):
        outcome.log_dir = log_dir  # kept: the full story of what went wrong
        if own_workdir:
            shutil.rmtree(results_dir, ignore_errors=True)
    elif own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def _launch_config(nproc: int, start_method: str, log_dir: str, seconds_left: float):
    """torch's elastic launcher, one node, no restarts, every worker's output in its log."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"ddpcheck-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"timeout": max(30, int(seconds_left))},
        max_restarts=0,
        monitor_interval=0.02,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL),
        shutdown_timeout=3,
    )


def _rank_results(nproc, results_dir, log_dir, watchdog: Watchdog, failures: dict,
                  outcome: LaunchOutcome) -> list[RankResult]:
    records = read_records(results_dir)
    out = []
    now = time.time()
    readings = {}
    for rank in range(nproc):
        if rank in watchdog.alone:
            readings[rank] = watchdog.alone[rank]
        else:
            readings[rank] = forensics.read_stack(forensics.stderr_lines(log_dir, rank))
    waited = _waiting_ranks(nproc, records, watchdog, readings)
    for rank in range(nproc):
        rec = records.get(rank)
        if rec is not None and rec.final and rec.result is not None:
            out.append(rec.result)
            continue
        res = RankResult(rank)
        if rec is not None:
            res.stage, res.pid = rec.stage, rec.pid
            res.stage_age = max(0.0, now - rec.since)
            res.failure = rec.failure  # posted before it was stopped
        fail = failures.get(rank)
        if rank in watchdog.alone:
            res.status = RankStatus.HUNG
        elif rank in waited:
            res.status = RankStatus.WAITING
        elif rank in watchdog.killed:
            res.status = RankStatus.HUNG if watchdog.reason == StopReason.DEADLINE \
                else RankStatus.STOPPED
        elif fail is not None and watchdog.reason == StopReason.DEADLINE \
                and fail.exitcode == -signal.SIGKILL:
            res.status = RankStatus.HUNG  # killed at the deadline before it said who it was
        elif fail is not None:
            res.status = RankStatus.CRASHED
            res.exitcode = fail.exitcode
            res.exit_text = forensics.describe_exit(fail.exitcode)
        elif rank in watchdog.gone and not (failures or outcome.interrupted):
            # torch's agent lists only non-zero exits, and stops the other workers when
            # one fails; with no failure listed, this one left on its own with code 0
            res.status = RankStatus.CRASHED
            res.exitcode = 0
            res.exit_text = "its process exited with code 0 before it finished (os._exit?)"
        elif failures or outcome.interrupted or outcome.launcher_error:
            res.status = RankStatus.STOPPED
        else:
            res.status = RankStatus.HUNG
        if res.failure is not None and res.status in (RankStatus.STOPPED, RankStatus.HUNG,
                                                       RankStatus.WAITING):
            res.status = RankStatus.FAILED  # it raised first; the stop only followed
        reading = readings.get(rank)
        if res.status == RankStatus.CRASHED:
            res.last_words = forensics.summarize_stderr(forensics.stderr_lines(log_dir, rank))
        elif reading is not None:
            res.stuck_at, res.collective = reading.frame, reading.collective
        out.append(res)
    return out


def _waiting_ranks(nproc: int, records: dict, watchdog: Watchdog, readings: dict) -> set:
    """Ranks the watchdog killed while they waited for a peer: at one of the tool's
    meeting points, or blocked in a collective, while some other rank was not
    waiting (it had ended, crashed, finished, or was busy elsewhere). When every
    unfinished rank waits in a collective, none of them is the one being waited
    for: they are all hung."""
    killed = set(watchdog.killed) - set(watchdog.alone)
    waiting = {rank for rank in killed if rank in watchdog.waiting
               or (readings.get(rank) is not None and readings[rank].waits_for_peers)}
    others = [rank for rank in range(nproc) if rank not in waiting]
    return waiting if others else set()
