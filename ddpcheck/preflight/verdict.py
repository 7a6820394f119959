"""Judge what the ranks did: check rows for failures and the process group
(pure Python, no torch).

Input is one :class:`~ddpcheck.preflight.results.RankResult` per rank, so
every verdict can be unit-tested with made-up ranks (two ranks on one GPU, a
wrong all_reduce, a rank stuck in a collective nobody else calls, an NCCL
bandwidth far below its link, ...). Memory is judged in :mod:`memverdict`.
"""

from __future__ import annotations

import os
from typing import Optional

from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId
from ddpcheck.preflight.results import FailureKind, RankResult, RankStatus
from ddpcheck.preflight.units import format_bytes

# all_reduce bus bandwidth, nccl-tests' formula, as published for common links;
# a reference to read the figure against, not a pass mark
NCCL_REFERENCE = ("for reference, NCCL all_reduce bus bandwidth is typically ~10-25 GB/s "
                  "over PCIe 4.0 and ~150-450 GB/s over NVLink (nccl-tests)")
NCCL_TOO_SLOW = 5e9  # below PCIe 3.0 x16: NCCL is not using the GPUs' link


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def seconds_text(value: Optional[float]) -> str:
    if value is None:
        return "?"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _where(r: RankResult) -> str:
    if r.collective:
        return f"in {r.collective}() called from {r.stuck_at}"
    return f"at {r.stuck_at}" if r.stuck_at else f"while {r.stage}"


def _meeting(stage: str) -> str:
    """``waiting for every rank at 'model built'`` -> ``'model built'``."""
    return stage.split(" at ", 1)[1] if stage.startswith("waiting for every rank at ") else ""


# -- what happened to the ranks ------------------------------------------------------------


def failure_checks(results: list[RankResult], timeout: float,
                   log_dir: Optional[str] = None) -> list[Check]:
    logs = f"; every rank's full log: {log_dir}" if log_dir else ""
    unstarted = [r.rank for r in results if r.status == RankStatus.NOT_STARTED]
    if unstarted:
        return [not_started_check(unstarted, timeout)]
    failed = [r for r in results if r.status == RankStatus.FAILED and r.failure is not None
              and r.failure.kind != FailureKind.PEER_LOST]
    lost = [r for r in results if r.status == RankStatus.FAILED and r.failure is not None
            and r.failure.kind == FailureKind.PEER_LOST]
    crashed = [r for r in results if r.status == RankStatus.CRASHED]
    hung = [r for r in results if r.status == RankStatus.HUNG]
    # stopped because another rank failed or ended, or waiting for it: not the cause
    stopped = [r for r in results if r.status in (RankStatus.STOPPED, RankStatus.WAITING)]

    out = _raised_checks(failed, stopped + hung, results, logs)
    if failed:
        hung = [h for h in hung if h.collective]  # the rest only waited for the failed rank
        stopped = []
    out += _crash_checks(crashed, stopped, logs)
    alone = [r for r in hung if r.collective]
    out += _alone_checks(alone, results, logs)
    hung = [r for r in hung if not r.collective]
    if _all_hung_alike(hung, results):
        out.append(_all_hung_check(hung, results, timeout, logs))
        hung = []
    out += _hung_checks(hung, results, timeout, logs)

    if lost and not (failed or crashed or alone or hung):
        for r in lost:
            out.append(Check(
                CheckId.RANK_FAILED, FAIL,
                f"rank {r.rank} stopped while {r.failure.stage}: {r.failure.message}",
                "a peer never arrived: see the other ranks' rows and logs" + logs, rank=r.rank))
    if stopped and not (failed or crashed or alone or hung):
        out.append(Check(
            CheckId.WORKERS_STOPPED, FAIL,
            f"{ranks_text([r.rank for r in stopped])} were stopped before they finished",
            "rerun; if it repeats, run with --gpus 1" + logs))
    return out


def not_started_check(ranks: list[int], timeout: float) -> Check:
    """--timeout ended before the workers were started: nothing of the run was checked."""
    return Check(
        CheckId.RUN_DEADLINE, FAIL,
        f"--timeout {timeout:g} s ended before {ranks_text(ranks)} were started: the start-up "
        f"(the sandbox, importing torch and the training code) took all of it, so nothing "
        f"was run", "raise --timeout: the start-up alone needs more than that",
        headline=f"the workers were not started within --timeout {timeout:g} s",
        ranks=tuple(ranks))


