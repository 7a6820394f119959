"""Autofix (`ddpcheck lint --fix`): every fixable rule's fixtures are fixed in
a temporary copy; the fixed file no longer reports what was fixed, compiles,
keeps every comment, and a second fix changes nothing."""

from __future__ import annotations

import io
import shutil
import tokenize
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpcheck import cli
from ddpcheck.findings import Applicability
from ddpcheck.lint.engine import lint_text
from ddpcheck.lint.fixes import fix_text, unified_diff
from ddpcheck.rules.base import REGISTRY
from ddpcheck.settings import LintSettings
from tests.conftest import MISSING_SET_EPOCH, REPO, write

FIXTURES = REPO / "fixtures"
FIXABLE = sorted(code for code, rule in REGISTRY.items() if getattr(rule, "fixable", False))


def positive_fixtures(code: str) -> list[Path]:
    """The rule's own positive fixtures: bad_*.py, and the multi-file ones."""
    files = sorted((FIXTURES / "rules" / code).glob("bad_*.py"))
    for folder in sorted((FIXTURES / "multifile").glob(code.lower() + "_*")):
        files += [p for p in sorted(folder.glob("*.py")) if f"expect: {code}" in p.read_text()]
    return files


def negative_fixtures(code: str) -> list[Path]:
    return sorted((FIXTURES / "rules" / code).glob("good_*.py"))


def copied(src: Path, tmp_path: Path) -> Path:
    """A copy of the fixture with its folder (helper modules resolve the same)."""
    dest = tmp_path / src.parent.name
    shutil.copytree(src.parent, dest)
    return dest / src.name


def comments(text: str) -> Counter:
    return Counter(tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                   if tok.type == tokenize.COMMENT)


def test_the_fixable_rules_are_the_ones_with_mechanical_fixes():
    assert FIXABLE == ["DDP101", "DDP102", "DDP201", "DDP302", "DDP303", "DDP307", "DDP402", "DDP501"]


@pytest.mark.parametrize("code", FIXABLE)
def test_fixing_every_positive_fixture(code, tmp_path):
    fixtures = positive_fixtures(code)
    assert fixtures, f"{code} has no positive fixtures"
    settings = LintSettings(enabled=frozenset([code]))
    fully_fixed = 0
    for src in fixtures:
        path = copied(src, tmp_path / src.stem)
        text = path.read_text()
        before = lint_text(text, str(path), settings).findings
        with_fix = [f for f in before if f.applicability is not None]
        outcome = fix_text(text, str(path), settings, unsafe=True)
        after = [f for f in outcome.result.findings if f.code == code]
        # what carried a fix is gone; what did not is still reported
        assert len(after) == len(before) - len(with_fix), (src, unified_diff(outcome), after)
        assert len(outcome.applied) == len(with_fix), src
        assert outcome.changed == bool(with_fix), src
        compile(outcome.fixed, str(path), "exec")
        assert comments(outcome.fixed) == comments(text), f"{src}: a comment was lost"
        again = fix_text(outcome.fixed, str(path), settings, unsafe=True)
        assert again.fixed == outcome.fixed and not again.applied, f"{src}: a second fix changed it again"
        fully_fixed += not after
    assert fully_fixed, f"no positive fixture of {code} is fully fixed: the fix never applies"


@pytest.mark.parametrize("code", FIXABLE)
def test_negative_fixtures_are_left_alone(code, tmp_path):
    settings = LintSettings(enabled=frozenset([code]))
    for src in negative_fixtures(code):
        path = copied(src, tmp_path / src.stem)
        text = path.read_text()
        assert fix_text(text, str(path), settings, unsafe=True).fixed == text, src


def fix_of(code: str, source: str, tmp_path: Path, unsafe: bool = False):
    path = write(tmp_path / "train.py", source)
    return fix_text(path.read_text(), str(path), LintSettings(enabled=frozenset([code])), unsafe=unsafe)


def test_set_epoch_goes_first_in_the_loop_with_the_loop_variable(tmp_path):
    outcome = fix_of("DDP101", MISSING_SET_EPOCH.replace("for epoch in", "for ep in"), tmp_path)
    assert "for ep in range(10):\n    sampler.set_epoch(ep)\n    for batch in loader:" in outcome.fixed


