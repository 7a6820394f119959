from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ddpcheck
from ddpcheck import cli
from ddpcheck.rules.base import REGISTRY
from ddpcheck.lint.runner import IN_PROCESS_MAX_FILES
from tests.conftest import (MISSING_SET_EPOCH, PREAMBLE, REPO, UNGUARDED_SAVE, WITH_SET_EPOCH, GUARDED_SAVE,
                            ddpcheck_cmd, needs_rule, write)


def invoke(*args: str):
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


@pytest.fixture
def project(tmp_path, monkeypatch, fake_rules):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a.py", PREAMBLE + "x = 1\nBAD_ERROR\n")
    write(tmp_path / "b.py", PREAMBLE + "BAD_WARNING\nBAD_INFO\n")
    write(tmp_path / "clean.py", PREAMBLE + "y = 2\n")
    return tmp_path


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and ddpcheck.__version__ in result.stdout


def test_text_output_and_summary(project):
    result = invoke("lint", "--no-color")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "a.py:3:1: DDP901 fake-error happened. Second sentence.",
        "b.py:2:1: DDP902 fake-warning happened. Second sentence.",
        "b.py:3:1: DDP903 fake-info happened. Second sentence.",
        "",
        "Found 3 findings (1 error, 1 warning, 1 info) in 2 of 3 files.",
    ]
    assert result.stderr == ""


def test_clean_run_exits_0(project):
    result = invoke("lint", "clean.py")
    assert result.exit_code == 0
    assert result.stdout.strip() == "All checks passed (1 file)."


@pytest.mark.parametrize("args, exit_code", [
    ([], 1),                                   # default --fail-on warning: the warning fails
    (["--fail-on", "error"], 0),
    (["--fail-on", "warning"], 1),
    (["--fail-on", "info"], 1),
    (["--select", "DDP903"], 0),               # info alone does not fail by default
    (["--select", "DDP903", "--fail-on", "INFO"], 1),
])
def test_fail_on(project, args, exit_code):
    assert invoke("lint", "b.py", *args).exit_code == exit_code


def test_select_ignore_with_prefixes(project):
    out = invoke("lint", "--select", "DDP9", "--ignore", "ddp901, DDP903").stdout
    assert "DDP902" in out and "DDP901" not in out and "DDP903" not in out


@pytest.mark.parametrize("flag", ["--select", "--ignore"])
def test_unknown_code_on_command_line(project, flag):
    result = invoke("lint", flag, "DDP9,XYZ123")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"ddpcheck: error: {flag}: unknown rule code 'XYZ123' (known: ")
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def test_json_format(project):
    result = invoke("lint", "--format", "json")
    doc = json.loads(result.stdout)
    assert [(d["path"], d["line"], d["code"], d["severity"]) for d in doc["findings"]] == [
        ("a.py", 3, "DDP901", "error"), ("b.py", 2, "DDP902", "warning"), ("b.py", 3, "DDP903", "info")]
    assert doc["files_checked"] == 3 and doc["errors"] == []
    assert result.exit_code == 1


def test_github_format(project):
    result = invoke("lint", "--format", "github", "--quiet")
    assert result.stdout.splitlines() == [
        "::error file=a.py,line=3,col=1,title=DDP901 fake-error::fake-error happened. Second sentence.",
        "::warning file=b.py,line=2,col=1,title=DDP902 fake-warning::fake-warning happened. Second sentence.",
        "::notice file=b.py,line=3,col=1,title=DDP903 fake-info::fake-info happened. Second sentence.",
    ]


def test_quiet_prints_only_findings(project):
    (project / "empty").mkdir()
    result = invoke("lint", "--quiet", "--no-color", ".", "empty")
    assert "Found" not in result.stdout and "DDP901" in result.stdout
    assert result.stderr == ""  # the empty-folder warning is hidden too
    loud = invoke("lint", "--no-color", ".", "empty")
    assert loud.stderr.strip() == "ddpcheck: warning: empty/: no Python files"
    assert loud.exit_code == 1  # an empty folder is a warning, not an unreadable input


def test_statistics(project):
    result = invoke("lint", "--statistics", "--no-color")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["count", "code", "name", "severity"]
    assert [line.split()[:2] for line in lines[2:5]] == [["1", "DDP901"], ["1", "DDP902"], ["1", "DDP903"]]
    assert "help:" not in result.stdout
    assert lines[-1].startswith("Found 3 findings")
    doc = json.loads(invoke("lint", "--statistics", "--format", "json").stdout)
    assert [s["code"] for s in doc["statistics"]] == ["DDP901", "DDP902", "DDP903"]
    assert invoke("lint", "--statistics", "--format", "github").exit_code == 2


