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