def test_set_epoch_not_inserted_where_the_sampler_may_be_none(tmp_path):
    source = MISSING_SET_EPOCH.replace(
        "sampler = DistributedSampler(dataset)\n",
        "if dist.is_initialized():\n    sampler = DistributedSampler(dataset)\nelse:\n    sampler = None\n")
    outcome = fix_of("DDP101", source, tmp_path)
    assert [f.code for f in outcome.result.findings] == ["DDP101"]
    assert outcome.result.findings[0].applicability is None and not outcome.changed


def test_shuffle_follows_the_sampler_name(tmp_path):
    source = MISSING_SET_EPOCH.replace("sampler=sampler, batch_size=8", "sampler=sampler, shuffle=True, batch_size=8")
    outcome = fix_of("DDP102", source, tmp_path)
    assert "DataLoader(dataset, sampler=sampler, shuffle=(sampler is None), batch_size=8)" in outcome.fixed


SYNCBN_AFTER_WRAP = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).cuda()
model = DDP(model, device_ids=[0])
# convert for multi-GPU statistics
model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
"""


def test_unsafe_fix_needs_unsafe_fixes(tmp_path):
    safe_only = fix_of("DDP201", SYNCBN_AFTER_WRAP, tmp_path)
    assert not safe_only.changed
    assert safe_only.result.findings[0].applicability is Applicability.UNSAFE
    unsafe = fix_of("DDP201", SYNCBN_AFTER_WRAP, tmp_path, unsafe=True)
    assert unsafe.fixed.index("convert_sync_batchnorm") < unsafe.fixed.index("DDP(model")
    assert "# convert for multi-GPU statistics\nmodel = nn.SyncBatchNorm" in unsafe.fixed


def test_map_location_is_safe_only_straight_into_load_state_dict(tmp_path):
    source = ("import torch\nimport torch.distributed as dist\n"
              "dist.init_process_group('nccl')\nmodel = torch.nn.Linear(2, 2).cuda()\n"
              "model.load_state_dict(torch.load('ckpt.pth'))\nbest = torch.load('best_model.pth')\n")
    outcome = fix_of("DDP303", source, tmp_path)
    assert "model.load_state_dict(torch.load('ckpt.pth', map_location=\"cpu\"))" in outcome.fixed
    [left] = outcome.result.findings
    assert left.line == 6 and left.applicability is Applicability.UNSAFE


def test_exist_ok_is_safe_only_under_an_existence_test(tmp_path):
    source = ("import os\nfrom pathlib import Path\nimport torch.distributed as dist\n"
              "dist.init_process_group('nccl')\n"
              "if not os.path.exists('out'):\n    os.makedirs('out')\n"
              "os.makedirs('runs', 0o755)\nPath('ckpt').mkdir(parents=True)\nos.mkdir('samples')\n"
              "os.makedirs('logs', exist_ok=False)\n")
    safe = fix_of("DDP307", source, tmp_path)
    assert "    os.makedirs('out', exist_ok=True)\n" in safe.fixed
    left = {f.line: f.applicability for f in safe.result.findings}
    # unsafe without the existence test; os.mkdir and an explicit exist_ok=False get no fix
    assert left == {7: Applicability.UNSAFE, 8: Applicability.UNSAFE, 9: None, 10: None}
    unsafe = fix_of("DDP307", source, tmp_path, unsafe=True)
    assert "os.makedirs('runs', 0o755, exist_ok=True)" in unsafe.fixed
    assert "Path('ckpt').mkdir(parents=True, exist_ok=True)" in unsafe.fixed
    assert "os.mkdir('samples')\n" in unsafe.fixed and "exist_ok=False" in unsafe.fixed


def test_destroy_goes_at_the_end_of_the_entry_point_not_of_a_setup_helper(tmp_path):
    entry = ("import torch.distributed as dist\n\n\ndef main():\n    dist.init_process_group('nccl')\n"
             "    train()  # the work\n\n\nif __name__ == '__main__':\n    main()\n")
    fixed = fix_of("DDP402", entry, tmp_path).fixed
    assert "    train()  # the work\n    dist.destroy_process_group()\n" in fixed
    helper = entry.replace("def main():\n    dist.init_process_group('nccl')\n    train()  # the work\n",
                           "def setup():\n    dist.init_process_group('nccl')\n\n\ndef main():\n    setup()\n    train()\n")
    assert not fix_of("DDP402", helper, tmp_path).changed


# --- through the command line -------------------------------------------------------------

def invoke(*args: str):
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


@pytest.fixture
def buggy_tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # DDP101's first fixtures (a while loop, iter()/next()) have no mechanical fix: use two `for epoch` loops
    picked = {"DDP101": ["bad_plain_loop.py", "bad_train_one_epoch.py"]}
    for code in ("DDP101", "DDP102", "DDP303", "DDP501"):
        names = picked.get(code) or [p.name for p in sorted((FIXTURES / "rules" / code).glob("bad_*.py"))[:2]]
        for name in names:
            shutil.copy(FIXTURES / "rules" / code / name, tmp_path / f"{code}_{name}")
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.py"))}


def test_without_fix_nothing_is_written(buggy_tree):
    before = snapshot(buggy_tree)
    assert invoke("lint", "--no-cache", ".").exit_code == 1
    diff = invoke("lint", "--no-cache", "--diff", ".")
    assert diff.exit_code == 1 and diff.stdout.startswith("--- a/")
    assert "+        sampler.set_epoch(epoch)" in diff.stdout
    assert snapshot(buggy_tree) == before


def test_fix_writes_and_a_second_fix_changes_nothing(buggy_tree):
    before = snapshot(buggy_tree)
    first = invoke("lint", "--no-cache", "--fix", "--show-fixes", "--select", "DDP101,DDP102,DDP303,DDP501", ".")
    assert "Fixed " in first.stdout and "DDP101 (missing-set-epoch)" in first.stdout
    after = snapshot(buggy_tree)
    assert after != before
    for name, data in after.items():
        compile(data, name, "exec")
    second = invoke("lint", "--no-cache", "--fix", "--select", "DDP101,DDP102,DDP303,DDP501", ".")
    assert snapshot(buggy_tree) == after
    assert "Fixed" not in second.stdout
    assert invoke("lint", "--no-cache", "--diff", ".").exit_code == 0


def test_diff_exits_0_when_there_is_nothing_to_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "clean.py", "import torch.distributed as dist\nx = 1\n")
    result = invoke("lint", "--diff", "clean.py")
    assert result.exit_code == 0 and result.stdout == ""


def test_fix_from_stdin_prints_the_fixed_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.main, ["lint", "--fix", "--select", "DDP101", "-", "--stdin-filename", "t.py"],
                                input=MISSING_SET_EPOCH, catch_exceptions=False)
    assert result.exit_code == 0
    assert "    sampler.set_epoch(epoch)\n" in result.stdout
    assert not list(tmp_path.glob("*.py"))


def test_set_epoch_under_the_same_flag_as_the_sampler(tmp_path):
    source = MISSING_SET_EPOCH.replace(
        "dataset = list(range(100))\nsampler = DistributedSampler(dataset)\n"
        "loader = DataLoader(dataset, sampler=sampler, batch_size=8)\n",
        "dataset = list(range(100))\ndistributed = True\nif distributed:\n    sampler = DistributedSampler(dataset)\n"
        "    loader = DataLoader(dataset, sampler=sampler, batch_size=8)\n"
        "else:\n    loader = DataLoader(dataset, shuffle=True, batch_size=8)\n")
    outcome = fix_of("DDP101", source, tmp_path)
    assert "for epoch in range(10):\n    if distributed:\n        sampler.set_epoch(epoch)\n    for batch" in outcome.fixed
    assert not outcome.result.findings
    # a flag reassigned between the sampler and the loop is not trusted
    moved = source.replace("for epoch in range(10):", "distributed = False\nfor epoch in range(10):")
    assert not fix_of("DDP101", moved, tmp_path).changed


@pytest.mark.parametrize("src", sorted((FIXTURES / "scripts").glob("*/train_*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_whole_scripts_fix_cleanly_with_every_rule(src, tmp_path):
    """Several rules' fixes in one file, applied together: the result
    compiles, keeps its comments, and fixing again changes nothing."""
    settings = LintSettings(enabled=frozenset(REGISTRY))
    path = copied(src, tmp_path)
    text = path.read_text()
    outcome = fix_text(text, str(path), settings, unsafe=True)
    compile(outcome.fixed, str(path), "exec")
    assert comments(outcome.fixed) == comments(text)
    assert not any(f.applicability for f in outcome.result.findings), "a fixable finding was left"
    assert fix_text(outcome.fixed, str(path), settings, unsafe=True).fixed == outcome.fixed
