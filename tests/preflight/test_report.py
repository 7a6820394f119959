"""Rendering: text tables keep values as written; json carries everything."""

from __future__ import annotations

import json

from ddpcheck.preflight.report import render_json, render_text


def sample_report():
    return {
        "headline": "ddpcheck preflight: 2 ranks, gloo on CPU",
        "checks": [{"name": "collectives", "status": "PASS", "detail": "ok " * 40, "fix": ""},
                   {"name": "batch: last batch", "status": "WARN", "detail": "holds 1 sample",
                    "fix": "drop_last=True"}],
        "arithmetic": {"rows": [("DataLoader drop_last", "False"), ("per-GPU batch", "4")],
                       "ranks": [("0", 4304, 4304, 0, 1076, 4, 0)], "guide": []},
        "memory": None,
        "timing": {"total_seconds": 1.0},
        "exit_code": 0,
    }


def test_text_keeps_false_as_false():
    text = render_text(sample_report())
    line = next(ln for ln in text.splitlines() if "DataLoader drop_last" in ln)
    assert line.split()[-1] == "False"
    assert "1 WARN, 1 PASS -> exit 0" in text


def test_json_is_complete():
    data = json.loads(render_json(sample_report()))
    assert data["summary"].startswith("ddpcheck preflight")
    assert data["checks"][1]["status"] == "WARN" and data["exit_code"] == 0
