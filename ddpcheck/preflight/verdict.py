"""Judge what the ranks saw: check rows and the memory table (pure Python).

Input is one :class:`RankView` per rank: the result dict a worker returned
(``None`` when it has none) plus what the launcher knows (crashed / hung /
stopped, the stage it was in, the tail of its stderr). Kept free of torch so
every verdict can be unit-tested with made-up ranks (two ranks on one GPU, a
wrong all_reduce, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ddpcheck.preflight import memfit
from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check
from ddpcheck.preflight.units import format_bytes

CONFIRM_TOLERANCE = 0.10


@dataclass
class RankView:
    rank: int
    result: Optional[dict] = None
    crashed: bool = False
    hung: bool = False
    stopped: bool = False
    exitcode: Optional[int] = None
    exit_text: str = ""
    stage: str = ""
    stage_age: Optional[float] = None
    stderr_tail: str = ""


@dataclass
class MemoryQuestion:
    target_batch: Optional[int] = None  # per-GPU batch the user will train with
    world_size: int = 1
    grad_accum: int = 1
    baseline_global: Optional[int] = None  # --base-batch, else the effective global batch
    safety_margin: float = 0.10
    budget_given: bool = False
    reserve_given: bool = False
    model: str = ""


@dataclass
class MemoryReport:
    checks: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # rows: batch, fwd+bwd, opt, peak, note
    facts: list = field(default_factory=list)  # key/value rows
    fit: Optional[memfit.MemoryFit] = None
    largest: Optional[int] = None
    data: dict = field(default_factory=dict)  # for json


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "?"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


# -- process group ---------------------------------------------------------------------


def failure_checks(views: list, timeout: float, log_dir: Optional[str] = None) -> list:
    out = []
    logs = f"; every rank's full log: {log_dir}" if log_dir else ""
    crashed = [v for v in views if v.crashed]
    hung = [v for v in views if v.hung]
    stopped = [v.rank for v in views if v.stopped]
    for v in crashed:
        tail = f"; its last words: {v.stderr_tail}" if v.stderr_tail else ""
        others = (f" ({_ranks_text(stopped)} stopped by the launcher)" if stopped else "")
        out.append(Check(
            f"rank {v.rank} crashed", FAIL,
            f"rank {v.rank} died ({v.exit_text or 'no result'}) while {v.stage}{tail}{others}",
            f"rerun with --gpus 1 to see the full error; a crash on some ranks only points "
            f"at rank-dependent code, data or a faulty GPU{logs}"))
    if hung and len(hung) == len(views) > 1 and len({v.stage for v in hung}) == 1:
        # nobody got past the same point: not one rank's bug, the group never formed
        v = hung[0]
        where = f"; rank {v.rank} was at {v.stderr_tail}" if v.stderr_tail else ""
        out.append(Check(
            "all ranks hung", FAIL,
            f"all {len(views)} ranks made no progress while {v.stage} and were killed at "
            f"--timeout {timeout:g} s{where}",
            (_fix_for_stage(v.stage) if "init_process_group" in v.stage else
             "every rank waits for the others: look for a collective that no rank reaches, "
             "or raise --timeout if the machine is only slow") + logs))
        hung = []
    if hung:
        aborted = [(v.rank, v.result["aborted"]["message"]) for v in views
                   if v.result and v.result.get("aborted")]
        said = (f"; {_ranks_text([r for r, _ in aborted])} reported: {aborted[0][1]}"
                if aborted else "")
        for v in hung:
            age = f" for {v.stage_age:.1f} s" if v.stage_age is not None else ""
            where = f", stuck at {v.stderr_tail}" if v.stderr_tail else ""
            out.append(Check(
                f"rank {v.rank} hung", FAIL,
                f"rank {v.rank} made no progress{age} while {v.stage}{where}; the group was torn "
                f"down and the rank killed (--timeout {timeout:g} s){said}",
                "find what blocks on that rank: a collective or barrier only some ranks reach "
                "(inside `if rank == 0:`), a lock, a file only rank 0 writes; raise --timeout "
                f"if it is only slow{logs}"))
    elif not crashed:
        for v in views:
            if v.result and v.result.get("aborted"):
                out.append(Check(
                    f"rank {v.rank} gave up", FAIL,
                    f"rank {v.rank} stopped while {v.result['aborted']['stage']}: "
                    f"{v.result['aborted']['message']}",
                    "a peer did not arrive in time; raise --timeout if the machine is slow"))
    if stopped and not crashed and not hung:
        out.append(Check(
            "workers stopped", FAIL,
            f"{_ranks_text(stopped)} were stopped before they finished",
            "rerun; if it repeats, run with --gpus 1"))
    for v in views:
        err = (v.result or {}).get("error")
        if err:
            out.append(Check(
                f"rank {v.rank} error", FAIL,
                f"rank {v.rank} failed while {err['stage']}: {err['type']}: {err['message']}"
                + (f" ({err['where']})" if err.get("where") else ""),
                _fix_for_stage(err["stage"]) + logs))
    return out


def _fix_for_stage(stage: str) -> str:
    if "init_process_group" in stage:
        return ("the ranks never met: MASTER_ADDR:MASTER_PORT must reach rank 0's host from "
                "every rank (no firewall on the port), the hostname must resolve to a reachable "
                "interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), every rank must agree on "
                "WORLD_SIZE; NCCL_DEBUG=INFO shows more")
    return "rerun with --gpus 1 to see the error on its own"


def process_group_checks(views: list, backend: str, device: str, world_size: int) -> list:
    results = [v.result for v in views if v.result and not v.result.get("error")]
    out = []
    if not results:
        return out
    inits = [r["init_seconds"] for r in results if "init_seconds" in r]
    if len(inits) == world_size:
        out.append(Check("process group init", PASS,
                         f"{world_size} ranks joined a {backend} group; slowest "
                         f"init_process_group {_seconds(max(inits))}"))

    peers = next((r.get("peers") for r in results if r.get("peers")), None)
    if peers:
        out.extend(identity_checks(peers, world_size, device))

    by_name: dict = {}
    for r in results:
        for c in r.get("collectives") or []:
            by_name.setdefault(c["name"], []).append((r["rank"], c))
    if by_name:
        wrong = [(name, rank, c) for name, rows in by_name.items() for rank, c in rows
                 if not c["ok"]]
        if wrong:
            name, rank, c = wrong[0]
            out.append(Check(
                "collectives", FAIL,
                f"{name} on rank {rank} gave {c['got']}, expected {c['expected']}"
                + (f" ({len(wrong) - 1} more wrong)" if len(wrong) > 1 else ""),
                "ranks disagree on who is who or the transport corrupts data: check "
                "RANK/LOCAL_RANK, CUDA_VISIBLE_DEVICES, and NCCL_P2P_DISABLE=1 / "
                "NCCL_IB_DISABLE=1 to isolate the link"))
        else:
            ar = [c.get("seconds") for rows in by_name.values() for _, c in rows
                  if c.get("seconds") is not None]
            out.append(Check(
                "collectives", PASS,
                f"{', '.join(by_name)} gave the exact expected values on all "
                f"{len(results)} ranks" + (f" (first all_reduce {_seconds(max(ar))})" if ar else "")))
    if all(r.get("barrier", {}).get("ok") for r in results) and len(results) == world_size:
        out.append(Check("monitored_barrier", PASS,
                         f"all {world_size} ranks passed a gloo monitored_barrier (a missing "
                         f"rank would be named)"))
    bws = [r.get("bandwidth") for r in results if r.get("bandwidth")]
    if bws:
        slow = min(bws, key=lambda b: b["busbw"])
        out.append(Check(
            "all_reduce bandwidth", PASS,
            f"{format_bytes(slow['bytes'])} all_reduce: {_seconds(slow['seconds'])}, "
            f"bus bandwidth {slow['busbw'] / 1e9:.2f} GB/s ({backend} on {device}, slowest rank)"))
    elif world_size == 1 and results:
        out.append(Check("all_reduce bandwidth", PASS, "1 rank: nothing to measure"))
    return out


def identity_checks(peers: list, world_size: int, device: str) -> list:
    out = []
    problems = []
    ranks = sorted(p["rank"] for p in peers)
    if ranks != list(range(world_size)):
        problems.append(f"group ranks are {ranks}, expected 0..{world_size - 1}")
    for p in peers:
        env = p.get("env") or {}
        if env.get("RANK") is not None and str(p["rank"]) != str(env["RANK"]):
            problems.append(f"rank {p['rank']} has RANK={env['RANK']}")
        if p["world_size"] != world_size or (
                env.get("WORLD_SIZE") is not None and str(env["WORLD_SIZE"]) != str(world_size)):
            problems.append(f"rank {p['rank']} sees world size {p['world_size']} "
                            f"(WORLD_SIZE={env.get('WORLD_SIZE')})")
        lr, lw = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
        if lr is not None and lw is not None and not 0 <= int(lr) < int(lw):
            problems.append(f"rank {p['rank']} has LOCAL_RANK={lr} outside "
                            f"LOCAL_WORLD_SIZE={lw}")
    seen: dict = {}
    for p in peers:
        key = (p.get("host"), (p.get("env") or {}).get("LOCAL_RANK"))
        if key[1] is not None:
            seen.setdefault(key, []).append(p["rank"])
    for (host, lr), rs in seen.items():
        if len(rs) > 1:
            problems.append(f"{_ranks_text(rs)} share LOCAL_RANK={lr} on {host}")
    if problems:
        out.append(Check(
            "rank / world size / local rank", FAIL, "; ".join(problems),
            "let the launcher set RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or derive them from "
            "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; never hard-code them"))
    else:
        out.append(Check(
            "rank / world size / local rank", PASS,
            f"RANK, WORLD_SIZE and LOCAL_RANK agree with the group on all {world_size} ranks"))

    if device == "cuda":
        users: dict = {}
        for p in peers:
            d = p.get("device") or {}
            key = (p.get("host"), d.get("uuid") or d.get("pci") or d.get("index"))
            users.setdefault(key, []).append(p["rank"])
        shared = [(key, rs) for key, rs in users.items() if len(rs) > 1]
        if shared:
            (host, dev), rs = shared[0]
            out.append(Check(
                "one GPU per rank", FAIL,
                f"{_ranks_text(rs)} use the same GPU ({dev}) on {host}: they fight for its "
                f"memory and NCCL fails or hangs",
                "torch.cuda.set_device(local_rank) before init_process_group and "
                "DDP(model, device_ids=[local_rank]); do not pin CUDA_VISIBLE_DEVICES to one "
                "GPU for all ranks"))
        else:
            out.append(Check("one GPU per rank", PASS,
                             f"{len(peers)} ranks on {len(users)} distinct GPUs"))
    else:
        out.append(Check("one GPU per rank", PASS,
                         "CPU processes (gloo): no GPU to share here; on GPUs every rank must "
                         "call torch.cuda.set_device(local_rank)"))
    return out


# -- memory ------------------------------------------------------------------------------------


def memory_report(views: list, q: MemoryQuestion) -> MemoryReport:
    rep = MemoryReport()
    mems = [(v.rank, v.result["memory"]) for v in views
            if v.result and v.result.get("memory")]
    if not mems:
        return rep
    rank, mem = mems[0]  # rank 0 speaks for all: every rank ran the same steps
    rep.data = dict(mem)
    on_cpu = mem.get("device", "cpu").startswith("cpu")

    if mem.get("factory_error"):
        err = mem["factory_error"]
        rep.checks.append(Check(
            "model factory", FAIL,
            f"--model {q.model} {'raised ' + err['type'] + ': ' if err['type'] != 'TypeError' else ''}"
            f"{err['message']} on {_ranks_text(err['ranks'])}",
            "the factory must build the model on every rank with no arguments; try it alone: "
            "python -c \"import m; m.build()\""))
        return rep
    if mem.get("host_too_small"):
        h = mem["host_too_small"]
        rep.checks.append(Check(
            "memory", WARN,
            f"not measured: parameters, gradients, DDP buckets and optimizer state alone need "
            f"{format_bytes(h['per_rank'])} per rank, {format_bytes(h['per_rank'] * h['ranks'])}"
            f" for {h['ranks']} CPU processes, more than this host's "
            f"{format_bytes(h['ram'])} of RAM allows",
            "run the preflight on the GPUs, or on CPU with --gpus 1"))
        return rep
    if mem.get("sync_bn") == "not on CPU":
        rep.checks.append(Check(
            "SyncBatchNorm", WARN,
            "SyncBatchNorm runs only on GPUs: measured with plain BatchNorm on CPU (SyncBN adds "
            "a small all_reduce of batch statistics per layer, little memory)",
            "run the preflight on the GPUs to measure SyncBN itself"))
    elif mem.get("sync_bn") == "converted":
        rep.checks.append(Check(
            "SyncBatchNorm", PASS,
            f"{mem.get('batchnorm_layers', 0)} BatchNorm layers converted before the DDP wrap"))
    if mem.get("unused"):
        names = mem["unused"]["names"]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        rep.checks.append(Check(
            "unused parameters", FAIL,
            f"DDP fails on the second step: {shown or 'some parameters'} got no gradient "
            f"(\"Expected to have finished reduction in the prior iteration\"); memory was then "
            f"measured with find_unused_parameters=True",
            "use them in forward or delete them (or set requires_grad=False); "
            "DDP(find_unused_parameters=True) also works but walks the graph every step"))
    if mem.get("bn_batch1"):
        rep.checks.append(Check(
            "batch=1 with BatchNorm", FAIL if q.target_batch == 1 else WARN,
            f"training at batch 1 raises \"{mem['bn_batch1']}\": a per-GPU batch of 1, or a "
            f"last batch of 1, crashes this model; measured at batch 2 and 3",
            "per-GPU batch of at least 2 and drop_last=True"))

    steps = mem.get("steps") or []
    for s in steps:
        ph = s["phases"]
        rep.steps.append((s["batch"], format_bytes(ph.get("forward+backward")),
                          format_bytes(ph.get("optimizer step")), format_bytes(s["peak"]),
                          "measured"))
    budget = mem.get("budget")
    reserve = mem.get("reserve") or 0
    err = mem.get("step_error")
    if err:
        if err["kind"] == "oom" and err.get("batch") == (steps[0]["batch"] if steps else 1) \
                and len(steps) <= 1:
            where = ("the model's tensor memory at batch 1 is "
                     f"{format_bytes(steps[0]['peak']) if steps else '?'}, more than "
                     f"--gpu-memory {format_bytes(budget or 0)}"
                     if err.get("simulated") else f"CUDA out of memory at batch {err['batch']}")
            rep.checks.append(Check(
                "memory at batch 1", FAIL,
                f"batch=1 does not fit: {where}. Data parallel cannot help: every GPU holds the "
                f"whole model, its gradients and optimizer state",
                "see model/tensor parallel: FSDP or ZeRO to shard parameters, gradients and "
                "optimizer state; tensor or pipeline parallel; or activation checkpointing, "
                "bf16, a smaller model (seed 000: make batch=1 run first)"))
        elif err["kind"] == "oom":
            rep.checks.append(Check(
                "memory", FAIL, f"out of memory at batch {err['batch']}: {err['message']}",
                f"the largest per-GPU batch is below {err['batch']}; use "
                f"--grad-accum or more GPUs for the global batch"))
        elif err["kind"] != "unused":
            rep.checks.append(Check(
                "training step", FAIL,
                f"the training step at batch {err.get('batch')} failed: {err['message']}",
                "the model, its --sample/--input-shape and --loss must run one forward, "
                "backward and optimizer step; rerun with --gpus 1 to see the error alone"))
        _facts(rep, mem, q, on_cpu, None)
        return rep
    if len(steps) < 2:
        return rep

    fit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in steps])
    rep.fit = fit
    usable = memfit.usable_memory(budget, reserve, q.safety_margin) if budget else None
    largest = fit.largest_batch(usable) if usable is not None else None
    rep.largest = largest
    confirm = mem.get("confirm") or {}
    target = q.target_batch
    if target and target not in [s["batch"] for s in steps]:
        pred = fit.predict(target)
        note = "predicted"
        if confirm.get("batch") == target and "measured" in confirm:
            m = confirm["measured"]
            note = (f"predicted {format_bytes(pred)}, measured {format_bytes(m)} "
                    f"({(pred - m) / m * 100:+.1f} %)")
            rep.steps.append((target, format_bytes(confirm["phases"].get("forward+backward")),
                              format_bytes(confirm["phases"].get("optimizer step")),
                              format_bytes(m), note))
        else:
            rep.steps.append((target, "", "", format_bytes(pred), note))
    if confirm.get("batch") and confirm.get("batch") != target and "measured" in confirm:
        m, pred = confirm["measured"], confirm["predicted"]
        rep.steps.append((confirm["batch"], format_bytes(confirm["phases"].get("forward+backward")),
                          format_bytes(confirm["phases"].get("optimizer step")), format_bytes(m),
                          f"largest that fits: predicted {format_bytes(pred)} "
                          f"({(pred - m) / m * 100:+.1f} %)"))

    if usable is not None:
        first = steps[0]
        rep.checks.append(Check(
            "memory at batch 1" if first["batch"] == 1 else f"memory at batch {first['batch']}",
            PASS,
            f"batch={first['batch']} fits: a full training step peaks at "
            f"{format_bytes(first['peak'])} of {format_bytes(usable)} usable (seed 000: make "
            f"batch=1 run first)"))
    if target and usable is not None:
        pred = fit.predict(target)
        if pred > usable:
            n = memfit.fewest_gpus(target * q.world_size * q.grad_accum, largest, q.grad_accum) \
                if largest else None
            fix = (f"largest per-GPU batch that fits: {largest}" if largest else
                   "not even batch 1 fits with this margin")
            if largest:
                accum = -(-target // largest)
                fix += (f"; keep the global batch with --grad-accum {accum * q.grad_accum} at "
                        f"batch {largest}" + (f", or {n} GPUs" if n else ""))
            rep.checks.append(Check(
                "memory at the target batch", FAIL,
                f"batch {target} per GPU is predicted to peak at {format_bytes(pred)}, more than "
                f"the {format_bytes(usable)} usable of {format_bytes(budget)}: it will run out "
                f"of memory", fix))
        else:
            rep.checks.append(Check(
                "memory at the target batch", PASS,
                f"batch {target} per GPU: predicted peak {format_bytes(pred)} of "
                f"{format_bytes(usable)} usable ({format_bytes(budget)} less "
                f"{q.safety_margin:.0%} margin" + (f" and {format_bytes(reserve)} reserve"
                                                   if reserve else "") + ")"))
    if "measured" in confirm:
        m, pred = confirm["measured"], confirm["predicted"]
        error = memfit.relative_error(pred, m)
        status = PASS if error <= CONFIRM_TOLERANCE else WARN
        rep.checks.append(Check(
            "memory prediction", status,
            f"a real step at batch {confirm['batch']} peaked at {format_bytes(m)}, predicted "
            f"{format_bytes(pred)} ({error:.1%} off)",
            "" if status == PASS else "the model's memory is not linear in the batch (dynamic "
            "shapes, cudnn workspaces): trust the measured figure and keep a wider margin"))
    elif confirm.get("failed"):
        rep.checks.append(Check(
            "memory prediction", FAIL,
            f"a real step at batch {confirm['batch']} (predicted {format_bytes(confirm['predicted'])})"
            f" failed: {confirm['message']}",
            "use a smaller batch than predicted; the fit underestimates this model"))
    _facts(rep, mem, q, on_cpu, usable)
    return rep


def _facts(rep: MemoryReport, mem: dict, q: MemoryQuestion, on_cpu: bool,
           usable: Optional[int]) -> None:
    f = rep.facts
    f.append(("measured with", mem.get("tool", "?")))
    if "params" in mem:
        f.append(("parameters", f"{mem['params']:,} ({format_bytes(mem['param_bytes'])}; "
                                f"gradients and DDP buckets add about as much again each)"))
    if rep.fit is not None:
        at = q.target_batch or 2
        lead = rep.fit.dominant(at)
        f.append(("fit: peak = fixed + per sample x batch",
                  f"{format_bytes(lead.fixed)} + {format_bytes(lead.per_sample)} x batch "
                  f"({lead.phase} is the peak at batch {at})"))
        for ln in rep.fit.lines:
            if ln is not lead:
                f.append((f"other phase: {ln.phase}", f"{format_bytes(ln.fixed)} + "
                                           f"{format_bytes(ln.per_sample)} x batch"))
    budget = mem.get("budget")
    if budget:
        src = "the device" if mem.get("budget_from_device") else "--gpu-memory"
        f.append(("memory budget", f"{format_bytes(budget)} ({src})"))
        reserve = mem.get("reserve") or 0
        if on_cpu:
            f.append(("kept aside", f"{q.safety_margin:.0%} margin"
                      + (f" + {format_bytes(reserve)} --reserve" if reserve else
                         "; CPU run: the CUDA context, NCCL buffers and allocator rounding are "
                         "not included (on GPUs they are measured): pass --reserve SIZE to "
                         "keep room for them")))
        else:
            f.append(("kept aside", f"{q.safety_margin:.0%} margin + {format_bytes(reserve)} "
                                    f"outside PyTorch's allocator (CUDA context, NCCL, other "
                                    f"processes)"))
        if usable is not None:
            f.append(("usable for a step", format_bytes(usable)))
        if rep.fit is not None:
            if rep.largest is None:
                f.append(("largest per-GPU batch", "not bounded: memory did not grow with the batch"))
            else:
                f.append(("largest per-GPU batch that fits", str(rep.largest)))
                base = q.baseline_global
                if base and rep.largest >= 1:
                    n = memfit.fewest_gpus(base, rep.largest, q.grad_accum)
                    f.append((f"fewest GPUs for global batch {base}",
                              f"{n} (at {-(-base // (n * q.grad_accum))} per GPU"
                              + (f", grad-accum {q.grad_accum}" if q.grad_accum > 1 else "")
                              + "; per-GPU batch = global / GPUs, seed 000)"))
    elif rep.fit is not None:
        f.append(("largest per-GPU batch", "give --gpu-memory (e.g. 24GiB) to get it"
                  if on_cpu else "?"))
    over = mem.get("overhead") or {}
    if over.get("outside_allocator") is not None and not on_cpu:
        f.append(("outside the allocator", f"{format_bytes(over['outside_allocator'])} "
                                            f"(CUDA context, NCCL, other processes)"))
    conf = mem.get("confirm") or {}
    if conf.get("skipped"):
        f.append(("confirmation step", f"skipped: {conf['skipped']}"))
