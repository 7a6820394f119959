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
    try:
        prepare_process(spec, local_world)
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
    except Exception as exc:
        from ddpcheck.preflight.collectives import PeerLost

        kind = FailureKind.PEER_LOST if isinstance(exc, PeerLost) else FailureKind.ERROR
        result.failure = failure_from_exception(exc, progress.current, kind)
        result.status = RankStatus.FAILED
        result.stage = progress.current
    finally:
        if group is not None:
            from ddpcheck.preflight import collectives

            collectives.close(group)
    progress.final(result)
    return to_json_dict(result)


def run_in_this_process(spec: RunSpec) -> Optional[RankResult]:
    """Under torchrun / srun: this process is the rank."""
    from ddpcheck.preflight.results import result_from_dict

    return result_from_dict(run_rank(spec))
