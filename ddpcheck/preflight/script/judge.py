"""Judge every rank's facts together (pure Python, no torch).

Each runtime observation becomes a :class:`~ddpcheck.preflight.checks.Check` (the
factory mode's verdict model too) with a check id, a status
and, where a ``ddpcheck lint`` rule predicts it statically, that rule's code:
``DDP101 confirmed: epoch 2 began without set_epoch``. The lint findings for
the same script are attached beside them (:func:`link_lint`). Formatting is
:mod:`ddpcheck.preflight.script.report`'s job.
"""

from __future__ import annotations

from ddpcheck.preflight.units import relative_path

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Optional

from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId, Status, worst
from ddpcheck.preflight.checks import exit_code as exit_code_of
from ddpcheck.preflight.results import RankResult, RankStatus
from ddpcheck.preflight.script.facts import Ending, LoaderFact
from ddpcheck.preflight.script.standin import failure_is_stand_in
from ddpcheck.preflight.shardplan import plan_shards
from ddpcheck.preflight.verdict import not_started_check
from ddpcheck.preflight.watchdog import StopReason

_BN1_RE = re.compile(r"Expected more than 1 value per channel when training")
_UNUSED_RE = re.compile(r"Expected to have finished reduction in the prior iteration"
                        r"|did not receive grad")
_UNUSED_NAMES_RE = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
# what a rank says when a peer died under it: a consequence, not a second failure
_PEER_LOST_RE = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker "
                           r"crash|Broken pipe|ProcessGroup.*(abort|shut ?down)|failed to "
                           r"recv|Socket Timeout|NCCL communicator was aborted", re.I)


# the static rule that predicts each runtime observation (None: runtime only)
RULE_FOR = {
    CheckId.SET_EPOCH: "DDP101",
    CheckId.DISTRIBUTED_SAMPLER: "DDP104",
    CheckId.CHECKPOINT_WRITES: "DDP301",
    CheckId.COLLECTIVE_ORDER: "DDP401",
    CheckId.SYNC_BN: "DDP201",
}


@dataclass
class LintLink:
    """One ``ddpcheck lint`` finding and what the run made of it."""

    code: str
    line: int
    severity: str
    message: str
    runtime: str  # "confirmed" / "not observed in this run" / "not checked at run time"


@dataclass
class Judgement:
    checks: list = field(default_factory=list)  # checks.Check, failures first
    lint: list = field(default_factory=list)
    lint_error: Optional[str] = None

    @property
    def status(self) -> Status:
        return worst(self.checks)

    @property
    def exit_code(self) -> int:
        """The factory mode's rule: 1 when any check FAILed."""
        return exit_code_of(self.checks)


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) == 2:
        return f"ranks {ranks[0]} and {ranks[1]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def _title(check: CheckId, status: str, text: str) -> str:
    rule = RULE_FOR.get(check)
    if rule and status != PASS:
        return f"{rule} confirmed: {text}"
    return text


def _v(check: CheckId, status: str, text: str, detail: str, fix: str = "",
       ranks=()) -> Check:
    return Check(check, status, detail, fix, headline=_title(check, status, text),
                 rule=RULE_FOR.get(check), ranks=tuple(ranks))


def _at(where: str) -> str:
    """``train.py:88`` for ``some/folder/train.py:88`` (what the reader looks for)."""
    import os

    return os.path.basename(where) if where else where


