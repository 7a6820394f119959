"""benchmarks/realworld/score.py: how findings are matched to hand-written
labels, and the figures computed from the matches, on tiny made-up inputs;
one end-to-end run lints a two-file case with this checkout."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_scorer():
    if "realworld_score" in sys.modules:
        return sys.modules["realworld_score"]
    spec = importlib.util.spec_from_file_location("realworld_score", REPO / "benchmarks" / "realworld" / "score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["realworld_score"] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sc = load_scorer()


def finding(line, rule="DDP101", severity="error", file="train.py", case="c"):
    return sc.Finding(case=case, file=file, line=line, rule=rule, severity=severity)


def expect(lines=(), rule="DDP101", severity="error", file="train.py", case="c", anywhere=False, optional=False,
           tolerance=2):
    return sc.Expected(case=case, file=file, rule=rule, lines=tuple(lines), severity=severity,
                       anywhere=anywhere, optional=optional, tolerance=tolerance)


# --- distance and match ---------------------------------------------------------

def test_a_finding_within_the_tolerance_matches_and_one_beyond_does_not():
    label = expect([10])
    assert sc.distance(finding(12), label) == 2
    assert sc.distance(finding(8), label) == 2
    assert sc.distance(finding(13), label) is None
    assert sc.distance(finding(10, rule="DDP102"), label) is None
    assert sc.distance(finding(10, file="utils.py"), label) is None
    assert sc.distance(finding(10, case="other"), label) is not None   # the case is matched by the caller


def test_any_of_several_lines_and_anywhere():
    assert sc.distance(finding(40), expect([10, 40])) == 0
    assert sc.distance(finding(25), expect([10, 40])) is None
    assert sc.distance(finding(999), expect(anywhere=True)) is not None
    assert sc.distance(finding(999, rule="DDP301"), expect(anywhere=True)) is None


def test_a_label_may_name_places_in_several_files():
    labels = sc.parse_labels('case = "c"\n[[expect]]\nat = ["utils.py:90", "train.py:349"]\nrule = "DDP301"\n'
                             'severity = "warning"\n', "c.toml")
    [label] = labels.expected
    assert (label.file, label.lines, label.elsewhere) == ("utils.py", (90,), (("train.py", 349),))
    assert sc.distance(finding(350, rule="DDP301"), label) == 1
    assert sc.distance(finding(91, rule="DDP301", file="utils.py"), label) == 1
    assert sc.distance(finding(90, rule="DDP301", file="other.py"), label) is None
    with pytest.raises(sc.FormatError, match="at"):
        sc.parse_labels('case = "c"\n[[expect]]\nat = ["utils.py"]\nrule = "DDP301"\nseverity = "warning"\n', "c")
    with pytest.raises(sc.FormatError, match="replaces"):
        sc.parse_labels('case = "c"\n[[expect]]\nat = ["u.py:3"]\nline = 3\nrule = "DDP301"\nseverity = "info"\n', "c")


def test_matching_is_one_to_one():
    pairs = sc.match([finding(10), finding(11)], [expect([10])])
    assert len(pairs) == 1 and pairs[0][0].line == 10


def test_matching_finds_the_largest_set_not_the_greedy_one():
    # finding 10 is nearest to both labels; taken greedily by label 11 it would leave finding 12
    # without a label. The largest matching gives 10 -> 9 and 12 -> 11.
    findings = [finding(10), finding(12)]
    labels = [expect([11]), expect([9])]
    pairs = sc.match(findings, labels)
    assert sorted((f.line, e.lines[0]) for f, e in pairs) == [(10, 9), (12, 11)]


def test_a_line_label_is_preferred_to_an_anywhere_label():
    pairs = sc.match([finding(10)], [expect(anywhere=True), expect([10])])
    assert len(pairs) == 1 and pairs[0][1].lines == (10,)


# --- score -------------------------------------------------------------------------

def test_precision_and_recall_count_true_false_and_missed():
    result = sc.score([finding(10), finding(50, rule="DDP301", severity="warning")],
                      [expect([10]), expect([70], rule="DDP104", severity="warning")], serious_only=False)
    assert (len(result.true), len(result.false), len(result.missed)) == (1, 1, 1)
    assert result.precision == 0.5 and result.recall == 0.5


def test_cases_are_matched_apart():
    result = sc.score([finding(10, case="a")], [expect([10], case="b")], serious_only=False)
    assert (len(result.true), len(result.false), len(result.missed)) == (0, 1, 1)


def test_severity_classes_decide_the_errors_and_warnings_scope():
    # reported as an error what deserves info: right for all rules, a false alarm for errors+warnings
    too_high = sc.score([finding(5, rule="DDP501", severity="error")], [expect([5], rule="DDP501", severity="info")],
                        serious_only=True)
    assert (len(too_high.true), len(too_high.false), len(too_high.missed)) == (0, 1, 0)
    # reported as info what deserves an error: a miss for errors+warnings
    too_low = sc.score([finding(5, rule="DDP501", severity="info")], [expect([5], rule="DDP501", severity="error")],
                       serious_only=True)
    assert (len(too_low.true), len(too_low.false), len(too_low.missed)) == (0, 0, 1)
    both = sc.score([finding(5, rule="DDP501", severity="info")], [expect([5], rule="DDP501", severity="error")],
                    serious_only=False)
    assert len(both.true) == 1


def test_debatable_labels_are_neither_credited_nor_missed():
    result = sc.score([finding(10), finding(30)], [expect([10], optional=True), expect([20], optional=True)],
                      serious_only=False)
    assert (len(result.true), len(result.false), len(result.missed), len(result.debatable)) == (0, 1, 0, 1)
    assert result.precision == 0.0 and result.recall is None


def test_a_required_label_wins_over_a_debatable_one():
    result = sc.score([finding(10)], [expect([10], optional=True), expect([11])], serious_only=False)
    assert len(result.true) == 1 and not result.debatable


def test_must_not_notes_name_the_false_findings():
    note = sc.MustNot(case="c", file="train.py", rule="*", lines=(20,))
    hits = sc.must_not_hits([finding(21, rule="DDP301"), finding(40)], [note])
    assert list(hits.values()) == [note]


# --- the formats --------------------------------------------------------------------

def test_label_file_round_trip_and_errors():
    text = textwrap.dedent("""
        case = "c"
        [[expect]]
        file = "train.py"
        rule = "DDP101"
        line = 12
        severity = "error"
        why = "no set_epoch"
        [[expect]]
        file = "train.py"
        rule = "DDP402"
        anywhere = true
        severity = "info"
        [[not]]
        file = "train.py"
        rule = "DDP301"
        lines = [40, 41]
        why = "rank-0 guard through a helper"
    """)
    labels = sc.parse_labels(text, "c.toml")
    assert [e.lines for e in labels.expected] == [(12,), ()]
    assert labels.expected[1].anywhere and labels.must_not[0].lines == (40, 41)
    with pytest.raises(sc.FormatError, match="severity"):
        sc.parse_labels(text.replace('"info"', '"fatal"'), "c.toml")
    with pytest.raises(sc.FormatError, match="anywhere"):
        sc.parse_labels(text.replace("anywhere = true", "anywhere = true\nline = 3"), "c.toml")
    with pytest.raises(sc.FormatError, match="needs"):
        sc.parse_labels(text.replace("line = 12\n", ""), "c.toml")


def test_manifest_checks_entry_and_lint_lists(tmp_path):
    path = tmp_path / "manifest.toml"
    path.write_text(textwrap.dedent("""
        [[case]]
        id = "c"
        repository = "someone/something"
        commit = "0123456789abcdef0123456789abcdef01234567"
        entry = "train.py"
        files = ["train.py", "utils.py", "config.yaml"]
    """))
    [case] = sc.load_manifest(path)
    assert case.lint == ("train.py", "utils.py") and case.multi_file
    path.write_text(path.read_text().replace('entry = "train.py"', 'entry = "main.py"'))
    with pytest.raises(sc.FormatError, match="entry"):
        sc.load_manifest(path)


# --- end to end with this checkout -------------------------------------------------

HELPER = """\
import torch


