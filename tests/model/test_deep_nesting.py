"""Valid code however deeply nested is analysed: ddpcheck's own walks are
iterative where the depth comes from user code (issue: `f(f(f(...)))` 150 deep
was refused as "too deeply nested")."""

from __future__ import annotations

import sys

from ddpcheck.lint.analyze import analyze
from ddpcheck.rules import REGISTRY
from ddpcheck.settings import LintSettings

PRE = ("import torch\nimport torch.distributed as dist\n"
       "from torch.nn.parallel import DistributedDataParallel as DDP\n"
       "dist.init_process_group('nccl')\nmodel = DDP(model)\n")
ALL = LintSettings(enabled=frozenset(REGISTRY))


def _codes(text: str) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in analyze(text, "deep.py", ALL).findings]


def test_calls_nested_150_deep_are_linted_and_findings_positioned():
    deep = "f(" * 150 + "1" + ")" * 150
    text = PRE + f"x = {deep}\ntorch.save(model.state_dict(), {deep})\n"
    found = _codes(text)
    assert (7, "DDP301") in found and (7, "DDP302") in found, found


def test_a_long_boolean_chain_guard_is_understood():
    test = " and ".join(["dist.get_rank() == 0"] * 600)
    text = PRE + f"if {test}:\n    torch.save(model.module.state_dict(), 'ckpt.pt')\n"
    assert not [c for _, c in _codes(text) if c == "DDP301"]   # guarded: rank 0 only


def test_deep_attribute_chain_and_the_limit_is_restored():
    limit = sys.getrecursionlimit()
    text = PRE + "x = a" + ".b" * 3000 + "\nnot_guarded = " + "not " * 2000 + "flag\n"
    assert _codes(text) is not None
    assert sys.getrecursionlimit() == limit
