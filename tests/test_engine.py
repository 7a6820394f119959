"""The engine's guarantees: one rule's crash does not hide the other rules'
findings, and the crash is reported, not swallowed."""

from __future__ import annotations

from click.testing import CliRunner

import ddpcheck.rules.ddp301_unguarded_save as ddp301
from ddpcheck.cli import main
from ddpcheck.findings import ErrorKind
from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY

SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
sampler = DistributedSampler(ds)
loader = DataLoader(ds, sampler=sampler)
for epoch in range(3):
    for batch in loader:
        step(batch)
    torch.save(state, "ckpt.pt")
dist.destroy_process_group()
"""


def test_a_crashing_rule_keeps_the_other_findings(tmp_path, monkeypatch):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)

    def boom(self, model):
        raise KeyError("bug")
        yield  # pragma: no cover

    monkeypatch.setattr(ddp301.UnguardedSave, "check", boom)
    result = lint_path(str(path), LintSettings(enabled=frozenset(REGISTRY)))
    assert {f.code for f in result.findings} == {"DDP101"}
    assert result.error.kind is ErrorKind.INTERNAL
    assert result.error.message == "internal error in DDP301 (KeyError: 'bug'); please report this"

    cli = CliRunner().invoke(main, ["lint", "--no-color", str(path)])
    assert "DDP101" in cli.stdout
    assert "internal error in DDP301" in cli.stderr
    assert cli.exit_code == 2
    assert "Traceback" not in cli.output


def test_without_the_crash_both_rules_report(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    result = lint_path(str(path), LintSettings(enabled=frozenset(REGISTRY)))
    assert result.error is None
    assert {f.code for f in result.findings} == {"DDP101", "DDP301"}
