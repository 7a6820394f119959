"""Print the preflight: the checks table, the arithmetic, the memory table, or json."""

from __future__ import annotations

import json
import shutil
import textwrap
from typing import Any

from tabulate import tabulate

from ddpcheck.preflight.checks import FAIL, PASS, WARN
from ddpcheck.preflight.datachecks import GUIDE_HEADERS, RANK_HEADERS


def _widths() -> tuple[int, int]:
    cols = shutil.get_terminal_size((120, 24)).columns
    cols = max(100, min(cols, 160))
    detail = (cols - 40) * 3 // 5
    fix = cols - 40 - detail
    return detail, fix


def _wrap(text, width: int) -> str:
    """Wrap a cell ourselves: tabulate's maxcolwidths turns the string 'False' into True."""
    text = "" if text is None else str(text)
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _wrap_rows(rows, widths) -> list:
    return [tuple(_wrap(cell, w) if w else cell for cell, w in zip(row, widths)) for row in rows]


def render_text(report: dict) -> str:
    lines = [report["headline"], ""]
    detail_w, fix_w = _widths()
    rows = [(c["status"], c["name"], c["detail"], c["fix"]) for c in report["checks"]]
    rows = _wrap_rows(rows, (None, 24, detail_w, fix_w))
    lines.append(tabulate(rows, headers=("", "check", "result", "fix"), tablefmt="simple_grid",
                          disable_numparse=True))
    arith = report.get("arithmetic")
    if arith:
        lines += ["", "Data-set arithmetic (what DistributedSampler + DataLoader give every rank)"]
        lines.append(tabulate(_wrap_rows(arith["rows"], (34, 90)), tablefmt="simple",
                              disable_numparse=True))
        lines += ["", tabulate(arith["ranks"], headers=RANK_HEADERS, tablefmt="simple")]
        if arith.get("guide"):
            lines += ["", "No --batch-size given; per-GPU batch sizes and what they leave over:",
                      tabulate(arith["guide"], headers=GUIDE_HEADERS, tablefmt="simple")]
    mem = report.get("memory")
    if mem and (mem.get("steps") or mem.get("facts")):
        lines += ["", "Memory of one training step per rank (forward, backward, optimizer step)"]
        if mem.get("steps"):
            lines.append(tabulate(mem["steps"], headers=("batch", "forward+backward",
                                                         "optimizer step", "peak", ""),
                                  tablefmt="simple"))
            lines.append("")
        lines.append(tabulate(_wrap_rows(mem["facts"], (40, 90)), tablefmt="simple",
                              disable_numparse=True))
    counts = {s: sum(1 for c in report["checks"] if c["status"] == s) for s in (FAIL, WARN, PASS)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no checks"
    lines += ["", f"{summary} -> exit {report['exit_code']} "
                  f"({report['timing']['total_seconds']:.1f} s)"]
    return "\n".join(lines)


def render_json(report: dict) -> str:
    def default(obj: Any):
        if hasattr(obj, "to_dict"):
            return obj.to_dict()
        return str(obj)

    out = {k: v for k, v in report.items() if k != "headline"}
    out["summary"] = report["headline"]
    return json.dumps(out, indent=2, default=default)
