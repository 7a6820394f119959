"""The budget bounds all the work done for one linted file, the work outside
the memo included: a recursion whose answers grow every round (a value
rebuilt one level deeper through two functions calling each other) is cut
as unknown after `budget` units, not run for minutes. No timing here: the
work is counted (benchmarks/ holds the timing goals)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ddpcheck.lint.analyze import rule_hits
from ddpcheck.model.flow import every_pass, passes
from ddpcheck.model.memo import TooComplex
from ddpcheck.model.project import Project
from ddpcheck.rules import REGISTRY
from ddpcheck.settings import LintSettings

# `assemble` hands a piece of a composite back to itself through
# `assemble_composite`: every round of the cycle sees the parameter one
# attribute deeper (`kit.core.core...`) and, with two ways to pick a piece,
# twice as many values, so its passes never stop changing.
GROWING_CYCLE = textwrap.dedent('''
    def assemble(pieces, opts):
        if isinstance(pieces[0], Composite):
            return assemble_composite(pieces[0], opts)
        for piece in pieces:
            for name, weight in piece.named_parameters():
                pass
        for piece in pieces:
            for buf in piece.buffers():
                pass
        return [[pieces[0]], pieces[1:]]

    def assemble_composite(kit, opts):
        for key, _ in kit.layout.items():
            if key == "core":
                chosen = kit.core
            else:
                chosen = kit.spares[key]
            assemble([chosen], opts)
''')

BUDGET = 20_000


def _model(code: str, budget: int):
    project = Project(LintSettings(enabled=frozenset(REGISTRY)))
    project.memo.budget = budget
    return project, project.build("t.py", cst.parse_module(code))


def test_a_cycle_whose_answers_grow_every_round_is_unknown_within_the_budget():
    project, model = _model(GROWING_CYCLE, BUDGET)
    with pytest.raises(TooComplex):
        list(every_pass(model))
    # the work stopped at the budget: the rebuilt values were charged as they grew
    assert project.memo.spent == BUDGET + 1
    assert project.memo.stack == [] and not project.memo.provisional


def test_a_file_out_of_budget_is_linted_without_error_and_the_next_file_has_its_own():
    project, model = _model(GROWING_CYCLE, BUDGET)
    settings = project.settings
    run = rule_hits(GROWING_CYCLE, "t.py", settings, project)
    assert run.crashed == ()
    assert project.memo.spent <= BUDGET + 1
    # the next file starts afresh: a plain loop over a loader is found
    plain = "def epochs(loader):\n    for batch in loader:\n        pass\n"
    model = project.build("u.py", cst.parse_module(plain))
    assert [fn.name for fn, _ in every_pass(model)] == ["epochs"]


def test_the_passes_carried_up_through_a_call_are_charged_to_the_budget():
    # A loop reached along many paths of a call graph is carried up once per
    # path and call: work that grows with the callee's answer, so it counts
    # against the file's budget even where nothing needs binding (a
    # DataLoader made in the callee), else a dense call graph runs unbounded.
    loops = 60
    code = "from torch.utils.data import DataLoader\n\ndef inner(data):\n" + "".join(
        f"    for batch in DataLoader(data[{i}]):\n        step(batch)\n" for i in range(loops))
    code += "\ndef outer(data):\n    inner(data)\n"
    project, model = _model(code, BUDGET)
    functions = {fn.name: fn for fn in model.functions}
    assert len(passes(model, functions["inner"])) == loops
    before = project.memo.spent
    assert len(passes(model, functions["outer"])) == loops
    assert project.memo.spent - before >= loops
