"""Verdicts from made-up rank results: the GPU situations this CPU machine cannot produce,
and the failure shapes (one rank raised, one rank alone in a collective, ...) without a run."""

from __future__ import annotations

import dataclasses

from ddpcheck.preflight.checks import FAIL, PASS, WARN, CheckId
from ddpcheck.preflight.memfit import Confirmation, StepMemory, fit_steps, usable_memory
from ddpcheck.preflight.memverdict import MemoryQuestion, memory_checks
from ddpcheck.preflight.results import (
    BandwidthResult,
    CollectiveResult,
    DeviceInfo,
    FailureKind,
    Identity,
    MemoryResult,
    RankFailure,
    RankResult,
    RankStatus,
    StateBytes,
    from_json_dict,
    to_json_dict,
)
from ddpcheck.preflight.units import format_bytes
from ddpcheck.preflight.verdict import (
    bandwidth_check,
    failure_checks,
    identity_checks,
    process_group_checks,
)


def peer(rank, world=2, host="node0", gpu=None, env=None):
    e = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
         "LOCAL_WORLD_SIZE": str(world)}
    e.update(env or {})
    dev = DeviceInfo() if gpu is None else DeviceInfo("cuda", gpu, uuid=f"GPU-{gpu}")
    return Identity(rank, world, e, host, 0, dev)


def good_result(rank, world=2, device="cpu", busbw=4e8):
    res = RankResult(rank, RankStatus.OK, stage="done", init_seconds=0.02, barrier_ok=True,
                     collectives=[CollectiveResult("all_reduce", True, 3, 3, 0.001),
                                  CollectiveResult("all_gather", True, [0, 1], [0, 1])],
                     bandwidth=BandwidthResult(2**24, 3, 0.04, busbw, busbw))
    if rank == 0:
        res.peers = [peer(r, world, gpu=(r if device == "cuda" else None)) for r in range(world)]
    return res


def by_id(checks):
    return {c.id: c for c in checks}


def test_healthy_group_passes():
    results = [good_result(r) for r in range(2)]
    checks = by_id(process_group_checks(results, "gloo", "cpu", 2))
    assert all(c.status == PASS for c in checks.values()), checks
    assert {CheckId.PG_INIT, CheckId.COLLECTIVES, CheckId.BARRIER, CheckId.BANDWIDTH,
            CheckId.IDENTITY, CheckId.ONE_GPU_PER_RANK} <= set(checks)
    # gloo on CPU: informational, with the reference for real links
    assert "informational" in checks[CheckId.BANDWIDTH].detail
    assert "NVLink" in checks[CheckId.BANDWIDTH].detail


def test_nccl_bandwidth_is_read_against_the_link():
    slow = bandwidth_check(BandwidthResult(2**28, 5, 0.2, 1.3e9, 2.0e9), "nccl", "cuda")
    assert slow.status == WARN and "PCIe 3.0" in slow.detail and "NCCL_P2P_DISABLE" in slow.fix
    fast = bandwidth_check(BandwidthResult(2**28, 5, 0.002, 1.3e11, 2.3e11), "nccl", "cuda")
    assert fast.status == PASS and "230.00 GB/s" in fast.detail and "NVLink" in fast.detail


def test_two_ranks_on_one_gpu_fail():
    checks = by_id(identity_checks([peer(0, gpu=0), peer(1, gpu=0)], 2, "cuda"))
    row = checks[CheckId.ONE_GPU_PER_RANK]
    assert row.status == FAIL and "ranks 0, 1 use the same GPU (GPU-0)" in row.detail
    assert "set_device(local_rank)" in row.fix
    ok = by_id(identity_checks([peer(0, gpu=0), peer(1, gpu=1)], 2, "cuda"))
    assert ok[CheckId.ONE_GPU_PER_RANK].status == PASS


def test_same_gpu_index_on_two_hosts_is_fine():
    peers = [peer(0, world=2, host="a", gpu=0, env={"LOCAL_RANK": "0"}),
             peer(1, world=2, host="b", gpu=0, env={"LOCAL_RANK": "0"})]
    peers[1].device.uuid = "GPU-other"
    checks = by_id(identity_checks(peers, 2, "cuda"))
    assert checks[CheckId.ONE_GPU_PER_RANK].status == PASS
    assert checks[CheckId.IDENTITY].status == PASS