def _raised_checks(failed: list, waiting: list, results: list, logs: str) -> list[Check]:
    """The first real failures, grouped over the ranks that raised the same thing, with
    the ranks that were left ``waiting`` for them."""
    out: list[Check] = []
    seen: dict = {}
    for r in failed:
        f = r.failure
        seen.setdefault((f.exc_type, f.message, f.frame, f.stage), []).append(r.rank)
    for (exc_type, message, frame, stage), ranks in seen.items():
        left = [s for s in waiting if s.rank not in ranks]
        waited = "; ".join(f"rank {s.rank} was left waiting {_where(s)}" for s in left)
        text = f"{exc_type}: {message}" if exc_type else message
        out.append(Check(
            CheckId.RANK_FAILED, FAIL,
            f"{ranks_text(ranks)} raised {text}" + (f" at {frame}" if frame else "")
            + f", during {stage}" + (f"; {waited}, and was stopped" if waited else ""),
            (_port_taken_fix() if "EADDRINUSE" in message or "address already in use" in message
             else _fix_for_stage(stage) if "init_process_group" in stage else
             "fix the error above; it happened on " + ranks_text(ranks) + " only, so look for "
             "rank-dependent code, data or device" if len(ranks) < len(results) else
             "fix the error above; rerun with --gpus 1 to see it on its own") + logs,
            rank=ranks[0]))
    return out


def _crash_checks(crashed: list, stopped: list, logs: str) -> list[Check]:
    """Ranks that died without a result, with the ranks that waited for them."""
    out: list[Check] = []
    for r in crashed:
        tail = f"; its last words: {r.last_words}" if r.last_words else ""
        waited = [s for s in stopped if s.status == RankStatus.WAITING]
        others = ("; " + "; ".join(f"rank {s.rank} waited for it {_where(s)}" for s in waited)
                  if waited else
                  f" ({ranks_text([s.rank for s in stopped])} stopped by the launcher)"
                  if stopped else "")
        out.append(Check(
            CheckId.RANK_CRASHED, FAIL,
            f"rank {r.rank} died ({r.exit_text or 'no result'}) while {r.stage}{tail}{others}",
            "rerun with --gpus 1 to see the full error; a crash on some ranks only points "
            "at rank-dependent code, data or a faulty GPU" + logs, rank=r.rank))
    return out


def _alone_checks(alone: list, results: list, logs: str) -> list[Check]:
    """Ranks that wait in a collective nobody else calls, with where the others went."""
    out: list[Check] = []
    for r in alone:
        others = [o for o in results if o.rank != r.rank]
        went_on = "; ".join(
            f"rank {o.rank} never calls it: it went on and waits at {_meeting(o.stage)}"
            if _meeting(o.stage) else f"rank {o.rank} never calls it (it was {_where(o)})"
            for o in others)
        out.append(Check(
            CheckId.RANK_ALONE_IN_COLLECTIVE, FAIL,
            f"rank {r.rank} waits in {r.collective}() called from {r.stuck_at}, while "
            f"{r.stage}; {went_on}. A collective that not every rank calls never returns",
            f"call {r.collective}() on every rank (move it out of `if rank == 0:` / "
            f"is_main_process() branches), or drop it" + logs, rank=r.rank))
    return out


def _all_hung_alike(hung: list, results: list) -> bool:
    return bool(hung) and len(hung) == len(results) > 1 and len({r.stage for r in hung}) == 1


def _all_hung_check(hung: list, results: list, timeout: float, logs: str) -> Check:
    r = hung[0]
    frames = "; ".join(f"rank {h.rank} {_where(h)}" for h in hung)
    return Check(
        CheckId.ALL_HUNG, FAIL,
        f"all {len(results)} ranks made no progress while {r.stage} and were killed at "
        f"--timeout {timeout:g} s: {frames}",
        (_fix_for_stage(r.stage) if "init_process_group" in r.stage else
         "every rank waits: look at the frames above for a collective no rank gets "
         "past, a lock, or a file nobody writes") + logs)


