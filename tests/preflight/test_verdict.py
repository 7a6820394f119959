"""Verdicts from made-up rank results: the GPU situations this CPU machine cannot produce."""

from __future__ import annotations

import copy

from ddpcheck.preflight.checks import FAIL, PASS, WARN
from ddpcheck.preflight.verdict import (
    MemoryQuestion,
    RankView,
    failure_checks,
    identity_checks,
    memory_report,
    process_group_checks,
)


def peer(rank, world=2, host="node0", gpu=None, env=None):
    e = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
         "LOCAL_WORLD_SIZE": str(world)}
    e.update(env or {})
    dev = {"kind": "cpu"} if gpu is None else {"kind": "cuda", "index": gpu,
                                               "uuid": f"GPU-{gpu}"}
    return {"rank": rank, "world_size": world, "env": e, "host": host, "device": dev}


def good_result(rank, world=2, device="cpu"):
    collectives = [{"name": "all_reduce", "ok": True, "expected": 3, "got": 3, "seconds": 0.001},
                   {"name": "all_gather", "ok": True, "expected": [0, 1], "got": [0, 1]}]
    res = {"rank": rank, "init_seconds": 0.02, "collectives": collectives,
           "barrier": {"ok": True}, "bandwidth": {"bytes": 2**24, "seconds": 0.04,
                                                  "busbw": 4e8, "algbw": 4e8}}
    if rank == 0:
        res["peers"] = [peer(r, world, gpu=(r if device == "cuda" else None))
                        for r in range(world)]
    return res


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_group_passes():
    views = [RankView(r, good_result(r)) for r in range(2)]
    checks = by_name(process_group_checks(views, "gloo", "cpu", 2))
    assert all(c.status == PASS for c in checks.values()), checks
    assert {"process group init", "collectives", "monitored_barrier", "all_reduce bandwidth",
            "rank / world size / local rank", "one GPU per rank"} <= set(checks)


def test_two_ranks_on_one_gpu_fail():
    peers = [peer(0, gpu=0), peer(1, gpu=0)]
    checks = by_name(identity_checks(peers, 2, "cuda"))
    row = checks["one GPU per rank"]
    assert row.status == FAIL and "ranks 0, 1 use the same GPU (GPU-0)" in row.detail
    assert "set_device(local_rank)" in row.fix
    ok = by_name(identity_checks([peer(0, gpu=0), peer(1, gpu=1)], 2, "cuda"))
    assert ok["one GPU per rank"].status == PASS


def test_same_gpu_index_on_two_hosts_is_fine():
    peers = [peer(0, world=2, host="a", gpu=0, env={"LOCAL_RANK": "0"}),
             peer(1, world=2, host="b", gpu=0, env={"LOCAL_RANK": "0"})]
    peers[1]["device"]["uuid"] = "GPU-other"
    checks = by_name(identity_checks(peers, 2, "cuda"))
    assert checks["one GPU per rank"].status == PASS
    assert checks["rank / world size / local rank"].status == PASS


def test_rank_env_disagreeing_with_the_group_fails():
    peers = [peer(0), peer(1, env={"RANK": "0", "LOCAL_RANK": "0"})]
    row = by_name(identity_checks(peers, 2, "cpu"))["rank / world size / local rank"]
    assert row.status == FAIL
    assert "rank 1 has RANK=0" in row.detail and "share LOCAL_RANK=0" in row.detail


def test_wrong_collective_value_names_the_rank():
    views = [RankView(r, good_result(r)) for r in range(2)]
    views[1].result["collectives"][0] = {"name": "all_reduce", "ok": False, "expected": 3,
                                         "got": 2}
    row = by_name(process_group_checks(views, "nccl", "cuda", 2))["collectives"]
    assert row.status == FAIL and "all_reduce on rank 1 gave 2, expected 3" in row.detail


def test_crashed_rank_is_named_with_signal_stage_and_last_words():
    views = [RankView(0, None, stopped=True, stage="building the model"),
             RankView(1, None, crashed=True, exitcode=-11, exit_text="killed by SIGSEGV",
                      stage="building the model", stderr_tail="Fatal Python error: x")]
    checks = failure_checks(views, 120)
    assert len(checks) == 1
    row = checks[0]
    assert row.status == FAIL and row.name == "rank 1 crashed"
    assert "killed by SIGSEGV" in row.detail and "building the model" in row.detail
    assert "Fatal Python error" in row.detail and "rank 0 stopped" in row.detail


def test_hung_rank_is_named_with_what_the_others_said():
    r0 = good_result(0)
    r0["aborted"] = {"stage": "building the model",
                     "message": "[Rank 0]: Ranks 1 failed to pass monitoredBarrier"}
    views = [RankView(0, r0), RankView(1, None, hung=True, stage="building the model",
                                       stage_age=9.5)]
    row = failure_checks(views, 10)[0]
    assert row.name == "rank 1 hung" and row.status == FAIL
    assert "for 9.5 s while building the model" in row.detail
    assert "--timeout 10 s" in row.detail and "Ranks 1 failed to pass" in row.detail


def test_worker_error_in_init_points_at_master_addr():
    res = {"rank": 0, "error": {"stage": "init_process_group", "type": "RuntimeError",
                                "message": "connection refused", "where": ""}}
    row = failure_checks([RankView(0, res)], 120)[0]
    assert row.status == FAIL and "MASTER_ADDR" in row.fix


