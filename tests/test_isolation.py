"""No input takes the run down: a file that kills or hangs the process
linting it is one error line, and every other file keeps its findings.
Nothing is re-run in ddpcheck's own process after a worker dies."""

from __future__ import annotations

import faulthandler
import os
import threading
import time

import pytest

import ddpcheck.lint.runner as runner
from ddpcheck.findings import ErrorKind
from ddpcheck.lint.runner import IN_PROCESS_MAX_FILES, LintTask, lint_files
from ddpcheck.settings import LintSettings
from tests.conftest import MISSING_SET_EPOCH, PREAMBLE, ddpcheck_cmd, write

FAKE = LintSettings(enabled=frozenset({"DDP901", "DDP902", "DDP903"}))
# A sum of 300 ones: fine for Python, but deep enough for libcst's native
# parser to overflow a 256 KiB stack. (On a normal 8 MiB stack the same crash
# needs ~8,000 terms and a minute of parsing; the small stack makes the real
# segfault come in milliseconds.)
DEEP_SUM = "x = " + "+".join(["1"] * 300) + "\n"


def tasks_for(root, names, settings=FAKE):
    return [LintTask(str(root / n), settings) for n in names]


def folder_with(root, count: int, bad: dict[str, str]) -> list[str]:
    names = [f"good{i:02d}.py" for i in range(count)]
    for name in names:
        write(root / name, PREAMBLE + "BAD_ERROR\n")
    for name, text in bad.items():
        write(root / name, PREAMBLE + text)
    return sorted(names + list(bad))


def check_others(results, bad: set[str]) -> None:
    for r in results:
        if os.path.basename(r.path) in bad:
            continue
        assert r.error is None, r
        assert [f.code for f in r.findings] == ["DDP901"], r


def sigsegv_on_marker(monkeypatch):
    """The analyzer dies of a real SIGSEGV on files containing SEGFAULT_HERE."""
    import ddpcheck.lint.analyze as analyze_module
    from tests.conftest import fake_analyze

    def analyze(text, path, settings, project=None):
        if "SEGFAULT_HERE" in text:
            faulthandler._sigsegv()
        if "HANG_HERE" in text:
            time.sleep(600)
        return fake_analyze(text, path, settings)

    monkeypatch.setattr(analyze_module, "analyze", analyze)


@pytest.mark.parametrize("count", [3, IN_PROCESS_MAX_FILES * 2])
def test_a_segfault_is_that_files_error_and_the_others_keep_their_findings(tmp_path, fake_rules, monkeypatch,
                                                                           count):
    sigsegv_on_marker(monkeypatch)
    names = folder_with(tmp_path, count, {"crash.py": "SEGFAULT_HERE\n", "zz_crash.py": "SEGFAULT_HERE\n"})
    results = lint_files(tasks_for(tmp_path, names), jobs=2)
    assert [os.path.basename(r.path) for r in results] == names          # every file has its one result
    crashed = {os.path.basename(r.path): r.error for r in results if r.error}
    assert set(crashed) == {"crash.py", "zz_crash.py"}
    assert all(e.kind is ErrorKind.CRASHED and "SIGSEGV" in e.message for e in crashed.values())
    check_others(results, set(crashed))


def test_a_hang_is_cut_at_the_time_limit(tmp_path, fake_rules, monkeypatch):
    sigsegv_on_marker(monkeypatch)
    names = folder_with(tmp_path, 4, {"hang.py": "HANG_HERE\n"})
    started = time.monotonic()
    results = lint_files(tasks_for(tmp_path, names), jobs=2, time_limit=1.0)
    assert time.monotonic() - started < 30
    [hung] = [r for r in results if r.error]
    assert os.path.basename(hung.path) == "hang.py" and hung.error.kind is ErrorKind.TIMED_OUT
    check_others(results, {"hang.py"})


def test_real_libcst_segfault_in_a_worker(tmp_path, monkeypatch):
    """The real pipeline on a real input that crashes libcst's native parser
    (a small thread stack brings the crash down from minutes to milliseconds)."""
    write(tmp_path / "huge.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\n" + DEEP_SUM)
    for i in range(3):
        write(tmp_path / f"train{i}.py", MISSING_SET_EPOCH)
    original = runner.lint_one

    def lint_one(task, projects=None):
        if not task.path.endswith("huge.py"):
            return original(task, projects)
        out = []
        threading.stack_size(256 * 1024)
        thread = threading.Thread(target=lambda: out.append(original(task, projects)))
        thread.start()
        thread.join()
        return out[0]

    monkeypatch.setattr(runner, "lint_one", lint_one)
    every_rule = LintSettings(enabled=frozenset({"DDP101"}))
    results = lint_files(tasks_for(tmp_path, ["huge.py", "train0.py", "train1.py", "train2.py"], every_rule), jobs=1)
    [huge, *trains] = results
    assert huge.error is not None and huge.error.kind is ErrorKind.CRASHED, huge
    assert huge.error.message.startswith("the parser crashed on this file (killed by SIGSEGV")
    assert [[f.code for f in r.findings] for r in trains] == [["DDP101"]] * 3


def test_the_issue_input_end_to_end(tmp_path):
    """8,000 terms: libcst spins for a minute, then segfaults. Python's own
    parser refuses it in milliseconds, so it never reaches libcst; every other
    file in the folder is still reported."""
    write(tmp_path / "huge.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
          "x = " + "+".join(["1"] * 8000) + "\n")
    for i in range(20):
        write(tmp_path / f"train{i:02d}.py", MISSING_SET_EPOCH)
    result = ddpcheck_cmd("lint", "--no-color", "--select", "DDP101", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "ddpcheck: error: huge.py: nested too deeply for Python to compile (a very long expression or chain)"]
    for i in range(20):
        assert f"train{i:02d}.py:9:1: DDP101" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
