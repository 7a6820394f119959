"""Which processes reach a function: answers do not depend on the order the
questions are asked in, even through recursive helpers."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.project import Project
from ddpcheck.model.reach import other_ranks_reach, script_reaches
from ddpcheck.settings import LintSettings

# a <-> b call each other; module-level code calls a on every rank.
CODE = """\
import torch.distributed as dist

def a():
    b()

def b():
    a()
    marker()

a()
"""


def _model():
    return Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(CODE))


def _fn(model, name):
    return next(f for f in model.functions if f.name == name)


def _first_call_in(model, name):
    return next(c for c in model.calls if c.ctx.function is _fn(model, name))


def test_recursive_helpers_answer_the_same_in_any_order():
    for order in (("a", "b"), ("b", "a")):
        model = _model()
        got = {name: other_ranks_reach(model, _first_call_in(model, name).ctx) for name in order}
        assert got == {"a": True, "b": True}, order
        model = _model()
        used = {name: script_reaches(model, _fn(model, name)) for name in order}
        assert used == {"a": True, "b": True}, order


def test_a_registered_hook_is_not_run_at_its_registration():
    code = ("def hook(*a):\n    marker()\n"
            "def other(*a):\n    marker()\n"
            "engine.register_save_hook(hook)\n"
            "atexit.register(hook)\n"
            "trainer.add_callback(hook)\n"
            "run(other)\n")
    model = Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(code))
    hooked, handed = [c for c in model.calls if c.func == "marker"]
    assert not other_ranks_reach(model, hooked.ctx)
    assert other_ranks_reach(model, handed.ctx)   # handed to a call that may run it there
