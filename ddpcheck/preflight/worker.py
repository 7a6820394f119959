"""One preflight rank: process group, collectives, bandwidth, memory.

:func:`run_rank` never raises: whatever happens is written into the result
(and into this rank's progress file, so the launcher can name the stage a
rank died or hung in).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from typing import Optional

from ddpcheck.preflight.launch import write_record


class Progress:
    """This rank's progress file: the stage it is in, since when, and its pid."""

    def __init__(self, results_dir: Optional[str], rank: int):
        self.results_dir = results_dir
        self.rank = rank
        self.current = "starting the worker process"

    def stage(self, name: str) -> None:
        self.current = name
        write_record(self.results_dir, self.rank,
                     {"rank": self.rank, "pid": os.getpid(), "stage": name,
                      "since": time.time(), "final": False})

    def final(self, result: dict) -> None:
        write_record(self.results_dir, self.rank,
                     {"rank": self.rank, "pid": os.getpid(), "stage": "done",
                      "since": time.time(), "final": True, "result": result})


def _prepare_process(spec: dict, local_world: int) -> None:
    if spec.get("launched_by") == "ddpcheck":
        # A forked worker inherits the launcher's handlers, which raise an
        # exception in Python code; the default action stops it even while it
        # sits in a C++ collective.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    try:  # a segfault then leaves Python's stack in this rank's log
        faulthandler.enable(file=sys.__stderr__ or sys.stderr)
        if spec.get("launched_by") == "ddpcheck":
            # the launcher's watchdog sends SIGUSR1 before it kills a hung rank
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or sys.stderr,
                                  all_threads=True)
    except (AttributeError, OSError, ValueError):
        pass
    import torch

    threads = spec.get("threads") or max(1, (os.cpu_count() or 1) // max(1, local_world))
    torch.set_num_threads(threads)


def _user_error(exc: BaseException, stage: str) -> dict:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    from ddpcheck.preflight.collectives import first_line

    return {"stage": stage, "type": type(exc).__name__, "message": first_line(exc),
            "where": where}


def run_rank(spec: dict) -> dict:
    """The per-rank entry point (a plain module-level function: spawn can pickle it)."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    progress = Progress(spec.get("results_dir"), rank)
    progress.stage("starting the worker process")
    result: dict = {"rank": rank, "world_size": world,
                    "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid()}
    group = None
    try:
        _prepare_process(spec, local_world)
        import torch.distributed as dist

        from ddpcheck.preflight import collectives

        if spec.get("model"):
            # names of unused parameters in DDP's error; DETAIL wraps the group
            # in checks that segfault on some CPU builds (torch 2.13)
            dist.set_debug_level(dist.DebugLevel.INFO)
        progress.stage("init_process_group")
        group = collectives.init_group(spec["backend"], spec["device"], spec["timeout"],
                                       spec["deadline"])
        result["init_seconds"] = group.init_seconds
        progress.stage("checking rank / world size / device")
        result["identity"] = collectives.identity(group)
        votes = collectives.agree(group, "identity", info=result["identity"])
        if rank == 0:
            result["peers"] = [v["info"] for v in votes]
        progress.stage("all_reduce / broadcast / all_gather")
        result["collectives"] = collectives.run_collectives(group)
        progress.stage("monitored_barrier")
        result["barrier"] = collectives.barrier_check(group)
        progress.stage("all_reduce bandwidth")
        result["bandwidth"] = collectives.bandwidth(group, spec["bandwidth_bytes"],
                                                    spec["bandwidth_iters"])
        if spec.get("model"):
            from ddpcheck.preflight import memory

            result["memory"] = memory.run(spec, group, progress)
        if spec.get("gather"):
            progress.stage("gathering results")
            votes = collectives.agree(group, "gathering results", info=result)
            result["all"] = [v["info"] for v in votes]
    except Exception as exc:
        name = type(exc).__name__
        if name == "PeerLost":
            result["aborted"] = {"stage": progress.current, "message": str(exc)}
        else:
            result["error"] = _user_error(exc, progress.current)
    finally:
        if group is not None:
            from ddpcheck.preflight import collectives

            collectives.close(group)
    progress.final(result)
    return result
