"""The data-set arithmetic against torch's own DistributedSampler and DataLoader."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.preflight import shardplan as sp

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def torch_view(n, w, b, drop_last, sampler_drop_last, shuffle=False):
    """What every rank really gets from torch: (len(sampler), padded, batches, sizes)."""
    out = []
    for rank in range(w):
        sampler = DistributedSampler(range(n), num_replicas=w, rank=rank, shuffle=shuffle,
                                     drop_last=sampler_drop_last)
        idx = list(sampler)
        assert len(idx) == len(sampler)
        # positions rank, rank+w, ...: without shuffle index == position unless padded
        padded = sum(1 for k, i in enumerate(idx) if i != rank + k * w)
        sizes = None
        if b is not None:
            loader = DataLoader(range(n), batch_size=b, sampler=sampler, drop_last=drop_last,
                                collate_fn=list)
            sizes = [len(batch) for batch in loader]
            assert len(sizes) == len(loader)
        out.append((len(idx), padded, sizes))
    return out


def assert_plan_matches(n, w, b, drop_last, sampler_drop_last):
    plan = sp.plan_shards(n, w, b, drop_last=drop_last, sampler_drop_last=sampler_drop_last)
    real = torch_view(n, w, b, drop_last, sampler_drop_last)
    assert plan.total_size == sum(r[0] for r in real)
    assert plan.padded == sum(r[1] for r in real)
    for share, (samples, padded, sizes) in zip(plan.ranks, real):
        assert share.samples == samples == plan.samples_per_rank
        assert share.padded == padded
        assert share.unique == samples - padded
        if b is None:
            continue
        assert share.batches == len(sizes)
        assert share.last_batch == (sizes[-1] if sizes else 0)
        assert share.dropped == samples - sum(sizes)
    if b is not None and not sampler_drop_last:
        # every real sample is seen once, padding repeats some
        assert plan.total_size - plan.padded == n or n < w


def test_seed_case_8607_samples_on_2_gpus_matches_torch():
    plan = sp.plan_shards(8607, 2, 4)
    assert plan.samples_per_rank == 4304
    assert plan.padded == 1
    assert [r.padded for r in plan.ranks] == [0, 1]
    assert plan.batches_per_rank == 1076 and plan.last_batch == 4
    assert plan.effective_global_batch == 8
    assert_plan_matches(8607, 2, 4, False, False)
    assert_plan_matches(8607, 2, 4, True, False)
    assert_plan_matches(8607, 2, 32, False, False)
    assert_plan_matches(8607, 2, 32, True, True)


def test_seed_case_dataloader_really_iterates_tensors():
    """The full torch stack with a TensorDataset and default collation, not just indices."""
    ds = torch.utils.data.TensorDataset(torch.arange(8607))
    plan = sp.plan_shards(8607, 2, 3)
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
        loader = DataLoader(ds, batch_size=3, sampler=sampler)
        sizes = [batch[0].shape[0] for batch in loader]
        assert len(sizes) == plan.ranks[rank].batches == 1435
        assert sizes[-1] == plan.ranks[rank].last_batch == 4304 % 3


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 2500), w=st.integers(1, 9), b=st.one_of(st.none(), st.integers(1, 70)),
       drop_last=st.booleans(), sampler_drop_last=st.booleans())
def test_plan_matches_torch_everywhere(n, w, b, drop_last, sampler_drop_last):
    assert_plan_matches(n, w, b, drop_last, sampler_drop_last)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 600), w=st.integers(1, 8), seed=st.integers(0, 100))
def test_padding_count_with_shuffle(n, w, seed):
    plan = sp.plan_shards(n, w)
    seen = []
    for rank in range(w):
        sampler = DistributedSampler(range(n), num_replicas=w, rank=rank, shuffle=True,
                                     seed=seed)
        seen += list(sampler)
    assert len(seen) == plan.total_size
    assert len(seen) - len(set(seen)) == plan.padded
    assert len(set(seen)) == n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), parts=st.integers(1, 9))
def test_chunk_sizes_match_tensor_chunk(n, parts):
    assert sp.chunk_sizes(n, parts) == [c.shape[0] for c in torch.arange(n).chunk(parts)]


def test_seed_004_data_parallel_last_batch_leaves_replica_3_idle():
    dp = sp.plan_data_parallel(8607, 4, 4)
    assert dp.batches == 2152 and dp.last_batch == 3
    assert list(dp.last_chunks) == [1, 1, 1]
    assert dp.idle_replicas == 1
    fixed = sp.suggest_dp_batch(8607, 4, 4)
    assert fixed % 4 == 0
    good = sp.plan_data_parallel(8607, 4, fixed)
    assert good.idle_replicas == 0 and min(good.last_chunks) >= 2
    assert sp.plan_data_parallel(8607, 4, 4, drop_last=True).last_batch == 4


def test_last_batch_idle_replica_even_when_batch_exceeds_gpu_count():
    # 5 samples on 4 GPUs chunk as [2, 2, 1]: one replica idle although 5 >= 4
    dp = sp.plan_data_parallel(13, 4, 8)
    assert dp.last_batch == 5 and dp.idle_replicas == 1


def test_global_batch_is_divided_and_non_divisible_is_flagged():
    c = sp.resolve_batch_size(4, global_batch_size=32)
    assert (c.per_gpu, c.effective_global, c.exact) == (8, 32, True)
    c = sp.resolve_batch_size(4, global_batch_size=30, grad_accum=1)
    assert (c.per_gpu, c.effective_global, c.exact) == (7, 28, False)
    assert c.nearest_globals == (28, 32)
    c = sp.resolve_batch_size(2, global_batch_size=64, grad_accum=4)
    assert c.per_gpu == 8 and c.effective_global == 64
    with pytest.raises(sp.PlanError, match="smaller than 4 GPUs"):
        sp.resolve_batch_size(4, global_batch_size=3)
    with pytest.raises(sp.PlanError, match="not both"):
        sp.resolve_batch_size(4, batch_size=2, global_batch_size=8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset_size=-5, world_size=2), "dataset-size"),
    (dict(dataset_size=0, world_size=2), "dataset-size"),
    (dict(dataset_size=10, world_size=0), "gpus"),
    (dict(dataset_size=10, world_size=2, batch_size=0), "batch-size"),
    (dict(dataset_size=10, world_size=2, grad_accum=0), "grad-accum"),
])
def test_bad_numbers_raise_plan_error(kwargs, match):
    with pytest.raises(sp.PlanError, match=match):
        sp.plan_shards(**kwargs)


def test_lr_suggestions_linear_and_sqrt():
    lr = sp.lr_suggestion(0.1, 256, 1024)
    assert lr.linear == pytest.approx(0.4)
    assert lr.sqrt == pytest.approx(0.2)
    # SSD300-style lr * gpus * batch / 32 is linear scaling from batch 32 on one GPU
    lr = sp.lr_suggestion(2.6e-3, 32, 4 * 64)
    assert lr.linear == pytest.approx(2.6e-3 * 4 * (64 / 32))


@settings(max_examples=60, deadline=None)
@given(s=st.integers(2, 5000), b=st.integers(1, 200))
def test_suggested_batch_sizes_really_avoid_a_last_batch_of_one(s, b):
    for cand in sp.suggest_batch_sizes(s, b):
        assert cand != b
        last = s % cand or cand
        assert last >= 2
        assert abs(cand - b) <= max(2, int(b * 0.5))


def test_batch_guide_for_the_seed_split():
    rows = {size: (batches, last, rest) for size, batches, last, rest in sp.batch_guide(4304)}
    assert rows[1] == (4304, 1, 0)
    assert rows[16] == (269, 16, 0)
    assert rows[32] == (math.ceil(4304 / 32), 16, 16)
    assert 8192 not in rows
