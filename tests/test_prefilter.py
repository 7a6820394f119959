"""The prefilter is built from the rules' declared trigger words
(ddpcheck/triggers.py): what it reads from the rule modules' source is what
each rule class declares, every rule that can fire declares something, and a
`Prefilter(codes)` is exactly the union of `codes`' triggers; lint opens a
file when any rule's trigger matches it, so that what one rule reports does
not depend on which other rules were selected with it."""

from __future__ import annotations

import subprocess
import sys

from pathlib import Path

from ddpcheck.lint.engine import lint_path, might_have_findings, worth_analysing
from ddpcheck.rules import REGISTRY
from ddpcheck.settings import LintSettings
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


# A script whose process group is started by a helper module: the script
# itself only names `get_rank()` and `barrier()` (the words of the hang rules),
# none of the words of the unguarded-save rule, which still finds its save.
GROUP_STARTER = """\
import torch


def start():
    torch.distributed.init_process_group(backend="nccl")
"""

SAVES_ON_EVERY_RANK = """\
import torch

from launch import start


def report_memory():
    print("rank", torch.distributed.get_rank(), torch.cuda.memory_allocated())
    torch.distributed.barrier()


def main(path):
    start()
    report_memory()
    torch.save({"weights": torch.zeros(3)}, path)


if __name__ == "__main__":
    main("ground_truth.pt")
"""


def test_a_rules_findings_do_not_depend_on_the_rules_selected_with_it(tmp_path: Path):
    (tmp_path / "launch.py").write_text(GROUP_STARTER)
    script = tmp_path / "train.py"
    script.write_text(SAVES_ON_EVERY_RANK)
    assert not any(t.matches(SAVES_ON_EVERY_RANK) for t in declared()["DDP301"])
    every_rule = frozenset(code for code in declared() if not code.startswith("DDP9"))

    def saves(enabled):
        result = lint_path(str(script), LintSettings(enabled=frozenset(enabled)))
        assert result.error is None
        return [(f.line, f.message) for f in result.findings if f.code == "DDP301"]

    alone = saves({"DDP301"})
    assert alone and alone[0][0] == 14
    assert saves(every_rule) == alone
    assert saves({"DDP301", "DDP401"}) == alone


def test_only_the_noqa_check_opens_nothing():
    ddp = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    assert not worth_analysing(ddp, frozenset({"DDP001"}))
    assert not worth_analysing(ddp, frozenset())
    assert worth_analysing(ddp, frozenset({"DDP001", "DDP101"}))
    assert not worth_analysing("import torch\nx = torch.zeros(3)\n", frozenset({"DDP101"}))


# A script naming no distributed word: its whole run lives in a module it imports.
RUNNER = """\
import torch


class Runner:
    def __init__(self, steps):
        torch.distributed.init_process_group(backend="nccl")
        self.steps = steps

    def run(self):
        for _ in range(self.steps):
            pass
"""
PLAIN_HELPER = """\
def summarise(values):
    return sum(values) / len(values)
"""
ENTRY = """\
import sys

from {module} import {name}

if __name__ == "__main__":
    {call}
"""
EVERY_RULE = frozenset(code for code in declared() if not code.startswith("DDP9"))


def analysed_files(monkeypatch) -> list[str]:
    import ddpcheck.lint.analyze as analysis

    seen: list[str] = []
    real = analysis.analyze

    def counting(text, path, settings, project=None):
        seen.append(Path(path).name)
        return real(text, path, settings, project)

    monkeypatch.setattr(analysis, "analyze", counting)
    return seen


def test_an_entry_script_whose_run_is_in_a_helper_module_is_analysed(tmp_path: Path, monkeypatch):
    (tmp_path / "runner.py").write_text(RUNNER)
    script = tmp_path / "train.py"
    script.write_text(ENTRY.format(module="runner", name="Runner", call="Runner(int(sys.argv[1])).run()"))
    assert not worth_analysing(script.read_text(), EVERY_RULE)
    seen = analysed_files(monkeypatch)
    result = lint_path(str(script), LintSettings(enabled=EVERY_RULE, root=str(tmp_path)))
    assert seen == ["train.py"]
    assert [(f.code, f.line) for f in result.findings] == [("DDP402", 6)]   # at the call: the group is never destroyed


def test_a_script_importing_nothing_distributed_is_not_analysed(tmp_path: Path, monkeypatch):
    (tmp_path / "stats.py").write_text(PLAIN_HELPER)
    script = tmp_path / "report.py"
    script.write_text(ENTRY.format(module="stats", name="summarise", call="print(summarise([1, 2]))"))
    seen = analysed_files(monkeypatch)
    result = lint_path(str(script), LintSettings(enabled=EVERY_RULE, root=str(tmp_path)))
    assert seen == [] and result.findings == ()
    assert result.helpers == (str(tmp_path / "stats.py"),)   # what the decision read: the cache keys on it


def test_only_scripts_look_at_their_imports(tmp_path: Path, monkeypatch):
    """A module with no entry point is judged by its own text (the cost of a
    big repo stays that of its distributed files), unless config's
    `script-files` names it."""
    (tmp_path / "runner.py").write_text(RUNNER)
    module = tmp_path / "tasks.py"
    module.write_text("from runner import Runner\n\n\ndef go(n):\n    Runner(n).run()\n")
    seen = analysed_files(monkeypatch)
    lint_path(str(module), LintSettings(enabled=EVERY_RULE, root=str(tmp_path)))
    assert seen == []
    lint_path(str(module), LintSettings(enabled=EVERY_RULE, root=str(tmp_path), script_files=("tasks.py",)))
    assert seen == ["tasks.py"]


def test_a_helper_edited_during_a_run_is_judged_again(tmp_path: Path, monkeypatch):
    """One run (one Projects, as a worker keeps it) lints the same script
    twice: the helper's prefilter verdict is kept by the project with its
    other per-file caches, and is read again once the helper's mtime moves."""
    import os

    from ddpcheck.lint.engine import Projects

    helper = tmp_path / "stats.py"
    helper.write_text(PLAIN_HELPER)
    script = tmp_path / "report.py"
    script.write_text(ENTRY.format(module="stats", name="summarise", call="print(summarise([1, 2]))"))
    settings = LintSettings(enabled=EVERY_RULE, root=str(tmp_path))
    projects = Projects()
    seen = analysed_files(monkeypatch)
    lint_path(str(script), settings, projects=projects)
    assert seen == []
    helper.write_text(RUNNER.replace("class Runner", "class Runner2") + "\n\ndef summarise(xs):\n    return sum(xs)\n")
    stat = helper.stat()
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    lint_path(str(script), settings, projects=projects)
    assert seen == ["report.py"]
