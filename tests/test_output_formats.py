"""--output-format concise|full|json|github|sarif|junit on real findings."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from urllib.parse import urlparse

import pytest
from click.testing import CliRunner

from ddpcheck import cli
from ddpcheck.lint import report
from ddpcheck.rules.base import REGISTRY
from tests.conftest import MISSING_SET_EPOCH, needs_rule, write


def invoke(*args: str):
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", MISSING_SET_EPOCH)
    write(tmp_path / "broken.py", "import torch.distributed as dist\ndist.init_process_group()\ndef (:\n")
    return tmp_path


@pytest.mark.parametrize("code", sorted(REGISTRY))
def test_every_rule_has_a_short_message(code):
    short = REGISTRY[code].short
    assert 10 <= len(short) <= 80 and "\n" not in short, short
    assert short != REGISTRY[code].message


@needs_rule("DDP101")
def test_concise_is_the_default_one_line_each(project):
    result = invoke("lint", "--no-color", "train.py")
    lines = result.stdout.splitlines()
    findings = [line for line in lines if re.match(r"train\.py:\d+:\d+: DDP\d{3} ", line)]
    assert [line.split()[1] for line in findings] == ["DDP402", "DDP101"]
    assert all(len(line) <= 110 for line in findings), findings
    assert "train.py:9:1: DDP101 [*] " + REGISTRY["DDP101"].short in lines
    assert lines[-1] == "[*] 2 fixable with the `--fix` option."
    assert invoke("lint", "--no-color", "--output-format", "concise", "train.py").stdout == result.stdout


@needs_rule("DDP101")
def test_full_shows_source_caret_teaching_text_and_fix(project):
    out = invoke("lint", "--no-color", "--output-format", "full", "--select", "DDP101", "train.py").stdout
    lines = out.splitlines()
    assert lines[0] == "train.py:9:1: DDP101 [*] " + REGISTRY["DDP101"].short
    assert " 9 | for epoch in range(10):" in lines
    caret = lines[lines.index(" 9 | for epoch in range(10):") + 1]
    assert caret == "   | ^ DDP101"
    assert any(line.startswith("  = `loader` draws from a shuffling DistributedSampler") for line in lines)
    assert "  = help: call `sampler.set_epoch(epoch)` at the top of the epoch loop, before iterating `loader`" in lines
    assert "  = autofix: `ddpcheck lint --fix` applies it (safe)" in lines
    # `--format text`, the old long form, is an alias of full
    assert invoke("lint", "--no-color", "--format", "text", "--select", "DDP101", "train.py").stdout == out


@needs_rule("DDP101")
def test_json_carries_short_message_and_applicability(project):
    doc = json.loads(invoke("lint", "--output-format", "json", "--select", "DDP101", "train.py").stdout)
    [finding] = doc["findings"]
    assert finding["short"] == REGISTRY["DDP101"].short and finding["applicability"] == "safe"


@needs_rule("DDP101")
def test_github_annotations_carry_the_short_message(project):
    out = invoke("lint", "--output-format", "github", "--quiet", "--select", "DDP101", ".").stdout.splitlines()
    assert out[0].startswith("::error file=broken.py,line=3,")
    assert out[1] == ("::error file=train.py,line=9,col=1,title=DDP101 missing-set-epoch::"
                      + REGISTRY["DDP101"].short)


# --- SARIF 2.1.0 ---------------------------------------------------------------------------
# The structure below is what the SARIF 2.1.0 schema (sarif-schema-2.1.0.json)
# requires of the objects ddpcheck writes: required properties, enums, minimums,
# and URI formats.

LEVELS = {"none", "note", "warning", "error"}


def _is_absolute_uri(text: str) -> bool:
    parsed = urlparse(text)
    return bool(parsed.scheme) and bool(parsed.netloc or parsed.path)


def _message(obj: dict) -> None:
    assert isinstance(obj, dict) and ("text" in obj or "id" in obj)


def check_sarif(doc: dict) -> None:
    assert set(doc) <= {"$schema", "version", "runs", "inlineExternalProperties", "properties"}
    assert doc["version"] == "2.1.0" and _is_absolute_uri(doc["$schema"])
    assert isinstance(doc["runs"], list)
    for run in doc["runs"]:
        driver = run["tool"]["driver"]
        assert isinstance(driver["name"], str) and driver["name"]
        assert _is_absolute_uri(driver["informationUri"])
        ids = []
        for rule in driver["rules"]:
            ids.append(rule["id"])
            for key in ("shortDescription", "fullDescription", "help"):
                assert isinstance(rule[key]["text"], str) and rule[key]["text"], (rule["id"], key)
            assert _is_absolute_uri(rule["helpUri"])
            assert rule["defaultConfiguration"]["level"] in LEVELS
        assert len(ids) == len(set(ids)), "rule ids are unique"
        for base in run.get("originalUriBaseIds", {}).values():
            assert _is_absolute_uri(base["uri"]) and base["uri"].endswith("/")
        for result in run["results"]:
            _message(result["message"])
            assert result["level"] in LEVELS
            if "ruleIndex" in result:
                assert isinstance(result["ruleIndex"], int) and result["ruleIndex"] >= -1
                assert ids[result["ruleIndex"]] == result["ruleId"]
            for location in result["locations"]:
                physical = location["physicalLocation"]
                assert isinstance(physical["artifactLocation"]["uri"], str)
                region = physical["region"]
                assert region["startLine"] >= 1 and region["startColumn"] >= 1
        for invocation in run["invocations"]:
            assert isinstance(invocation["executionSuccessful"], bool)
            for note in invocation["toolExecutionNotifications"]:
                _message(note["message"])
                assert note["level"] in LEVELS


@needs_rule("DDP101")
def test_sarif_document(project):
    result = invoke("lint", "--output-format", "sarif", ".")
    assert result.exit_code == 2   # broken.py could not be read
    doc = json.loads(result.stdout)
    check_sarif(doc)
    [run] = doc["runs"]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert set(rules) == set(REGISTRY)
    assert rules["DDP101"]["shortDescription"]["text"] == REGISTRY["DDP101"].short
    assert rules["DDP101"]["helpUri"].endswith("/rules/DDP101.md")
    assert "## Why it bites in DDP" in rules["DDP101"]["help"]["markdown"]
    assert rules["DDP101"]["properties"]["fixable"] is True
    located = [(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in run["results"]]
    assert ("DDP101", "train.py", 9) in located
    assert run["invocations"][0]["executionSuccessful"] is False
    assert "broken.py" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]


def test_sarif_check_rejects_what_the_schema_rejects():
    good = json.loads(report.sarif_document([], [], {}))
    check_sarif(good)
    for broken in ({**good, "version": "2.0.0"}, {k: v for k, v in good.items() if k != "runs"}):
        with pytest.raises((AssertionError, KeyError)):
            check_sarif(broken)


@needs_rule("DDP101")
def test_junit_document(project):
    result = invoke("lint", "--output-format", "junit", ".")
    root = ET.fromstring(result.stdout)
    assert root.tag == "testsuites"
    [suite] = root
    cases = {case.get("name"): case for case in suite}
    assert set(cases) == {"broken.py", "train.py"}
    failures = cases["train.py"].findall("failure")
    assert {f.get("type") for f in failures} == {"DDP101", "DDP402"}
    assert cases["broken.py"].find("error") is not None
    assert suite.get("failures") == "1" and suite.get("errors") == "1"


def test_statistics_only_with_text_or_json(project):
    assert invoke("lint", "--statistics", "--output-format", "sarif").exit_code == 2
