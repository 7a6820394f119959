"""Lint many files: in-process for a handful (a pre-commit run must feel
instant, and starting workers costs more than linting three files), a forked
process pool across cores for many. Results come back sorted by path, so the
output never depends on scheduling."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Sequence

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.findings import FileResult

# Below this many files the pool's start-up outweighs the parallelism.
IN_PROCESS_MAX_FILES = 16

Task = tuple[str, LintSettings]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # honours CPU pinning / cgroups
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def lint_one(task: Task) -> FileResult:
    """Lint one file; a crash inside ddpcheck becomes that file's error, not
    the end of the whole run."""
    path, settings = task
    try:
        return lint_path(path, settings)
    except RecursionError:
        return FileResult(path=path, error="too deeply nested for ddpcheck to analyse")
    except Exception as exc:  # a bug in a rule must not hide the other files' findings
        return FileResult(path=path, error=f"internal error ({type(exc).__name__}: {exc}); please report this")


def _pool_context():
    # fork: workers inherit the already-imported libcst and rules for free.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # unreadable: lint_one reports it, in no time


def chunks_biggest_first(tasks: Sequence[Task], workers: int) -> list[list[Task]]:
    """Batches of tasks, biggest files first, each batch about 1/(16 x workers)
    of the bytes. Largest-first keeps one huge file from starting last and
    leaving the other workers idle; batching keeps the per-task overhead of
    the many small (mostly prefiltered-out) files low."""
    sized = sorted(((_size(t[0]), t) for t in tasks), key=lambda st: (-st[0], st[1][0]))
    budget = max(1, sum(size for size, _ in sized) // (workers * 16))
    batches: list[list[Task]] = []
    current: list[Task] = []
    current_bytes = 0
    for size, task in sized:
        if current and current_bytes + size > budget:
            batches.append(current)
            current, current_bytes = [], 0
        current.append(task)
        current_bytes += size
    if current:
        batches.append(current)
    return batches


def lint_batch(batch: list[Task]) -> list[FileResult]:
    return [lint_one(task) for task in batch]


def lint_files(tasks: Sequence[Task], jobs: int) -> list[FileResult]:
    tasks = sorted(tasks, key=lambda t: t[0])
    if jobs <= 1 or len(tasks) <= IN_PROCESS_MAX_FILES:
        return [lint_one(t) for t in tasks]
    workers = min(jobs, len(tasks))
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
            futures = [pool.submit(lint_batch, batch) for batch in chunks_biggest_first(tasks, workers)]
            results = [result for future in futures for result in future.result()]
    except (BrokenProcessPool, OSError):
        # No usable process pool (sandbox without /dev/shm, a worker killed):
        # still give an answer, just a slower one.
        results = [lint_one(t) for t in tasks]
    return sorted(results, key=lambda r: r.path)
