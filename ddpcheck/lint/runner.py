"""Lint many files in worker processes, so that no input can take the run down.

libcst's parser is native code: on a pathological input it can spin for
minutes and then overflow its stack (a segfault, not an exception). So files
are never parsed in ddpcheck's own process. A supervisor forks workers
(one for a handful of files: a pre-commit run stays instant; one per core
for many), sends each a batch of files and gets one result back per file, in
order. When a worker dies, the file it was on is reported as crashed and the
rest of its batch goes to a fresh worker; when a file runs past its time
limit, its worker is killed and the file reported as timed out. Nothing is
ever re-run in-process after a death. Results come back sorted by path, so
the output never depends on scheduling.

Where no worker process can be started at all (no fork, a sandbox refusing
pipes or processes), files are linted in-process: Python's own parser still
refuses up front what would crash libcst, but nothing bounds the time."""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import NamedTuple, Sequence

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import Projects, lint_path
from ddpcheck.findings import ErrorKind, FileError, FileResult

# Up to this many files one worker lints them all: starting more costs more
# than linting a pre-commit's handful.
IN_PROCESS_MAX_FILES = 16
# Per-file time limit: generous for any real file (libcst parses ~10k lines
# a second per core, a 1 MB file in a few seconds), short of the minutes a
# pathological one can spin before it crashes.
FILE_TIME_LIMIT_S = 60.0
TIME_PER_MEGABYTE_S = 60.0
# A worker collects reference cycles itself, between files, once the objects
# allocated since its last collection (a parsed file's model and tree are
# freed only as cycles) pass its share of this many, about 500 MB in all
# (see _collect_between_files). The workers of a run share it, so the memory
# they hold does not grow with the number of cores.
GARBAGE_OBJECTS_PER_RUN = 8_000_000
GC_AFTER_ALLOCATIONS = 20_000   # the least a worker lets pile up
# Batches per worker (chunks_in_path_order). The cost of a batch is not its
# bytes: the few files that pass the prefilter (and the helper modules they
# reach) are nearly all of it, so a run's last batch can hold seconds of
# work while the other worker, its own run done, has nothing left to take.
# At 16 per worker, linting torch's source, one of two workers idled 1.4 to
# 2.0 s at the end; at 64, 0.3 to 0.5 s (the same 87 helper modules parsed,
# none by both workers, the same CPU).
BATCHES_PER_WORKER = 64


class LintTask(NamedTuple):
    path: str
    settings: LintSettings
    named: bool = False   # named on the command line: a syntax error is reported whatever the prefilter says


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # honours CPU pinning / cgroups
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def lint_one(task: LintTask, projects: Projects | None = None) -> FileResult:
    """Lint one file; a Python-level crash inside ddpcheck becomes that file's
    error, not the end of the whole run."""
    try:
        return lint_path(task.path, task.settings, task.named, projects)
    except RecursionError:
        return FileResult(path=task.path, error=FileError(
            ErrorKind.TOO_COMPLEX, "nested too deeply for ddpcheck to analyse"))
    except Exception as exc:  # a bug in ddpcheck must not hide the other files' findings
        return FileResult(path=task.path, error=FileError(
            ErrorKind.INTERNAL, f"internal error ({type(exc).__name__}: {exc}); please report this"))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # unreadable: lint_one reports it, in no time


def time_limit_for(path: str, base: float = FILE_TIME_LIMIT_S) -> float:
    return base + TIME_PER_MEGABYTE_S * _size(path) / 1e6


