"""RankGuard recognition: which worlds (rank 0 / other ranks / single process)
reach the body of an `if`, for the idioms real scripts use."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpcheck.model.builder import build_model
from ddpcheck.model.worlds import D0, DN, S
from ddpcheck.settings import LintSettings

PRE = "import os\nimport torch.distributed as dist\nfrom accelerate import Accelerator\n"


def body_worlds(test: str, setup: str = "", guards: tuple[str, ...] = ()) -> frozenset[str]:
    code = PRE + setup + f"if {test}:\n    marker()\n"
    model = build_model("t.py", cst.parse_module(code), LintSettings(enabled=frozenset(), main_process_guards=guards))
    site = next(c for c in model.calls if c.func == "marker")
    return model.worlds(site.ctx)


@pytest.mark.parametrize("test", [
    "dist.get_rank() == 0",
    "args.rank == 0",
    "args.local_rank in [-1, 0]",
    "0 == rank",
    "int(os.environ['RANK']) == 0",
    "os.environ.get('LOCAL_RANK', '0') == '0'",
    "rank == 0x0",
    "is_main_process()",
    "utils.is_main_process()",
    "accelerator.is_main_process",
    "trainer.is_global_zero",
    "not args.distributed or args.rank == 0",
    "args.rank % ngpus_per_node == 0",
    "args.save and args.local_rank == 0",
])
def test_main_only_guards_exclude_the_other_ranks(test):
    worlds = body_worlds(test)
    assert DN not in worlds and D0 in worlds


@pytest.mark.parametrize("test", ["rank != 0", "dist.get_rank() > 0", "args.local_rank not in (-1, 0)"])
def test_other_rank_guards_exclude_rank_zero(test):
    assert body_worlds(test) & {D0, DN} == {DN}


@pytest.mark.parametrize("test", ["args.distributed", "dist.is_initialized()", "world_size > 1",
                                  "dist.is_available() and dist.is_initialized()"])
def test_distribution_flags_run_on_every_rank(test):
    assert body_worlds(test) == {D0, DN}


@pytest.mark.parametrize("test", ["epoch % 10 == 0", "args.save", "rank_ok(x)", "len(batch) == 0"])
def test_unknown_tests_say_nothing(test):
    assert body_worlds(test) == {D0, DN, S}


def test_variable_assigned_from_a_rank_test():
    setup = "ddp_rank = int(os.environ['RANK'])\nmaster_process = ddp_rank == 0\n"
    assert DN not in body_worlds("master_process", setup)


def test_helper_predicate_is_followed():
    setup = "def get_rank():\n    if not dist.is_initialized():\n        return 0\n    return dist.get_rank()\n\n" \
            "def am_i_first():\n    return get_rank() == 0\n\n"
    assert DN not in body_worlds("am_i_first()", setup)


def test_configured_guard_names():
    assert DN in body_worlds("on_leader_node()")
    assert DN not in body_worlds("on_leader_node()", guards=("on_leader_node",))


def test_early_return_guards_the_rest_of_the_block():
    code = PRE + "def f():\n    if dist.get_rank() != 0:\n        return\n    marker()\n"
    model = build_model("t.py", cst.parse_module(code), LintSettings(enabled=frozenset()))
    site = next(c for c in model.calls if c.func == "marker")
    assert DN not in model.worlds(site.ctx)


def test_short_circuit_and_conditional_expression_arms():
    code = PRE + "is_main_process() and marker()\nx = marker() if dist.get_rank() == 0 else None\n"
    model = build_model("t.py", cst.parse_module(code), LintSettings(enabled=frozenset()))
    for site in (c for c in model.calls if c.func == "marker"):
        assert DN not in model.worlds(site.ctx)