# -- memory -----------------------------------------------------------------------------


def mem_result(**extra):
    steps = [{"batch": b, "phases": {"forward+backward": 1000 + 500 * b,
                                     "optimizer step": 1200}, "peak": max(1000 + 500 * b, 1200)}
             for b in (1, 2)]
    mem = {"device": "cpu", "steps": steps, "params": 10, "param_bytes": 40, "budget": 100_000,
           "reserve": 0, "tool": "t"}
    mem.update(extra)
    return [RankView(0, {"rank": 0, "memory": mem}), RankView(1, {"rank": 1})]


def test_prediction_and_largest_batch():
    views = mem_result(confirm={"batch": 16, "predicted": 9000, "measured": 9100,
                                "phases": {"forward+backward": 9100, "optimizer step": 1200}})
    rep = memory_report(views, MemoryQuestion(target_batch=16, world_size=2,
                                              baseline_global=64, budget_given=True))
    checks = by_name(rep.checks)
    assert checks["memory at the target batch"].status == PASS
    assert checks["memory prediction"].status == PASS and "1.1% off" in \
        checks["memory prediction"].detail
    # usable = 90 000 -> 1000 + 500 b <= 90 000 -> b = 178
    assert rep.largest == 178
    facts = dict(rep.facts)
    assert facts["largest per-GPU batch that fits"] == "178"
    assert facts["fewest GPUs for global batch 64"].startswith("1 ")


def test_target_batch_that_will_not_fit_fails_with_the_way_out():
    views = mem_result()
    rep = memory_report(views, MemoryQuestion(target_batch=400, world_size=2,
                                              budget_given=True))
    row = by_name(rep.checks)["memory at the target batch"]
    assert row.status == FAIL and "178" in row.fix and "--grad-accum 3" in row.fix


def test_prediction_far_off_warns():
    views = mem_result(confirm={"batch": 16, "predicted": 9000, "measured": 12000,
                                "phases": {}})
    rep = memory_report(views, MemoryQuestion(target_batch=16, budget_given=True))
    assert by_name(rep.checks)["memory prediction"].status == WARN


def test_oom_at_batch_one_says_data_parallel_cannot_help():
    views = mem_result(steps=[{"batch": 1, "phases": {"forward+backward": 5000,
                                                      "optimizer step": 6000}, "peak": 6000}],
                       step_error={"kind": "oom", "batch": 1, "message": "x",
                                   "simulated": True}, budget=4000)
    row = by_name(memory_report(views, MemoryQuestion(budget_given=True)).checks)[
        "memory at batch 1"]
    assert row.status == FAIL
    assert "batch=1 does not fit" in row.detail and "Data parallel cannot help" in row.detail
    assert "model/tensor parallel" in row.fix
    gpu = mem_result(steps=[], step_error={"kind": "oom", "batch": 1,
                                           "message": "CUDA out of memory"}, device="cuda:0")
    row = by_name(memory_report(gpu, MemoryQuestion()).checks)["memory at batch 1"]
    assert "CUDA out of memory at batch 1" in row.detail


def test_factory_error_and_unused_parameters():
    views = mem_result(factory_error={"type": "FileNotFoundError", "message": "no weights",
                                      "ranks": [0, 1]})
    row = memory_report(views, MemoryQuestion(model="m:build")).checks[0]
    assert row.status == FAIL and "raised FileNotFoundError: no weights on ranks 0, 1" in \
        row.detail
    views = mem_result(unused={"names": ["aux.bias", "aux.weight"], "message": "DDP: ..."})
    row = by_name(memory_report(views, MemoryQuestion()).checks)["unused parameters"]
    assert row.status == FAIL and "aux.bias, aux.weight" in row.detail
    assert "find_unused_parameters=True" in row.fix


def test_syncbn_on_cpu_and_bn_batch_one():
    views = mem_result(sync_bn="not on CPU", bn_batch1="Expected more than 1 value per channel")
    checks = by_name(memory_report(views, MemoryQuestion(target_batch=8)).checks)
    assert checks["SyncBatchNorm"].status == WARN
    assert checks["batch=1 with BatchNorm"].status == WARN
    checks = by_name(memory_report(copy.deepcopy(views), MemoryQuestion(target_batch=1)).checks)
    assert checks["batch=1 with BatchNorm"].status == FAIL


def test_all_ranks_stuck_in_init_is_one_row_about_the_group():
    views = [RankView(r, None, hung=True, stage="init_process_group", stage_age=30.0,
                      stderr_tail='File "x/distributed_c10d.py", line 1 in init')
             for r in range(4)]
    checks = failure_checks(views, 30, log_dir="/tmp/logs")
    assert [c.name for c in checks] == ["all ranks hung"]
    row = checks[0]
    assert "all 4 ranks made no progress while init_process_group" in row.detail
    assert "MASTER_ADDR:MASTER_PORT" in row.fix and "/tmp/logs" in row.fix


def test_model_too_big_for_the_cpu_host_is_not_measured_and_says_why():
    views = mem_result(steps=[], host_too_small={"per_rank": 40 * 2**30, "ranks": 2,
                                                 "ram": 24 * 2**30})
    rep = memory_report(views, MemoryQuestion())
    assert [c.status for c in rep.checks] == [WARN]
    assert "80.0 GiB for 2 CPU processes" in rep.checks[0].detail
    assert rep.steps == []
