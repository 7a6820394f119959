"""Print a script preflight: runtime checks with their rule codes, the writes
that were kept away from the user's folders, and ``ddpcheck lint`` beside."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Optional

from tabulate import tabulate

from ddpcheck.preflight.checks import FAIL, PASS, WARN
from ddpcheck.preflight.writes import writes_table


@dataclass
class ScriptReport:
    """The script mode's result: what ran, the checks, lint beside, every rank's facts
    (typed; :meth:`to_dict` is the ``--format json`` document)."""

    headline: str
    target: str
    argv: list
    world_size: int
    one_process: bool
    nodes: int
    backend: str
    device: str
    cuda_stand_in: bool
    steps: int
    checks: list  # checks.Check, failures first
    lint: list  # judge.LintLink
    lint_error: Optional[str]
    writes: list = field(default_factory=list)  # writes.Write rows: every change, by rank
    ranks: list = field(default_factory=list)  # RankFacts.to_dict() per rank
    seconds: float = 0.0
    workers_seconds: float = 0.0
    worker_logs: Optional[str] = None
    exit_code: int = 0
    sandbox: str = ""  # how the run was isolated (sandbox.Sandbox.summary())
    unsandboxed: bool = False  # no OS sandbox: the first line of the report says so
    degraded: bool = False  # a weaker sandbox than bwrap's (Landlock, or none)

    def to_dict(self) -> dict:
        return {
            "mode": "script", "summary": self.headline, "target": self.target,
            "argv": self.argv, "world_size": self.world_size, "one_process": self.one_process,
            "nodes": self.nodes, "backend": self.backend, "device": self.device,
            "cuda_stand_in": self.cuda_stand_in, "steps": self.steps,
            "checks": [c.to_dict() for c in self.checks],
            "lint": [vars(x) for x in self.lint], "lint_error": self.lint_error,
            "writes": self.writes, "ranks": self.ranks,
            "timing": {"total_seconds": self.seconds, "workers_seconds": self.workers_seconds},
            "worker_logs": self.worker_logs, "sandbox": self.sandbox,
            "exit_code": self.exit_code,
        }


def _width() -> int:
    return max(100, min(shutil.get_terminal_size((120, 24)).columns, 160))


def _wrap_rows(rows, widths) -> list:
    """Wrap cells ourselves (tabulate's maxcolwidths turns 'False' into True)."""
    return [tuple("\n".join(textwrap.wrap(str(cell), w, break_on_hyphens=False)) or str(cell)
                  if w else cell for cell, w in zip(row, widths)) for row in rows]




def render_text(result: ScriptReport) -> str:
    report = result.to_dict()
    lines = [result.headline, ""]
    if result.sandbox and result.degraded:
        # the full sandbox goes without saying (json has it); a weaker one is said
        lines.insert(0 if result.unsandboxed else 1, result.sandbox)
    width = _width() - 10
    for v in report["checks"]:
        lines.append(textwrap.fill(v["name"], width, initial_indent=f"{v['status']:<6}",
                                   subsequent_indent=" " * 6, break_on_hyphens=False))
        if v["detail"]:
            lines.append(textwrap.fill(v["detail"], width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6, break_on_hyphens=False))
        if v["fix"]:
            lines.append(textwrap.fill("fix: " + v["fix"], width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 11, break_on_hyphens=False))
    lines += writes_table(report.get("writes") or [])
    lint = report.get("lint") or []
    lines += ["", f"ddpcheck lint {report['target']}:"]
    if report.get("lint_error"):
        lines.append(f"  not linted: {report['lint_error']}")
    elif not lint:
        lines.append("  no findings")
    else:
        rows = [(f"{x['code']}", x["line"], x["severity"], x["runtime"], x["message"])
                for x in lint]
        lines.append(tabulate(_wrap_rows(rows, (None, None, None, 14, width - 50)),
                              headers=("rule", "line", "severity", "at run time", "finding"),
                              tablefmt="simple", disable_numparse=True))
    counts = {s: sum(1 for v in report["checks"] if v["status"] == s) for s in (FAIL, WARN, PASS)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no checks"
    lines += ["", f"{summary} -> exit {report['exit_code']} "
                  f"({report['timing']['total_seconds']:.1f} s)"]
    if report.get("worker_logs"):
        lines.append(f"every rank's output: {report['worker_logs']}")
    return "\n".join(lines)


def render_json(result: ScriptReport) -> str:
    return json.dumps(result.to_dict(), indent=2, default=str)
