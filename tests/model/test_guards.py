"""RankGuard recognition: which worlds (rank 0 / other ranks / single process)
reach the body of an `if`, for the idioms real scripts use."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpcheck.model.project import Project
from ddpcheck.model.worlds import D0, DN, S
from ddpcheck.settings import LintSettings
from ddpcheck.model.guards import worlds

PRE = "import os\nimport torch.distributed as dist\nfrom accelerate import Accelerator\n"


def body_worlds(test: str, setup: str = "", guards: tuple[str, ...] = ()) -> frozenset[str]:
    code = PRE + setup + f"if {test}:\n    marker()\n"
    model = Project(LintSettings(enabled=frozenset(), main_process_guards=guards)).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "marker")
    return worlds(model, site.ctx)


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
    "config.get('rank', 0) == 0",
    "config['local_rank'] in (-1, 0)",
    "not params.rank",
    "not dist.get_rank()",
    "not params.rank and not os.path.isdir(d)",
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


@pytest.mark.parametrize("test", ["epoch % 10 == 0", "args.save", "rank_ok(x)", "len(batch) == 0",
                                  "config.get('num_ranks', 1) == 0", "config['node_rank'] == 0", "batch[0] == 0",
                                  "not self.is_built_on_rank", "cfg.use_global_rank"])
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
    model = Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "marker")
    assert DN not in worlds(model, site.ctx)


def test_short_circuit_and_conditional_expression_arms():
    code = PRE + "is_main_process() and marker()\nx = marker() if dist.get_rank() == 0 else None\n"
    model = Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(code))
    for site in (c for c in model.calls if c.func == "marker"):
        assert DN not in worlds(model, site.ctx)


# -- guards through the value flow -------------------------------------------------

def _marker_worlds(code: str) -> frozenset[str]:
    model = Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(PRE + code))
    site = next(c for c in model.calls if c.func == "marker")
    return worlds(model, site.ctx)


def test_namespace_flag_set_in_another_function():
    worlds = _marker_worlds(
        "def setup(config):\n    config.writes_logs = dist.get_rank() == 0\n"
        "def train(config):\n    if config.writes_logs:\n        marker()\n")
    assert DN not in worlds and D0 in worlds


def test_namespace_flag_not_from_the_rank_stays_unknown():
    worlds = _marker_worlds(
        "def setup(config):\n    config.writes_logs = config.save_every > 0\n"
        "def train(config):\n    if config.writes_logs:\n        marker()\n")
    assert DN in worlds


def test_parameter_is_the_guard_its_callers_pass():
    code = ("def log(leader):\n    if leader:\n        marker()\n"
            "def main(args):\n    log(args.rank == 0)\n")
    assert DN not in _marker_worlds(code)
    # one caller passing a value true on every rank makes it no guard
    assert DN in _marker_worlds(code + "    log(args.verbose)\n")
    # a function handed away: its callers are unknown, so is the parameter
    handed = ("def log(leader):\n    if leader:\n        marker()\n"
              "def main(args):\n    run(log)\n")
    assert DN in _marker_worlds(handed)


def test_helper_guard_on_its_parameter_judged_at_the_call():
    from ddpcheck.model.guards import worlds_from_call

    code = PRE + ("def save(state, should_write):\n    if not should_write:\n        return\n    marker()\n"
                  "def main(args):\n    save(s, should_write=args.rank == 0)\n    save(s, should_write=args.save)\n")
    model = Project(LintSettings(enabled=frozenset())).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "marker")
    fn = site.ctx.function
    guarded, unguarded = [c for c in model.calls if c.func == "save"]
    assert DN not in worlds_from_call(model, site.ctx, fn, ((model, guarded),))
    assert DN in worlds_from_call(model, site.ctx, fn, ((model, unguarded),))
