"""How fast is `ddpcheck lint` on a big real code base?

Lints the installed torch package's own source with the real runner (all
cores, prefilter, process pool) and, in the same run over the same files,
times a plain single-process `libcst.parse_module` of each file. The figure
that matters is the ratio ddpcheck / bare parse (target: below 0.5): it
compares against a baseline measured on the same machine at the same moment,
so it means something on any machine.

    python benchmarks/lint_speed.py            # every file of torch
    python benchmarks/lint_speed.py --limit 300  # a quick, evenly spread subset
    python benchmarks/lint_speed.py --repeat 2   # best of two, alternated
    python benchmarks/lint_speed.py --no-cache-runs  # skip the cold/warm cache runs

torch is located without being imported (ddpcheck lint never imports it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import libcst

from ddpcheck.lint.config import known_codes
from ddpcheck.lint.discovery import discover
from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import might_have_findings
from ddpcheck.lint.runner import default_jobs, lint_files


def torch_source_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: pip install torch==2.13.0")
    return Path(list(spec.submodule_search_locations)[0])


def evenly_spread(files: list[str], limit: int | None) -> list[str]:
    if not limit or limit >= len(files):
        return files
    step = len(files) / limit
    return [files[int(i * step)] for i in range(limit)]


def bare_parse(files: list[str]) -> tuple[float, int]:
    """Seconds to read and libcst-parse every file in this process; failures."""
    failures = 0
    start = time.perf_counter()
    for path in files:
        try:
            libcst.parse_module(Path(path).read_text(encoding="utf-8"))
        except (libcst.ParserSyntaxError, UnicodeDecodeError, RecursionError):
            failures += 1
    return time.perf_counter() - start, failures


def ruff_executable() -> str | None:
    """ruff beside this Python (a venv) or on PATH; None when not installed."""
    here = Path(sys.executable).parent / "ruff"
    return str(here) if here.exists() else shutil.which("ruff")


def children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes of this one:
    the lint's worker processes and ruff's threads, counted apart from what
    other jobs on the machine take (on a busy machine wall time says little)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ruff_check(files: list[str], ruff: str) -> tuple[float, float]:
    """Seconds and CPU seconds for `ruff check` (its default rules, all cores, no cache) over the same files."""
    cpu = children_cpu()
    start = time.perf_counter()
    subprocess.run([ruff, "check", "--isolated", "--no-cache", "--exit-zero", "--quiet", *files],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env=dict(os.environ, RUFF_NO_CACHE="true"))
    return time.perf_counter() - start, children_cpu() - cpu


def ddpcheck_lint(files: list[str], jobs: int) -> tuple[float, float, list]:
    """Seconds, the worker processes' CPU seconds, and the results of the real runner."""
    settings = LintSettings(enabled=frozenset(known_codes()))
    cpu = children_cpu()
    start = time.perf_counter()
    results = lint_files([(path, settings) for path in files], jobs)
    return time.perf_counter() - start, children_cpu() - cpu, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="lint only N files, evenly spread")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="ddpcheck worker processes")
    parser.add_argument("--repeat", type=int, default=1,
                        help="alternate the two measurements N times and keep each one's best: "
                             "on a busy machine this keeps other load from landing on one side only")
    parser.add_argument("--no-cache-runs", action="store_true", help="skip the cold/warm result-cache runs")
    args = parser.parse_args()

    root = torch_source_dir()
    files = evenly_spread(discover([str(root)]).files, args.limit)
    texts = [Path(f).read_bytes() for f in files]  # also warms the page cache for both timings
    lines = sum(t.count(b"\n") for t in texts)
    prefiltered = sum(might_have_findings(t.decode("utf-8", "replace")) for t in texts)
    del texts

    ruff = ruff_executable()
    lint_s = parse_s = ruff_s = lint_cpu = ruff_cpu = float("inf")
    for _ in range(max(1, args.repeat)):
        seconds, cpu, results = ddpcheck_lint(files, args.jobs)
        lint_s, lint_cpu = min(lint_s, seconds), min(lint_cpu, cpu)
        seconds, parse_failures = bare_parse(files)
        parse_s = min(parse_s, seconds)
        if ruff is not None:
            seconds, cpu = ruff_check(files, ruff)
            ruff_s, ruff_cpu = min(ruff_s, seconds), min(ruff_cpu, cpu)
    findings = sum(len(r.findings) for r in results)
    errors = sum(r.error is not None for r in results)

    print(f"torch source:     {root}")
    print(f"files:            {len(files)} ({lines:,} lines); {prefiltered} pass the prefilter "
          f"({100 * prefiltered / max(1, len(files)):.0f} %)")
    print(f"ddpcheck lint:    {lint_s:7.2f} s  {len(files) / lint_s:8.0f} files/s  "
          f"({args.jobs} jobs; {findings} findings, {errors} unreadable; workers' CPU {lint_cpu:.2f} s)")
    print(f"bare libcst parse:{parse_s:7.2f} s  {len(files) / parse_s:8.0f} files/s  "
          f"(1 process; {parse_failures} failed to parse)")
    ratio = lint_s / parse_s
    verdict = "ok" if ratio < 0.5 else "SLOWER THAN TARGET"
    print(f"ratio:            {ratio:.2f}x the bare parse (target < 0.5x): {verdict}")
    if ruff is not None:
        to_ruff = lint_s / ruff_s
        print(f"ruff check:       {ruff_s:7.2f} s  {len(files) / ruff_s:8.0f} files/s  (default rules, all cores, "
              f"no cache; CPU {ruff_cpu:.2f} s)")
        print(f"ddpcheck / ruff:  {to_ruff:.1f}x (about 12x before value flow; must not grow, aim 6x): "
              f"{'ok' if to_ruff <= 12 else 'SLOWER THAN BEFORE'}")
        print(f"CPU seconds:      {lint_cpu / ruff_cpu:.1f}x ruff's (the same work measured apart from other load "
              f"on the machine; best of {max(1, args.repeat)})")
    else:
        print("ruff check:       not installed (pip install ruff to compare)")
    if not args.no_cache_runs:
        cache_runs(files, args.jobs)


def cache_runs(files: list[str], jobs: int) -> None:
    """The same lint through the result cache: a cold run (empty cache: lint
    and write every entry) then a warm one (nothing changed: every result read
    back). Target: the warm run at most 1/5 of the cold one."""
    import tempfile

    from ddpcheck.lint.command import lint_cached

    settings = LintSettings(enabled=frozenset(known_codes()))
    tasks = [(path, settings) for path in files]
    with tempfile.TemporaryDirectory(prefix="ddpcheck-cache-") as folder:
        start = time.perf_counter()
        cold = lint_cached(tasks, jobs, Path(folder))
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        warm = lint_cached(tasks, jobs, Path(folder))
        warm_s = time.perf_counter() - start
    same = [(r.path, r.findings, r.error) for r in cold] == [(r.path, r.findings, r.error) for r in warm]
    ratio = warm_s / cold_s
    print(f"cached, cold:     {cold_s:7.2f} s  (empty cache: lint and write each entry)")
    print(f"cached, warm:     {warm_s:7.2f} s  (unchanged tree; same results: {same})")
    print(f"warm/cold:        {ratio:.2f}x (target <= 0.2x, 5x faster): "
          f"{'ok' if ratio <= 0.2 and same else 'SLOWER THAN TARGET'}")


if __name__ == "__main__":
    main()
