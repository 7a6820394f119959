"""The script mode's parts without a launch: the scratch overlay, the steering,
the facts' round trip and the judge on hand-made facts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpcheck.preflight.checks import CheckId
from ddpcheck.preflight.script import judge
from ddpcheck.preflight.script.facts import (
    CrashFact,
    Ending,
    EpochFact,
    LoaderFact,
    RankFacts,
    WriteFact,
)
from ddpcheck.preflight.script.scratch import Scratch
from ddpcheck.preflight.script.steer import schedule


@pytest.fixture
def overlay(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.txt").write_text("lr=0.1\n")
    monkeypatch.chdir(project)
    scratch = Scratch(str(tmp_path / "scratch"), [str(project)], lambda: "train.py:1")
    torch = pytest.importorskip("torch")
    scratch.install(torch)
    try:
        yield project, scratch
    finally:
        scratch.uninstall()


def test_overlay_keeps_writes_out_and_reads_them_back(overlay):
    project, scratch = overlay
    import torch

    os.makedirs("out/run1", exist_ok=True)
    assert os.path.isdir("out/run1")
    with open("out/run1/log.txt", "w") as fh:
        fh.write("epoch 0\n")
    with open("out/run1/log.txt", "a") as fh:
        fh.write("epoch 1\n")
    assert Path("out/run1/log.txt").read_text() == "epoch 0\nepoch 1\n"
    torch.save({"w": torch.ones(2)}, "out/run1/ckpt.pt.tmp")
    os.replace("out/run1/ckpt.pt.tmp", "out/run1/ckpt.pt")
    assert torch.load("out/run1/ckpt.pt")["w"].tolist() == [1.0, 1.0]
    with open("config.txt", "a") as fh:  # appending to the user's file: a copy is appended
        fh.write("extra\n")
    assert open("config.txt").read() == "lr=0.1\nextra\n"
    os.remove("config.txt")  # the user's file stays
    with pytest.raises(FileNotFoundError):
        open("missing_dir/x.txt", "w")  # a folder that does not exist fails as it would
    scratch.uninstall()
    assert sorted(p.name for p in project.iterdir()) == ["config.txt"]
    assert (project / "config.txt").read_text() == "lr=0.1\n"
    kinds = {(w.kind, os.path.basename(w.path)) for w in scratch.writes}
    assert {("makedirs", "run1"), ("open", "log.txt"), ("torch.save", "ckpt.pt.tmp"),
            ("rename", "ckpt.pt"), ("remove", "config.txt")} <= kinds
    log = next(w for w in scratch.writes if w.path.endswith("log.txt"))
    assert log.count == 2 and log.where == "train.py:1" and log.redirected


def test_overlay_leaves_temp_and_reads_alone(overlay, tmp_path):
    project, scratch = overlay
    other = tmp_path / "elsewhere.txt"  # under the temp folder, not the project
    other.write_text("x")
    with open(other, "w") as fh:
        fh.write("y")
    assert other.read_text() == "y"
    assert scratch.overlay(str(other)) is None
    assert scratch.overlay(str(project / "a.txt")) is not None
    assert scratch.overlay("/dev/null") is None


def test_schedule_serves_the_last_batch_first():
    assert schedule(6, 3) == [5, 0, 1]
    assert schedule(2, 3) == [1, 0]
    assert schedule(1, 3) == [0]
    assert schedule(0, 3) == []


def test_steered_loader_keeps_len_and_real_batches(monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from ddpcheck.preflight.script.steer import (
        PreflightStop,
        Steering,
        steered_batch_sampler,
        steered_next,
    )

    data = TensorDataset(torch.arange(10))
    loader = DataLoader(data, batch_size=4)
    fact = LoaderFact(0, "t.py:1", "TensorDataset", 10, 4, False, "SequentialSampler", False,
                      False, None, None, None, 0, len(loader), True)
    steering = Steering(2)
    monkeypatch.setattr(_BaseDataLoaderIter, "__next__",
                        steered_next(_BaseDataLoaderIter.__next__, steering))
    sampler = steered_batch_sampler(loader.batch_sampler, fact, steering, lambda: 0,
                                    loader.sampler)
    object.__setattr__(loader, "batch_sampler", sampler)
    assert len(loader) == 3 and loader.batch_size == 4
    # no optimizer step in the pass (gradient accumulation): it goes on past `steps`
    assert [b[0].tolist() for b in loader] == [[8, 9], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert fact.epochs[0].batches_total == 3 and fact.epochs[0].first_batch == 2
    assert fact.epochs[0].batches_served == 3
    fact.training = True  # an optimizer stepped: epoch 2's second batch stops the run
    fact.epochs[0].steps = 1
    it = iter(loader)
    assert next(it)[0].tolist() == [8, 9]
    with pytest.raises(PreflightStop):
        next(it)


def test_facts_round_trip():
    facts = RankFacts(rank=1, world_size=2, ending=Ending.CRASHED,
                      crash=CrashFact("ValueError", "boom", "t.py:3"),
                      loaders=[LoaderFact(0, "t.py:1", "D", 10, 4, False, "S", True, True,
                                          False, 2, 1, 0, 3, True,
                                          epochs=[EpochFact(1, 0, 1, "ab")])],
                      writes=[WriteFact("open", "/p/x", "t.py:2", True)])
    back = RankFacts.from_dict(facts.to_dict())
    assert back == facts


def _rank(rank: int, digest2: str, calls: int) -> RankFacts:
    loader = LoaderFact(0, "train.py:30", "TensorDataset", 96, 8, False, "DistributedSampler",
                        True, True, False, 2, rank, 0, 6, True, training=True,
                        epochs=[EpochFact(1, 0, 1, "aaa", [1, 2], steps=3),
                                EpochFact(2, 0 if calls == 0 else 1, calls, digest2, [1, 2],
                                          ended_run=True)])
    return RankFacts(rank=rank, world_size=2, loaders=[loader], ending=Ending.STOPPED,
                     optimizer_steps=4, collective_count=5)


def test_judge_set_epoch_with_a_constant_value():
    facts = [_rank(0, "aaa", 1), _rank(1, "aaa", 1)]
    out = judge.judge(facts, [None, None], 2, "", 60)
    v = next(v for v in out.checks if v.id == CheckId.SET_EPOCH)
    assert v.status == "FAIL" and v.name.startswith("DDP101 confirmed: set_epoch(1)")
    assert out.exit_code == 1


def test_judge_new_order_passes():
    facts = [_rank(0, "bbb", 1), _rank(1, "ccc", 1)]
    out = judge.judge(facts, [None, None], 2, "", 60)
    assert out.exit_code == 0
    assert all(v.status == "PASS" for v in out.checks)


def test_judge_folds_a_peers_lost_connection_into_the_crash():
    first = _rank(1, "bbb", 1)
    first.ending, first.crash = Ending.CRASHED, CrashFact("RuntimeError", "CUDA error", "t.py:9")
    second = _rank(0, "bbb", 1)
    second.ending = Ending.CRASHED
    second.crash = CrashFact("RuntimeError", "[gloo] Connection closed by peer [127.0.0.1]",
                             "t.py:8")
    out = judge.judge([second, first], [None, None], 2, "", 60)
    crashes = [v for v in out.checks if v.id == CheckId.CRASH]
    assert len(crashes) == 1 and crashes[0].ranks == (1,)
    assert "rank 0 then lost its peer" in crashes[0].name


# -- the launcher's view of ranks without facts (main's RankResult) ---------------------------


def _launched(rank: int, status, **kw):
    from ddpcheck.preflight.results import RankResult

    return RankResult(rank, status, **kw)


def test_judge_names_a_rank_killed_at_the_deadline_as_hung():
    from ddpcheck.preflight.results import RankStatus
    from ddpcheck.preflight.watchdog import StopReason

    ranks = [_launched(0, RankStatus.OK),
             _launched(1, RankStatus.HUNG, stuck_at="train.py:12 in main",
                       collective="all_reduce")]
    out = judge.judge([_rank(0, "bbb", 1), None], ranks, 2, "", 30, StopReason.DEADLINE)
    hang = next(v for v in out.checks if v.id == CheckId.HANG)
    assert hang.status == "FAIL" and hang.ranks == (1,)
    assert "no result within --timeout 30 s" in hang.detail
    assert "stuck at train.py:12 in main in all_reduce" in hang.detail
    assert out.exit_code == 1


def test_judge_a_rank_left_running_after_its_peers_ended_is_hung():
    from ddpcheck.preflight.results import RankStatus
    from ddpcheck.preflight.watchdog import StopReason

    ranks = [_launched(0, RankStatus.OK), _launched(1, RankStatus.STOPPED)]
    out = judge.judge([_rank(0, "bbb", 1), None], ranks, 2, "", 30, StopReason.PEER_FAILED)
    hang = next(v for v in out.checks if v.id == CheckId.HANG)
    assert "still running after the other ranks had ended" in hang.detail


def test_judge_a_rank_stopped_by_torch_after_a_peer_died_is_not_a_second_failure():
    from ddpcheck.preflight.results import RankStatus

    ranks = [_launched(0, RankStatus.STOPPED),
             _launched(1, RankStatus.CRASHED, exitcode=-11, exit_text="killed by SIGSEGV",
                       last_words="Fatal Python error: Segmentation fault at t.py:4 in f")]
    out = judge.judge([None, None], ranks, 2, "", 30)
    alarms = [v for v in out.checks if v.status != "PASS"]
    assert [(v.id, v.ranks) for v in alarms] == [(CheckId.CRASH, (1,))]
    assert alarms[0].name == "rank 1 died (killed by SIGSEGV)"
    assert alarms[0].detail.startswith("Fatal Python error: Segmentation fault")


def test_every_preflight_option_is_either_shared_or_factory_only():
    """A new factory option must be refused in script mode (or declared shared here)."""
    import dataclasses

    from ddpcheck.preflight.options import PreflightOptions
    from ddpcheck.preflight.script.command import FACTORY_ONLY, factory_only_set

    shared = {"gpus", "backend", "timeout", "output_format", "allow_unsandboxed"}
    names = {f.name for f in dataclasses.fields(PreflightOptions)}
    assert set(FACTORY_ONLY) | shared == names and not set(FACTORY_ONLY) & shared
    assert factory_only_set(PreflightOptions(gpus=2, timeout=5.0)) == []
    assert factory_only_set(PreflightOptions(amp="bf16", static_graph=True)) == \
        ["--amp", "--static-graph"]


def test_judge_ranks_never_started_before_the_deadline_are_one_deadline_failure():
    from ddpcheck.preflight.results import RankStatus
    from ddpcheck.preflight.watchdog import StopReason

    ranks = [_launched(0, RankStatus.NOT_STARTED), _launched(1, RankStatus.NOT_STARTED)]
    out = judge.judge([None, None], ranks, 2, "", 0.5, StopReason.DEADLINE)
    alarms = [v for v in out.checks if v.status != "PASS"]
    assert [(v.id, v.ranks) for v in alarms] == [(CheckId.RUN_DEADLINE, (0, 1))]
    assert "--timeout 0.5 s ended before ranks 0, 1 were started" in alarms[0].detail
    assert out.exit_code == 1


def _memory_row(peaks: list[int]):
    from ddpcheck.preflight.script.facts import MemoryFact

    facts = [_rank(r, "bbb", 1) for r in range(len(peaks))]
    for f, peak in zip(facts, peaks):
        f.memory = MemoryFact(8, peak, 5000, "TensorDispatchMode")
    out = judge.judge(facts, [None] * len(peaks), len(peaks), "", 60)
    return next(v for v in out.checks if v.id == CheckId.MEMORY)


def test_the_memory_row_names_a_rank_that_stands_out_and_is_stable_otherwise():
    # a CPU step's peak moves by a few bytes between ranks and runs: the lowest rank is named
    assert _memory_row([16_600, 16_640]).detail.startswith("rank 0;")
    assert _memory_row([16_640, 16_600]).detail.startswith("rank 0;")
    # a rank well above the others is the one named
    row = _memory_row([16_600, 20_000])
    assert row.detail.startswith("rank 1;") and "peak 19.5 KiB" in row.name