def _hung_checks(hung: list, results: list, timeout: float, logs: str) -> list[Check]:
    """Each rank that made no progress until the deadline, where it was stuck, and what
    the other ranks said meanwhile."""
    out: list[Check] = []
    for r in hung:
        age = f" for {r.stage_age:.1f} s" if r.stage_age is not None else ""
        waiting = [o for o in results if o.rank != r.rank]
        said = "; ".join(
            f"rank {o.rank} waited for it at {_meeting(o.stage)}" if _meeting(o.stage) else
            f"rank {o.rank} reported: {o.failure.message}" if o.failure is not None else
            f"rank {o.rank} was {_where(o)}" for o in waiting)
        out.append(Check(
            CheckId.RANK_HUNG, FAIL,
            f"rank {r.rank} made no progress{age} while {r.stage}, "
            + (f"stuck at {r.stuck_at}" if r.stuck_at else "where it was stuck is unknown")
            + f"; killed at --timeout {timeout:g} s" + (f"; {said}" if said else ""),
            "find what blocks on that rank at that frame: a lock, a file only rank 0 writes, a "
            "download, an input() or a very slow step; raise --timeout only if the frame "
            "shows real work" + logs, rank=r.rank))
    return out


def _port_taken_fix() -> str:
    port = os.environ.get("MASTER_PORT", "the port")
    return (f"MASTER_PORT={port} is taken by another process on rank 0's host: export a free "
            f"port (`ss -ltnp` shows who holds it), or let torchrun pick one (--standalone, or "
            f"--rdzv-endpoint host:0)")


def _fix_for_stage(stage: str) -> str:
    if "init_process_group" in stage:
        return ("the ranks never met: MASTER_ADDR:MASTER_PORT must reach rank 0's host from "
                "every rank (no firewall on the port, the port free), the hostname must resolve "
                "to a reachable interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), every rank "
                "must agree on WORLD_SIZE; NCCL_DEBUG=INFO shows more")
    return "rerun with --gpus 1 to see the error on its own"


# -- the process group -----------------------------------------------------------------------


def process_group_checks(results: list[RankResult], backend: str, device: str,
                         world_size: int) -> list[Check]:
    done = [r for r in results if r.ok]
    out: list[Check] = []
    inits = [r.init_seconds for r in results if r.init_seconds is not None]
    if len(inits) == world_size:
        out.append(Check(CheckId.PG_INIT, PASS,
                         f"{world_size} ranks joined a {backend} group; slowest "
                         f"init_process_group {seconds_text(max(inits))}"))
    peers = next((r.peers for r in results if r.peers), None)
    if peers:
        out.extend(identity_checks(peers, world_size, device))
    by_name: dict = {}
    for r in results:
        for c in r.collectives:
            by_name.setdefault(c.name, []).append((r.rank, c))
    if by_name:
        wrong = [(name, rank, c) for name, rows in by_name.items() for rank, c in rows
                 if not c.ok]
        if wrong:
            name, rank, c = wrong[0]
            out.append(Check(
                CheckId.COLLECTIVES, FAIL,
                f"{name} on rank {rank} gave {c.got}, expected {c.expected}"
                + (f" ({len(wrong) - 1} more wrong)" if len(wrong) > 1 else ""),
                "ranks disagree on who is who or the transport corrupts data: check "
                "RANK/LOCAL_RANK, CUDA_VISIBLE_DEVICES, and NCCL_P2P_DISABLE=1 / "
                "NCCL_IB_DISABLE=1 to isolate the link"))
        else:
            ar = [c.seconds for rows in by_name.values() for _, c in rows
                  if c.seconds is not None]
            ranks = len({rank for rows in by_name.values() for rank, _ in rows})
            out.append(Check(
                CheckId.COLLECTIVES, PASS,
                f"{', '.join(by_name)} gave the exact expected values on all {ranks} ranks"
                + (f" (first all_reduce {seconds_text(max(ar))})" if ar else "")))
    if done and len(done) == world_size and all(r.barrier_ok for r in done):
        out.append(Check(CheckId.BARRIER, PASS,
                         f"all {world_size} ranks passed a gloo monitored_barrier (a missing "
                         f"rank would be named)"))
    bws = [r.bandwidth for r in results if r.bandwidth is not None]
    if bws:
        out.append(bandwidth_check(min(bws, key=lambda b: b.busbw), backend, device))
    elif world_size == 1 and done:
        out.append(Check(CheckId.BANDWIDTH, PASS, "1 rank: nothing to measure"))
    return out


