"""Helpers for the preflight tests: run the command in-process or as a CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def child_pids(pid: int) -> list[int]:
    """Live (non-zombie) children of ``pid``, from /proc, except multiprocessing's
    resource tracker."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid != pid or state == "Z":
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        # Python's own helper for spawned processes lives as long as its parent
        if b"multiprocessing.resource_tracker" in cmdline:
            continue
        out.append(int(entry))
    return out


def pids_with_marker(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (children of a finished CLI run)."""
    found = []
    needle = f"DDPCHECK_TEST_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


class Run:
    def __init__(self, code: int, out: str, err: str):
        self.code = code
        self.out = out
        self.err = err

    def json(self) -> dict:
        return json.loads(self.out)

    def check(self, name_prefix: str) -> dict:
        rows = [c for c in self.json()["checks"] if c["name"].startswith(name_prefix)]
        assert rows, f"no check named {name_prefix!r} in {[c['name'] for c in self.json()['checks']]}"
        return rows[0]


def run_in_this_process(mode, opts, steps, script_args, folder, nodes=None):
    """The run the sandbox's inner process makes (:mod:`ddpcheck.preflight.inside`),
    made here instead: for tests of what the run finds (torch imported once, workers
    forked from the test process, GPU counts and host memory can be faked). The
    sandbox itself is tested through the real command (test_sandbox.py, script mode,
    ``preflight_cli``)."""
    from ddpcheck.preflight import command
    from ddpcheck.preflight.script.command import run_script_preflight

    if mode == "script":
        return run_script_preflight(opts, steps, script_args, nodes=nodes)
    return command.run_preflight(opts)


@pytest.fixture
def preflight_inproc(monkeypatch, tmp_path):
    """Run `ddpcheck preflight ARGS` inside the test process, without the sandbox's
    own process (:func:`run_in_this_process`); asserts that no worker process
    survives."""
    from click.testing import CliRunner

    from ddpcheck.preflight import command
    from ddpcheck.preflight.command import preflight

    monkeypatch.setattr(command, "run_sandboxed", run_in_this_process)

    monkeypatch.chdir(REPO)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    # worker logs kept after a failing run land in pytest's tmp dir, not /tmp
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def run(*args: str) -> Run:
        result = CliRunner().invoke(preflight, list(args), catch_exceptions=False)
        assert child_pids(os.getpid()) == [], "a worker outlived the preflight"
        err = result.stderr if hasattr(result, "stderr") else ""
        return Run(result.exit_code, result.stdout, err)

    return run


@pytest.fixture
def preflight_cli(tmp_path):
    """Run `python -m ddpcheck.preflight ARGS` as a real process; asserts that no
    process it started is left behind."""

    def run(*args: str, timeout: float = 120) -> Run:
        marker = uuid.uuid4().hex
        env = dict(os.environ, DDPCHECK_TEST_MARKER=marker, TMPDIR=str(tmp_path))
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
            env.pop(key, None)
        proc = subprocess.run([sys.executable, "-m", "ddpcheck.preflight", *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=timeout)
        assert pids_with_marker(marker) == [], "a worker outlived the preflight"
        return Run(proc.returncode, proc.stdout, proc.stderr)

    return run