def chunks_in_path_order(tasks: Sequence[LintTask], workers: int) -> list[list[LintTask]]:
    """Batches of tasks in path order, each about 1/(BATCHES_PER_WORKER x
    workers) of the bytes (a file bigger than that is a batch of its own).
    Path order keeps the files of one package together: they import the same
    helper modules, which a worker parses once for all the files it lints
    (see _Supervisor: each worker takes a run of consecutive batches);
    batching keeps the per-task overhead of the many small (mostly
    prefiltered-out) files low."""
    sized = [(_size(t.path), t) for t in sorted(tasks, key=lambda t: t.path)]
    budget = max(1, sum(size for size, _ in sized) // (workers * BATCHES_PER_WORKER))
    batches: list[list[LintTask]] = []
    current: list[LintTask] = []
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


def split_in_runs(batches: list[list[LintTask]], workers: int) -> list[deque[list[LintTask]]]:
    """`batches` cut into `workers` runs of consecutive batches of about the
    same bytes, one per worker."""
    sizes = [sum(_size(t.path) for t in batch) for batch in batches]
    share = sum(sizes) / max(1, workers)
    runs: list[deque[list[LintTask]]] = [deque() for _ in range(workers)]
    done = 0
    for batch, size in zip(batches, sizes):
        index = min(workers - 1, int((done + size / 2) // share)) if share else 0
        runs[index].append(batch)
        done += size
    return runs


# --- the worker side -------------------------------------------------------------

def _worker_main(conn, collect_after: int = GC_AFTER_ALLOCATIONS) -> None:
    # Ctrl-C goes to the whole process group: the supervisor handles it and
    # ends its workers; a worker printing its own KeyboardInterrupt is noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A crash here is reported by the supervisor as one line; a fault
    # handler inherited from the parent (pytest, PYTHONFAULTHANDLER) would
    # add a C-level traceback to the user's terminal.
    faulthandler.disable()
    gc.disable()
    gc.freeze()   # what the worker inherited from the supervisor is never garbage here
    projects = Projects()
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for task in batch:
            conn.send(lint_one(task, projects))
            _collect_between_files(collect_after)


def _collect_between_files(collect_after: int = GC_AFTER_ALLOCATIONS) -> None:
    """Python's automatic collector rescans every live object each time it
    runs a full pass, and a worker keeps the parsed helper modules alive for
    the whole run: on a big tree those rescans took about 40 % of the
    analysis time. So a worker turns it off and, between files, once more
    than `collect_after` objects were allocated since its last collection,
    collects what the files left in cycles, then freezes the survivors (the
    helper models, the memoised answers): later collections never look at
    them again. A collection costs about the same per object whether it runs
    after every file or after many, so collecting rarely only saves the work
    on the garbage of the last files, never collected before the worker
    exits: on torch's source that was 5 of the workers' 33 s of CPU when
    they collected after every file. Memory stays bounded by the worker's
    share of GARBAGE_OBJECTS_PER_RUN."""
    if gc.get_count()[0] >= collect_after:
        gc.collect()
        gc.freeze()


# --- the supervisor side ---------------------------------------------------------

def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    described = {"SIGSEGV": "segmentation fault", "SIGKILL": "killed, perhaps out of memory",
                 "SIGABRT": "aborted", "SIGBUS": "bus error"}.get(name)
    return f"{name}: {described}" if described else name


def crash_error(exitcode: int | None) -> FileError:
    # Only native code can make a Python process die of a signal, and the
    # only native code on the lint path is the parser (libcst's, CPython's).
    if exitcode is not None and exitcode < 0:
        how = f"killed by {_signal_name(-exitcode)}"
    else:
        how = f"the worker exited with status {exitcode}"
    return FileError(ErrorKind.CRASHED, f"the parser crashed on this file ({how}); the other files were linted")


def timeout_error(limit: float) -> FileError:
    return FileError(ErrorKind.TIMED_OUT, f"gave up after {limit:.0f} s (the per-file time limit); "
                                          "the other files were linted")


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: object
    batch: deque = field(default_factory=deque)   # sent, result not back yet, in order
    started: float = 0.0                          # when the file now in flight started

    def send(self, batch: list[LintTask]) -> None:
        self.batch = deque(batch)
        self.started = time.monotonic()
        self.conn.send(batch)

    def stop(self, kill: bool = False) -> None:
        try:
            if kill:
                self.process.kill()
            else:
                self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.conn.close()
        self.process.join(timeout=None if kill else 5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _fork_context():
    # fork: workers inherit the already-imported libcst and rules for free.
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _start_worker(ctx, collect_after: int) -> _Worker:
    parent_end, child_end = ctx.Pipe(duplex=True)
    process = ctx.Process(target=_worker_main, args=(child_end, collect_after), daemon=True, name="ddpcheck-lint")
    process.start()
    child_end.close()
    return _Worker(process, parent_end)


class _Supervisor:
    def __init__(self, ctx, batches: list[list[LintTask]], workers: int, time_limit: float) -> None:
        self.ctx = ctx
        self.limit = time_limit
        self.results: dict[str, FileResult] = {}
        self.workers: list[_Worker] = []
        started = min(workers, len(batches))
        # each worker's run of consecutive batches (neighbouring files share
        # helper modules); one whose run is done takes from the end of the
        # longest other run, so no worker idles while batches are left
        self.runs = split_in_runs(batches, started)
        self.collect_after = max(GC_AFTER_ALLOCATIONS, GARBAGE_OBJECTS_PER_RUN // max(1, started))
        try:
            for _ in range(started):
                self.workers.append(_start_worker(ctx, self.collect_after))
        except OSError:
            self._stop_all()
            raise

    def run(self) -> list[FileResult]:
        try:
            for index in range(len(self.workers)):
                self._feed(index)
            while any(w.batch for w in self.workers):
                self._step()
        except OSError as exc:
            # A replacement worker could not be started (out of processes,
            # out of memory): the files not linted yet are reported as such,
            # never re-run in this process after a death.
            self._give_up(f"not linted: no worker process could be started ({exc.strerror or exc})")
        finally:
            self._stop_all()
        return list(self.results.values())

    def _stop_all(self) -> None:
        for worker in self.workers:
            worker.stop(kill=bool(worker.batch))

    def _give_up(self, message: str) -> None:
        left = [t for w in self.workers for t in w.batch] + [t for run in self.runs for batch in run for t in batch]
        for task in left:
            self.results.setdefault(task.path, FileResult(path=task.path, error=FileError(ErrorKind.CRASHED, message)))
        for worker in self.workers:
            worker.batch.clear()
        for run in self.runs:
            run.clear()

    def _feed(self, index: int, batch: list[LintTask] | None = None) -> None:
        """Send `batch` (else the next of its run, else one taken from the
        end of the longest other run) to worker `index`; a worker found dead
        before it started is replaced (a few times at most)."""
        if batch is None:
            if self.runs[index]:
                batch = self.runs[index].popleft()
            else:
                longest = max(self.runs, key=len)
                if not longest:
                    return
                batch = longest.pop()
        for _ in range(3):
            try:
                self.workers[index].send(batch)
                return
            except (OSError, ValueError):
                self.workers[index].batch.clear()
                self.workers[index].stop(kill=True)
                self.workers[index] = _start_worker(self.ctx, self.collect_after)
        raise OSError("worker processes die before they start")

    def _limit_for(self, task: LintTask) -> float:
        return time_limit_for(task.path, self.limit)

    def _step(self) -> None:
        busy = [w for w in self.workers if w.batch]
        now = time.monotonic()
        next_deadline = min(w.started + self._limit_for(w.batch[0]) for w in busy)
        ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                         timeout=max(0.0, next_deadline - now)))
        for index, worker in enumerate(self.workers):
            if not worker.batch:
                continue
            if worker.conn in ready and self._receive(worker):
                if not worker.batch:
                    self._feed(index)
                continue
            if worker.process.sentinel in ready or worker.conn in ready:
                # Died (or its pipe broke) with a file in flight.
                self._replace(index, crash_error(self._exitcode(worker)))
            elif time.monotonic() - worker.started > self._limit_for(worker.batch[0]):
                self._replace(index, timeout_error(self._limit_for(worker.batch[0])))

    def _receive(self, worker: _Worker) -> bool:
        """Take every result the worker has sent; False if its pipe is at an end."""
        try:
            while worker.batch and worker.conn.poll():
                result = worker.conn.recv()
                task = worker.batch.popleft()
                self.results[task.path] = result
                worker.started = time.monotonic()
        except Exception:  # EOF, a broken pipe, a result cut short by the death
            return False
        return True

    @staticmethod
    def _exitcode(worker: _Worker) -> int | None:
        worker.process.join(timeout=5)
        return worker.process.exitcode

    def _replace(self, index: int, error: FileError) -> None:
        """Report the file in flight, hand the rest of its batch to a fresh worker."""
        worker = self.workers[index]
        task = worker.batch.popleft()
        self.results[task.path] = FileResult(path=task.path, error=error)
        rest = list(worker.batch)
        worker.batch.clear()
        worker.stop(kill=True)
        self.workers[index] = _start_worker(self.ctx, self.collect_after)
        self._feed(index, rest or None)


def lint_files(tasks: Sequence[LintTask | tuple], jobs: int, time_limit: float = FILE_TIME_LIMIT_S) -> list[FileResult]:
    """Every task's result, sorted by path; one result per task whatever happens
    to the processes linting them."""
    tasks = sorted((LintTask(*t) for t in tasks), key=lambda t: t.path)
    if not tasks:
        return []
    ctx = _fork_context()
    workers = 1 if jobs <= 1 or len(tasks) <= IN_PROCESS_MAX_FILES else min(jobs, len(tasks))
    batches = [list(tasks)] if workers == 1 else chunks_in_path_order(tasks, workers)
    supervisor = None
    if ctx is not None:
        if workers > 1:
            import ddpcheck.lint.analyze  # noqa: F401  (imported once here, inherited by every worker)
        try:
            supervisor = _Supervisor(ctx, batches, workers, time_limit)
        except OSError:
            supervisor = None  # no process can be started here (a sandbox); nothing was linted yet
    if supervisor is not None:
        results = supervisor.run()
    else:
        projects = Projects()
        results = [lint_one(t, projects) for t in tasks]
    return sorted(results, key=lambda r: r.path)
