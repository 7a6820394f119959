"""Units, check rows, the memory fit, backend choice and launcher detection (no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.preflight import memfit
from ddpcheck.preflight.backend import BackendError, choose_backend
from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId, exit_code, worst
from ddpcheck.preflight.envdetect import LaunchEnvError, detect_launched
from ddpcheck.preflight.forensics import read_stack, summarize_stderr
from ddpcheck.preflight.modelspec import SpecError, load_ref, parse_input_shape, split_ref
from ddpcheck.preflight.units import format_bytes, parse_size


@pytest.mark.parametrize("text, size", [
    ("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("24G", 24 * 2**30), ("512MiB", 512 * 2**20),
    ("1.5 GiB", int(1.5 * 2**30)), ("1000", 1000), ("80gib", 80 * 2**30),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "24XB", "-1GiB", "0", "lots"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="memory size|larger than 0"):
        parse_size(text)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(24 * 2**30) == "24.0 GiB"
    assert format_bytes(None) == "-"


def test_exit_code_follows_the_worst_check():
    rows = [Check(CheckId.BACKEND, PASS, ""), Check(CheckId.COLLECTIVES, WARN, "")]
    assert worst(rows) == WARN and exit_code(rows) == 0
    assert exit_code(rows + [Check(CheckId.BARRIER, FAIL, "")]) == 1
    with pytest.raises(ValueError):
        Check(CheckId.BACKEND, "MAYBE", "")
    with pytest.raises(TypeError):
        Check("collectives", PASS, "")  # ids, not prose


# -- memory fit ---------------------------------------------------------------------


def test_fit_recovers_a_line_and_the_largest_batch():
    steps = [memfit.StepMemory(b, {"fb": 1000 + 300 * b, "opt": 1500}) for b in (1, 2)]
    fit = memfit.fit_steps(steps)
    assert fit.predict(10) == 4000
    # 1000 + 300 b <= 10000  ->  b = 30
    assert fit.largest_batch(10000) == 30
    assert fit.largest_batch(1200) == 0  # optimizer phase alone (1500) does not fit
    assert fit.dominant(1).phase == "opt" and fit.dominant(10).phase == "fb"


def test_fit_per_phase_beats_one_line_where_phases_cross():
    # at batch 1 and 2 the flat optimizer phase is the peak; one line through the
    # peaks would have slope 0 and predict 5000 at batch 64
    steps = [memfit.StepMemory(b, {"fb": 1000 + 100 * b, "opt": 5000}) for b in (1, 2)]
    fit = memfit.fit_steps(steps)
    assert fit.predict(64) == 1000 + 6400


def test_fit_never_has_negative_slope_and_says_unbounded():
    steps = [memfit.StepMemory(1, {"a": 900}), memfit.StepMemory(2, {"a": 800})]
    fit = memfit.fit_steps(steps)
    assert all(line.per_sample == 0 for line in fit.lines)
    assert fit.largest_batch(10**6) is None


@settings(max_examples=60, deadline=None)
@given(points=st.lists(st.tuples(st.integers(1, 512), st.integers(0, 10**9)), min_size=2,
                       max_size=6, unique_by=lambda p: p[0]))
def test_fit_is_never_below_a_measured_point(points):
    steps = [memfit.StepMemory(b, {"p": m}) for b, m in points]
    fit = memfit.fit_steps(steps)
    assert all(fit.predict(b) >= m for b, m in points)


def test_fit_on_more_points_follows_growth_faster_than_linear():
    # memory that grows a little faster than linearly (workspaces, temporaries):
    # a line through batch 1 and 2 predicts low at 64; the fit over 1, 2, 4 less so,
    # and the refit with a confirmation at 64 is exact there
    def peak(b):
        return 10_000 + 1000 * b + 3 * b * b

    two = memfit.fit_steps([memfit.StepMemory(b, {"p": peak(b)}) for b in (1, 2)])
    three = memfit.fit_steps([memfit.StepMemory(b, {"p": peak(b)}) for b in (1, 2, 4)])
    assert two.predict(64) < three.predict(64) < peak(64)
    refit = memfit.fit_steps([memfit.StepMemory(b, {"p": peak(b)}) for b in (1, 2, 4, 64)])
    assert refit.predict(64) >= peak(64)
    assert refit.batches == (1, 2, 4, 64)


def test_fit_needs_two_batches():
    with pytest.raises(ValueError):
        memfit.fit_steps([memfit.StepMemory(1, {"a": 1})])


@settings(max_examples=60, deadline=None)
@given(fixed=st.integers(0, 10**9), per=st.integers(1, 10**8), usable=st.integers(1, 10**11))
def test_largest_batch_is_the_edge(fixed, per, usable):
    fit = memfit.fit_steps([memfit.StepMemory(b, {"p": fixed + per * b}) for b in (1, 2)])
    best = fit.largest_batch(usable)
    if best:
        assert fit.predict(best) <= usable < fit.predict(best + 1)
    else:
        assert fit.predict(1) > usable


def test_fewest_gpus_and_usable():
    assert memfit.fewest_gpus(64, 16) == 4
    assert memfit.fewest_gpus(64, 12) == 6
    assert memfit.fewest_gpus(64, 8, grad_accum=2) == 4
    assert memfit.fewest_gpus(64, 0) is None
    assert memfit.usable_memory(1000, reserve=100, safety_margin=0.1) == 800


# -- backend --------------------------------------------------------------------------


def test_auto_backend_falls_back_to_gloo_and_says_so():
    c = choose_backend("auto", 2, 0, nccl_available=False)
    assert (c.backend, c.device, c.status) == ("gloo", "cpu", WARN)
    assert "no CUDA devices" in c.note and "not checked" in c.note
    # a GPU machine with fewer GPUs than asked: an error, never a silent CPU fallback
    with pytest.raises(BackendError, match="--gpus 4 but this node has 2 visible GPUs"):
        choose_backend("auto", 4, 2, nccl_available=True)
    assert choose_backend("gloo", 4, 2, nccl_available=True).backend == "gloo"
    c = choose_backend("auto", 2, 8, nccl_available=True)
    assert (c.backend, c.device, c.status) == ("nccl", "cuda", PASS)


def test_nccl_with_more_gpus_than_the_node_has_is_a_usage_error():
    with pytest.raises(BackendError, match="--gpus 4 with --backend nccl needs 4 CUDA devices"):
        choose_backend("nccl", 4, 2, nccl_available=True)
    with pytest.raises(BackendError, match="no NCCL"):
        choose_backend("nccl", 1, 1, nccl_available=False)
    assert choose_backend("nccl", 2, 2, nccl_available=True).backend == "nccl"


# -- already launched? -------------------------------------------------------------------


TORCHRUN = {"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
            "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


def test_detects_torchrun():
    env = detect_launched(TORCHRUN)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == \
        ("torchrun", 3, 16, 3, 8)
    assert detect_launched({}) is None


def test_half_launched_environment_is_a_usage_error():
    with pytest.raises(LaunchEnvError, match="LOCAL_RANK"):
        detect_launched({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(LaunchEnvError, match="MASTER_ADDR"):
        detect_launched({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(LaunchEnvError, match="outside"):
        detect_launched(dict(TORCHRUN, RANK="16"))


def test_detects_srun_and_exports_env():
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_STEP_ID": "0",
             "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    env = detect_launched(slurm)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == \
        ("slurm", 5, 8, 1, 4)
    exported = {}
    env.export(exported)
    assert exported == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                        "LOCAL_WORLD_SIZE": "4"}
    with pytest.raises(LaunchEnvError, match="scontrol show hostnames"):
        detect_launched({k: v for k, v in slurm.items() if k != "MASTER_ADDR"})
    # the batch script itself (no job step) is not a rank
    assert detect_launched({k: v for k, v in slurm.items() if k != "SLURM_STEP_ID"}) is None


def test_stderr_summary_prefers_the_fatal_error_and_frame():
    text = ["[W socket.cpp] noise", "Fatal Python error: Segmentation fault", "",
            "Current thread 0x1 (most recent call first):",
            '  File "/x/models.py", line 13 in build', '  File "/x/other.py", line 2 in f',
            "Extension modules: torch._C"]
    assert summarize_stderr(text) == ('Fatal Python error: Segmentation fault at '
                                      '/x/models.py:13 in build')
    assert summarize_stderr(["a", "b", "RuntimeError: boom"], 1) == "RuntimeError: boom"


def test_stack_reading_names_the_users_frame_and_the_collective():
    text = ["Thread 0x2 (most recent call first):",
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
            "Current thread 0x1 (most recent call first):",
            '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 9 in barrier',
            '  File "/v/site-packages/torch/distributed/c10d_logger.py", line 8 in wrapper',
            '  File "/home/me/train/models.py", line 42 in build',
            '  File "/home/me/ddpcheck/preflight/memory.py", line 7 in run',
            '  File "/home/me/ddpcheck/preflight/worker.py", line 9 in run_rank']
    reading = read_stack(text)
    assert reading.frame == "/home/me/train/models.py:42 in build"
    assert reading.collective == "barrier"
    # not in a collective: the innermost user frame
    plain = read_stack(["Current thread 0x1 (most recent call first):",
                        '  File "/home/me/train/models.py", line 21 in hang',
                        '  File "/home/me/ddpcheck/preflight/memory.py", line 7 in run'])
    assert plain.frame == "/home/me/train/models.py:21 in hang" and plain.collective == ""
    assert read_stack(["no dump here"]) is None


# -- model references -----------------------------------------------------------------------


def test_refs_and_shapes():
    assert split_ref("pkg.models:build", "--model") == ("pkg.models", "build")
    assert parse_input_shape("3,224,224") == (3, 224, 224)
    assert parse_input_shape("3x32x32") == (3, 32, 32)
    for bad in ("3,,a", "0,3", "", "-1", "3,x", "3x"):
        with pytest.raises(SpecError, match="--input-shape"):
            parse_input_shape(bad)
    with pytest.raises(SpecError, match="MODULE:FUNCTION"):
        split_ref("pkg.models.build", "--model")


def test_load_ref_reports_what_is_wrong(tmp_path, monkeypatch):
    (tmp_path / "broken_mod.py").write_text("import json\nraise ValueError('bad config')\n")
    (tmp_path / "good_mod.py").write_text("def build():\n    return 1\nvalue = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError, match="importing broken_mod raised ValueError: bad config"):
        load_ref("broken_mod:build")
    with pytest.raises(SpecError, match="has no attribute 'nope'"):
        load_ref("good_mod:nope")
    with pytest.raises(SpecError, match="is an int, not a function"):
        load_ref("good_mod:value")
    with pytest.raises(SpecError, match="cannot import no_such_mod"):
        load_ref("no_such_mod:build")
    assert load_ref("good_mod:build")() == 1
    assert load_ref(str(tmp_path / "good_mod.py") + ":build")() == 1
    with pytest.raises(SpecError, match="no such file"):
        load_ref("missing/file.py:build")


def test_importing_the_command_does_not_import_torch():
    code = ("import sys, ddpcheck.preflight, ddpcheck.preflight.command, "
            "ddpcheck.preflight.shardplan, ddpcheck.preflight.verdict; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- counting GPUs without poisoning fork ------------------------------------------------------


def test_visible_gpus_prefers_nvml_and_says_when_fork_is_unsafe(monkeypatch):
    torch = pytest.importorskip("torch")
    from ddpcheck.preflight.gpus import visible_gpus

    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 8, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 4, raising=False)
    assert visible_gpus() == (4, True)  # NVML answered: CUDA untouched, fork is fine
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1, raising=False)
    assert visible_gpus() == (8, False)  # the CUDA runtime answered: workers must spawn
    monkeypatch.delattr(torch._C, "_cuda_getDeviceCount")
    assert visible_gpus() == (0, True)  # a CPU-only build


def _supervise(monkeypatch, tmp_path, inner_code: str, seconds: float = 0.5):
    """Run ``inner_code`` as the supervisor's inner process, with a deadline ``seconds``
    away and a short grace after it; what reached stdout and the outcome."""
    import time

    from ddpcheck.preflight import sandbox, supervisor

    run_dir = sandbox.make_run_dir(str(tmp_path))
    box = sandbox.Sandbox(sandbox.Level.NONE, "", "test", run_dir)
    monkeypatch.setattr(supervisor, "GRACE", 0.5)
    monkeypatch.setattr(supervisor, "_inner_command",
                        lambda b: [sys.executable, "-c", inner_code, b.box])
    request = supervisor.Request(mode="factory", options={}, cwd=str(tmp_path),
                                 deadline=time.time() + seconds, sandbox=box.to_dict())
    printed: list[str] = []
    outcome = supervisor.run(box, request, seconds,
                             on_deadline=lambda records, timeout: "the deadline report\n",
                             on_lost=lambda why: f"lost: {why}\n",
                             echo_out=printed.append, echo_err=lambda text: None)
    return "".join(printed), outcome


_REPORT_THEN_SLOW_EXIT = (
    "import sys, time\n"
    "from ddpcheck.preflight import supervisor\n"
    "print('the run report', flush=True)\n"
    "supervisor.write_status(sys.argv[1], reported=True, exit_code=0)\n"
    "time.sleep(30)\n")


def test_a_report_out_before_the_hard_deadline_is_the_only_report(monkeypatch, tmp_path):
    """The run answered, then its interpreter was slow to exit: killed at the hard
    deadline, but no second report contradicts the first."""
    out, outcome = _supervise(monkeypatch, tmp_path, _REPORT_THEN_SLOW_EXIT)
    assert out == "the run report\n" and outcome.out == "" and outcome.code == 0


def test_a_run_that_never_answered_gets_the_deadline_report(monkeypatch, tmp_path):
    out, outcome = _supervise(monkeypatch, tmp_path, "import time; time.sleep(30)")
    assert out == "" and outcome.out == "the deadline report\n" and outcome.code == 1