def save_state(model, path):
    torch.save(model.state_dict(), path)
"""

SCRIPT = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from helpers import save_state

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
net = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x.cuda()), y.cuda()).backward()
        opt.step()
if dist.get_rank() == 0:
    save_state(net.module, "last.pt")
dist.destroy_process_group()
"""


def test_end_to_end_lint_and_score(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    (corpus / "tiny").mkdir(parents=True)
    (corpus / "tiny" / "train.py").write_text(SCRIPT)
    (corpus / "tiny" / "helpers.py").write_text(HELPER)
    (tmp_path / "labels").mkdir()
    (tmp_path / "manifest.toml").write_text(textwrap.dedent("""
        [[case]]
        id = "tiny"
        repository = "nobody/tiny"
        commit = "0000000000000000000000000000000000000000"
        entry = "train.py"
        files = ["train.py", "helpers.py"]
    """))
    # the missing set_epoch is real; a line 30 lines away is deliberately wrong to produce a miss
    (tmp_path / "labels" / "tiny.toml").write_text(textwrap.dedent("""
        case = "tiny"
        [[expect]]
        file = "train.py"
        rule = "DDP101"
        line = 18
        severity = "error"
        [[expect]]
        file = "train.py"
        rule = "DDP104"
        line = 48
        severity = "warning"
        [[not]]
        file = "train.py"
        rule = "DDP301"
        line = 24
        why = "only rank 0 saves"
    """))
    saved = tmp_path / "run.json"
    figures = tmp_path / "figures.json"
    code = sc.main(["--manifest", str(tmp_path / "manifest.toml"), "--corpus", str(corpus), "--checkout", str(REPO),
                    "--save-findings", str(saved), "--json", str(figures)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "misses (1):" in printed and "train.py:48  DDP104 warning" in printed
    data = json.loads(figures.read_text())
    assert data["errors_warnings"]["true"] == 1 and data["errors_warnings"]["missed"] == 1
    assert data["errors_warnings"]["recall"] == 0.5
    assert data["problems"] == []
    run = sc.load_run(saved)
    assert any(f.rule == "DDP101" and f.line == 18 and f.file == "train.py" for f in run.findings)
    # scoring the saved run gives the same figures without linting
    again = tmp_path / "again.json"
    assert sc.main(["--manifest", str(tmp_path / "manifest.toml"), "--findings", str(saved),
                    "--json", str(again)]) == 0
    assert json.loads(again.read_text())["all_rules"] == data["all_rules"]


def test_the_committed_regression_labels_follow_the_format():
    folder = REPO / "benchmarks" / "realworld" / "regression"
    cases = sc.load_manifest(folder / "manifest.toml")
    labels = sc.load_labels(folder / "labels", cases)
    assert len(cases) >= 15 and set(labels) == {c.id for c in cases}
    assert all(c.commit and len(c.commit) == 40 for c in cases)
