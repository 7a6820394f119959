from __future__ import annotations

import os

import pytest

import ddpcheck.lint.analyze as run
import ddpcheck.lint.engine as lint_engine
from ddpcheck.settings import LintSettings
from ddpcheck.findings import Finding, Severity
from ddpcheck.lint.runner import IN_PROCESS_MAX_FILES, LintTask, chunks_in_path_order, lint_files, split_in_runs
from tests.conftest import PREAMBLE, write


def pid_analyze(text, path, settings, project=None):
    """Reports which process analysed the file."""
    return run.Analysis((Finding(path, 1, 1, "DDP901", "pid", Severity.INFO, str(os.getpid()), ""),))


@pytest.fixture
def many_files(tmp_path, monkeypatch, fake_rules):
    monkeypatch.setattr(run, "analyze", pid_analyze)
    names = [f"f{i:03d}.py" for i in range(IN_PROCESS_MAX_FILES * 2)]
    for name in names:
        write(tmp_path / name, PREAMBLE)
    settings = LintSettings(enabled=frozenset({"DDP901"}))
    # Deliberately unsorted input: output order must not depend on it.
    return [(str(tmp_path / n), settings) for n in reversed(names)]


def pids(results) -> set[str]:
    return {f.message for r in results for f in r.findings}


def test_many_files_use_worker_processes_and_come_back_sorted(many_files):
    results = lint_files(many_files, jobs=2)
    assert [r.path for r in results] == sorted(path for path, _ in many_files)
    assert str(os.getpid()) not in pids(results)
    assert len(results) == len(many_files) and all(len(r.findings) == 1 for r in results)


def test_a_handful_of_files_share_one_worker(many_files):
    # Never parsed in ddpcheck's own process (a parser crash would end the
    # run), but one worker for a pre-commit's handful.
    results = lint_files(many_files[:3], jobs=2)
    assert len(pids(results)) == 1 and str(os.getpid()) not in pids(results)
    assert [r.path for r in results] == sorted(path for path, _ in many_files[:3])


def test_one_job_is_one_worker(many_files):
    found = pids(lint_files(many_files, jobs=1))
    assert len(found) == 1 and str(os.getpid()) not in found


def test_without_worker_processes_files_are_linted_in_process(many_files, monkeypatch):
    import ddpcheck.lint.runner as runner

    def no_processes(ctx, collect_after):
        raise OSError("no processes here")

    monkeypatch.setattr(runner, "_start_worker", no_processes)
    results = lint_files(many_files, jobs=2)
    assert pids(results) == {str(os.getpid())} and len(results) == len(many_files)


def test_prefiltered_files_are_never_analysed(tmp_path, monkeypatch, fake_rules):
    def must_not_run(*args):
        raise AssertionError("analyze called for a file without any distributed mention")

    monkeypatch.setattr(run, "analyze", must_not_run)
    write(tmp_path / "plain.py", "import os\nprint(os.getcwd())\n")
    result = lint_engine.lint_path(str(tmp_path / "plain.py"), LintSettings(enabled=frozenset({"DDP901"})))
    assert result.error is None and result.findings == ()


def test_batches_follow_path_order_and_cover_every_task(tmp_path):
    sizes = [5, 1000, 20, 20, 7000, 3, 0]
    tasks = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}.py"
        path.write_text("x" * size)
        tasks.append((str(path), LintSettings(enabled=frozenset())))
    tasks.append((str(tmp_path / "missing.py"), LintSettings(enabled=frozenset())))
    batches = chunks_in_path_order([LintTask(*t) for t in reversed(tasks)], workers=2)
    flat = [task.path for batch in batches for task in batch]
    assert flat == sorted(path for path, _ in tasks)   # neighbours stay together
    assert [LintTask(*tasks[4])] in batches            # the biggest file is a batch of its own
    assert any(len(batch) > 1 for batch in batches)    # the small ones are batched together


def test_each_worker_gets_a_run_of_consecutive_batches_of_about_the_same_bytes(tmp_path):
    tasks = []
    for i in range(40):
        path = tmp_path / f"f{i:02}.py"
        path.write_text("x" * 100)
        tasks.append(LintTask(str(path), LintSettings(enabled=frozenset())))
    batches = chunks_in_path_order(tasks, workers=2)
    runs = split_in_runs(batches, 2)
    assert [batch for run in runs for batch in run] == batches   # consecutive, in order, all of them
    sizes = [sum(len(batch) for batch in run) for run in runs]
    assert abs(sizes[0] - sizes[1]) <= max(len(batch) for batch in batches)


def test_a_worker_collects_cycles_between_files_and_freezes_the_survivors():
    import gc
    import weakref

    from ddpcheck.lint import runner

    class Node:
        pass

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        survivor = Node()
        garbage = Node()
        garbage.self = garbage            # a cycle: only the collector frees it
        # as a parsed file's model: many objects, freed only with the cycle
        garbage.tree = [[] for _ in range(runner.GC_AFTER_ALLOCATIONS)]
        dead = weakref.ref(garbage)
        del garbage
        assert dead() is not None
        frozen_before = gc.get_freeze_count()
        runner._collect_between_files()
        assert dead() is None                                   # the last file's cycles are gone
        assert gc.get_freeze_count() > frozen_before            # what lives on is never rescanned
        assert survivor is not None
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def test_a_worker_leaves_cycles_alone_until_more_than_its_share_was_allocated():
    import gc
    import weakref

    from ddpcheck.lint import runner

    class Node:
        pass

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        garbage = Node()
        garbage.self = garbage
        garbage.tree = [[] for _ in range(1000)]
        dead = weakref.ref(garbage)
        del garbage
        runner._collect_between_files(collect_after=1_000_000)
        assert dead() is not None            # a collection costs the same per object later: not yet
        runner._collect_between_files(collect_after=500)
        assert dead() is None
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
