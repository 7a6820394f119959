"""DDP101 missing-set-epoch: beyond the fixtures."""

import textwrap

import pytest

from ddpcheck.lint.engine import lint_path
from ddpcheck.settings import LintSettings
from tests.rules.lintsnippet import lines

TEMPLATE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
ONE = 1
data = list(range(64))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
start = 3
for epoch in {epochs}:
    for batch in loader:
        pass
"""


@pytest.mark.parametrize("epochs", ["range(1)", "range(0, 1)", "range(start, start + 1)", "range(ONE)"])
def test_a_loop_of_one_epoch_has_no_order_to_replay(epochs):
    assert lines("DDP101", TEMPLATE.format(epochs=epochs)) == []


@pytest.mark.parametrize("epochs", ["range(2)", "range(start, start + 2)", "range(int(torch.randint(2, 9, (1,))))"])
def test_more_epochs_are_reported(epochs):
    assert lines("DDP101", TEMPLATE.format(epochs=epochs)) == [10]


def test_a_loop_a_helper_module_makes_and_runs_is_reported_there_only(tmp_path):
    """The script hands nothing over and gets nothing back: the helper makes
    the loader and loops over it. The helper module reports it at its own
    epoch loop; the script's call is no second place to report it."""
    (tmp_path / "engine.py").write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader, DistributedSampler

        def run(args):
            data = list(range(64))
            for epoch in range(args.epochs):
                for batch in DataLoader(data, batch_size=8, sampler=DistributedSampler(data)):
                    pass
        """))
    train = tmp_path / "train.py"
    train.write_text("import torch.distributed as dist\nimport engine\n\n"
                     "dist.init_process_group('nccl')\nengine.run(parse())\ndist.destroy_process_group()\n")
    settings = LintSettings(enabled=frozenset({"DDP101"}))
    assert lint_path(str(train), settings).findings == ()
    (finding,) = lint_path(str(tmp_path / "engine.py"), settings).findings
    assert finding.line == 5
