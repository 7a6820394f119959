"""One preflight rank: process group, collectives, bandwidth, memory.

:func:`run_rank` never raises: whatever happens is recorded in its
:class:`~ddpcheck.preflight.results.RankResult` (and in this rank's progress
file, so the launcher can name the stage a rank failed, died or hung in).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Optional

from ddpcheck.preflight.options import RunSpec, WorkerSpec
from ddpcheck.preflight.progress import Progress
from ddpcheck.preflight.results import (
    FailureKind,
    RankResult,
    RankStatus,
    failure_from_exception,
)


def prepare_process(spec: WorkerSpec, local_world: int) -> None:
    """What every preflight worker does first (factory and script ranks): default
    signal actions in forked workers, stack dumps on SIGUSR1, a share of the cores.
    ``spec``: :class:`RunSpec` or script mode's spec (``launched_by``, ``threads``)."""
    if spec.launched_by == "ddpcheck":
        # A forked worker inherits the launcher's handlers, which raise an
        # exception in Python code; the default action stops it even while it
        # sits in a C++ collective.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if getattr(spec, "redirect", False):
            # no PID namespace around the run: die with the launcher, whatever kills it
            try:
                import ctypes

                ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass
    try:  # a segfault then leaves Python's stack in this rank's log
        faulthandler.enable(file=sys.__stderr__ or sys.stderr)
        if spec.launched_by == "ddpcheck":
            # the launcher's watchdog sends SIGUSR1 to see where a rank waits
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or sys.stderr,
                                  all_threads=True)
    except (AttributeError, OSError, ValueError):
        pass
    import torch

    threads = spec.threads or max(1, (os.cpu_count() or 1) // max(1, local_world))
    torch.set_num_threads(threads)


def user_line() -> str:
    """``file:line`` of the innermost frame of the user's code on this thread's stack
    (the model factory, the sample or loss function), else ""."""
    from ddpcheck.preflight.forensics import Frame

    frame = sys._getframe(1)
    while frame is not None:
        here = Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        if not frame.f_code.co_filename.startswith("<") and here.is_user:
            return str(here).rsplit(" in ", 1)[0]
        frame = frame.f_back
    return ""


def watch_writes(spec: RunSpec):
    """Record the writes of the user's code in this rank (and, without an OS sandbox,
    redirect them into the run's scratch folder). Returns the undo."""
    import torch

    from ddpcheck.preflight.writes import WriteRecorder

    scratch_dir = os.path.join(spec.box, "scratch") if spec.box else None
    scratch = None
    if spec.redirect and scratch_dir:
        from ddpcheck.preflight.script.scratch import Scratch

        scratch = Scratch(scratch_dir, [os.getcwd()], user_line)
        scratch.install(torch)
    # the preflight's own files (progress records, logs) are not the user's writes
    spill = None
    if spec.box:
        os.makedirs(os.path.join(spec.box, "writes"), exist_ok=True)
        spill = os.path.join(spec.box, "writes", f"rank{os.environ.get('RANK', '0')}."
                                                 f"{os.getpid()}.jsonl")
    recorder = WriteRecorder(user_line, own=(spec.box or "", spec.results_dir or ""),
                             spill=spill)
    recorder.install(torch)

    def undo() -> list:
        from ddpcheck.preflight.writes import Write

        recorder.uninstall()
        if scratch is not None:
            scratch.uninstall()
        out = [Write(w.path, w.kind, where=w.where, count=w.count)
               for w in (scratch.writes if scratch is not None else [])]
        seen = {(w.kind, w.path) for w in out}
        return out + [w for w in recorder.collect() if (w.kind, w.path) not in seen]

    return undo


def run_rank(spec: RunSpec) -> dict:
    """The per-rank entry point (a plain module-level function: spawn can pickle it).
    Returns the result as json (elastic_launch hands return values back by pickle)."""
    from ddpcheck.preflight.results import to_json_dict

    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    progress = Progress(spec.results_dir, rank)
    progress.stage("starting the worker process")
    result = RankResult(rank, pid=os.getpid())
    group = None
    unwatch = None
    try:
        prepare_process(spec, local_world)
        unwatch = watch_writes(spec)
        import torch.distributed as dist

        from ddpcheck.preflight import collectives

        if spec.model is not None:
            # names of unused parameters in DDP's error; DETAIL wraps the group
            # in checks that segfault on some CPU builds (torch 2.13)
            dist.set_debug_level(dist.DebugLevel.INFO)
        progress.stage("init_process_group")
        group = collectives.init_group(spec.backend, spec.device, spec.timeout, spec.deadline,
                                       progress)
        result.init_seconds = group.init_seconds
        progress.stage("checking rank / world size / device")
        result.identity = collectives.identity(group)
        votes = collectives.agree(group, "identity", info=result.identity)
        if rank == 0:
            result.peers = [v["info"] for v in votes]
        progress.stage("all_reduce / broadcast / all_gather")
        result.collectives = collectives.run_collectives(group)
        progress.stage("monitored_barrier")
        result.barrier_ok = collectives.barrier_check(group)
        progress.stage("all_reduce bandwidth")
        result.bandwidth = collectives.bandwidth(group, spec.bandwidth_bytes,
                                                 spec.bandwidth_iters)
        if spec.model is not None:
            from ddpcheck.preflight import memory

            result.memory = memory.run(spec, group, progress)
        result.status = RankStatus.OK
        result.stage = "done"
        if spec.gather:
            progress.stage("gathering results")
            votes = collectives.agree(group, "gathering results", info=result)
            result.everyone = [v["info"] for v in votes]
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        # KeyboardInterrupt / SystemExit here come from the user's code (a real Ctrl-C
        # kills a worker: its SIGINT is the default action): a failure to report, not a
        # way out that torch's worker wrapper would turn into a silent exit 0
        from ddpcheck.preflight.collectives import PeerLost

        kind = FailureKind.PEER_LOST if isinstance(exc, PeerLost) else FailureKind.ERROR
        result.failure = failure_from_exception(exc, progress.current, kind)
        result.status = RankStatus.FAILED
        result.stage = progress.current
    finally:
        if unwatch is not None:
            result.writes = unwatch()
        if group is not None:
            from ddpcheck.preflight import collectives

            collectives.close(group)
    progress.final(result)
    return to_json_dict(result)


def run_in_this_process(spec: RunSpec) -> Optional[RankResult]:
    """Under torchrun / srun: this process is the rank."""
    from ddpcheck.preflight.results import result_from_dict

    return result_from_dict(run_rank(spec))
