"""Print the preflight: the checks, the arithmetic, the memory tables, or json.

Formatting only: every judgement is already in the checks (:mod:`verdict`,
:mod:`memverdict`, :mod:`datachecks`). Text fits the terminal, at most 100
columns (``COLUMNS`` is honoured; narrower terminals get narrower, wrapped
cells).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional

from tabulate import tabulate

from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check
from ddpcheck.preflight.memfit import StepMemory
from ddpcheck.preflight.results import MemoryResult, RankResult, to_json_dict
from ddpcheck.preflight.units import format_bytes as fb
from ddpcheck.preflight.writes import writes_table

MAX_WIDTH = 100
MIN_WIDTH = 60
PHASE_FB = "forward+backward"
PHASE_OPT = "optimizer step"


@dataclass
class Arithmetic:
    rows: list = field(default_factory=list)  # (key, value)
    ranks: list = field(default_factory=list)  # per-rank rows (DDP)
    rank_headers: tuple = ()
    guide: list = field(default_factory=list)  # per-batch rows without --batch-size
    guide_headers: tuple = ()
    title: str = "Data-set arithmetic (what DistributedSampler + DataLoader give every rank)"


@dataclass
class PreflightReport:
    headline: str
    world_size: int
    backend: str
    device: str
    launcher: str
    checks: list[Check]
    exit_code: int
    total_seconds: float
    workers_seconds: float = 0.0
    arithmetic: Optional[Arithmetic] = None
    memory: Optional[MemoryResult] = None
    memory_target: Optional[int] = None
    safety_margin: float = 0.10
    baseline_global: Optional[int] = None
    grad_accum: int = 1
    ranks: list[RankResult] = field(default_factory=list)
    worker_logs: Optional[str] = None
    sandbox: str = ""  # how the run was isolated (one line; first when there was none)
    unsandboxed: bool = False  # no OS sandbox: the report says so on its first line
    degraded: bool = False  # a weaker sandbox than bwrap's (Landlock, or none)
    writes: list = field(default_factory=list)  # writes.Write: what the user's code changed


def terminal_width() -> int:
    cols = shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(MIN_WIDTH, min(cols, MAX_WIDTH))


def _wrap(text, width: int) -> str:
    """Wrap a cell ourselves: tabulate's maxcolwidths turns the string 'False' into True."""
    text = "" if text is None else str(text)
    out = []
    for para in text.split("\n"):
        out.append("\n".join(textwrap.wrap(para, max(8, width), break_on_hyphens=False,
                                           break_long_words=True)) or para)
    return "\n".join(out)


def _kv_table(rows, width: int, key_width: int = 30) -> str:
    key_w = min(key_width, max((len(str(k)) for k, _ in rows), default=10))
    value_w = width - key_w - 2
    wrapped = [(_wrap(k, key_w), _wrap(v, value_w)) for k, v in rows]
    return tabulate(wrapped, tablefmt="simple", disable_numparse=True)


def _table_with_note(rows, headers, width: int) -> str:
    """A table whose last column is free text: wrapped into what the others leave."""
    if not rows:
        return ""
    fixed = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers[:-1])]
    # tabulate pads every column by 2 and separates columns by 2
    note_w = max(12, width - sum(fixed) - 4 * len(fixed) - 2)
    wrapped = [tuple(r[:-1]) + (_wrap(r[-1], note_w),) for r in rows]
    return tabulate(wrapped, headers=headers, tablefmt="simple", disable_numparse=True)


def checks_table(checks: list[Check], width: int) -> str:
    name_w = 22
    result_w = width - 4 - name_w - 10  # three columns of a grid: 10 characters of borders
    rows = []
    for c in checks:
        cell = c.detail + (f"\nfix: {c.fix}" if c.fix else "")
        rows.append((c.status.value, _wrap(c.name, name_w), _wrap(cell, result_w)))
    return tabulate(rows, headers=("", "check", "result"), tablefmt="simple_grid",
                    disable_numparse=True)


