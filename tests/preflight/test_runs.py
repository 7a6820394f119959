"""Real preflight runs: 2-process gloo groups on CPU with the fixture models.

Most run in-process (CliRunner; torch is imported once and the workers are
forked from the test process, the way the CLI forks them from itself); the
8607-sample case and the torchrun case run real processes. Every run asserts
that no worker process is left behind. Runs are shared between assertions to
keep the suite fast.
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


# -- the 8607-sample case ----------------------------------------------------------------------


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


def test_text_fits_the_terminal_and_a_busy_master_port_is_reported(preflight_inproc,
                                                                  monkeypatch):
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv("COLUMNS", "80")
        run = preflight_inproc("--gpus", "2", "--dataset-size", "8607", "--batch-size", "4")
    assert run.code == 0, run.out
    assert "4304 (len(DistributedSampler))" in run.out
    assert "effective global batch" in run.out and "8 = 4 x 2 x 1" in run.out
    assert "Traceback" not in run.out
    assert max(len(line) for line in run.out.splitlines()) <= 80
    assert "seed" not in run.out.lower()
    # the result column of the checks table, its wrapped lines joined again
    results = " ".join(line.split("│")[3].strip() for line in run.out.splitlines()
                       if line.count("│") == 4)
    assert f"MASTER_PORT={port} is exported but already in use" in results
    assert "gave the exact expected values" in results  # it still ran, on a free port


# -- memory -------------------------------------------------------------------------------


def test_memory_prediction_at_a_larger_batch_within_ten_percent(preflight_inproc):
    run = preflight_inproc("--gpus", "2", *TINY, "--batch-size", "24", "--gpu-memory", "64MiB",
                           "--format", "json")
    assert run.code == 0, run.out
    mem = run.json()["memory"]["measured"]
    steps = mem["steps"]
    assert [s["batch"] for s in steps] == [1, 2, 4]  # more than two points
    peaks = [max(s["phases"].values()) for s in steps]
    assert peaks[2] > peaks[1] > peaks[0] > 0
    confirm = mem["confirmations"][0]
    assert confirm["batch"] == 24
    fit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in steps])
    assert confirm["predicted"] == fit.predict(24)
    assert abs(confirm["predicted"] - confirm["measured"]) <= 0.10 * confirm["measured"]
    prediction = run.check("memory prediction")
    assert prediction["status"] == "PASS" and "from batches 1, 2, 4" in prediction["detail"]
    assert run.check("memory at the target batch")["status"] == "PASS"
    # the fit the verdict reports is the worker's, refitted with the confirmation
    refit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in steps]
                             + [memfit.StepMemory(24, {"p": confirm["measured"]})])
    assert mem["fit"]["batches"] == [1, 2, 4, 24]
    usable = memfit.usable_memory(64 * 2**20, 0, 0.10)
    assert mem["largest"] <= refit.largest_batch(usable) + 1


def test_largest_batch_really_fits(preflight_inproc):
    # no --batch-size: the confirmation step runs at the largest batch that fits
    run = preflight_inproc("--gpus", "2", *TINY, "--gpu-memory", "8MiB", "--format", "json")
    assert run.code == 0, run.out
    mem = run.json()["memory"]["measured"]
    confirm = mem["confirmations"][0]
    usable = memfit.usable_memory(8 * 2**20, 0, 0.10)
    fit = memfit.fit_steps([memfit.StepMemory(s["batch"], s["phases"]) for s in mem["steps"]])
    assert confirm["batch"] == fit.largest_batch(usable) > 2
    # the recommendation is a batch whose own step fitted (refitted until it does)
    last = mem["confirmations"][-1]
    assert mem["largest_confirmed"] and last["batch"] == mem["largest"]
    assert last["measured"] <= usable
    facts = dict(run.json()["memory"]["facts"])
    assert facts["largest per-GPU batch that fits"] == \
        f"{mem['largest']} (its own step confirmed it)"


def test_target_batch_that_does_not_fit_fails(preflight_inproc):
    run = preflight_inproc("--gpus", "2", *TINY, "--batch-size", "512", "--gpu-memory", "8MiB",
                           "--format", "json")
    assert run.code == 1
    row = run.check("memory at the target batch")
    assert row["status"] == "FAIL" and "largest per-GPU batch that fits" in row["fix"]
    assert run.json()["memory"]["measured"]["confirm_skipped"].endswith("not run")


def test_model_that_does_not_fit_at_batch_one(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_big",
                           "--input-shape", "3,32,32", "--gpu-memory", "32MiB", "--format", "json")
    assert run.code == 1
    # parameters + gradients + buckets + AdamW state alone exceed 32 MiB: the
    # arithmetic says so before any step
    row = run.check("memory: model state")
    assert row["status"] == "FAIL" and "no batch fits" in row["detail"]
    assert "data parallel cannot help" in row["detail"].lower() and "FSDP" in row["fix"]


def test_a_model_too_big_for_the_host_still_fails_from_the_arithmetic(preflight_inproc,
                                                                       monkeypatch):
    # the 604 M-parameter case: the host cannot measure it, the budget decides anyway
    from ddpcheck.preflight import memory

    monkeypatch.setattr(memory, "host_memory", lambda: 64 * 2**20)
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_big",
                           "--input-shape", "3,32,32", "--gpu-memory", "64MiB", "--format", "json")
    assert run.code == 1
    assert run.check("memory: model state")["status"] == "FAIL"
    # without a budget the host only limits what can be measured: a WARN
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_big",
                           "--input-shape", "3,32,32", "--format", "json")
    assert run.code == 0 and run.check("memory")["status"] == "WARN"


def test_unused_parameters_are_named(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build_unused",
                           "--input-shape", "3,32,32", "--batch-size", "6", "--format", "json")
    assert run.code == 1
    row = run.check("unused parameters")
    assert row["status"] == "FAIL" and "aux_head.bias, aux_head.weight" in row["detail"]
    # memory was still measured, with find_unused_parameters=True
    assert len(run.json()["memory"]["measured"]["steps"]) == 3
    assert run.check("memory prediction")["status"] == "PASS"


def test_batchnorm_at_batch_one_escalates_a_last_batch_of_one(preflight_inproc):
    run = preflight_inproc("--gpus", "1", "--dataset-size", "8607", "--batch-size", "2",
                           "--model", "fixtures.models.tiny:build_bn1d", "--input-shape", "3,32,32",
                           "--format", "json")
    assert run.code == 1
    assert run.check("batch=1 with BatchNorm")["status"] == "WARN"
    last = run.check("batch: last batch")
    assert last["id"] == "last_batch_of_one"
    assert last["status"] == "FAIL" and "does raise at batch 1" in last["detail"]
    assert [s["batch"] for s in run.json()["memory"]["measured"]["steps"]] == [2, 3, 6]


def test_sample_loss_custom_optimizer_amp_and_ddp_options(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.tiny:build",
                           "--sample", "fixtures.models.tiny:sample_with_labels",
                           "--loss", "fixtures.models.tiny:loss_ce", "--sync-bn",
                           "--batch-size", "8", "--optimizer", "fixtures.models.tiny:make_sgd",
                           "--amp", "bf16", "--gradient-as-bucket-view", "--static-graph",
                           "--gpu-memory", "64MiB", "--format", "json")
    assert run.code == 0, run.out
    assert run.check("SyncBatchNorm")["status"] == "WARN"
    mem = run.json()["memory"]["measured"]
    assert mem["amp"] == "bf16"
    # gradients live in DDP's buckets; a custom optimizer's state is not guessed
    assert mem["state"]["buckets"] == 0 and mem["state"]["optimizer"] is None
    prediction = run.check("memory prediction")
    assert prediction["status"] == "PASS" and "%)" in prediction["detail"]
    facts = dict(run.json()["memory"]["facts"])
    assert facts["mixed precision"] == "torch.autocast(bf16)"


def test_amp_changes_the_measured_memory(preflight_inproc):
    peaks = {}
    for amp in ([], ["--amp", "fp16"]):
        run = preflight_inproc("--gpus", "1", *TINY, "--batch-size", "16", *amp,
                               "--format", "json")
        assert run.code == 0, run.out
        mem = run.json()["memory"]["measured"]
        peaks[bool(amp)] = mem["confirmations"][0]["measured"]
        assert run.check("memory prediction")["status"] == "PASS"
    assert peaks[True] != peaks[False]


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
    assert row["status"] == "FAIL" and row["id"] == "rank_crashed"
    assert "SIGSEGV" in row["detail"] and "building the model" in row["detail"]
    assert "faults.py:" in row["detail"]  # the frame it died in
    assert "Traceback" not in run.out


def test_rank_that_hangs_is_named_and_killed(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:hang_on_rank1",
                           "--input-shape", "3,32,32", "--timeout", "8", "--format", "json")
    assert run.code == 1, run.out
    row = run.check("rank 1 hung")
    assert row["status"] == "FAIL"
    assert "building the model" in row["detail"] and "--timeout 8 s" in row["detail"]
    assert "rank 0 reported: waiting for every rank at 'model built'" in row["detail"]
    ranks = {r["rank"]: r for r in run.json()["ranks"]}
    assert ranks[1]["status"] == "hung" and ranks[0]["status"] != "hung"
    # the watchdog's SIGUSR1 made the hung rank dump its stack: the report says where
    assert "fixtures/models/faults.py:" in row["detail"] and "in hang_on_rank1" in row["detail"]
    # and the workers' logs are kept for the full story
    assert os.path.isdir(run.json()["worker_logs"])


def test_an_exception_mid_step_on_one_rank_is_reported_as_that_rank_within_seconds(
        preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:raise_in_forward_on_rank1",
                           "--input-shape", "3,32,32", "--timeout", "60", "--format", "json")
    assert run.code == 1, run.out
    row = run.check("rank 1 failed")
    assert row["status"] == "FAIL" and row["id"] == "rank_failed"
    assert "RuntimeError: shape mismatch in the decoder on rank 1" in row["detail"]
    assert "fixtures/models/faults.py:" in row["detail"] and "in forward" in row["detail"]
    assert "training step" in row["detail"] and "rank 0 was left waiting" in row["detail"]
    assert not [c for c in run.json()["checks"] if c["id"] in ("all_hung", "rank_hung")]
    # stopped by the failure, not by the 60 s timeout
    assert run.json()["timing"]["total_seconds"] < 45


def test_a_collective_only_rank_0_calls_is_named_with_its_line(preflight_inproc):
    run = preflight_inproc("--gpus", "2", "--model", "fixtures.models.faults:barrier_on_rank0",
                           "--input-shape", "3,32,32", "--timeout", "60", "--format", "json")
    assert run.code == 1, run.out
    row = run.check("rank 0 waits alone")
    assert row["id"] == "rank_alone_in_collective"
    assert "rank 0 waits in barrier() called from fixtures/models/faults.py:" in row["detail"]
    assert "in barrier_on_rank0" in row["detail"]
    assert "rank 1 never calls it: it went on and waits at 'model built'" in row["detail"]
    assert "timeout" not in row["fix"]
    assert run.json()["timing"]["total_seconds"] < 45


# -- nn.DataParallel: nothing is launched -------------------------------------------------


def test_data_parallel_mode_reads_the_batch_as_the_whole_batch(preflight_inproc, monkeypatch):
    import ddpcheck.preflight.launch as launch

    def no_launch(*a, **k):
        raise AssertionError("DataParallel mode must not start processes")

    monkeypatch.setattr(launch, "run_local", no_launch)
    run = preflight_inproc("--gpus", "4", "--dataset-size", "8607", "--batch-size", "4",
                           "--data-parallel", "--format", "json")
    assert run.code == 0, run.out
    row = run.check("DataParallel: last batch")
    assert row["status"] == "WARN" and "replica 3 (GPU 3) gets no data" in row["detail"]
    data = run.json()
    assert not data["arithmetic"]["ranks"]  # no DistributedSampler rows
    assert not [c for c in data["checks"] if c["id"].startswith("sampler")]
    rows = dict(data["arithmetic"]["rows"])
    assert rows["last batch, chunked"] == "[1, 1, 1]"
    # the call the script makes: model(x, return_loss=True) breaks on that batch
    run = preflight_inproc("--gpus", "4", "--dataset-size", "8607", "--batch-size", "4",
                           "--data-parallel", "--model", "fixtures.models.tiny:build_return_loss",
                           "--sample", "fixtures.models.tiny:sample_with_flag")
    assert run.code == 1
    flat = " ".join(run.out.split())
    assert "FAIL" in flat and "TypeError" in flat and "nothing launched" in flat


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
    assert data["checks"][0]["id"] == "backend"
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
    import ddpcheck.preflight.gpus as gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda: (0, False))
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


def test_no_worker_is_started_once_the_deadline_has_passed():
    """--timeout ended during the start-up: the launcher starts nothing, so nothing can run
    on past it (whatever the watchdog's polling would have caught)."""
    import multiprocessing
    import time

    from ddpcheck.preflight import launch
    from ddpcheck.preflight.options import RunSpec
    from ddpcheck.preflight.results import RankStatus
    from ddpcheck.preflight.watchdog import StopReason

    def must_not_run(spec):
        raise AssertionError("a worker started after the deadline")

    spec = RunSpec(backend="gloo", device="cpu", timeout=0.5, bandwidth_bytes=1 << 20,
                   bandwidth_iters=1)
    before = set(multiprocessing.active_children())
    outcome = launch.run_local(2, spec, entrypoint=must_not_run, deadline=time.time() - 0.1)
    assert outcome.stop_reason == StopReason.DEADLINE
    assert [r.status for r in outcome.ranks] == [RankStatus.NOT_STARTED] * 2
    assert set(multiprocessing.active_children()) <= before
