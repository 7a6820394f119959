"""The arithmetic's check rows: the classic situations get the right verdict and advice."""

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
               accum=1, base_batch=None, base_lr=None):
    choice = sp.resolve_batch_size(w, b, global_batch, accum)
    plan = sp.plan_shards(n, w, choice.per_gpu if choice else None, drop_last=drop_last,
                          sampler_drop_last=sampler_drop_last, grad_accum=accum)
    q = DataQuestion(plan, choice, base_batch, base_lr)
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
    # baseline global batch 4 on 2 GPUs needs 2 per GPU, not 4
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


def dp_checks(n, gpus, batch, call=None, drop_last=False):
    from ddpcheck.preflight.datachecks import data_parallel_checks

    dp = sp.plan_data_parallel(n, gpus, batch, drop_last)
    return {c.id: c for c in data_parallel_checks(dp, call)}, dp


def test_data_parallel_batch_is_the_whole_batch_and_the_idle_replica_is_named():
    from ddpcheck.preflight.checks import CheckId

    # 8607 samples, DataLoader batch_size=4 over 4 GPUs: 2151 batches of 4 and one of 3
    checks, dp = dp_checks(8607, 4, 4)
    assert (dp.batches, dp.last_batch, dp.last_chunks) == (2152, 3, (1, 1, 1))
    assert checks[CheckId.DP_EVERY_BATCH].status == PASS
    row = checks[CheckId.DP_LAST_BATCH]
    assert row.status == WARN and "replica 3 (GPU 3) gets no data" in row.detail
    assert "runs that step on 3 replicas" in row.detail and "pass --model" in row.detail
    assert "drop_last=True" in row.fix and "a batch of 16 (4 per GPU)" in row.fix
    checks, _ = dp_checks(8607, 4, 4, drop_last=True)
    assert CheckId.DP_LAST_BATCH not in checks and \
        checks[CheckId.DP_EVERY_BATCH].status == PASS


def test_data_parallel_with_positional_tensors_only_wastes_a_gpu():
    from ddpcheck.preflight.checks import CheckId

    positional = lambda n: ((sp.TensorLeaf(n),), {})  # noqa: E731
    checks, _ = dp_checks(8607, 4, 4, positional)
    row = checks[CheckId.DP_LAST_BATCH]
    assert row.status == WARN and "pass --model" not in row.detail
    # keyword tensors scatter like positional ones
    keywords = lambda n: ((), {"x": sp.TensorLeaf(n), "mask": sp.TensorLeaf(n)})  # noqa: E731
    assert dp_checks(8607, 4, 4, keywords)[0][CheckId.DP_LAST_BATCH].status == WARN


def test_data_parallel_with_non_tensor_keywords_fails_on_the_short_batch():
    from ddpcheck.preflight.checks import CheckId

    # model(x, return_loss=True): the kwargs hold no tensor, so torch's scatter_kwargs
    # copies them to all 4 GPUs and pads the 3 positional chunks with ()
    call = lambda n: ((sp.TensorLeaf(n),), {"return_loss": True})  # noqa: E731
    checks, _ = dp_checks(8607, 4, 4, call)
    row = checks[CheckId.DP_INPUTS]
    assert row.status == FAIL and "replica 3 (GPU 3) is called with the keyword arguments" \
        in row.detail and "TypeError" in row.detail
    assert "drop_last=True" in row.fix
    # the same call on batches that feed every GPU is fine
    checks, _ = dp_checks(8608, 4, 4, call)
    assert [c.status for c in checks.values()] == [PASS]


def test_data_parallel_batch_that_never_feeds_every_gpu():
    from ddpcheck.preflight.checks import CheckId

    checks, dp = dp_checks(8607, 4, 6)  # chunk(4) of 6 is [2, 2, 2]
    row = checks[CheckId.DP_EVERY_BATCH]
    assert dp.batch_chunks == (2, 2, 2) and row.status == WARN
    assert "replica 3 (GPU 3) gets no data" in row.detail and "multiple of 4" in row.fix


def test_dp_scatter_mirrors_torch_scatter_kwargs():
    leaf = sp.TensorLeaf
    s = sp.dp_scatter((leaf(3),), {}, 4)
    assert (s.inputs, s.kwargs, s.keyword_only_replicas, s.mismatch) == (3, 3, (), False)
    s = sp.dp_scatter((leaf(3),), {"flag": True}, 4)
    assert (s.inputs, s.kwargs, s.keyword_only_replicas) == (4, 4, (3,))
    s = sp.dp_scatter((leaf(3),), {"flag": True, "mask": leaf(3)}, 4)
    assert (s.inputs, s.kwargs, s.keyword_only_replicas) == (3, 3, ())
    s = sp.dp_scatter((leaf(5), "a string"), {}, 4)  # chunk(4) of 5 is [2, 2, 1]
    assert s.inputs == 3 and not s.keyword_only_replicas


def test_global_batch_split_is_checked_without_a_data_set_too():
    from ddpcheck.preflight.datachecks import choice_checks

    rows = choice_checks(sp.resolve_batch_size(4, global_batch_size=30), 4, 1)
    assert [r.status for r in rows] == [WARN] and "28 or 32" in rows[0].fix
    assert choice_checks(sp.resolve_batch_size(4, global_batch_size=32), 4, 1) == []
    assert choice_checks(None, 4, 1) == []


def test_dp_scatter_agrees_with_torchs_own_scatter_kwargs(monkeypatch):
    """torch's scatter_kwargs itself, with only the device copy replaced by
    Tensor.chunk (what comm.scatter does per device), so it runs on CPU."""
    import pytest

    torch = pytest.importorskip("torch")
    from torch.nn.parallel import scatter_gather

    monkeypatch.setattr(scatter_gather.Scatter, "apply",
                        staticmethod(lambda gpus, sizes, dim, t: t.chunk(len(gpus), dim)))

    def skeleton(obj):
        if isinstance(obj, torch.Tensor):
            return sp.TensorLeaf(obj.shape[0])
        if isinstance(obj, dict):
            return {k: skeleton(v) for k, v in obj.items()}
        if isinstance(obj, tuple):
            return tuple(skeleton(v) for v in obj)
        return obj

    for n in (1, 3, 4, 5, 6, 7, 9):
        for gpus in (2, 3, 4, 8):
            for args, kwargs in [((torch.ones(n, 2),), {}),
                                 ((torch.ones(n, 2),), {"flag": True}),
                                 ((torch.ones(n, 2),), {"flag": True, "m": torch.ones(n)}),
                                 ((), {"x": torch.ones(n, 2)}),
                                 ((torch.ones(n), "s"), {"k": 1, "j": "v"})]:
                ins, kws = scatter_gather.scatter_kwargs(args, kwargs, list(range(gpus)))
                mine = sp.dp_scatter(skeleton(args), skeleton(kwargs), gpus)
                assert (mine.inputs, mine.kwargs) == (len(ins), len(kws)), (n, gpus, kwargs)
                empty = tuple(i for i, a in enumerate(ins) if a == () and kws[i])
                assert mine.keyword_only_replicas == (empty if args else ()), (n, gpus)