def memory_tables(report: PreflightReport, width: int) -> list[str]:
    mem = report.memory
    if mem is None or (not mem.steps and mem.fit is None and mem.state is None):
        return []
    out = ["", "Memory of one training step per rank (forward, backward, optimizer step)"]
    rows = [_step_row(s, "measured") for s in mem.steps]
    for c in mem.confirmations:
        what = "largest that fits? " if c.purpose == "largest" else ""
        if c.measured is None:
            rows.append((c.batch, "", "", fb(c.predicted), f"{what}predicted; the step failed"))
            continue
        fits = "" if mem.usable is None else (" fits" if c.measured <= mem.usable else
                                               " does NOT fit")
        rows.append((c.batch, "", "", fb(c.measured),
                     f"{what}predicted {fb(c.predicted)}, measured {fb(c.measured)} "
                     f"({c.error:+.1%}){fits}"))
    target = report.memory_target
    if target and mem.fit is not None and target not in {r[0] for r in rows}:
        rows.append((target, "", "", fb(mem.fit.predict(target)), "predicted"))
    if rows:
        out.append(_table_with_note(rows, ("batch", PHASE_FB, PHASE_OPT, "peak", ""), width))
        out.append("")
    out.append(_kv_table(memory_facts(report), width, key_width=34))
    return out


def _step_row(s: StepMemory, note: str) -> tuple:
    ph = s.phases
    return (s.batch, fb(ph.get(PHASE_FB)) if PHASE_FB in ph else "",
            fb(ph.get(PHASE_OPT)) if PHASE_OPT in ph else "", fb(s.peak), note)


def memory_facts(report: PreflightReport) -> list[tuple[str, str]]:
    from ddpcheck.preflight import memfit

    mem = report.memory
    on_cpu = mem.device.startswith("cpu")
    f = [("measured with", mem.tool or "-")]
    if mem.amp:
        f.append(("mixed precision", f"torch.autocast({mem.amp})"
                  + (" with GradScaler" if mem.amp == "fp16" else "")))
    if mem.params:
        f.append(("parameters", f"{mem.params:,} ({fb(mem.param_bytes)})"))
    if mem.state is not None:
        s = mem.state
        f.append(("model state before activations",
                  f"{fb(s.total)} = parameters {fb(s.params)} + gradients {fb(s.grads)}"
                  + (f" + DDP buckets {fb(s.buckets)}" if s.buckets else "")
                  + (f" + optimizer {fb(s.optimizer)}" if s.optimizer is not None else
                     " (+ optimizer state, not known in advance)")))
    if mem.fit is not None:
        at = report.memory_target or max(mem.fit.batches)
        lead = mem.fit.dominant(at)
        f.append(("fit: peak = fixed + per sample x batch",
                  f"{fb(lead.fixed)} + {fb(lead.per_sample)} x batch ({lead.phase} is the peak; "
                  f"fitted on batches {', '.join(map(str, mem.fit.batches))})"))
        for ln in mem.fit.lines:
            if ln is not lead:
                f.append((f"other phase: {ln.phase}",
                          f"{fb(ln.fixed)} + {fb(ln.per_sample)} x batch"))
    if mem.budget:
        src = "the device" if mem.budget_from_device else "--gpu-memory"
        f.append(("memory budget", f"{fb(mem.budget)} ({src})"))
        if on_cpu:
            f.append(("kept aside", f"{report.safety_margin:.0%} margin"
                      + (f" + {fb(mem.reserve)} --reserve" if mem.reserve else
                         "; on CPU the CUDA context, NCCL buffers and allocator rounding are "
                         "not included: pass --reserve SIZE to keep room for them")))
        else:
            f.append(("kept aside", f"{report.safety_margin:.0%} margin + {fb(mem.reserve)} "
                                    f"outside PyTorch's allocator (CUDA context, NCCL, others)"))
        if mem.usable is not None:
            f.append(("usable for a step", fb(mem.usable)))
        if mem.fit is not None:
            if mem.largest is None:
                f.append(("largest per-GPU batch", "not bounded: memory did not grow with it"))
            else:
                f.append(("largest per-GPU batch that fits", str(mem.largest)
                          + (" (its own step confirmed it)" if mem.largest_confirmed else
                             " (predicted)")))
                base = report.baseline_global
                if base and mem.largest >= 1:
                    n = memfit.fewest_gpus(base, mem.largest, report.grad_accum)
                    f.append((f"fewest GPUs for global batch {base}",
                              f"{n} (at {-(-base // (n * report.grad_accum))} per GPU"
                              + (f", grad-accum {report.grad_accum}" if report.grad_accum > 1
                                 else "") + ")"))
    elif mem.fit is not None:
        f.append(("largest per-GPU batch", "give --gpu-memory (e.g. 24GiB) to get it"
                  if on_cpu else "?"))
    if mem.outside_allocator is not None and not on_cpu:
        f.append(("outside the allocator", f"{fb(mem.outside_allocator)} (CUDA context, "
                                            f"NCCL, other processes)"))
    if mem.confirm_skipped:
        f.append(("confirmation step", f"skipped: {mem.confirm_skipped}"))
    return f