def test_color(project, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli._use_color(no_color=False, output_format="concise") is True
    assert cli._use_color(no_color=False, output_format="full") is True
    assert cli._use_color(no_color=False, output_format="sarif") is False
    assert cli._use_color(no_color=True, output_format="concise") is False
    assert cli._use_color(no_color=False, output_format="json") is False
    assert cli._use_color(no_color=False, output_format="github") is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli._use_color(no_color=False, output_format="text") is False
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("NO_COLOR")
    assert cli._use_color(no_color=False, output_format="text") is False


def test_usage_error_exits_2(project):
    assert invoke("lint", "--format", "xml").exit_code == 2
    assert invoke("lint", "--jobs", "0").exit_code == 2
    assert invoke("frobnicate").exit_code == 2


def test_process_pool_gives_the_same_sorted_output(project):
    for i in range(IN_PROCESS_MAX_FILES * 3):
        write(project / "many" / f"f{i:03d}.py", PREAMBLE + "BAD_ERROR\n" * (i % 3) + "BAD_INFO\n")
    serial = invoke("lint", "--no-color", "--jobs", "1", "many", "a.py")
    pooled = invoke("lint", "--no-color", "--jobs", "2", "many", "a.py")
    assert serial.stdout == pooled.stdout
    assert serial.stdout.count("DDP901") == sum(i % 3 for i in range(IN_PROCESS_MAX_FILES * 3)) + 1
    assert serial.stdout.splitlines()[-1] == "Found 97 findings (49 errors, 48 info) in 49 of 49 files."


def test_rules_command_lists_every_rule(fake_rules):
    result = invoke("rules")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["code", "name", "severity", "fix", "summary"]
    for code, rule in REGISTRY.items():
        [row] = [line for line in lines if line.startswith(code + " ")]
        assert rule.name in row and str(rule.severity) in row
        # the whole summary, never cut with "..."
        assert (getattr(rule, "short", "") or rule.message) in row and not row.rstrip().endswith("...")
        assert (" yes " in row) == bool(getattr(rule, "fixable", False))


@pytest.mark.skipif(not REGISTRY, reason="no rules registered yet")
def test_rule_command_prints_the_page():
    code = sorted(REGISTRY)[0]
    result = invoke("rule", code.lower())
    assert result.exit_code == 0
    assert result.stdout.startswith("# ") and "## What it does" in result.stdout and code in result.stdout


def test_rule_command_unknown_code():
    result = invoke("rule", "DDP999")
    assert result.exit_code == 2
    assert result.stderr.startswith("ddpcheck: error: unknown rule 'DDP999' (known: ")
    assert len(result.stderr.splitlines()) == 1


def test_default_path_is_the_current_folder(project):
    assert invoke("lint", "--no-color").stdout == invoke("lint", "--no-color", ".").stdout


def test_lint_never_imports_torch(tmp_path):
    script = write(tmp_path / "train.py", MISSING_SET_EPOCH)
    code = (
        "import sys\n"
        "import ddpcheck.lint.runner as runner\n"
        "from ddpcheck.cli import main\n"
        # In-process (the no-fork fallback), so sys.modules here shows what
        # linting imports; a worker is a fork running the same code.
        "runner._fork_context = lambda: None\n"
        "try:\n"
        f"    main(['lint', {str(script)!r}, '--jobs', '1'])\n"
        "except SystemExit as exit:\n"
        "    assert 'torch' not in sys.modules, 'lint imported torch'\n"
        "    assert 'ddpcheck.lint.analyze' in sys.modules, 'nothing was analysed'\n"
        "    print('exit', exit.code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] in ("exit 0", "exit 1")


def test_importing_the_cli_never_imports_torch_and_preflight_is_registered():
    code = ("import sys; import ddpcheck.cli as cli; "
            "assert 'torch' not in sys.modules, 'importing the CLI imported torch'; "
            "assert 'preflight' in cli.main.commands; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr
    assert "ddpcheck preflight" in invoke("preflight", "--help").stdout


# --- end to end, real rules, real process ------------------------------------------

@needs_rule("DDP101")
def test_end_to_end_missing_set_epoch(tmp_path):
    write(tmp_path / "buggy.py", MISSING_SET_EPOCH)
    write(tmp_path / "fixed.py", WITH_SET_EPOCH)
    bad = ddpcheck_cmd("lint", "--no-color", "buggy.py", cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "buggy.py:9:1: DDP101 [*] " in bad.stdout and "help:" not in bad.stdout
    full = ddpcheck_cmd("lint", "--no-color", "--output-format", "full", "buggy.py", cwd=tmp_path)
    assert "buggy.py:9:1: DDP101 [*] " in full.stdout and "  = help: call `sampler.set_epoch(epoch)`" in full.stdout
    good = ddpcheck_cmd("lint", "--no-color", "--select", "DDP101", "fixed.py", cwd=tmp_path)
    assert good.returncode == 0 and "All checks passed (1 file)." in good.stdout, good.stdout


@needs_rule("DDP301")
def test_end_to_end_unguarded_save(tmp_path):
    write(tmp_path / "buggy.py", UNGUARDED_SAVE)
    write(tmp_path / "fixed.py", GUARDED_SAVE)
    result = ddpcheck_cmd("lint", "--format", "json", "--select", "DDP301", ".", cwd=tmp_path)
    doc = json.loads(result.stdout)
    assert [(d["path"], d["code"]) for d in doc["findings"]] == [("buggy.py", "DDP301")]


def test_fixtures_folder_lints_without_crashing():
    """The README's first command: lint the fixtures. Every file must be
    analysed (no internal errors, no unreadable inputs)."""
    result = ddpcheck_cmd("lint", "--no-color", "fixtures", cwd=REPO)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert "error:" not in result.stderr, result.stderr