def bandwidth_check(bw, backend: str, device: str) -> Check:
    figure = (f"{format_bytes(bw.bytes)} all_reduce: {seconds_text(bw.seconds)}, bus bandwidth "
              f"{bw.busbw / 1e9:.2f} GB/s (slowest rank)")
    if device != "cuda":
        return Check(CheckId.BANDWIDTH, PASS,
                     f"{figure}; {backend} between CPU processes on this host, so informational "
                     f"only: it says nothing about GPU links ({NCCL_REFERENCE})")
    if bw.busbw < NCCL_TOO_SLOW:
        return Check(
            CheckId.BANDWIDTH, WARN,
            f"{figure}: below what NCCL gets even over PCIe 3.0 x16 (~5-12 GB/s); "
            f"{NCCL_REFERENCE}",
            "NCCL is likely going through host memory or sockets: check `nvidia-smi topo -m`, "
            "that NCCL_P2P_DISABLE / NCCL_SHM_DISABLE are unset, and NCCL_DEBUG=INFO for the "
            "transport it picked")
    return Check(CheckId.BANDWIDTH, PASS, f"{figure}; {NCCL_REFERENCE}")


def identity_checks(peers: list, world_size: int, device: str) -> list[Check]:
    out = []
    problems = []
    ranks = sorted(p.rank for p in peers)
    if ranks != list(range(world_size)):
        problems.append(f"group ranks are {ranks}, expected 0..{world_size - 1}")
    for p in peers:
        env = p.env or {}
        if env.get("RANK") is not None and str(p.rank) != str(env["RANK"]):
            problems.append(f"rank {p.rank} has RANK={env['RANK']}")
        if p.world_size != world_size or (
                env.get("WORLD_SIZE") is not None and str(env["WORLD_SIZE"]) != str(world_size)):
            problems.append(f"rank {p.rank} sees world size {p.world_size} "
                            f"(WORLD_SIZE={env.get('WORLD_SIZE')})")
        lr, lw = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
        if lr is not None and lw is not None and not 0 <= int(lr) < int(lw):
            problems.append(f"rank {p.rank} has LOCAL_RANK={lr} outside LOCAL_WORLD_SIZE={lw}")
    seen: dict = {}
    for p in peers:
        key = (p.host, (p.env or {}).get("LOCAL_RANK"))
        if key[1] is not None:
            seen.setdefault(key, []).append(p.rank)
    for (host, lr), rs in seen.items():
        if len(rs) > 1:
            problems.append(f"{ranks_text(rs)} share LOCAL_RANK={lr} on {host}")
    if problems:
        out.append(Check(
            CheckId.IDENTITY, FAIL, "; ".join(problems),
            "let the launcher set RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or derive them from "
            "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; never hard-code them"))
    else:
        out.append(Check(
            CheckId.IDENTITY, PASS,
            f"RANK, WORLD_SIZE and LOCAL_RANK agree with the group on all {world_size} ranks"))

    if device == "cuda":
        users: dict = {}
        for p in peers:
            d = p.device
            key = (p.host, d.uuid or d.pci or d.index)
            users.setdefault(key, []).append(p.rank)
        shared = [(key, rs) for key, rs in users.items() if len(rs) > 1]
        if shared:
            (host, dev), rs = shared[0]
            out.append(Check(
                CheckId.ONE_GPU_PER_RANK, FAIL,
                f"{ranks_text(rs)} use the same GPU ({dev}) on {host}: they fight for its "
                f"memory and NCCL fails or hangs",
                "torch.cuda.set_device(local_rank) before init_process_group and "
                "DDP(model, device_ids=[local_rank]); do not pin CUDA_VISIBLE_DEVICES to one "
                "GPU for all ranks"))
        else:
            out.append(Check(CheckId.ONE_GPU_PER_RANK, PASS,
                             f"{len(peers)} ranks on {len(users)} distinct GPUs"))
    else:
        out.append(Check(CheckId.ONE_GPU_PER_RANK, PASS,
                         "CPU processes (gloo): no GPU to share here; on GPUs every rank must "
                         "call torch.cuda.set_device(local_rank)"))
    return out