def _size(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- the judge ---------------------------------------------------------------------------


def judge(facts: list, ranks: list, world: int, backend_note: str, timeout: float,
          stop_reason: StopReason = StopReason.NONE, one_process: bool = False) -> Judgement:
    """``facts``: RankFacts (or None) per rank; ``ranks``: the launcher's
    :class:`RankResult` per rank (empty under torchrun / srun, where this process is a
    rank); ``stop_reason``: why the launcher's watchdog stopped the run, if it did;
    ``one_process``: the script ran as its only process driving ``world`` devices."""
    out = Judgement()
    have = [f for f in facts if f is not None]
    out.checks.append(_backend(have, backend_note))
    failed = _failures(facts, ranks, timeout, stop_reason)
    out.checks += failed
    out.checks += _collective_order(have)
    main = have[0] if have else None
    if main is not None:
        crashed = any(v.id in (CheckId.LAST_BATCH, CheckId.DATA_PARALLEL)
                      for v in failed)
        if one_process:
            out.checks += _one_process(main, world, crashed)
        else:
            out.checks += _loaders(have, world, crashed=crashed)
            out.checks += _wraps(have, world)
            out.checks += _writes(have)
        out.checks += _memory(have)
    if not any(v.status == FAIL for v in out.checks) and have:
        out.checks.insert(1, _ran(have))
    # failures first, then warnings, then what passed (each group in run order)
    order = {FAIL: 0, WARN: 1, PASS: 2}
    out.checks.sort(key=lambda v: order[v.status])
    return out


def _backend(have: list, note: str) -> Check:
    if not have:
        return _v(CheckId.BACKEND, PASS, "no rank reported back (see below)", note)
    asked = next((f.backend_asked for f in have if f.backend_asked), None)
    used = next((f.backend_used for f in have if f.backend_used), None)
    where = next((f.init_where for f in have if f.init_where), "")
    stand_in = any(f.cuda_stand_in for f in have)
    if used is None:
        text = "the script did not start a process group"
        detail = note
    else:
        text = (f"init_process_group({asked!r}) at {_at(where)}, ran on {used}" if asked else
                f"init_process_group() at {_at(where)}, ran on {used}")
        detail = note
    notes = sorted({n for f in have for n in f.init_notes})
    if notes:
        detail += "; " + "; ".join(notes)
    if stand_in:
        # the CUDA calls answered are in --format json (ranks[].stand_in_used)
        detail += ("; .cuda() / .to('cuda') / set_device kept tensors on CPU: NCCL, CUDA "
                   "placement and GPU memory are unmeasured")
    return _v(CheckId.BACKEND, PASS, text, detail)


def _ran(have: list) -> Check:
    if all(f.ending == Ending.EXITED and not f.optimizer_steps for f in have):
        where = sorted({f.ending_detail for f in have if f.ending_detail})
        return _v(CheckId.RUN, WARN, "the script exited before its first training step",
                  f"{'; '.join(where) or 'sys.exit'} on every rank: nothing after it was "
                  f"checked (a GPU-count check, a missing file, a --help?)",
                  "give the script what it needs to train (arguments, data, devices), or "
                  "--gpus matching the devices it asks for", [f.rank for f in have])
    return _ran_through(have)


def _ran_through(have: list) -> Check:
    steps = sorted({f.optimizer_steps for f in have})
    endings = sorted({f.ending.value for f in have})
    detail = "; ".join(sorted({f.ending_detail for f in have if f.ending_detail}
                              | {n for f in have for n in f.notes}))
    seconds = max(f.seconds for f in have)
    who = "the script ran" if have[0].one_process else "every rank ran the script"
    text = (f"{who}: {'/'.join(map(str, steps))} optimizer steps, "
            f"ended {'/'.join(endings)}")
    return _v(CheckId.RUN, PASS, text,
              (detail + "; " if detail else "") + f"{seconds:.1f} s in the script",
              ranks=[f.rank for f in have])


_REPLICA_RE = re.compile(r"Caught (\w+) in replica (\d+) on device (\d+)")


def _failures(facts: list, launched: list, timeout: float, stop_reason: StopReason) -> list:
    out = []
    crashes: dict = defaultdict(list)
    crashed = [f for f in facts if f is not None and f.ending == Ending.CRASHED and f.crash]
    primary = [f for f in crashed if not _PEER_LOST_RE.search(f.crash.message)]
    followers = [f.rank for f in crashed if f not in primary] if primary else []
    for f in (primary or crashed):
        crashes[(f.crash.type, f.crash.message, f.crash.where)].append(f)
    stand_in = False
    for (ctype, message, where), group in crashes.items():
        at = f" at {_at(where)}" if where else ""
        if followers:
            their = "its" if len(followers) == 1 else "their"
            message += f" ({_ranks(followers)} then lost {their} peer and stopped)"
        crash = group[0].crash
        if group[0].cuda_stand_in and failure_is_stand_in(message, crash.traceback):
            stand_in = True
            out.append(_stand_in_failure(group, ctype, message, at))
        else:
            out.append(_crash_verdict(group, ctype, message, at))
    if not stand_in:  # a rank killed after a stand-in failure waited for it: no hang
        out += _launcher_failures(facts, launched, timeout, stop_reason)
    return out


def _crash_verdict(group: list, ctype: str, message: str, at: str) -> Check:
    """The verdict for one crash: a known cause (last batch of 1 with BatchNorm, a
    DataParallel replica with no input, unused parameters) or the exception itself
    with the script's own frames."""
    ranks = [f.rank for f in group]
    crash = group[0].crash
    if _BN1_RE.search(message):
        return _last_batch_crash(group, ctype, message, at)
    replica = _REPLICA_RE.search(message)
    if replica and group[0].one_process:
        return _replica_crash(group[0], replica, crash.last_line or message, at)
    if _UNUSED_RE.search(message):
        names = _UNUSED_NAMES_RE.search(crash.traceback or message)
        named = f": {names.group(1).strip()}" if names else ""
        return _v(CheckId.UNUSED_PARAMETERS, FAIL,
                  f"parameters without a gradient crash DDP{named}",
                  f"{_ranks(ranks)}: {ctype}: {message}{at}. DDP waits for a gradient of every "
                  f"parameter; one the forward did not use never gets one, and the next step "
                  f"fails (step {group[0].optimizer_steps + 1} here)",
                  "use every parameter in forward, delete the unused ones, or pass "
                  "find_unused_parameters=True to DDP (costs a graph traversal per step)",
                  ranks)
    frames = "; ".join(crash.frames) if crash.frames else ""
    who = "the script" if group[0].one_process else _ranks(ranks)
    everyone = len(ranks) == group[0].world_size
    fix = (f"fix the {ctype} at {_at(crash.where)}" if crash.where else f"fix the {ctype}") + (
        "" if everyone or group[0].one_process else
        f"; only {_ranks(ranks)} raised it: look for rank-dependent code, data or paths")
    return _v(CheckId.CRASH, FAIL, f"{who} crashed{at}: {ctype}: {message}",
              f"traceback in your code: {frames}" if frames else
              "no frame of your code in the traceback", fix, ranks)


def _stand_in_failure(group: list, ctype: str, message: str, at: str) -> Check:
    """The CPU stand-in could not run something only a GPU can: say what was not
    checked; it is not the script's crash (WARN, exit 0 unless something else fails)."""
    steps = max(f.optimizer_steps for f in group)
    return _v(CheckId.CPU_STAND_IN, WARN,
              f"not checked past {_at(group[0].crash.where) or 'this point'}: the CPU stand-in "
              f"for CUDA cannot run it",
              f"{ctype}: {message}{at}. The run stopped there after {steps} optimizer "
              f"step{'s' if steps != 1 else ''}; what comes later (the rest of the epoch, "
              f"the next epoch, checkpoints) was not checked. Not a fault of the script",
              "rerun the preflight on a machine with GPUs to check the rest",
              [f.rank for f in group])


def _replica_crash(main, replica, cause: str, at: str) -> Check:
    """DataParallel gave a replica no input: the last batch is smaller than the device
    count (or splits into fewer chunks than devices), with the arithmetic."""
    lf = next((x for x in main.loaders if x.epochs), None)
    devices = main.data_parallel[0]["devices"] if main.data_parallel else main.devices
    numbers = ""
    if lf is not None and lf.dataset_len and lf.batch_size:
        last = lf.dataset_len % lf.batch_size or lf.batch_size
        size = -(-last // devices)
        chunks = -(-last // size)
        numbers = (f"{lf.dataset_len} samples, batch {lf.batch_size}, {devices} devices: the "
                   f"last batch holds {last} sample{'s' if last != 1 else ''}, which "
                   f"DataParallel splits into {chunks} chunk{'s' if chunks != 1 else ''}, so "
                   f"replica {replica.group(2)} gets no input; ")
    return _v(CheckId.DATA_PARALLEL, FAIL,
              f"DataParallel replica {replica.group(2)} got no input from the last batch{at}",
              f"{numbers}{replica.group(1)} in replica {replica.group(2)}: {cause}. Positional "
              f"and keyword arguments are scattered separately: the keyword arguments still "
              f"reach every device. Served first here; in a full run it comes at the end of "
              f"epoch 1",
              "DataLoader(drop_last=True), a batch size that leaves at least one sample per "
              "device in the last batch (divisible by the device count), or DDP (one process "
              "per GPU, each with its own DistributedSampler shard)", [main.rank])


def _launcher_failures(facts: list, launched: list, timeout: float,
                       stop_reason: StopReason) -> list:
    unstarted = [end.rank for end in launched
                 if end is not None and end.status == RankStatus.NOT_STARTED]
    if unstarted:
        return [not_started_check(unstarted, timeout)]
    out = []
    waiting = [end for end in launched if end is not None and facts[end.rank] is None
               and end.status == RankStatus.WAITING]
    for end in launched:
        if end is None or facts[end.rank] is not None or end in waiting:
            continue
        if _hung(end, stop_reason):
            where = end.stuck_at + (f" in {end.collective}" if end.collective else "")
            waited = (f"no result within --timeout {timeout:g} s"
                      if stop_reason == StopReason.DEADLINE else
                      "still running after the other ranks had ended")
            out.append(_v(CheckId.HANG, FAIL, f"rank {end.rank} hung",
                          waited + (f", stuck at {where}" if where else "") + "; it was killed",
                          "a collective or barrier only some ranks reach, a DDP backward one "
                          "rank skipped, or a slow step: raise --timeout if it is only slow",
                          [end.rank]))
        elif end.status == RankStatus.CRASHED:
            out.append(_v(CheckId.CRASH, FAIL, f"rank {end.rank} died ({end.exit_text})",
                          end.last_words or "no Python traceback (a crash in native code?)",
                          "rerun with --gpus 1 to see the full error", [end.rank]))
    if waiting:
        # waiting for a peer is not hanging: named beside the rank it waited for
        said = "; ".join(f"rank {w.rank} waited for it" + (
            f" in {w.collective}" if w.collective else "") + (
            f" at {_at(w.stuck_at)}" if w.stuck_at else "") + " and was stopped"
            for w in waiting)
        if out:
            out[0] = replace(out[0], detail=f"{out[0].detail}; {said}")
        else:
            out.append(_v(CheckId.HANG, FAIL,
                          f"{_ranks([w.rank for w in waiting])} waited for peers that never came",
                          said, "see the other ranks' rows: one of them ended or went elsewhere",
                          [w.rank for w in waiting]))
    return out


def _hung(end: RankResult, stop_reason: StopReason) -> bool:
    """Killed by the watchdog: at the deadline, or after the other ranks had ended (the
    script has no meeting points of the tool's own, so a rank that cannot follow its
    peers' end is waiting for them: in script mode that is a hang). A rank that
    torch's launcher stopped because a peer process died is not."""
    if end.status == RankStatus.HUNG:
        return True
    return end.status == RankStatus.STOPPED and stop_reason != StopReason.NONE


def _last_batch_crash(group: list, ctype: str, message: str, at: str) -> Check:
    ranks = [f.rank for f in group]
    loader = next((lf for lf in group[0].loaders if lf.epochs), None)
    arithmetic = ""
    if loader is not None:
        arithmetic = f" ({_loader_numbers(loader)})"
    return _v(CheckId.LAST_BATCH, FAIL,
              "the epoch's last batch holds 1 sample and BatchNorm fails on it",
              f"served first, the last batch{arithmetic} crashed {_ranks(ranks)}: {ctype}: "
              f"{message}{at}; in a full run this comes at the end of epoch 1",
              "DataLoader(drop_last=True), or a batch size that leaves 2 or more samples "
              "per rank in the last batch", ranks)


def _loader_numbers(lf: LoaderFact) -> str:
    if lf.dataset_len is None or not lf.batch_size:
        return f"{lf.sampler}, batch {lf.batch_size}"
    replicas = lf.num_replicas if lf.distributed else 1
    plan = plan_shards(lf.dataset_len, replicas or 1, lf.batch_size, drop_last=lf.drop_last,
                       sampler_drop_last=bool(lf.sampler_drop_last))
    per = f"{plan.samples_per_rank} per rank" if lf.distributed else "all of them on every rank"
    pad = f", {plan.padded} padded" if plan.padded else ""
    return (f"{lf.dataset_len} samples, {per}{pad}, batch {lf.batch_size} -> "
            f"{plan.batches_per_rank} batches, the last of {plan.last_batch}"
            + (f", drop_last drops {plan.loader_dropped_per_rank}"
               if plan.loader_dropped_per_rank else ""))


def _collective_order(have: list) -> list:
    # a rank that waited for a peer which crashed is part of that crash's story
    found = [f for f in have if f.mismatch is not None
             and not (f.mismatch.reason == "ended"
                      and all(p.ended == Ending.CRASHED.value for p in f.mismatch.peers
                              if p.ended is not None))]
    if not found:
        compared = max((f.collective_count for f in have), default=0)
        if compared and len(have) > 1 and all(f.ending != Ending.CRASHED for f in have):
            ops = sorted({c.op for f in have for c in f.collectives})
            return [_v(CheckId.COLLECTIVE_ORDER, PASS,
                       f"{compared} collectives in the same order on every rank",
                       ", ".join(ops))]
        return []
    first = min(found, key=lambda f: f.mismatch.seq)
    mm = first.mismatch
    mine = mm.mine
    parts = [f"rank {first.rank} entered {_op(mine.op, mine.shapes, mine.dtype)} at "
             f"{_at(mine.where)}"]
    for peer in mm.peers:
        if peer.ended is not None:
            how = {"stopped": "reached the preflight's stop point without it",
                   "finished": "finished the script without it",
                   "exited": "exited the script without it",
                   "crashed": "crashed before it", "mismatch": "stopped on another mismatch"}
            parts.append(f"rank {peer.rank} {how.get(peer.ended, peer.ended)}"
                         + (f" ({_at(peer.ended_where)})" if peer.ended_where else ""))
        else:
            parts.append(f"rank {peer.rank} {_op(peer.op, peer.shapes, peer.dtype, article=True)} "
                         f"at {_at(peer.where)}")
    text = ", ".join(parts)
    parted = next((f.first_divergence for f in have if f.first_divergence), "")
    parted = (f"; the sequences parted at {parted}" if parted else "")
    if mm.reason in ("op", "ended"):
        return [_v(CheckId.COLLECTIVE_ORDER, FAIL, text,
                   f"collective #{mm.seq + 1}: the ranks disagree on what comes next; a real run "
                   f"hangs there (or mixes up tensors) until the NCCL timeout{parted}",
                   "make every rank reach the same collectives in the same order: move the "
                   "collective out of the rank-only branch (reduce on all ranks, print on "
                   "rank 0)", [first.rank] + [p.rank for p in mm.peers])]
    # a tensor mismatch is not what DDP401 predicts (a rank-only collective): no rule
    return [Check(CheckId.COLLECTIVE_ORDER, FAIL,
                  f"collective #{mm.seq + 1}: the ranks pass different tensors; gloo raises, "
                  f"NCCL hangs or reduces garbage",
                  "pad or gather sizes first so every rank passes the same shape and dtype",
                  headline=f"{mine.op} with different "
                           f"{'shapes' if mm.reason == 'shape' else 'dtypes'}: " + text,
                  ranks=tuple([first.rank] + [p.rank for p in mm.peers]))]


def _op(op: str, shapes: list, dtype: Optional[str], article: bool = False) -> str:
    name = op
    if article:
        name = ("a " if op[0].lower() not in "aeiou" or op.startswith("DDP") else "an ") + name
    if shapes and not op.startswith("DDP"):
        shown = ", ".join("a scalar" if s == [] else "[" + "x".join(map(str, s)) + "]"
                          for s in shapes[:2])
        name += f" ({shown}{' ' + dtype if dtype else ''})"
    return name


def _loaders(have: list, world: int, crashed: bool) -> list:
    out = []
    main = have[0]
    for lf in main.loaders:
        if not lf.training:
            continue
        peers = [next((x for x in f.loaders if x.index == lf.index), None) for f in have]
        peers = [p for p in peers if p is not None]
        numbers = _loader_numbers(lf)
        # the sampler: does every rank get its own shard?
        if world > 1 and not lf.distributed:
            same = len({p.epochs[0].order_digest for p in peers if p.epochs}) == 1
            detail = (f"DataLoader at {_at(lf.where)} uses {lf.sampler}: {numbers}. "
                      + ("Every rank drew the same batches (first indices "
                         f"{lf.epochs[0].head[:6] if lf.epochs else []} on all ranks)"
                         if same else "Each rank walks the whole data set")
                      + f": one epoch is {world} epochs' worth of steps on duplicated data")
            out.append(_v(CheckId.DISTRIBUTED_SAMPLER, FAIL,
                          f"the training DataLoader ({_at(lf.where)}) has no DistributedSampler",
                          detail,
                          "DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset)) "
                          "and sampler.set_epoch(epoch) each epoch (shuffle goes to the sampler)",
                          [f.rank for f in have]))
        elif world > 1 and lf.distributed:
            out.append(_v(CheckId.DISTRIBUTED_SAMPLER, PASS,
                          f"the training DataLoader ({_at(lf.where)}) shards with "
                          f"DistributedSampler",
                          numbers))
        # set_epoch: the first two training epochs (peeks and evaluation passes skipped)
        out += _set_epoch(lf, main, have)
        # the last batch
        out += _last_batch(lf, numbers, crashed)
    return out


def _set_epoch(lf: LoaderFact, main, have: list) -> list:
    trained = lf.training_epochs
    if not (lf.shuffle and lf.distributed and len(trained) >= 2):
        return []
    e1, e2 = trained[0], trained[1]
    between = lf.epochs[lf.epochs.index(e1) + 1: lf.epochs.index(e2) + 1]
    calls = sum(e.set_epoch_calls for e in between)
    ranks = [f.rank for f in have]
    if e1.order_digest != e2.order_digest:
        return [_v(CheckId.SET_EPOCH, PASS,
                   f"set_epoch({e2.sampler_epoch}) before epoch 2: a new order",
                   f"{_at(lf.where)}: epoch 1 started {e1.head[:4]}, epoch 2 {e2.head[:4]}")]
    if calls == 0:
        return [_v(CheckId.SET_EPOCH, FAIL, "epoch 2 began without set_epoch",
                   f"the DistributedSampler of {_at(lf.where)} shuffled epoch 2 "
                   f"exactly like epoch 1 (rank {main.rank} starts {e2.head[:6]} both times): "
                   f"every epoch trains on the same order",
                   "call sampler.set_epoch(epoch) at the start of every epoch, before "
                   "iterating the DataLoader", ranks)]
    return [_v(CheckId.SET_EPOCH, FAIL,
               f"set_epoch({e2.sampler_epoch}) gave epoch 2 epoch 1's order",
               f"set_epoch was called, but with the same value both epochs (the order at "
               f"{_at(lf.where)} repeats)",
               "pass the epoch number that changes: sampler.set_epoch(epoch)", ranks)]


def _last_batch(lf: LoaderFact, numbers: str, crashed: bool) -> list:
    if not lf.epochs or crashed or not lf.batch_size:
        return []
    last = lf.epochs[0].first_batch
    if last == 1 and lf.batch_size > 1:
        return [_v(CheckId.LAST_BATCH, WARN, "the epoch's last batch holds 1 sample",
                   f"{numbers}; served first it ran, but its gradient is one sample's (noisy) "
                   f"and BatchNorm in training mode cannot take it",
                   "drop_last=True on the DataLoader, or a batch size that divides the "
                   "per-rank share")]
    return [_v(CheckId.LAST_BATCH, PASS, f"the epoch's last batch ({last} samples) ran first",
               numbers)]


def _one_process(main, world: int, crashed: bool) -> list:
    """A script that runs as one process: DataParallel over the devices, or one device.
    No per-rank verdicts (sampler shards, files written by several ranks)."""
    out = []
    training = [lf for lf in main.loaders if lf.training]
    for lf in training[:1]:
        out += _last_batch(lf, _loader_numbers(lf), crashed)
    dp = [w for w in main.wraps if w.kind == "DataParallel"]
    if dp:
        out.append(_data_parallel(main, dp[0], crashed))
        return out
    copies = _what_copies_do(main, training, world)
    out.append(_v(CheckId.SINGLE_PROCESS, WARN,
                  f"a single-process script: it uses one device, not {world}",
                  f"no process group and no DataParallel: run with python it trains on one "
                  f"GPU; {copies}",
                  f"to use {world} GPUs: DDP (torchrun --nproc-per-node {world}, "
                  f"init_process_group, DistributedSampler, DDP(model), save on rank 0)",
                  [main.rank]))
    return out


def _what_copies_do(main, training: list, world: int) -> str:
    parts = [f"started {world} times (torchrun --nproc-per-node {world}), each copy would "
             f"train its own model, gradients never averaged"]
    for lf in training[:1]:
        parts.append(f"each on all {lf.dataset_len} samples of the DataLoader at "
                     f"{_at(lf.where)} (no DistributedSampler)")
    paths = sorted({relative_path(w.path) for w in main.writes
                    if w.kind in ("torch.save", "open") and w.redirected})
    if paths:
        parts.append(f"and all {world} would write {', '.join(paths[:3])}")
    return ", ".join(parts)


def _data_parallel(main, wrap, crashed: bool) -> Check:
    records = main.data_parallel
    devices = records[0]["devices"] if records else main.devices
    text = f"DataParallel built at {_at(wrap.where)}: one process drives {devices} devices"
    if crashed or not records:
        return _v(CheckId.DATA_PARALLEL, PASS, text,
                  "its forward was emulated on CPU with torch's scatter rules")
    least = min(records, key=lambda r: r["replicas"])
    detail = (f"{len(records)} forward{'s' if len(records) != 1 else ''} scattered with "
              f"torch's rules on CPU; the smallest batch ({least['batch']} samples) ran on "
              f"{least['replicas']} of {devices} devices")
    return _v(CheckId.DATA_PARALLEL, PASS, text, detail)


def _wraps(have: list, world: int) -> list:
    out = []
    main = have[0]
    for w in main.wraps:
        ids = (f"device_ids={w.device_ids}" + (" (dropped: the module stands on CPU here)"
                                               if w.device_ids_dropped else "")
               if w.device_ids is not None else "device_ids=None")
        out.append(_v(CheckId.DDP_WRAP, PASS, f"{w.kind} built at {_at(w.where)}",
                      f"{ids}, find_unused_parameters={w.find_unused_parameters}, "
                      f"{w.parameters:,} parameters ({_size(w.parameter_bytes)}), "
                      f"{w.batchnorms} BatchNorm / {w.syncbatchnorms} SyncBatchNorm layers"))
    for s in main.syncbn:
        if s.after_wrap:
            out.append(_v(CheckId.SYNC_BN, WARN,
                          f"convert_sync_batchnorm ran after the DDP wrap ({_at(s.where)})",
                          "DDP registered its hooks and buffers on the old BatchNorm layers",
                          "convert first, then wrap: DDP(SyncBatchNorm.convert_sync_batchnorm("
                          "model), ...)"))
    if world > 1 and not any(f.wraps for f in have) and main.optimizer_steps \
            and not any(f.collective_count for f in have):
        out.append(_v(CheckId.DDP_WRAP, WARN,
                      "no DDP and no collective: every rank trains its own copy",
                      f"{main.optimizer_steps} optimizer steps without gradients averaged "
                      f"across ranks",
                      "wrap the model: model = DDP(model, device_ids=[local_rank])"))
    return out


def _writes(have: list) -> list:
    out = []
    by_path: dict = defaultdict(dict)
    node_of = {f.rank: f.node for f in have}
    for f in have:
        for w in f.writes:
            if w.redirected or w.kind == "torch.save":
                by_path[(w.kind == "torch.save", w.path)][f.rank] = w
    for (is_save, path), ranks in sorted(by_path.items()):
        if len(ranks) < 2 or not is_save:
            continue
        nodes = sorted({node_of[r] for r in ranks})
        if len(nodes) == len(ranks) > 1:  # one writer per node: a shared filesystem's problem
            out.append(_node_writes(path, ranks, nodes))
            continue
        where = sorted({_at(w.where) for w in ranks.values()})
        out.append(_v(CheckId.CHECKPOINT_WRITES, FAIL,
                      f"{_ranks(ranks)} all wrote {relative_path(path)}".replace(
                          "ranks 0 and 1 all", "ranks 0 and 1 both"),
                      f"torch.save at {', '.join(where)} ran on every rank: concurrent writes of "
                      f"one file can leave it truncated or mixed, and every rank pays the I/O",
                      "save on one rank: if dist.get_rank() == 0: torch.save(...), then "
                      "dist.barrier() before anyone loads it", ranks.keys()))
    shared = [(p, r) for (is_save, p), r in by_path.items() if not is_save and len(r) > 1
              and any(w.kind == "open" for w in r.values())]
    for path, ranks in shared[:3]:
        out.append(_v(CheckId.FILE_WRITES, WARN,
                      f"{_ranks(ranks)} all wrote {relative_path(path)}",
                      "every rank opened it for writing: lines interleave or overwrite",
                      "write logs and files on rank 0 only", ranks.keys()))
    saves = [(f.rank, w) for f in have for w in f.writes if w.kind == "torch.save"]
    if saves and not any(v.id in (CheckId.CHECKPOINT_WRITES, CheckId.NODE_WRITES)
                         for v in out):
        listed = "; ".join(f"rank {r}: {relative_path(w.path)} ({_at(w.where)})"
                           for r, w in saves[:4])
        out.append(_v(CheckId.CHECKPOINT_WRITES, PASS, "checkpoints written by one rank per file",
                      listed))
    return out


def _node_writes(path: str, ranks: dict, nodes: list) -> Check:
    """One path written once per node: the save is guarded per node (local_rank == 0);
    on a filesystem the nodes share, they overwrite each other's file."""
    where = sorted({_at(w.where) for w in ranks.values()})
    return _v(CheckId.NODE_WRITES, WARN,
              f"{relative_path(path)} is written by {len(nodes)} nodes "
              f"({', '.join(f'rank {r} on node {n}' for r, n in zip(sorted(ranks), nodes))})",
              f"torch.save at {', '.join(where)} runs once per node (a local-rank guard): on a "
              f"filesystem the nodes share, they write the same file at the same time and "
              f"one node's copy can be truncated or mixed with another's",
              "save on the global rank 0 (dist.get_rank() == 0, or RANK from the "
              "environment, not LOCAL_RANK), or give each node its own path",
              ranks.keys())


def _memory(have: list) -> list:
    measured = [f for f in have if f.memory is not None]
    if not measured:
        return []
    top = max(f.memory.peak_bytes for f in measured)
    # a CPU step's peak moves by a few bytes from run to run: ranks within 1 % of the
    # highest are alike, and the lowest of them is named, so the report is stable
    peak = min((f for f in measured if f.memory.peak_bytes >= 0.99 * top), key=lambda f: f.rank)
    m = peak.memory
    return [_v(CheckId.MEMORY, PASS,
               f"peak {_size(top)} in one training step at the script's batch "
               f"{m.batch}", f"rank {peak.rank}; {_size(m.baseline_bytes)} before the step "
               f"(parameters, gradients, optimizer state); {m.tool}")]


# -- lint beside -------------------------------------------------------------------------


def link_lint(judgement: Judgement, findings: list, ended_early: bool = False) -> None:
    """Attach ``ddpcheck lint`` findings, each marked with what the run made of it.
    ``ended_early``: the run stopped before the script's end (the steering's stop, a
    crash, something the CPU stand-in cannot run), so a finding the run did not
    confirm may lie past the point it reached."""
    confirmed = {v.confirms for v in judgement.checks if v.confirms}
    passed = {v.rule for v in judgement.checks if v.rule and v.status == PASS}
    checked = set(RULE_FOR.values())
    for f in findings:
        if f.code in confirmed:
            runtime = "confirmed"
        elif f.code in passed:
            runtime = "not seen at run time"
        elif f.code in checked:
            runtime = ("not reached: the run ended before this point" if ended_early
                       else "not observed in this run")
        else:
            runtime = "static only"
        judgement.lint.append(LintLink(f.code, f.line, str(f.severity), f.message, runtime))
