"""``ddpcheck preflight --gpus 2 -- SCRIPT``: the fixture training scripts, run for real.

Each script under fixtures/train_scripts/ runs once (module-scoped cache), in
its own project folder, through the click command in-process (torch imported
once, workers forked from here as the CLI forks them). Every run checks that
no worker outlived it and records the folder's hash before and after; the
tests then assert the verdicts, rule links, exit code and the run's bounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import REPO, child_pids

pytest.importorskip("torch")

SCRIPTS = REPO / "fixtures" / "train_scripts"
TIMEOUT = 60


def folder_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


class ScriptRun:
    def __init__(self, code, out, err, seconds, before, after, project):
        self.code, self.out, self.err, self.seconds = code, out, err, seconds
        self.before, self.after, self.project = before, after, project
        self.data = json.loads(out) if out.lstrip().startswith("{") else None

    def verdicts(self, check: str) -> list:
        return [v for v in self.data["checks"] if v["id"] == check]

    def verdict(self, check: str) -> dict:
        found = self.verdicts(check)
        assert found, f"no {check!r} verdict in {[v['id'] for v in self.data['checks']]}"
        return found[0]

    def alarms(self) -> list:
        return [v for v in self.data["checks"] if v["status"] != "PASS"]

    def lint(self, code: str) -> dict:
        return next(x for x in self.data["lint"] if x["code"] == code)


@pytest.fixture(scope="module")
def run_script(tmp_path_factory):
    """``run_script(name, *args, module=False)`` -> ScriptRun, each script run once."""
    from click.testing import CliRunner

    from ddpcheck.preflight.command import preflight

    cache: dict = {}
    mp = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        mp.delenv(key, raising=False)
    scratch_tmp = tmp_path_factory.mktemp("tmp")
    mp.setattr(tempfile, "tempdir", str(scratch_tmp))

    def run(name: str, *args: str, module: bool = False) -> ScriptRun:
        key = (name, args, module)
        if key in cache:
            return cache[key]
        project = tmp_path_factory.mktemp(name.replace(".py", ""))
        if module:
            (project / "trainpkg").mkdir()
            (project / "trainpkg" / "__init__.py").write_text("")
            shutil.copy(SCRIPTS / name, project / "trainpkg" / "train.py")
            target = ["-m", "trainpkg.train"]
        else:
            shutil.copy(SCRIPTS / name, project / name)
            target = [name]
        before = folder_hash(project)
        cwd = os.getcwd()
        os.chdir(project)
        try:
            start = time.monotonic()
            result = CliRunner().invoke(
                preflight, ["--gpus", "2", "--timeout", str(TIMEOUT), "--format", "json", "--",
                            *target, *args], catch_exceptions=False)
            seconds = time.monotonic() - start
        finally:
            os.chdir(cwd)
        assert child_pids(os.getpid()) == [], "a worker outlived the preflight"
        err = result.stderr if hasattr(result, "stderr") else ""
        cache[key] = ScriptRun(result.exit_code, result.stdout, err, seconds, before,
                               folder_hash(project), project)
        return cache[key]

    yield run
    mp.undo()


def assert_untouched_and_bounded(run: ScriptRun) -> None:
    assert run.data is not None, run.out + run.err
    assert run.before == run.after, f"the preflight changed {run.project}"
    assert not (run.project / "checkpoints").exists()
    assert run.seconds < TIMEOUT, "the run waited for the watchdog instead of stopping"
    assert not any(r.get("ending") == "no report" for r in run.data["ranks"])


# -- the correct script: no false alarm ---------------------------------------------------


def test_correct_script_passes_without_alarm(run_script):
    run = run_script("fixed_set_epoch.py", "--epochs", "50")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.data["exit_code"] == 0
    assert run.alarms() == []
    # the run was steered: last batch first, a few steps, into epoch 2, stopped together
    assert {r["ending"] for r in run.data["ranks"]} == {"stopped"}
    assert all(r["optimizer_steps"] == 4 for r in run.data["ranks"])  # 3 in epoch 1, 1 in 2
    loader = run.data["ranks"][0]["loaders"][0]
    assert loader["dataset_len"] == 96 and loader["batch_size"] == 8 and loader["distributed"]
    assert [e["batches_served"] for e in loader["epochs"]] == [3, 1]
    assert run.verdict("set_epoch")["status"] == "PASS"
    assert run.verdict("collective_order")["status"] == "PASS"
    assert run.verdict("memory")["name"].endswith("batch 8")
    # NCCL asked for, gloo used, said so
    backend = run.verdict("backend")
    assert "'nccl'" in backend["name"] and "ran on gloo" in backend["name"]
    assert run.data["cuda_stand_in"] is True
    # what it would have written, by which rank, where
    saves = [w for w in run.data["writes"] if w["kind"] == "torch.save"]
    assert [(w["rank"], Path(w["path"]).name) for w in saves] == [(0, "ckpt.pt")]
    assert saves[0]["where"] == "fixed_set_epoch.py:55"


# -- buggy / fixed pairs --------------------------------------------------------------------


def test_no_set_epoch_confirms_ddp101(run_script):
    run = run_script("buggy_no_set_epoch.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("set_epoch")
    assert v["status"] == "FAIL" and v["rule"] == "DDP101"
    assert v["name"] == "DDP101 confirmed: epoch 2 began without set_epoch"
    assert v["ranks"] == [0, 1]
    assert run.lint("DDP101")["runtime"] == "confirmed"


def test_save_on_every_rank_confirms_ddp301(run_script):
    run = run_script("buggy_save_every_rank.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("checkpoint_writes")
    assert v["status"] == "FAIL" and v["rule"] == "DDP301" and v["ranks"] == [0, 1]
    assert v["name"] == "DDP301 confirmed: ranks 0 and 1 both wrote checkpoints/ckpt.pt"
    writers = {w["rank"] for w in run.data["writes"] if w["kind"] == "torch.save"}
    assert writers == {0, 1}
    assert run.lint("DDP301")["runtime"] == "confirmed"


def test_save_on_master_helper_passes(run_script):
    run = run_script("fixed_save_every_rank.py")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    assert {w["rank"] for w in run.data["writes"] if w["kind"] == "torch.save"} == {0}
    # every rank made the folder (exist_ok=True): recorded, kept out, not an alarm. Under bwrap the
    # kernel-level record names the os.mkdir; without it (Landlock and the redirect) the makedirs call
    assert {w["rank"] for w in run.data["writes"] if w["kind"] in ("mkdir", "makedirs")} == {0, 1}


def test_last_batch_of_one_crashes_batchnorm_in_step_one(run_script):
    run = run_script("buggy_last_batch_bn.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("last_batch")
    assert v["status"] == "FAIL"
    assert "Expected more than 1 value per channel" in v["detail"]
    assert "49 per rank" in v["detail"] and "the last of 1" in v["detail"]
    for rank in run.data["ranks"]:
        assert rank["ending"] == "crashed" and rank["optimizer_steps"] == 0  # the first step
        assert rank["crash"]["where"] == "buggy_last_batch_bn.py:50"


def test_drop_last_fixes_the_last_batch(run_script):
    run = run_script("fixed_last_batch_bn.py")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    assert run.verdict("last_batch")["status"] == "PASS"


def test_collective_only_rank0_reaches_is_named_not_hung(run_script):
    run = run_script("buggy_rank0_collective.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("collective_order")
    assert v["status"] == "FAIL" and v["rule"] == "DDP401"
    assert v["name"].startswith("DDP401 confirmed: rank 0 entered all_reduce")
    assert "buggy_rank0_collective.py:54" in v["name"]
    assert "rank 1 a DDP forward at buggy_rank0_collective.py:49" in v["name"]
    assert {r["ending"] for r in run.data["ranks"]} == {"mismatch"}  # stopped, not killed
    assert run.lint("DDP401")["runtime"] == "confirmed"


def test_collective_on_every_rank_passes(run_script):
    run = run_script("fixed_rank0_collective.py")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    ops = [c["op"] for c in run.data["ranks"][1]["collectives"]]
    assert ops.count("all_reduce") == 1  # epoch 1's, on rank 1 too


def test_unused_parameters_are_named(run_script):
    run = run_script("buggy_unused_params.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("unused_parameters")
    assert v["status"] == "FAIL" and "aux_head.weight" in v["name"]
    assert "find_unused_parameters=True" in v["fix"]
    assert run.verdicts("memory") == []  # the step that failed measured nothing


def test_find_unused_parameters_passes(run_script):
    run = run_script("fixed_unused_params.py")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    assert run.data["ranks"][0]["wraps"][0]["find_unused_parameters"] is True


def test_loader_without_distributed_sampler_confirms_ddp104(run_script):
    run = run_script("buggy_no_sampler.py")
    assert_untouched_and_bounded(run)
    assert run.code == 1
    v = run.verdict("distributed_sampler")
    assert v["status"] == "FAIL" and v["rule"] == "DDP104"
    assert "RandomSampler" in v["detail"] and "96 samples, all of them on every rank" in v["detail"]
    assert run.lint("DDP104")["runtime"] == "confirmed"


def test_sampler_behind_a_flag_passes_as_module(run_script):
    run = run_script("fixed_no_sampler.py", module=True)
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    assert run.data["target"] == "-m trainpkg.train"
    assert run.verdict("distributed_sampler")["status"] == "PASS"
    # two persistent loader workers prefetch ahead: the steps still count what was delivered
    assert [r["optimizer_steps"] for r in run.data["ranks"]] == [4, 4]
    assert run.data["ranks"][0]["loaders"][0]["num_workers"] == 2


def test_mp_spawn_script_runs_its_worker_in_place(run_script):
    run = run_script("spawn_launcher.py")
    assert_untouched_and_bounded(run)
    assert run.code == 0 and run.alarms() == []
    notes = " ".join(run.verdict("run")["detail"] for _ in [0])
    assert "mp.spawn(main_worker, nprocs=2) ran in place" in notes
    assert "tcp://127.0.0.1:23456" in run.verdict("backend")["detail"]


# -- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--gpus", "2", "--", "no_such_train.py"], "no_such_train.py: no such file"),
    (["--gpus", "2", "--dataset-size", "10", "--", "x.py"], "--dataset-size is for the factory"),
    (["--gpus", "2", "--steps", "0", "--", "x.py"], "'--steps': 0 is not in the range x>=1"),
    (["--gpus", "2", "--amp", "bf16", "--", "x.py"], "--amp is for the factory mode"),
    (["--gpus", "2", "--optimizer", "sgd", "--", "x.py"], "--optimizer is for the factory"),
    (["--gpus", "2", "--static-graph", "--", "x.py"], "--static-graph is for the factory"),
    (["--gpus", "2", "--safety-margin", "0.2", "--", "x.py"], "--safety-margin is for the"),
    (["--gpus", "2", "--grad-accum", "2", "--", "x.py"], "--grad-accum is for the factory"),
    (["--gpus", "2", "--", "-m"], "-m needs a module name"),
    (["--gpus", "2", "--steps", "3"], "--steps needs a script"),
])
def test_usage_errors_are_one_line(args, message, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ddpcheck.preflight.command import preflight

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('hi')\n")
    result = CliRunner().invoke(preflight, args)
    assert result.exit_code == 2
    err = result.stderr if hasattr(result, "stderr") else result.output
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_rank_that_never_ends_is_named_hung_where_it_waits(tmp_path, monkeypatch):
    """Rank 1 sleeps after init: once rank 0 has ended, the launcher's watchdog waits its
    grace, dumps rank 1's stack and kills it; the verdict names the line."""
    from click.testing import CliRunner

    from ddpcheck.preflight.command import preflight

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    project = tmp_path / "project"
    project.mkdir()
    (project / "stuck.py").write_text(
        "import time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(600)\n"
        "dist.destroy_process_group()\n")
    before = folder_hash(project)
    monkeypatch.chdir(project)
    start = time.monotonic()
    result = CliRunner().invoke(preflight, ["--gpus", "2", "--timeout", "40", "--format",
                                            "json", "--", "stuck.py"], catch_exceptions=False)
    seconds = time.monotonic() - start
    assert child_pids(os.getpid()) == [], "a worker outlived the preflight"
    assert folder_hash(project) == before
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["exit_code"] == 1
    hang = [v for v in data["checks"] if v["id"] == "hang"]
    assert len(hang) == 1 and hang[0]["ranks"] == [1] and hang[0]["status"] == "FAIL", \
        json.dumps(data["checks"], indent=1)
    assert "still running after the other ranks had ended" in hang[0]["detail"]
    assert "stuck at stuck.py:5" in hang[0]["detail"]
    assert data["ranks"][0]["ending"] == "finished"
    killed = data["ranks"][1]
    assert killed["ending"] == "no report" and killed["status"] == "stopped"
    assert killed["stuck_at"].startswith("stuck.py:5")
    # --timeout 40 gives a 10 s grace: the watchdog stops rank 1 well before the deadline even
    # when the ranks are slow to start on a loaded machine (at --timeout 20 they once were not)
    assert seconds < 40, "stopped by the watchdog's grace, not the deadline"
