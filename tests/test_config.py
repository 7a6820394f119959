from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpcheck.cli import main
from ddpcheck.lint.config import ConfigError, find_pyproject, load_config, resolve_enabled
from ddpcheck.findings import Severity
from ddpcheck.lint.command import LintOptions, file_settings, plan
from ddpcheck.rules.base import REGISTRY
from tests.conftest import PREAMBLE, write

ALL_MARKERS = PREAMBLE + "BAD_ERROR\nBAD_WARNING\nBAD_INFO\n"


def pyproject(folder: Path, body: str) -> Path:
    return write(folder / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.ddpcheck]\n" + body)


def lint(*args: str, cwd: Path) -> tuple[int, str, str]:
    assert Path.cwd() == cwd
    result = CliRunner().invoke(main, ["lint", "--no-color", "--jobs", "1", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_no_pyproject_means_defaults(in_tmp):
    config = load_config(None, in_tmp)
    assert config.path is None and config.root is None and config.select is None


def test_nearest_pyproject_with_a_ddpcheck_table_wins(in_tmp, fake_rules):
    pyproject(in_tmp, 'ignore = ["DDP901"]\n')
    # A nearer pyproject.toml without [tool.ddpcheck] is skipped on the way up.
    write(in_tmp / "pkg" / "pyproject.toml", "[project]\nname = 'inner'\n")
    script = write(in_tmp / "pkg" / "sub" / "train.py", "x = 1\n")
    assert find_pyproject(script) == (in_tmp / "pyproject.toml").resolve()
    config = load_config(None, script)
    assert config.ignore == ("DDP901",)
    assert config.root == str(in_tmp.resolve())


def test_root_goes_into_lint_settings(in_tmp, fake_rules):
    pyproject(in_tmp / "proj", 'main-process-guards = ["is_chief", "utils.on_master"]\n')
    script = write(in_tmp / "proj" / "train.py", ALL_MARKERS)
    the_plan = plan(LintOptions(paths=(str(script),)))
    [task] = file_settings([str(script)], the_plan)
    settings = task.settings
    assert settings.root == str((in_tmp / "proj").resolve())
    assert settings.main_process_guards == ("is_chief", "utils.on_master")
    assert settings.enabled == frozenset(REGISTRY) and set(fake_rules) <= settings.enabled


@pytest.mark.parametrize("body, message", [
    ('selct = ["DDP901"]\n', "unknown key 'selct' (known: select, ignore, per-file-ignores"),
    ('select = "DDP901"\n', "select must be a list of rule codes, got 'DDP901'"),
    ('select = ["DDP999"]\n', "select: unknown rule code 'DDP999' (known: "),
    ('ignore = ["XYZ1"]\n', "ignore: unknown rule code 'XYZ1'"),
    ('per-file-ignores = ["tests/*"]\n', "per-file-ignores must be a table"),
    ('per-file-ignores = { "tests/*" = ["NOPE1"] }\n', "per-file-ignores 'tests/*': unknown rule code 'NOPE1'"),
    ('exclude = "build"\n', "exclude must be a list of strings"),
    ('fail-on = "fatal"\n', 'fail-on must be "error", "warning" or "info"'),
    ('fail-on = 3\n', 'fail-on must be "error", "warning" or "info"'),
    ('main-process-guards = ["is chief"]\n', "'is chief' is not a Python name"),
    ('select = [\n', "invalid TOML"),
])
def test_config_mistakes_are_one_line_exit_2(in_tmp, fake_rules, body, message):
    pyproject(in_tmp, body)
    write(in_tmp / "train.py", ALL_MARKERS)
    code, out, err = lint("train.py", cwd=in_tmp)
    assert code == 2
    assert err.startswith("ddpcheck: error: pyproject.toml:"), err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""


def test_config_error_raises_config_error_in_api(in_tmp, fake_rules):
    pyproject(in_tmp, 'select = ["DDP999"]\n')
    with pytest.raises(ConfigError, match="DDP999"):
        load_config(None, in_tmp)


def test_config_select_and_ignore_apply(in_tmp, fake_rules):
    pyproject(in_tmp, 'select = ["DDP9"]\nignore = ["DDP903"]\n')
    write(in_tmp / "train.py", ALL_MARKERS)
    code, out, _ = lint("train.py", cwd=in_tmp)
    assert "DDP901" in out and "DDP902" in out and "DDP903" not in out


def test_cli_flags_replace_config_values(in_tmp, fake_rules):
    pyproject(in_tmp, 'select = ["DDP901"]\n')
    write(in_tmp / "train.py", ALL_MARKERS)
    _, out, _ = lint("--select", "DDP902", "train.py", cwd=in_tmp)
    assert "DDP902" in out and "DDP901" not in out


def test_per_file_ignores(in_tmp, fake_rules):
    pyproject(in_tmp, 'per-file-ignores = { "scripts/*" = ["DDP901"], "legacy_*.py" = ["DDP9"] }\n')
    write(in_tmp / "scripts" / "a.py", ALL_MARKERS)
    write(in_tmp / "deep" / "legacy_b.py", ALL_MARKERS)
    write(in_tmp / "c.py", ALL_MARKERS)
    _, out, _ = lint(".", cwd=in_tmp)
    codes_by_file = {}
    for line in out.splitlines():
        if ": DDP" in line:
            path, rest = line.split(":", 1)
            codes_by_file.setdefault(path, set()).add(rest.split()[1])
    assert codes_by_file == {
        "c.py": {"DDP901", "DDP902", "DDP903"},
        str(Path("scripts/a.py")): {"DDP902", "DDP903"},
    }


def test_exclude_applies_to_walked_and_named_files(in_tmp, fake_rules):
    pyproject(in_tmp, 'exclude = ["generated", "old_*.py"]\n')
    write(in_tmp / "generated" / "x.py", ALL_MARKERS)
    write(in_tmp / "old_train.py", ALL_MARKERS)
    write(in_tmp / "train.py", ALL_MARKERS)
    _, out, _ = lint(".", cwd=in_tmp)
    assert "train.py:" in out and "old_train.py" not in out and "generated" not in out
    # Named explicitly (as pre-commit does): still excluded.
    code, out, _ = lint("old_train.py", cwd=in_tmp)
    assert code == 0 and "DDP9" not in out


def test_fail_on_from_config_and_flag_override(in_tmp, fake_rules):
    pyproject(in_tmp, 'fail-on = "error"\n')
    write(in_tmp / "train.py", PREAMBLE + "BAD_WARNING\n")
    assert lint("train.py", cwd=in_tmp)[0] == 0
    assert lint("--fail-on", "warning", "train.py", cwd=in_tmp)[0] == 1


def test_explicit_config_path(in_tmp, fake_rules):
    write(in_tmp / "cfg" / "custom.toml", '[tool.ddpcheck]\nselect = ["DDP903"]\n')
    write(in_tmp / "train.py", ALL_MARKERS)
    _, out, _ = lint("--config", "cfg/custom.toml", "train.py", cwd=in_tmp)
    assert "DDP903" in out and "DDP901" not in out


def test_missing_explicit_config(in_tmp, fake_rules):
    write(in_tmp / "train.py", ALL_MARKERS)
    code, _, err = lint("--config", "nope.toml", "train.py", cwd=in_tmp)
    assert code == 2 and err.strip() == "ddpcheck: error: nope.toml: config file not found"


@pytest.mark.parametrize("select, ignore, expected", [
    (None, (), {"DDP101", "DDP102", "DDP301"}),
    (("DDP1",), (), {"DDP101", "DDP102"}),
    (("ALL",), ("DDP102",), {"DDP101", "DDP301"}),
    (("DDP101",), ("DDP1",), set()),  # ignore wins
    ((), (), set()),
])
def test_resolve_enabled(select, ignore, expected):
    assert resolve_enabled(select, ignore, ["DDP101", "DDP102", "DDP301"]) == expected


def test_severity_parse():
    assert Severity.parse(" Warning ") is Severity.WARNING
    with pytest.raises(ValueError):
        Severity.parse("fatal")
