"""Real preflight runs: 2-process gloo groups on CPU with the fixture models.

Most run in-process (CliRunner; torch is imported once and the workers are
forked from the test process, the way the CLI forks them from itself); the
seed case and the torchrun case run real processes. Every run asserts that no
worker process is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddpcheck.preflight import memfit

from .conftest import REPO, pids_with_marker

pytest.importorskip("torch")

TINY = ["--model", "fixtures.models.tiny:build", "--input-shape", "3,32,32"]


# -- the seed case ----------------------------------------------------------------------


def test_seed_case_cli_json(preflight_cli):
    run = preflight_cli("--gpus", "2", "--dataset-size", "8607", "--format", "json")
    assert run.code == 0, run.out + run.err
    data = run.json()
    assert data["world_size"] == 2 and data["backend"] == "gloo" and data["exit_code"] == 0
    assert run.check("collectives")["status"] == "PASS"
    assert run.check("monitored_barrier")["status"] == "PASS"
    assert run.check("rank / world size")["status"] == "PASS"
    assert run.check("backend")["status"] == "WARN"  # CPU stand-ins, said plainly
    rows = dict(data["arithmetic"]["rows"])
    assert rows["samples per rank"].startswith("4304")
    assert rows["padded duplicates"].startswith("1")
    assert [r[3] for r in data["arithmetic"]["ranks"]] == [0, 1]  # the duplicate is on rank 1
    assert all(r["ok"] for r in data["ranks"]) and len(data["ranks"]) == 2


def test_seed_case_text(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--dataset-size", "8607", "--batch-size", "4")
    assert run.code == 0, run.out
    assert "4304 (len(DistributedSampler))" in run.out
    assert "rank 1 gets one duplicate" in run.out
    assert "effective global batch" in run.out and "8 = 4 x 2 x 1" in run.out
    assert "Traceback" not in run.out


# -- memory -------------------------------------------------------------------------------


def test_memory_prediction_at_a_larger_batch_within_ten_percent(preflight_inproc):
    run = preflight_inproc("--gpus", "2", *TINY, "--batch-size", "24", "--gpu-memory", "64MiB",
                           "--format", "json")
    assert run.code == 0, run.out
    mem = run.json()["memory"]["measured"]
    steps = mem["steps"]
    assert [s["batch"] for s in steps] == [1, 2]
    assert steps[1]["peak"] > steps[0]["peak"] > 0
    confirm = mem["confirm"]
    assert confirm["batch"] == 24
    fit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in steps])
    assert confirm["predicted"] == fit.predict(24)
    assert abs(confirm["predicted"] - confirm["measured"]) <= 0.10 * confirm["measured"]
    assert run.check("memory prediction")["status"] == "PASS"
    assert run.check("memory at the target batch")["status"] == "PASS"
    facts = dict(run.json()["memory"]["facts"])
    usable = memfit.usable_memory(64 * 2**20, 0, 0.10)
    assert facts["largest per-GPU batch that fits"] == str(fit.largest_batch(usable))


def test_largest_batch_really_fits(preflight_inproc):
    # no --batch-size: the confirmation step runs at the largest batch that fits
    run = preflight_inproc("--gpus", "2", *TINY, "--gpu-memory", "8MiB", "--format", "json")
    assert run.code == 0, run.out
    mem = run.json()["memory"]["measured"]
    confirm = mem["confirm"]
    usable = memfit.usable_memory(8 * 2**20, 0, 0.10)
    fit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in mem["steps"]])
    largest = fit.largest_batch(usable)
    assert confirm["batch"] == largest > 2
    assert confirm["measured"] <= usable * 1.02
    assert fit.predict(largest + 1) > usable


def test_target_batch_that_does_not_fit_fails(preflight_inproc):
    run = preflight_inproc("--gpus", "2", *TINY, "--batch-size", "512", "--gpu-memory", "8MiB",
                           "--format", "json")
    assert run.code == 1
    row = run.check("memory at the target batch")
    assert row["status"] == "FAIL" and "largest per-GPU batch that fits" in row["fix"]
    assert run.json()["memory"]["measured"]["confirm"]["skipped"].endswith("not run")


def test_model_that_does_not_fit_at_batch_one(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_big",
                           "--input-shape", "3,32,32", "--gpu-memory", "32MiB", "--format", "json")
    assert run.code == 1
    row = run.check("memory at batch 1")
    assert row["status"] == "FAIL"
    assert "batch=1 does not fit" in row["detail"] and "data parallel cannot help" in \
        row["detail"].lower()
    assert "model/tensor parallel" in row["fix"]


def test_unused_parameters_are_named(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_unused",
                           "--input-shape", "3,32,32", "--batch-size", "4", "--format", "json")
    assert run.code == 1
    row = run.check("unused parameters")
    assert row["status"] == "FAIL" and "aux_head.bias, aux_head.weight" in row["detail"]
    # memory was still measured, with find_unused_parameters=True
    assert len(run.json()["memory"]["measured"]["steps"]) == 2
    assert run.check("memory prediction")["status"] == "PASS"


def test_batchnorm_at_batch_one_escalates_a_last_batch_of_one(preflight_inproc):
    run = preflight_inproc("--gpus", "1", "--dataset-size", "8607", "--batch-size", "2",
                           "--model", "fixtures.models.tiny:build_bn1d", "--input-shape", "3,32,32",
                           "--format", "json")
    assert run.code == 1
    assert run.check("batch=1 with BatchNorm")["status"] == "WARN"
    last = run.check("batch: last batch")
    assert last["status"] == "FAIL" and "does raise at batch 1" in last["detail"]
    assert [s["batch"] for s in run.json()["memory"]["measured"]["steps"]] == [2, 3]


def test_sample_and_loss_functions_and_syncbn_note(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build",
                           "--sample", "fixtures.models.tiny:sample_with_labels",
                           "--loss", "fixtures.models.tiny:loss_ce", "--sync-bn",
                           "--batch-size", "4", "--optimizer", "sgd", "--format", "json")
    assert run.code == 0, run.out
    assert run.check("SyncBatchNorm")["status"] == "WARN"
    assert run.check("memory prediction")["status"] == "PASS"


# -- faults -----------------------------------------------------------------------------------


def test_factory_that_raises(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_raises",
                           "--input-shape", "3,32,32")
    assert run.code == 1
    assert "FileNotFoundError: pretrained weights not found" in run.out
    assert "Traceback" not in run.out


def test_factory_that_raises_on_one_rank_only(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:raise_on_rank1",
                           "--input-shape", "3,32,32", "--format", "json")
    assert run.code == 1
    row = run.check("model factory")
    assert row["detail"].endswith("on rank 1") and "illegal memory access" in row["detail"]


def test_factory_returning_something_else(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_not_a_module",
                           "--input-shape", "3,32,32", "--format", "json")
    assert run.code == 1
    assert "returned a dict, not a torch.nn.Module" in run.check("model factory")["detail"]


def test_rank_that_crashes_is_named(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:crash_on_rank1",
                        "--input-shape", "3,32,32", "--format", "json")
    assert run.code == 1, run.out
    row = run.check("rank 1 crashed")
    assert row["status"] == "FAIL"
    assert "SIGSEGV" in row["detail"] and "building the model" in row["detail"]
    assert "faults.py" in row["detail"]  # the frame it died in
    assert "Traceback" not in run.out


def test_rank_that_hangs_is_named_and_killed(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:hang_on_rank1",
                           "--input-shape", "3,32,32", "--timeout", "8", "--format", "json")
    assert run.code == 1, run.out
    row = run.check("rank 1 hung")
    assert row["status"] == "FAIL"
    assert "building the model" in row["detail"] and "--timeout 8 s" in row["detail"]
    assert "monitoredBarrier" in row["detail"]  # rank 0 named the missing rank too
    ranks = {r["rank"]: r for r in run.json()["ranks"]}
    assert ranks[1]["hung"] and not ranks[0]["hung"]
    # the watchdog's SIGUSR1 made the hung rank dump its stack: the report says where
    assert 'faults.py", line' in row["detail"] and "in hang_on_rank1" in row["detail"]
    # and the workers' logs are kept for the full story
    assert os.path.isdir(run.json()["worker_logs"])


# -- already inside a launcher ------------------------------------------------------------------


def test_inside_torchrun_acts_as_the_worker(tmp_path):
    marker = os.urandom(8).hex()
    env = dict(os.environ, DDPCHECK_TEST_MARKER=marker, TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ddpcheck", "preflight", "--dataset-size", "8607", "--format", "json"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)  # only rank 0 printed
    assert data["launcher"] == "rank 0 of 2 under torchrun"
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and all(r["ok"] for r in data["ranks"])
    assert dict(data["arithmetic"]["rows"])["samples per rank"].startswith("4304")
    assert pids_with_marker(marker) == []


# -- the CPU memory meter counts what torch's MemTracker counts ------------------------------------


def test_cpu_meter_agrees_with_torch_mem_tracker():
    torch = pytest.importorskip("torch")
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        pytest.skip("torch.distributed._tools.mem_tracker needs torch >= 2.5")
    from ddpcheck.preflight.memory import CpuMeter
    from fixtures.models.tiny import build

    def step(model, opt, x):
        model(x).float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for batch in (1, 8):
        torch.manual_seed(0)
        model = build()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(batch, 3, 32, 32)
        ours = CpuMeter()
        ours.watch(model)
        ours.track(x)
        with ours.phase("step"):
            step(model, opt, x)
        with ours.phase("step"):  # steady state: optimizer state exists
            step(model, opt, x)

        torch.manual_seed(0)
        model = build()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(batch, 3, 32, 32)
        mt = MemTracker()
        mt.track_external(model, opt, x)
        with mt:
            step(model, opt, x)
        mt.reset_mod_stats()
        with mt:
            step(model, opt, x)
        theirs = sum(d["Total"] for d in mt.get_tracker_snapshot("peak").values())
        assert ours.peaks["step"] == pytest.approx(theirs, rel=0.02), (batch, ours.peaks, theirs)


def test_spawned_workers_when_fork_is_unsafe(preflight_inproc, monkeypatch):
    # where counting GPUs had to initialise CUDA, forked workers could not use it
    import ddpcheck.preflight.launch as launch

    monkeypatch.setattr(launch, "visible_gpus", lambda: (0, False))
    run = preflight_inproc("--gpus", "2", "--dataset-size", "100", "--format", "json")
    assert run.code == 0, run.out
    assert "elastic_launch (spawn)" in run.json()["launcher"]
    assert run.check("collectives")["status"] == "PASS"


def test_batch_larger_than_the_share_fails_the_run(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--dataset-size", "8607", "--batch-size", "5000",
                           "--format", "json")
    assert run.code == 1
    assert run.check("batch: per-GPU batch vs share")["status"] == "FAIL"
    assert run.check("collectives")["status"] == "PASS"  # the rest still ran
