"""The prefilter is built from the rules' declared trigger words
(ddpcheck/triggers.py): what it reads from the rule modules' source is what
each rule class declares, every rule that can fire declares something, and a
file passes exactly when one enabled rule's trigger matches it."""

from __future__ import annotations

import subprocess
import sys

from ddpcheck.lint.engine import might_have_findings
from ddpcheck.rules import REGISTRY
from ddpcheck.triggers import COLLECTIVE_UNDER_RANK, LIBRARY_TRAINER, USES_DISTRIBUTED, declared


def test_declarations_read_from_source_equal_the_classes():
    read = declared()
    for code, rule in REGISTRY.items():
        if code.startswith("DDP9"):   # the CLI tests' fake rules
            continue
        assert read.get(code, ()) == rule.triggers, code


def test_every_rule_that_analyses_declares_its_words():
    silent = {code for code, rule in REGISTRY.items() if not rule.triggers and not code.startswith("DDP9")}
    assert silent == {"DDP001"}   # unused-noqa reads comments, not the model


def test_the_prefilter_is_the_union_of_the_enabled_rules_triggers():
    plain = "import torch\nx = torch.zeros(3)\n"
    ddp = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    hang = "import torch.distributed as dist\nif rank == 0:\n    dist.barrier()\n"
    trainer = "from transformers import Trainer\nTrainer(model).train()\n"
    assert not might_have_findings(plain)
    assert might_have_findings(ddp) and USES_DISTRIBUTED.matches(ddp)
    assert might_have_findings(hang) and COLLECTIVE_UNDER_RANK.matches(hang) and not USES_DISTRIBUTED.matches(hang)
    assert might_have_findings(trainer) and LIBRARY_TRAINER.matches(trainer)
    # a rule set that declares none of a file's words does not open it
    assert not might_have_findings(hang, {"DDP101"})
    assert might_have_findings(hang, {"DDP401"})
    assert not might_have_findings(trainer, {"DDP101", "DDP401"})
    assert might_have_findings(trainer, {"DDP301"})


def test_reading_the_declarations_does_not_import_libcst():
    code = ("import sys\nfrom ddpcheck.lint.engine import might_have_findings\n"
            "might_have_findings('dist.init_process_group()')\nprint('libcst' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
