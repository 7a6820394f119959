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


# A config object whose field holds the local rank, tested in a helper module
# the script calls: the field is judged by what the function that made the
# object set it to.
_CONFIG = """\
import os
from types import SimpleNamespace

def get_config():
    conf = SimpleNamespace()
    conf.out = "ckpt"
    conf.device = {device}
    return conf
"""
_LEARNER = """\
import torch

class Learner:
    def save_state(self, conf, tag):
        torch.save({{}}, f"{{conf.out}}/model_{{tag}}.pth")

    def train(self, conf, epochs):
        for epoch in range(epochs):
            if {test}:
                self.save_state(conf, epoch)
"""
_ENTRY = """\
import torch.distributed as dist
from config import get_config
from learner import Learner

if __name__ == "__main__":
    conf = get_config()
    dist.init_process_group("nccl")
    learner = Learner()
    learner.train(conf, 3)
"""


@pytest.mark.parametrize("device, test, reported", [
    ('int(os.environ["LOCAL_RANK"])', "conf.device == 0", False),
    ('int(os.environ["LOCAL_RANK"])', "0 == conf.device", False),
    ('int(os.environ["LOCAL_RANK"])', "epoch > 1 and conf.device in [0, -1]", False),
    ('int(os.environ["LOCAL_RANK"])', "conf.device != 0", True),
    ('"cuda"', "conf.device == 0", True),          # not a rank: the test says nothing of ranks
    ("int(os.environ.get('GPU', 0))", "conf.device == 0", True),
])
def test_a_rank_field_of_a_config_guards_a_helper_called_from_the_script(tmp_path, device, test, reported):
    from ddpcheck.lint.engine import lint_path

    (tmp_path / "config.py").write_text(_CONFIG.format(device=device))
    (tmp_path / "learner.py").write_text(_LEARNER.format(test=test))
    (tmp_path / "train.py").write_text(_ENTRY)
    result = lint_path(str(tmp_path / "train.py"), LintSettings(enabled=frozenset({"DDP301"}), root=str(tmp_path)))
    assert [f.line for f in result.findings] == ([9] if reported else [])


def test_a_rank_field_of_a_config_guards_in_the_script_itself(tmp_path):
    from ddpcheck.lint.engine import lint_path

    (tmp_path / "config.py").write_text(_CONFIG.format(device='int(os.environ["LOCAL_RANK"])'))
    entry = ("import torch\nimport torch.distributed as dist\nfrom config import get_config\n\n"
             "conf = get_config()\ndist.init_process_group('nccl')\n"
             "if conf.device == 0:\n    torch.save({}, 'a.pt')\n"
             "if conf.out == 0:\n    torch.save({}, 'b.pt')\n")
    (tmp_path / "train.py").write_text(entry)
    result = lint_path(str(tmp_path / "train.py"), LintSettings(enabled=frozenset({"DDP301"}), root=str(tmp_path)))
    assert [f.line for f in result.findings] == [10]
