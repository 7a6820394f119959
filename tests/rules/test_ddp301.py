"""DDP301 unguarded-save: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

PRE = "import os\nimport torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nrank = dist.get_rank()\n"


def test_a_shared_path_is_reported_with_the_why():
    (f,) = findings("DDP301", PRE + "torch.save(state, 'ckpt.pth')\n")
    assert f.line == 6
    assert "every rank" in f.message and "corrupt" in f.message
    assert "is_main_process" in f.fix


def test_a_per_rank_path_is_deliberate_state():
    """swav keeps one queue file per rank: `"queue" + str(args.rank) + ".pth"`."""
    assert lines("DDP301", PRE + "torch.save(state, f'queue{rank}.pth')\n") == []
    assert lines("DDP301", PRE + "path = os.path.join('out', 'q' + str(args.rank) + '.pth')\ntorch.save(q, path)\n") == []
    assert lines("DDP301", PRE + "torch.save(q, os.path.join(out, f'shard_{dist.get_rank()}.pt'))\n") == []


def test_summary_writer_per_rank_log_dir():
    src = PRE + "from torch.utils.tensorboard import SummaryWriter\n"
    assert lines("DDP301", src + "w = SummaryWriter(log_dir=f'runs/rank{rank}')\n") == []
    assert lines("DDP301", src + "w = SummaryWriter(log_dir='runs/exp')\n") == [7]


def test_single_process_scripts_are_not_judged():
    src = "import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(model)\ntorch.save(model.module.state_dict(), 'm.pt')\n"
    assert lines("DDP301", src) == []


def test_a_helper_module_is_named_by_a_relative_path(monkeypatch):
    from pathlib import Path

    from ddpcheck.lint.engine import lint_path
    from ddpcheck.rules import REGISTRY
    from ddpcheck.settings import LintSettings

    folder = Path(__file__).resolve().parents[2] / "fixtures" / "multifile" / "ddp301_save_helpers"
    monkeypatch.chdir(folder.parent)
    result = lint_path("ddp301_save_helpers/train.py", LintSettings(enabled=frozenset(REGISTRY)))
    via_helper = [f.message for f in result.findings if "writes with" in f.message]
    assert via_helper and all("(ddp301_save_helpers/utils.py)" in m for m in via_helper), via_helper
