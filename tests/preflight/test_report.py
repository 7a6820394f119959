"""Rendering: text keeps values as written and fits the terminal (100 columns at most);
json carries everything."""

from __future__ import annotations

import json

from ddpcheck.preflight.checks import PASS, WARN, Check, CheckId
from ddpcheck.preflight.report import Arithmetic, PreflightReport, render_json, render_text


def sample_report():
    return PreflightReport(
        headline="ddpcheck preflight: 2 ranks, gloo on CPU, workers started by torch's "
                 "elastic_launch (fork) in 0.6 s",
        world_size=2, backend="gloo", device="cpu", launcher="x",
        checks=[Check(CheckId.COLLECTIVES, PASS, "ok " * 80),
                Check(CheckId.LAST_BATCH_OF_ONE, WARN, "holds 1 sample " * 10,
                      "drop_last=True " * 12)],
        exit_code=0, total_seconds=1.0,
        arithmetic=Arithmetic(rows=[("DataLoader drop_last", "False"),
                                    ("per-GPU batch", "4 " * 60)],
                              ranks=[("0", 4304, 4304, 0, 1076, 4, 0)],
                              rank_headers=("rank", "samples", "unique", "padded", "batches",
                                            "last batch", "dropped"),
                              guide=[(1, 4304, 1, 0, "BatchNorm1d cannot train at batch 1 " * 3)],
                              guide_headers=("per-GPU batch", "batches/rank", "last batch",
                                             "dropped", "")))


def test_text_keeps_false_as_false():
    text = render_text(sample_report())
    line = next(ln for ln in text.splitlines() if "DataLoader drop_last" in ln)
    assert line.split()[-1] == "False"
    assert "1 WARN, 1 PASS -> exit 0" in text
    assert "fix: drop_last=True" in text


def test_text_fits_100_columns_and_80_when_asked(monkeypatch):
    wide = render_text(sample_report())
    assert max(len(ln) for ln in wide.splitlines()) <= 100
    monkeypatch.setenv("COLUMNS", "80")
    narrow = render_text(sample_report())
    assert max(len(ln) for ln in narrow.splitlines()) <= 80
    monkeypatch.setenv("COLUMNS", "300")
    assert max(len(ln) for ln in render_text(sample_report()).splitlines()) <= 100


def test_json_is_complete():
    data = json.loads(render_json(sample_report()))
    assert data["summary"].startswith("ddpcheck preflight")
    assert data["checks"][1]["status"] == "WARN" and data["exit_code"] == 0
    assert data["checks"][1]["id"] == "last_batch_of_one"
    assert data["checks"][1]["name"] == "batch: last batch"


def test_both_modes_write_checks_in_one_shape_with_snake_case_ids():
    import re

    from ddpcheck.preflight.script.report import ScriptReport
    from ddpcheck.preflight.script.report import render_json as render_script_json

    ids = [c.value for c in CheckId]
    assert len(ids) == len(set(ids))
    assert [i for i in ids if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", i)] == []
    seen = Check(CheckId.SET_EPOCH, "FAIL", "epoch 2 repeats epoch 1", "call set_epoch",
                 headline="DDP101 confirmed: epoch 2 began without set_epoch", rule="DDP101",
                 ranks=(1, 0))
    script = ScriptReport(headline="h", target="t.py", argv=[], world_size=2, one_process=False,
                          nodes=1, backend="gloo", device="cpu", cuda_stand_in=False, steps=3,
                          checks=[seen], lint=[], lint_error=None, exit_code=1)
    script_check = json.loads(render_script_json(script))["checks"][0]
    factory_check = json.loads(render_json(sample_report()))["checks"][1]
    assert set(script_check) == set(factory_check)
    assert script_check["id"] == "set_epoch" and script_check["ranks"] == [0, 1]
    assert script_check["name"] == "DDP101 confirmed: epoch 2 began without set_epoch"
    assert script_check["rule"] == "DDP101" and factory_check["rule"] is None
    per_rank = Check(CheckId.RANK_HUNG, "FAIL", "stuck", rank=1)
    assert per_rank.name == "rank 1 hung" and per_rank.to_dict()["ranks"] == [1]