def test_rank_env_disagreeing_with_the_group_fails():
    peers = [peer(0), peer(1, env={"RANK": "0", "LOCAL_RANK": "0"})]
    row = by_id(identity_checks(peers, 2, "cpu"))[CheckId.IDENTITY]
    assert row.status == FAIL
    assert "rank 1 has RANK=0" in row.detail and "share LOCAL_RANK=0" in row.detail


def test_wrong_collective_value_names_the_rank():
    results = [good_result(r) for r in range(2)]
    results[1].collectives[0] = CollectiveResult("all_reduce", False, 3, 2)
    row = by_id(process_group_checks(results, "nccl", "cuda", 2))[CheckId.COLLECTIVES]
    assert row.status == FAIL and "all_reduce on rank 1 gave 2, expected 3" in row.detail


# -- what happened to the ranks -----------------------------------------------------------


def test_crashed_rank_is_named_with_signal_stage_and_last_words():
    results = [RankResult(0, RankStatus.STOPPED, stage="building the model"),
               RankResult(1, RankStatus.CRASHED, stage="building the model", exitcode=-11,
                          exit_text="killed by SIGSEGV", last_words="Fatal Python error: x")]
    checks = failure_checks(results, 120)
    assert len(checks) == 1
    row = checks[0]
    assert row.status == FAIL and row.id == CheckId.RANK_CRASHED and row.name == "rank 1 crashed"
    assert "killed by SIGSEGV" in row.detail and "building the model" in row.detail
    assert "Fatal Python error" in row.detail and "rank 0 stopped" in row.detail


def test_an_exception_on_one_rank_is_that_ranks_failure_not_a_hang():
    boom = RankFailure(FailureKind.ERROR, "training step (warm-up) at batch 1", "RuntimeError",
                       "boom on rank 1", "fixtures/models/faults.py:40 in forward", 1)
    results = [RankResult(0, RankStatus.STOPPED, stage="training step (warm-up) at batch 1",
                          stuck_at="torch/autograd/graph.py:829 in _engine_run_backward"),
               RankResult(1, RankStatus.FAILED, failure=boom,
                          stage="waiting for every rank at 'training step at batch 1'")]
    checks = failure_checks(results, 120, log_dir="/tmp/logs")
    assert [c.id for c in checks] == [CheckId.RANK_FAILED]
    row = checks[0]
    assert row.name == "rank 1 failed"
    assert "RuntimeError: boom on rank 1 at fixtures/models/faults.py:40 in forward" in row.detail
    assert "rank 0 was left waiting at torch/autograd/graph.py:829" in row.detail
    assert "hung" not in row.detail and "--timeout" not in row.fix and "/tmp/logs" in row.fix


def test_a_collective_only_one_rank_calls_names_it_and_the_line():
    results = [RankResult(0, RankStatus.HUNG, stage="building the model (--model factory)",
                          stuck_at="fixtures/models/faults.py:30 in barrier_on_rank0",
                          collective="barrier"),
               RankResult(1, RankStatus.STOPPED, stage="waiting for every rank at 'model built'")]
    checks = failure_checks(results, 120)
    assert [c.id for c in checks] == [CheckId.RANK_ALONE_IN_COLLECTIVE]
    row = checks[0]
    assert "rank 0 waits in barrier() called from fixtures/models/faults.py:30" in row.detail
    assert "rank 1 never calls it: it went on and waits at 'model built'" in row.detail
    assert "timeout" not in (row.detail + row.fix).lower()
    assert "if rank == 0:" in row.fix


def test_a_genuine_hang_names_each_ranks_frame():
    lost = RankFailure(FailureKind.PEER_LOST, "waiting for every rank at 'model built'", "",
                       "[Rank 0]: Ranks 1 failed to pass monitoredBarrier")
    results = [RankResult(0, RankStatus.FAILED, failure=lost,
                          stage="waiting for every rank at 'model built'"),
               RankResult(1, RankStatus.HUNG, stage="building the model", stage_age=9.5,
                          stuck_at="fixtures/models/faults.py:21 in hang_on_rank1")]
    row = failure_checks(results, 10)[0]
    assert row.id == CheckId.RANK_HUNG and row.status == FAIL
    assert "for 9.5 s while building the model" in row.detail
    assert "stuck at fixtures/models/faults.py:21 in hang_on_rank1" in row.detail
    assert "rank 0 waited for it at 'model built'" in row.detail


