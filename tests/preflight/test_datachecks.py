"""The arithmetic's check rows: the seeds' situations get the right verdict and advice."""

from __future__ import annotations

from ddpcheck.preflight import shardplan as sp
from ddpcheck.preflight.checks import FAIL, PASS, WARN
from ddpcheck.preflight.datachecks import (
    DataQuestion,
    arithmetic_rows,
    data_checks,
    guide_rows,
    rank_rows,
)


def checks_for(n, w, b=None, *, global_batch=None, drop_last=False, sampler_drop_last=False,
               accum=1, base_batch=None, base_lr=None, dp=False):
    choice = sp.resolve_batch_size(w, b, global_batch, accum)
    plan = sp.plan_shards(n, w, choice.per_gpu if choice else None, drop_last=drop_last,
                          sampler_drop_last=sampler_drop_last, grad_accum=accum)
    q = DataQuestion(plan, choice, base_batch, base_lr, dp)
    return {c.name: c for c in data_checks(q)}, q


def test_seed_split_warns_about_the_padded_duplicate_in_evaluation():
    checks, q = checks_for(8607, 2)
    pad = checks["data: DistributedSampler padding"]
    assert pad.status == WARN
    assert "rank 1 gets one duplicate" in pad.detail and "8608" in pad.detail
    assert "range(rank, 8607, 2)" in pad.fix
    rows = dict(arithmetic_rows(q))
    assert rows["samples per rank"].startswith("4304")
    assert rows["padded duplicates"].startswith("1")
    assert rank_rows(q.plan) == [("0", 4304, 4304, 0, "-", "-", "-"),
                                 ("1", 4304, 4303, 1, "-", "-", "-")]
    guide = {row[0]: row for row in guide_rows(q.plan)}
    assert guide[32][2] == 16 and guide[16][3] == 0


def test_even_split_passes():
    checks, _ = checks_for(8608, 4, 4)
    assert checks["data: DistributedSampler split"].status == PASS
    assert checks["batch: last batch"].status == PASS


def test_sampler_drop_last_cuts_instead_of_padding():
    checks, q = checks_for(8607, 4, 4, sampler_drop_last=True)
    assert checks["data: DistributedSampler drop_last"].status == PASS
    assert q.plan.sampler_dropped == 3 and q.plan.padded == 0


def test_last_batch_of_one_is_flagged_with_working_alternatives():
    # 8607 on one GPU at batch 2: 4303 full batches and a last batch of 1
    checks, _ = checks_for(8607, 1, 2)
    last = checks["batch: last batch"]
    assert last.status == WARN and "holds 1 sample" in last.detail
    assert "drop_last=True" in last.fix and "--batch-size 3 (last batch 3)" in last.fix
    checks, _ = checks_for(8607, 1, 2, drop_last=True)
    assert checks["batch: last batch"].status == PASS
    assert "drops 1 samples per rank" in checks["batch: last batch"].detail


def test_batch_larger_than_the_per_rank_share_fails():
    checks, _ = checks_for(8607, 2, 5000)
    row = checks["batch: per-GPU batch vs share"]
    assert row.status == FAIL and "4304" in row.detail and "--batch-size 4304" in row.fix
    checks, _ = checks_for(8607, 2, 5000, drop_last=True)
    assert "0 batches per epoch" in checks["batch: per-GPU batch vs share"].detail


def test_fewer_samples_than_ranks_fails():
    checks, _ = checks_for(3, 4)
    assert checks["data: samples per rank"].status == FAIL
    assert "rank 3 train on duplicates only" in checks["data: samples per rank"].detail
    checks, _ = checks_for(3, 4, sampler_drop_last=True)
    assert "0 samples" in checks["data: samples per rank"].detail


def test_global_batch_that_does_not_divide_warns():
    checks, q = checks_for(8607, 4, global_batch=30)
    row = checks["batch: global batch split"]
    assert row.status == WARN and "28" in row.detail and "28 or 32" in row.fix
    assert q.batch.per_gpu == 7


def test_doubled_effective_batch_against_the_baseline():
    # seed 000: baseline global batch 4 on 2 GPUs needs 2 per GPU, not 4
    checks, _ = checks_for(8607, 2, 4, base_batch=4, base_lr=0.002)
    row = checks["batch: effective global batch"]
    assert row.status == WARN and "2x the baseline 4" in row.detail
    assert "--batch-size 2" in row.fix and "linear 0.004" in row.fix and "sqrt 0.00283" in row.fix
    checks, _ = checks_for(8607, 2, 2, base_batch=4)
    assert checks["batch: effective global batch"].status == PASS


def test_lr_rows_when_a_baseline_is_given():
    _, q = checks_for(8607, 4, 8, base_batch=32, base_lr=0.1)
    rows = dict(arithmetic_rows(q))
    assert rows["lr, linear scaling"].startswith("0.1 ")
    _, q = checks_for(8607, 4, 32, base_batch=32, base_lr=0.1)
    rows = dict(arithmetic_rows(q))
    assert rows["lr, linear scaling"].startswith("0.4")
    assert rows["lr, sqrt scaling"].startswith("0.2")


def test_grad_accum_leftover_warns():
    checks, q = checks_for(8607, 2, 4, accum=3)
    assert q.plan.batches_per_rank == 1076 and q.plan.optimizer_steps_per_epoch == 358
    assert checks["batch: gradient accumulation"].status == WARN
    assert q.plan.effective_global_batch == 24


def test_seed_004_data_parallel_fails_with_the_replica_message():
    checks, _ = checks_for(8607, 4, 1, dp=True)
    row = checks["DataParallel: last batch"]
    assert row.status == FAIL
    assert "3 samples for 4 GPUs" in row.detail and "1 replica gets no data" in row.detail
    assert "drop_last=True" in row.fix and "a batch of 16 (4 per GPU)" in row.fix
    checks, _ = checks_for(8607, 4, 1, dp=True, drop_last=True)
    assert checks["DataParallel: last batch"].status == PASS


def test_global_batch_split_is_checked_without_a_data_set_too():
    from ddpcheck.preflight.datachecks import choice_checks

    rows = choice_checks(sp.resolve_batch_size(4, global_batch_size=30), 4, 1)
    assert [r.status for r in rows] == [WARN] and "28 or 32" in rows[0].fix
    assert choice_checks(sp.resolve_batch_size(4, global_batch_size=32), 4, 1) == []
    assert choice_checks(None, 4, 1) == []
