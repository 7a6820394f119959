"""Per-rank process-group checks, run inside a worker (imports torch).

Every function records facts (what this rank saw); judging them across ranks
happens later in :mod:`ddpcheck.preflight.verdict`, in plain Python.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddpcheck.preflight.results import (
    BandwidthResult,
    CollectiveResult,
    DeviceInfo,
    Identity,
    RankFailure,
)

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


class PeerLost(RuntimeError):
    """A peer did not arrive in time (or died): the group can no longer be used."""


@dataclass
class Group:
    backend: str
    device: torch.device
    rank: int
    world_size: int
    control: Any  # the tool's own gloo group: meeting points, object collectives
    timeout: float
    deadline: float
    init_seconds: float
    progress: Any = None  # ddpcheck.preflight.progress.Progress

    def wait_budget(self) -> float:
        """Seconds a barrier may wait: what is left before the deadline, less a
        margin so this rank can still report before the launcher's watchdog."""
        left = self.deadline - time.time()
        margin = min(5.0, 0.2 * self.timeout)
        return max(1.0, left - margin)


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def init_group(backend: str, device_kind: str, timeout: float, deadline: float,
               progress=None) -> Group:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        # before init: NCCL picks the current device
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    pg_timeout = datetime.timedelta(seconds=max(1.0, timeout))
    start = time.perf_counter()
    dist.init_process_group(backend=backend, init_method="env://", timeout=pg_timeout)
    init_seconds = time.perf_counter() - start
    # The tool's own meeting points never share a group with the user's model:
    # a rank that raised mid-step waits here while its peers sit in DDP's
    # all_reduce on the default group, and neither can be mistaken for the other.
    control = dist.new_group(backend="gloo", timeout=pg_timeout)
    return Group(backend, device, dist.get_rank(), dist.get_world_size(), control, timeout,
                 deadline, init_seconds, progress)


def close(group: Optional[Group]) -> None:
    if group is None or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:  # a broken group: nothing more to do
        pass


def identity(group: Group) -> Identity:
    """Who this process thinks it is, by the launcher's env and by the group."""
    device = DeviceInfo(kind=group.device.type)
    if group.device.type == "cuda":
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        device = DeviceInfo("cuda", index, props.name, str(getattr(props, "uuid", "")),
                            str(getattr(props, "pci_bus_id", "")), int(props.total_memory))
    return Identity(dist.get_rank(), dist.get_world_size(),
                    {k: os.environ.get(k) for k in ENV_KEYS}, socket.gethostname(),
                    os.getpid(), device)


def agree(group: Group, what: str, failure: Optional[RankFailure] = None,
          info: Any = None) -> list:
    """Meet every rank at ``what`` on the tool's own group and share ``(failure, info)``.

    A failure is posted to the progress file first: a peer that can never get
    here is stopped by the launcher's watchdog within seconds. Then a
    ``monitored_barrier`` (so a rank that never arrives is named) and every rank
    gets every rank's vote: ``[{"failure": ..., "info": ...}, ...]``.
    """
    if group.progress is not None:
        group.progress.meet(what, failure)
    try:
        dist.monitored_barrier(group=group.control,
                               timeout=datetime.timedelta(seconds=group.wait_budget()),
                               wait_all_ranks=True)
        votes: list = [None] * group.world_size
        dist.all_gather_object(votes, {"failure": failure, "info": info}, group=group.control)
    except RuntimeError as exc:
        raise PeerLost(f"waiting for every rank at '{what}': {first_line(exc)}") from None
    if group.progress is not None:
        group.progress.stage(f"past '{what}'")
    return votes


def _sync(group: Group) -> None:
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def run_collectives(group: Group) -> list[CollectiveResult]:
    """all_reduce / broadcast / all_gather with values whose result is known exactly."""
    w, r, dev = group.world_size, group.rank, group.device
    out = []

    t = torch.tensor([r + 1], dtype=torch.int64, device=dev)
    start = time.perf_counter()
    dist.all_reduce(t)
    _sync(group)
    expected = w * (w + 1) // 2
    out.append(CollectiveResult("all_reduce", int(t.item()) == expected, expected,
                                int(t.item()), time.perf_counter() - start))

    v = torch.full((4096,), float(r + 1), dtype=torch.float32, device=dev)
    dist.all_reduce(v)
    bad = int((v != float(expected)).sum().item())
    out.append(CollectiveResult("all_reduce (float32 x 4096)", bad == 0, float(expected),
                                float(v[0].item())))

    src = w - 1
    b = (torch.arange(16, dtype=torch.int64, device=dev) + 1000 * (src + 1)) if r == src \
        else torch.zeros(16, dtype=torch.int64, device=dev)
    dist.broadcast(b, src=src)
    want = list(range(1000 * (src + 1), 1000 * (src + 1) + 16))
    got = [int(x) for x in b.tolist()]
    out.append(CollectiveResult(f"broadcast from rank {src}", got == want, want[:3], got[:3]))

    mine = torch.full((3,), r, dtype=torch.int64, device=dev)
    parts = [torch.empty_like(mine) for _ in range(w)]
    dist.all_gather(parts, mine)
    got = [int(p[0].item()) for p in parts]
    out.append(CollectiveResult("all_gather", got == list(range(w)), list(range(w)), got))
    return out


def barrier_check(group: Group) -> bool:
    """``monitored_barrier`` on the tool's gloo group: a missing rank is named."""
    try:
        dist.monitored_barrier(group=group.control,
                               timeout=datetime.timedelta(seconds=group.wait_budget()),
                               wait_all_ranks=True)
    except RuntimeError as exc:
        raise PeerLost(f"monitored_barrier: {first_line(exc)}") from None
    return True


def bandwidth(group: Group, nbytes: int, iters: int) -> Optional[BandwidthResult]:
    """all_reduce bandwidth for one large float32 tensor (nccl-tests' busbw formula)."""
    w = group.world_size
    if w < 2:
        return None
    numel = max(1, nbytes // 4)
    t = torch.ones(numel, dtype=torch.float32, device=group.device)
    dist.all_reduce(t)  # warm-up: connections, NCCL rings
    _sync(group)
    dist.barrier(group=group.control)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    _sync(group)
    seconds = (time.perf_counter() - start) / iters
    algbw = numel * 4 / seconds
    return BandwidthResult(numel * 4, iters, seconds, algbw, algbw * 2 * (w - 1) / w)
