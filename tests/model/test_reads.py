"""Names read per expression: recorded by the builder in its one walk, and
equal to what reads() computes for an unrecorded expression."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from ddpcheck.model.project import Project
from ddpcheck.model.reads import _compute, reads
from ddpcheck.settings import LintSettings

REPO = Path(__file__).resolve().parents[2]
SETTINGS = LintSettings(enabled=frozenset())


def _model(code: str):
    return Project(SETTINGS).build("t.py", cst.parse_module(code))


def test_assignment_call_and_argument_reads():
    m = _model(
        "import os\nimport torch.distributed as dist\n"
        "bs = args.batch_size // dist.get_world_size()  # world_size in a comment\n"
        "ws = int(os.environ.get('WORLD_SIZE', 1)) + cfg['nodes'] + len('world')\n"
        "loader = DataLoader(ds, batch_size=bs, sampler=DistributedSampler(ds))\n"
    )
    by_key = {a.key: a for a in m.assigns}
    assert reads(m, by_key["bs"].value) == {"args.batch_size", "args", "dist.get_world_size", "dist"}
    assert reads(m, by_key["ws"].value) == {"int", "os.environ.get", "os.environ", "os",
                                            "os.environ['WORLD_SIZE']", "cfg['nodes']", "cfg", "len"}
    loader = next(c for c in m.calls if c.func == "DataLoader")
    assert reads(m, loader.arg("batch_size")) == {"bs"}
    assert reads(m, loader.node) >= {"DataLoader", "ds", "bs", "DistributedSampler"}
    (div,) = m.divisions_of[id(by_key["bs"].value)]
    assert div.dividend == {"args.batch_size", "args"} and div.divisor == {"dist.get_world_size", "dist"}


def test_recorded_reads_equal_computed_reads_on_every_fixture():
    files = sorted(REPO.glob("fixtures/**/*.py"))
    assert len(files) > 50
    checked = 0
    for path in files:
        m = _model(path.read_text())
        exprs = [a.value for a in m.assigns if a.value is not None] + [c.node for c in m.calls]
        exprs += [a.value for c in m.calls for a in c.node.args]
        for expr in exprs:
            assert m.reads_of[id(expr)] == _compute(m, expr), (path.name, m.module.code_for_node(expr))
            checked += 1
    assert checked > 1000
