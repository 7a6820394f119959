"""Print a script preflight: runtime verdicts with their rule codes, the writes
that were kept away from the user's folders, and ``ddpcheck lint`` beside."""

from __future__ import annotations

from ddpcheck.preflight.units import relative_path

import json
import shutil
import textwrap

from tabulate import tabulate

from ddpcheck.preflight.checks import FAIL, PASS, WARN


def _width() -> int:
    return max(100, min(shutil.get_terminal_size((120, 24)).columns, 160))


def _wrap_rows(rows, widths) -> list:
    """Wrap cells ourselves (tabulate's maxcolwidths turns 'False' into True)."""
    return [tuple("\n".join(textwrap.wrap(str(cell), w, break_on_hyphens=False)) or str(cell)
                  if w else cell for cell, w in zip(row, widths)) for row in rows]




def render_text(report: dict) -> str:
    lines = [report["headline"], ""]
    width = _width() - 10
    for v in report["verdicts"]:
        lines.append(textwrap.fill(v["title"], width, initial_indent=f"{v['status']:<6}",
                                   subsequent_indent=" " * 6, break_on_hyphens=False))
        if v["detail"]:
            lines.append(textwrap.fill(v["detail"], width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6, break_on_hyphens=False))
        if v["fix"]:
            lines.append(textwrap.fill("fix: " + v["fix"], width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 11, break_on_hyphens=False))
    writes = report.get("writes") or []
    if writes:
        lines += ["", "Writes kept out of your folders (redirected to scratch, then deleted):"]
        rows = [(w["rank"], w["kind"], relative_path(w["path"]), w["where"],
                 w["count"] if w["count"] > 1 else "") for w in writes[:20]]
        lines.append(tabulate(rows, headers=("rank", "what", "path", "line", "times"),
                              tablefmt="simple", disable_numparse=True))
        if len(writes) > 20:
            lines.append(f"... and {len(writes) - 20} more (--format json lists them all)")
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
    counts = {s: sum(1 for v in report["verdicts"] if v["status"] == s) for s in (FAIL, WARN, PASS)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no checks"
    lines += ["", f"{summary} -> exit {report['exit_code']} "
                  f"({report['timing']['total_seconds']:.1f} s)"]
    if report.get("worker_logs"):
        lines.append(f"every rank's output: {report['worker_logs']}")
    return "\n".join(lines)


def render_json(report: dict) -> str:
    out = {k: v for k, v in report.items() if k != "headline"}
    out["summary"] = report["headline"]
    return json.dumps(out, indent=2, default=str)
