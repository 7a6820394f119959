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
    monitor: Any  # a gloo group: monitored_barrier and object collectives
    timeout: float
    deadline: float
    init_seconds: float

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


def init_group(backend: str, device_kind: str, timeout: float, deadline: float) -> Group:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        # before init: NCCL picks the current device (seed 001: set_device first)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    pg_timeout = datetime.timedelta(seconds=max(1.0, timeout))
    start = time.perf_counter()
    dist.init_process_group(backend=backend, init_method="env://", timeout=pg_timeout)
    init_seconds = time.perf_counter() - start
    if backend == "gloo":
        monitor = dist.group.WORLD
    else:
        monitor = dist.new_group(backend="gloo", timeout=pg_timeout)
    return Group(backend, device, dist.get_rank(), dist.get_world_size(), monitor, timeout,
                 deadline, init_seconds)


def close(group: Optional[Group]) -> None:
    if group is None or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:  # a broken group: nothing more to do
        pass


def identity(group: Group) -> dict:
    """Who this process thinks it is, by the launcher's env and by the group."""
    facts = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": {"kind": group.device.type},
    }
    if group.device.type == "cuda":
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        facts["device"].update(index=index, name=props.name,
                               uuid=str(getattr(props, "uuid", "")),
                               pci=f"{getattr(props, 'pci_bus_id', '')}",
                               total_memory=props.total_memory)
    return facts


def agree(group: Group, what: str, ok: bool = True, info: Any = None) -> list:
    """Meet every rank at ``what`` and share ``(ok, info)``.

    ``monitored_barrier`` (gloo) first, so a rank that never arrives is named
    by rank 0 instead of everybody hanging in a collective; then every rank
    gets every rank's vote.
    """
    try:
        dist.monitored_barrier(group=group.monitor,
                               timeout=datetime.timedelta(seconds=group.wait_budget()),
                               wait_all_ranks=True)
        votes: list = [None] * group.world_size
        dist.all_gather_object(votes, {"ok": ok, "info": info}, group=group.monitor)
    except RuntimeError as exc:
        raise PeerLost(f"waiting for every rank at '{what}': {first_line(exc)}") from None
    return votes


def _sync(group: Group) -> None:
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def run_collectives(group: Group) -> list:
    """all_reduce / broadcast / all_gather with values whose result is known exactly."""
    w, r, dev = group.world_size, group.rank, group.device
    out = []

    t = torch.tensor([r + 1], dtype=torch.int64, device=dev)
    start = time.perf_counter()
    dist.all_reduce(t)
    _sync(group)
    expected = w * (w + 1) // 2
    out.append({"name": "all_reduce", "ok": int(t.item()) == expected,
                "expected": expected, "got": int(t.item()),
                "seconds": time.perf_counter() - start})

    v = torch.full((4096,), float(r + 1), dtype=torch.float32, device=dev)
    dist.all_reduce(v)
    bad = int((v != float(expected)).sum().item())
    out.append({"name": "all_reduce (float32 x 4096)", "ok": bad == 0,
                "expected": float(expected), "got": float(v[0].item()), "mismatches": bad})

    src = w - 1
    b = (torch.arange(16, dtype=torch.int64, device=dev) + 1000 * (src + 1)) if r == src \
        else torch.zeros(16, dtype=torch.int64, device=dev)
    dist.broadcast(b, src=src)
    want = list(range(1000 * (src + 1), 1000 * (src + 1) + 16))
    got = [int(x) for x in b.tolist()]
    out.append({"name": f"broadcast from rank {src}", "ok": got == want,
                "expected": want[:3], "got": got[:3]})

    mine = torch.full((3,), r, dtype=torch.int64, device=dev)
    parts = [torch.empty_like(mine) for _ in range(w)]
    dist.all_gather(parts, mine)
    got = [int(p[0].item()) for p in parts]
    out.append({"name": "all_gather", "ok": got == list(range(w)),
                "expected": list(range(w)), "got": got})
    return out


def barrier_check(group: Group) -> dict:
    """``monitored_barrier`` on the gloo group: a missing rank is named."""
    start = time.perf_counter()
    try:
        dist.monitored_barrier(group=group.monitor,
                               timeout=datetime.timedelta(seconds=group.wait_budget()),
                               wait_all_ranks=True)
    except RuntimeError as exc:
        raise PeerLost(f"monitored_barrier: {first_line(exc)}") from None
    return {"ok": True, "seconds": time.perf_counter() - start}


def bandwidth(group: Group, nbytes: int, iters: int) -> Optional[dict]:
    """all_reduce bandwidth for one large float32 tensor (nccl-tests' busbw formula)."""
    w = group.world_size
    if w < 2:
        return None
    numel = max(1, nbytes // 4)
    t = torch.ones(numel, dtype=torch.float32, device=group.device)
    dist.all_reduce(t)  # warm-up: connections, NCCL rings
    _sync(group)
    dist.barrier(group=group.monitor)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    _sync(group)
    seconds = (time.perf_counter() - start) / iters
    algbw = numel * 4 / seconds
    return {"bytes": numel * 4, "iters": iters, "seconds": seconds,
            "algbw": algbw, "busbw": algbw * 2 * (w - 1) / w}