def test_worker_error_in_init_points_at_master_addr():
    err = RankFailure(FailureKind.ERROR, "init_process_group", "torch.distributed.DistNetworkError",
                      "address already in use")
    row = failure_checks([RankResult(0, RankStatus.FAILED, failure=err)], 120)[0]
    assert row.status == FAIL and "taken by another process" in row.fix
    refused = dataclasses.replace(err, message="connection refused")
    row = failure_checks([RankResult(0, RankStatus.FAILED, failure=refused)], 120)[0]
    assert "MASTER_ADDR:MASTER_PORT must reach" in row.fix


def test_all_ranks_stuck_in_init_is_one_row_naming_every_frame():
    results = [RankResult(r, RankStatus.HUNG, stage="init_process_group", stage_age=30.0,
                          stuck_at=f"x/train.py:{r + 1} in init") for r in range(4)]
    checks = failure_checks(results, 30, log_dir="/tmp/logs")
    assert [c.id for c in checks] == [CheckId.ALL_HUNG]
    row = checks[0]
    assert "all 4 ranks made no progress while init_process_group" in row.detail
    assert "rank 3 at x/train.py:4 in init" in row.detail
    assert "MASTER_ADDR:MASTER_PORT" in row.fix and "/tmp/logs" in row.fix


def test_rank_result_round_trips_through_json():
    res = good_result(0)
    res.memory = MemoryResult(steps=[StepMemory(1, {"a": 1})],
                              fit=fit_steps([StepMemory(1, {"a": 1}), StepMemory(2, {"a": 3})]),
                              confirmations=[Confirmation(8, 10, 11)])
    back = from_json_dict(RankResult, to_json_dict(res))
    assert back == res and back.memory.fit.predict(4) == res.memory.fit.predict(4)


# -- memory ----------------------------------------------------------------------------


def mem(**extra):
    steps = [StepMemory(b, {"forward+backward": 1000 + 500 * b, "optimizer step": 1200})
             for b in (1, 2, 4)]
    base = dict(device="cpu", steps=steps, params=10, param_bytes=40, trainable_bytes=40,
                state=StateBytes(40, 40, 40, 80), budget=100_000, reserve=0, tool="t",
                usable=usable_memory(100_000), fit=fit_steps(steps))
    base.update(extra)
    m = MemoryResult(**base)
    if m.fit is not None and m.usable is not None and "largest" not in extra:
        m.largest = m.fit.largest_batch(m.usable)
    return m


def test_prediction_error_is_reported_and_the_target_judged():
    m = mem(confirmations=[Confirmation(16, 9000, 9100)])
    checks = by_id(memory_checks(m, MemoryQuestion(target_batch=16, world_size=2)))
    assert checks[CheckId.MEMORY_TARGET].status == PASS
    row = checks[CheckId.MEMORY_PREDICTION]
    assert row.status == PASS and "(-1.1%)" in row.detail and "from batches 1, 2, 4" in row.detail
    assert m.largest == 178  # 1000 + 500 b <= 90 000


def test_target_batch_that_will_not_fit_fails_with_the_way_out():
    row = by_id(memory_checks(mem(), MemoryQuestion(target_batch=400, world_size=2)))[
        CheckId.MEMORY_TARGET]
    assert row.status == FAIL and "178" in row.fix and "--grad-accum 3" in row.fix


def test_prediction_far_off_warns():
    m = mem(confirmations=[Confirmation(16, 9000, 12000)])
    assert by_id(memory_checks(m, MemoryQuestion(target_batch=16)))[
        CheckId.MEMORY_PREDICTION].status == WARN


