"""Shared test helpers.

`fake_rules` swaps in three made-up rules (DDP901 error, DDP902 warning,
DDP903 info) and a fake analyzer that reports them on lines containing the
markers `BAD_ERROR`, `BAD_WARNING`, `BAD_INFO`. That tests CLI behaviour
(selection, formats, exit codes, noqa through the engine) independently of the
real rules; the end-to-end tests use the real ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ddpcheck.rules  # noqa: F401  (registers the real rules)
from ddpcheck.findings import Finding, Severity
from ddpcheck.lint.analyze import Analysis
from ddpcheck.rules.base import REGISTRY, Rule

REPO = Path(__file__).resolve().parent.parent


_SANDBOX_HERE = ""


def pytest_configure(config):
    """The preflight's sandbox on this machine. Where none can be set up at all, the
    preflight runs of the suite go without one, as `--allow-unsandboxed` would let a
    user's (DDPCHECK_ALLOW_UNSANDBOXED): the tests of the sandbox itself skip there."""
    import tempfile

    from ddpcheck.preflight import sandbox as sandboxing

    global _SANDBOX_HERE
    run_dir = sandboxing.make_run_dir(tempfile.gettempdir())
    try:
        box = sandboxing.choose(run_dir, os.getcwd())
    finally:
        sandboxing.remove_tree(run_dir)
    if box.level == sandboxing.Level.NONE:
        os.environ["DDPCHECK_ALLOW_UNSANDBOXED"] = "1"
    _SANDBOX_HERE = f"preflight sandbox: {box.level.value} ({box.tool or box.why})"


def pytest_report_header(config):
    return _SANDBOX_HERE

FAKE_MARKERS = {
    "BAD_ERROR": ("DDP901", "fake-error", Severity.ERROR),
    "BAD_WARNING": ("DDP902", "fake-warning", Severity.WARNING),
    "BAD_INFO": ("DDP903", "fake-info", Severity.INFO),
}
# Every fake script must pass the engine's prefilter, which wants a mention of
# distributed training somewhere in the file.
PREAMBLE = "import torch.distributed as dist  # init_process_group\n"


def _fake_rule(code: str, name: str, severity: Severity) -> type[Rule]:
    return type(f"Fake{code}", (Rule,), {
        "code": code, "name": name, "severity": severity,
        "message": f"{name} happened. Second sentence.", "fix": f"fix the {name}",
    })


def fake_analyze(text: str, path: str, settings, project=None) -> Analysis:
    # The engine has already run Python's syntax check on `text`.
    if "CRASH_THE_RULE" in text:
        raise RuntimeError("boom")
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        for marker, (code, name, severity) in FAKE_MARKERS.items():
            if marker in line and code in settings.enabled:
                findings.append(Finding(path, number, line.index(marker) + 1, code, name, severity,
                                        f"{name} happened. Second sentence.", f"fix the {name}"))
    return Analysis(tuple(sorted(findings)))


@pytest.fixture(autouse=True)
def _cache_outside_the_repo(tmp_path_factory, monkeypatch):
    """Every test (and the CLI subprocesses it starts) keeps ddpcheck's result
    cache in a fresh temporary folder: nothing is left in the repository, and
    no test reads another's results."""
    monkeypatch.setenv("DDPCHECK_CACHE_DIR", str(tmp_path_factory.mktemp("ddpcheck_cache")))


@pytest.fixture
def fake_rules(monkeypatch):
    import ddpcheck.lint.analyze as run

    for marker, (code, name, severity) in FAKE_MARKERS.items():
        monkeypatch.setitem(REGISTRY, code, _fake_rule(code, name, severity))
    monkeypatch.setattr(run, "analyze", fake_analyze)
    return sorted(code for code, _, _ in FAKE_MARKERS.values())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def needs_rule(code: str):
    """Skip an end-to-end test until the lead's rule `code` has landed."""
    return pytest.mark.skipif(code not in REGISTRY, reason=f"rule {code} not registered yet")


def ddpcheck_cmd(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (no monkeypatching reaches it)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddpcheck", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)


# Real-rule examples used by several end-to-end tests.
MISSING_SET_EPOCH = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
dataset = list(range(100))
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, sampler=sampler, batch_size=8)
for epoch in range(10):
    for batch in loader:
        pass
"""

WITH_SET_EPOCH = MISSING_SET_EPOCH.replace(
    "for epoch in range(10):\n", "for epoch in range(10):\n    sampler.set_epoch(epoch)\n")

UNGUARDED_SAVE = """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
model = torch.nn.Linear(2, 2)
torch.save(model.state_dict(), "ckpt.pt")
"""

GUARDED_SAVE = UNGUARDED_SAVE.replace(
    'torch.save(model.state_dict(), "ckpt.pt")\n',
    'if dist.get_rank() == 0:\n    torch.save(model.state_dict(), "ckpt.pt")\n')


def git_available() -> bool:
    return shutil.which("git") is not None


def pytest_collection_modifyitems(config, items):
    """The engine's semantics suite (tests/semantics) runs first: it takes a
    few seconds, and when the engine breaks it names the Python feature that
    broke before hundreds of rule fixtures fail for the same reason."""
    semantics = str(REPO / "tests" / "semantics")
    items.sort(key=lambda item: not str(item.path).startswith(semantics))