def render_text(report: PreflightReport, width: Optional[int] = None) -> str:
    width = width or terminal_width()
    lines = [_wrap(report.headline, width), ""]
    if report.sandbox and report.degraded:
        # the full sandbox goes without saying (json has it); a weaker one is said
        if report.unsandboxed:
            lines = [_wrap(report.sandbox, width)] + lines
        else:
            lines.insert(1, _wrap(report.sandbox, width))
    lines.append(checks_table(report.checks, width))
    arith = report.arithmetic
    if arith:
        lines += ["", _wrap(arith.title, width), _kv_table(arith.rows, width)]
        if arith.ranks:
            lines += ["", tabulate(arith.ranks, headers=arith.rank_headers, tablefmt="simple")]
        if arith.guide:
            lines += ["", _wrap("No --batch-size given; per-GPU batch sizes, their last batch "
                                "and what drop_last=True would drop per rank:", width),
                      _table_with_note(arith.guide, arith.guide_headers, width)]
    lines += memory_tables(report, width)
    lines += writes_table(report.writes)
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in (FAIL, WARN, PASS)}
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no checks"
    lines += ["", f"{summary} -> exit {report.exit_code} ({report.total_seconds:.1f} s)"]
    return "\n".join(lines)


def report_dict(report: PreflightReport) -> dict:
    out: dict[str, Any] = {
        "summary": report.headline,
        "world_size": report.world_size,
        "backend": report.backend,
        "device": report.device,
        "launcher": report.launcher,
        "checks": [c.to_dict() for c in report.checks],
        "arithmetic": None,
        "memory": None,
        "ranks": [_rank_json(r) for r in report.ranks],
        "timing": {"total_seconds": report.total_seconds,
                   "workers_seconds": report.workers_seconds},
        "worker_logs": report.worker_logs,
        "sandbox": report.sandbox,
        "writes": [to_json_dict(w) for w in report.writes],
        "exit_code": report.exit_code,
    }
    if report.arithmetic:
        a = report.arithmetic
        out["arithmetic"] = {"rows": [list(r) for r in a.rows], "ranks": [list(r) for r in a.ranks],
                             "guide": [list(r) for r in a.guide]}
    if report.memory is not None:
        out["memory"] = {"measured": to_json_dict(report.memory),
                         "facts": [list(r) for r in memory_facts(report)]}
    return out


def _rank_json(r: RankResult) -> dict:
    data = to_json_dict(r)
    data.pop("everyone", None)
    data["ok"] = r.ok
    return data


def render_json(report: PreflightReport) -> str:
    return json.dumps(report_dict(report), indent=2, default=str)