def test_model_state_above_the_budget_fails_from_the_arithmetic():
    # 604 M parameters, AdamW, 8 GiB: parameters + gradients + buckets + moments = 11.3 GiB
    p = 604_000_000 * 4
    m = MemoryResult(params=604_000_000, param_bytes=p, trainable_bytes=p,
                     state=StateBytes(p, p, p, 2 * p), budget=8 * 2**30,
                     usable=usable_memory(8 * 2**30), host_too_small=24 * 2**30)
    checks = memory_checks(m, MemoryQuestion(model="big:build"))
    assert [c.id for c in checks] == [CheckId.MODEL_STATE_MEMORY]
    row = checks[0]
    assert row.status == FAIL and "no batch fits" in row.detail
    assert "604,000,000 parameters" in row.detail and "adamw state 4.50 GiB" in row.detail
    assert "FSDP" in row.fix
    # within the budget, a host too small to measure is still only a WARN
    ok = dataclasses.replace(m, budget=80 * 2**30, usable=usable_memory(80 * 2**30))
    assert [c.status for c in memory_checks(ok, MemoryQuestion())] == [WARN]


def test_oom_at_batch_one_says_data_parallel_cannot_help():
    oom = RankFailure(FailureKind.OOM, "training step at batch 1", "", "x", batch=1)
    m = mem(steps=[StepMemory(1, {"forward+backward": 5000, "optimizer step": 6000})],
            step_error=oom, simulated_oom=True, budget=4000, fit=None)
    row = by_id(memory_checks(m, MemoryQuestion()))[CheckId.MEMORY_FIRST_BATCH]
    assert row.status == FAIL and row.name == "memory at batch 1"
    assert "batch=1 does not fit" in row.detail and "Data parallel cannot help" in row.detail
    gpu = mem(steps=[], step_error=oom, device="cuda:0", fit=None)
    row = by_id(memory_checks(gpu, MemoryQuestion()))[CheckId.MEMORY_FIRST_BATCH]
    assert "CUDA out of memory at batch 1" in row.detail


def test_factory_error_and_unused_parameters():
    err = RankFailure(FailureKind.ERROR, "building", "FileNotFoundError", "no weights",
                      "m.py:3 in build")
    row = memory_checks(mem(factory_error=err, failed_ranks=[0, 1]),
                        MemoryQuestion(model="m:build"))[0]
    assert row.status == FAIL
    assert "raised FileNotFoundError: no weights at m.py:3 in build on ranks 0, 1" in row.detail
    unused = RankFailure(FailureKind.UNUSED, "s", "RuntimeError", "DDP",
                         names=["aux.bias", "aux.weight"])
    row = by_id(memory_checks(mem(unused=unused), MemoryQuestion()))[CheckId.UNUSED_PARAMETERS]
    assert row.status == FAIL and "aux.bias, aux.weight" in row.detail


def test_syncbn_on_cpu_and_bn_batch_one():
    m = mem(sync_bn="not on CPU", bn_batch1="Expected more than 1 value per channel")
    checks = by_id(memory_checks(m, MemoryQuestion(target_batch=8)))
    assert checks[CheckId.SYNC_BN].status == WARN
    assert checks[CheckId.BN_BATCH1].status == WARN
    checks = by_id(memory_checks(m, MemoryQuestion(target_batch=1)))
    assert checks[CheckId.BN_BATCH1].status == FAIL


def test_model_too_big_for_the_cpu_host_is_not_measured_and_says_why():
    m = mem(steps=[], fit=None, budget=None, usable=None, host_too_small=24 * 2**30,
            state=StateBytes(10 * 2**30, 10 * 2**30, 10 * 2**30, 10 * 2**30))
    checks = memory_checks(m, MemoryQuestion(world_size=2))
    assert [c.status for c in checks] == [WARN]
    assert "40.0 GiB per rank" in checks[0].detail and "24.0 GiB of RAM" in checks[0].detail
    assert format_bytes(512) == "512 B"


def test_ranks_never_started_are_one_deadline_failure_not_a_hang():
    results = [RankResult(r, RankStatus.NOT_STARTED, stage="not started") for r in range(2)]
    checks = failure_checks(results, 0.5)
    assert [(c.id, c.status) for c in checks] == [(CheckId.RUN_DEADLINE, FAIL)]
    assert "nothing was run" in checks[0].detail and "raise --timeout" in checks[0].fix
