"""Idioms of real public training scripts, captured in fixtures/script_idioms/ (each
written for this project, after a script the preflight once got wrong): the CUDA
surface on a machine without GPUs, a peek before set_epoch, rank-0 evaluation through
the DDP wrapper, gradient accumulation under no_sync, an endless stream over the
loader, DataParallel's last batch, plain single-process scripts and saves guarded by
the local rank on several nodes. Parts are tested directly (the DataParallel scatter,
the process shape, the stand-in, the judge); each fixture also runs through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ddpcheck.preflight.checks import CheckId

from .conftest import REPO, child_pids

torch = pytest.importorskip("torch")

IDIOMS = REPO / "fixtures" / "script_idioms"
TIMEOUT = 60


# -- DataParallel on CPU: torch's scatter rules ----------------------------------------------


class _Clips(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, clips, mode="train"):
        return self.head(clips)


def _emulated(devices: int):
    from ddpcheck.preflight.script import parallel

    dp = torch.nn.DataParallel.__new__(torch.nn.DataParallel)
    parallel.emulate_init(dp, _Clips(), devices)
    return dp


def test_last_batch_smaller_than_devices_leaves_a_replica_without_input():
    from ddpcheck.preflight.script import parallel

    dp, record = _emulated(4), []
    with pytest.raises(TypeError, match=r"Caught TypeError in replica 3 on device 3") as err:
        parallel.emulate_forward(dp, (torch.randn(3, 4),), {"mode": "train"}, record)
    assert "missing 1 required positional argument: 'clips'" in str(err.value)
    # the tensor split into 3 chunks, the keyword copied to all 4 devices
    assert record == [{"devices": 4, "batch": 3, "replicas": 4, "positional": [1, 1, 1, 0],
                       "keyword": [1, 1, 1, 1]}]


def test_positional_only_last_batch_runs_on_fewer_replicas():
    from ddpcheck.preflight.script import parallel

    dp, record = _emulated(4), []
    out = parallel.emulate_forward(dp, (torch.randn(3, 4),), {}, record)
    assert out.shape == (3, 2) and record[0]["replicas"] == 3
    # torch.chunk's rule, as the tutorial prints it on 3 GPUs: 10 -> 4, 4, 2
    dp3 = _emulated(3)
    sizes = []
    dp3.module.register_forward_hook(lambda m, args, out: sizes.append(args[0].shape[0]))
    parallel.emulate_forward(dp3, (torch.randn(10, 4),), {}, [])
    assert sizes == [4, 4, 2]


# -- which process shape -------------------------------------------------------------------------


def test_process_shape_from_the_script_and_its_local_imports(tmp_path):
    from ddpcheck.preflight.script.processes import ProcessShape, plan_processes

    (tmp_path / "helpers.py").write_text("import torch.distributed as dist\n"
                                         "def setup():\n    dist.init_process_group('nccl')\n")
    (tmp_path / "ddp.py").write_text("from helpers import setup\nsetup()\n")
    (tmp_path / "dp.py").write_text("import torch\nm = torch.nn.DataParallel(torch.nn.Linear(1, 1))\n")
    (tmp_path / "plain.py").write_text("import torch\nm = torch.nn.Linear(1, 1)\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert plan_processes(str(tmp_path / "ddp.py")).shape == ProcessShape.RANKS
    assert "helpers.py" in plan_processes(str(tmp_path / "ddp.py")).why
    assert plan_processes(str(tmp_path / "dp.py")).shape == ProcessShape.DATA_PARALLEL
    assert plan_processes(str(tmp_path / "plain.py")).shape == ProcessShape.SINGLE
    assert plan_processes(str(tmp_path / "broken.py")).shape == ProcessShape.RANKS  # unknown


def test_rank_environment_for_one_process_and_emulated_nodes():
    from ddpcheck.preflight.script.launch import ScriptSpec, node_of, rank_environment

    spec = ScriptSpec("t.py", "t.py", None, (), ".", 3, True, 60, "/s", None, "k")
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_PORT": "1", "PATH": "/b"}
    import dataclasses

    one = rank_environment(dataclasses.replace(spec, one_process=True), env)
    assert set(one) == {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}
    assert all(v is None for v in one.values())
    nodes = rank_environment(dataclasses.replace(spec, nodes=2), env)
    assert nodes == {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                     "GROUP_WORLD_SIZE": "2"}
    assert node_of({"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}) == (1, 2)
    assert node_of({"SLURM_NODEID": "3", "SLURM_NNODES": "4"}) == (3, 4)


# -- the CUDA stand-in ------------------------------------------------------------------------


def test_stand_in_answers_the_cuda_surface_and_is_removed():
    from ddpcheck.preflight.script.standin import CudaStandIn

    stand_in = CudaStandIn(4, 1)
    stand_in.install()
    try:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 4
        assert torch.accelerator.current_accelerator().type == "cuda"
        model = torch.nn.Linear(2, 2).to(1).cuda(2).to(torch.device("cuda", 3))
        x = torch.randn(5, 2).to("cuda:1", non_blocking=True).cuda().pin_memory()
        y = torch.zeros(5, 2, device="cuda")
        assert model(x).device.type == "cpu" and y.device.type == "cpu"
        torch.cuda.set_device(2)
        assert torch.cuda.current_device() == 2 and stand_in.set_device_calls == [2]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        torch.cuda.synchronize()
        assert start.elapsed_time(end) >= 0
        assert torch.cuda.get_device_properties(0).total_memory > 0
        assert torch.cuda.is_bf16_supported()
        scaler = torch.amp.GradScaler("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert "torch.cuda.set_device" in stand_in.used
    finally:
        stand_in.uninstall()
    assert not torch.cuda.is_available()
    assert torch.nn.Module.to.__name__ == "to"


def test_stand_in_failures_are_told_apart_from_the_scripts():
    from ddpcheck.preflight.script.standin import failure_is_stand_in

    assert failure_is_stand_in("Torch not compiled with CUDA enabled", "")
    assert failure_is_stand_in("boom", 'File "/x/torch/cuda/__init__.py", line 3, in init')
    tensor_op = 'File "/x/ddpcheck/preflight/script/standin.py", line 9, in __torch_function__'
    assert not failure_is_stand_in("Expected more than 1 value per channel", tensor_op)
    assert not failure_is_stand_in("batch_size should be a positive integer value", "")


# -- the judge ---------------------------------------------------------------------------------


def _facts(rank, **kw):
    from ddpcheck.preflight.script.facts import Ending, RankFacts

    kw.setdefault("ending", Ending.STOPPED)
    return RankFacts(rank=rank, world_size=kw.pop("world", 2), **kw)


def test_one_path_per_node_is_a_node_warning_and_per_rank_a_failure():
    from ddpcheck.preflight.script import judge
    from ddpcheck.preflight.script.facts import WriteFact

    save = WriteFact("torch.save", "/p/ckpt.pt", "train.py:20", True)
    out = judge.judge([_facts(0, writes=[save], node=0, nodes=2),
                       _facts(1, writes=[save], node=1, nodes=2)], [None, None], 2, "", 60)
    v = next(v for v in out.checks if v.id == CheckId.NODE_WRITES)
    assert v.status == "WARN" and "written by 2 nodes" in v.name and "global rank 0" in v.fix
    assert out.exit_code == 0
    out = judge.judge([_facts(0, writes=[save]), _facts(1, writes=[save])], [None, None], 2,
                      "", 60)
    assert any(v.id == CheckId.CHECKPOINT_WRITES and v.status == "FAIL"
               for v in out.checks)


def test_a_stand_in_failure_is_a_warning_not_the_scripts_crash():
    from ddpcheck.preflight.script import judge
    from ddpcheck.preflight.script.facts import CrashFact, Ending

    crash = CrashFact("RuntimeError", "Torch not compiled with CUDA enabled", "train.py:9",
                      frames=["train.py:9 in <module>: x = torch.cuda.foo()"])
    facts = [_facts(r, ending=Ending.CRASHED, crash=crash, cuda_stand_in=True) for r in (0, 1)]
    out = judge.judge(facts, [None, None], 2, "", 60)
    v = next(v for v in out.checks if v.id == CheckId.CPU_STAND_IN)
    assert v.status == "WARN" and "not checked past train.py:9" in v.name
    assert out.exit_code == 0


def test_a_crash_row_shows_the_exception_and_the_scripts_frames():
    from ddpcheck.preflight.script import judge
    from ddpcheck.preflight.script.facts import CrashFact, Ending

    crash = CrashFact("KeyError", "'SLURM_PROCID'", "train.py:15",
                      frames=["train.py:15 in <module>: rank = int(os.environ['SLURM_PROCID'])"])
    facts = [_facts(r, ending=Ending.CRASHED, crash=crash) for r in (0, 1)]
    v = next(v for v in judge.judge(facts, [None, None], 2, "", 60).checks
             if v.id == CheckId.CRASH)
    assert "KeyError: 'SLURM_PROCID'" in v.name and "os.environ['SLURM_PROCID']" in v.detail
    assert "json" not in v.fix and v.fix.startswith("fix the KeyError at train.py:15")


def test_an_exit_before_training_is_a_warning_with_its_line():
    from ddpcheck.preflight.script import judge
    from ddpcheck.preflight.script.facts import Ending

    facts = [_facts(r, ending=Ending.EXITED, ending_detail="sys.exit(None) at main.py:51")
             for r in (0, 1)]
    out = judge.judge(facts, [None, None], 2, "", 60)
    v = next(v for v in out.checks if v.id == CheckId.RUN)
    assert v.status == "WARN" and "main.py:51" in v.detail and out.exit_code == 0


def test_one_process_has_no_per_rank_verdicts():
    from ddpcheck.preflight.script import judge
    from ddpcheck.preflight.script.facts import EpochFact, LoaderFact, WriteFact

    loader = LoaderFact(0, "train.py:5", "TensorDataset", 200, 20, False, "RandomSampler",
                        False, True, None, None, None, 0, 10, True, training=True,
                        epochs=[EpochFact(1, None, 0, "a", steps=3)])
    save = WriteFact("torch.save", "/p/model.pt", "train.py:12", True)
    main = _facts(0, world=1, loaders=[loader], writes=[save], one_process=True, optimizer_steps=4)
    out = judge.judge([main], [None], 2, "", 60, one_process=True)
    checks = {v.id for v in out.checks}
    assert CheckId.DISTRIBUTED_SAMPLER not in checks and CheckId.CHECKPOINT_WRITES not in checks
    v = next(v for v in out.checks if v.id == CheckId.SINGLE_PROCESS)
    assert v.status == "WARN" and "all 200 samples" in v.detail and "model.pt" in v.detail
    assert out.exit_code == 0


# -- the fixtures through the CLI ------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_idiom(tmp_path_factory):
    """``run_idiom(name, *args, gpus=2)`` -> (exit code, json report, seconds, untouched)."""
    from click.testing import CliRunner

    from ddpcheck.preflight.command import preflight

    mp = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        mp.delenv(key, raising=False)
    mp.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tmp")))

    def run(name: str, *args: str, gpus: int = 2, options=()):
        project = tmp_path_factory.mktemp(name.replace(".py", ""))
        shutil.copy(IDIOMS / name, project / name)
        before = sorted(p.name for p in project.iterdir())
        cwd = os.getcwd()
        os.chdir(project)
        try:
            start = time.monotonic()
            result = CliRunner().invoke(
                preflight, ["--gpus", str(gpus), "--timeout", str(TIMEOUT), "--format", "json",
                            *options, "--", name, *args], catch_exceptions=False)
            seconds = time.monotonic() - start
        finally:
            os.chdir(cwd)
        assert child_pids(os.getpid()) == [], "a worker outlived the preflight"
        untouched = sorted(p.name for p in project.iterdir()) == before
        return result.exit_code, json.loads(result.stdout), seconds, untouched

    yield run
    mp.undo()


def _checks(report, status=None):
    return {v["id"] for v in report["checks"] if status is None or v["status"] == status}


def test_seed_dataparallel_case_is_reproduced_and_named(run_idiom):
    code, report, seconds, untouched = run_idiom("dp_kwargs_last_batch.py", gpus=4)
    assert code == 1 and untouched and report["one_process"] is True
    v = next(v for v in report["checks"] if v["id"] == "data_parallel" and v["status"] == "FAIL")
    assert "8607 samples, batch 4, 4 devices" in v["detail"]
    assert "last batch holds 3 samples" in v["detail"] and "replica 3" in v["name"]
    assert "drop_last=True" in v["fix"] and "DDP" in v["fix"]
    assert not _checks(report) & {"distributed_sampler", "checkpoint_writes"}  # one process


def test_dataparallel_with_drop_last_passes(run_idiom):
    code, report, _, untouched = run_idiom("dp_kwargs_last_batch.py", "--drop-last", gpus=4)
    assert code == 0 and untouched and _checks(report, "FAIL") == set()


@pytest.mark.parametrize("name", ["cuda_surface.py", "no_sync_accumulation.py",
                                  "infinite_stream.py", "eval_rank0.py",
                                  "peek_then_set_epoch.py"])
def test_correct_scripts_pass_without_alarm(run_idiom, name):
    code, report, seconds, untouched = run_idiom(name)
    alarms = [v["name"] for v in report["checks"] if v["status"] != "PASS"]
    assert code == 0 and alarms == [] and untouched
    assert seconds < TIMEOUT / 2, "stalled instead of running through"
    assert {r["ending"] for r in report["ranks"]} <= {"stopped", "finished"}


def test_a_peek_is_not_an_epoch(run_idiom):
    _, report, _, _ = run_idiom("peek_then_set_epoch.py")
    v = next(v for v in report["checks"] if v["id"] == "set_epoch")
    assert v["status"] == "PASS"
    assert all(r["optimizer_steps"] >= 4 for r in report["ranks"])  # epoch 1 ran in full
    assert any(w["kind"] == "torch.save" for w in report["writes"])  # its checkpoint too


def test_rank0_training_alone_is_named_at_its_line(run_idiom):
    code, report, seconds, _ = run_idiom("eval_rank0.py", "--train-on-rank0")
    assert code == 1 and seconds < TIMEOUT / 2
    v = next(v for v in report["checks"] if v["id"] == "collective_order")
    assert v["status"] == "FAIL" and "eval_rank0.py:32" in v["detail"]


def test_single_process_script_says_what_copies_would_do(run_idiom):
    code, report, _, untouched = run_idiom("single_process.py")
    assert code == 0 and untouched and report["one_process"] is True
    v = next(v for v in report["checks"] if v["id"] == "single_process")
    assert v["status"] == "WARN" and "all 200 samples" in v["detail"]
    assert "model.pt" in v["detail"]


def test_local_rank_save_on_two_nodes(run_idiom):
    code, report, _, untouched = run_idiom("save_local_rank0.py", options=("--nodes", "2"))
    assert code == 0 and untouched
    v = next(v for v in report["checks"] if v["id"] == "node_writes")
    assert v["status"] == "WARN" and "ckpt.pt" in v["name"]
    _, one_node, _, _ = run_idiom("save_local_rank0.py")
    assert "node_writes" not in _checks(one_node)
