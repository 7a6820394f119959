"""ruff's conventions: --exit-zero, --extend-select / --extend-ignore, `-`
with --stdin-filename, --show-settings, `ddpcheck rule NAME`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpcheck.cli import main
from ddpcheck.rules.base import REGISTRY
from tests.conftest import PREAMBLE, write

ALL_MARKERS = PREAMBLE + "BAD_ERROR\nBAD_WARNING\nBAD_INFO\n"


def lint(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, ["lint", "--no-color", "--jobs", "1", *args], input=stdin,
                              catch_exceptions=False)


def codes_in(output: str) -> list[str]:
    return sorted({word for word in output.split() if word.startswith("DDP9")})


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, fake_rules):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a.py", ALL_MARKERS)
    return tmp_path


def pyproject(folder: Path, body: str) -> Path:
    return write(folder / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.ddpcheck]\n" + body)


def test_exit_zero(in_tmp):
    assert lint("a.py").exit_code == 1
    result = lint("--exit-zero", "a.py")
    assert result.exit_code == 0 and "DDP901" in result.stdout
    # an unreadable input is still an error
    assert lint("--exit-zero", "a.py", "missing.py").exit_code == 2


def test_select_replaces_the_config_and_extend_select_adds_to_it(in_tmp):
    pyproject(in_tmp, 'select = ["DDP901"]\n')
    assert codes_in(lint("a.py").stdout) == ["DDP901"]
    assert codes_in(lint("--select", "DDP902", "a.py").stdout) == ["DDP902"]
    assert codes_in(lint("--extend-select", "DDP903", "a.py").stdout) == ["DDP901", "DDP903"]


def test_ignore_replaces_the_config_and_extend_ignore_adds_to_it(in_tmp):
    pyproject(in_tmp, 'ignore = ["DDP901"]\n')
    assert codes_in(lint("a.py").stdout) == ["DDP902", "DDP903"]
    assert codes_in(lint("--ignore", "DDP903", "a.py").stdout) == ["DDP901", "DDP902"]
    assert codes_in(lint("--extend-ignore", "DDP903", "a.py").stdout) == ["DDP902"]


def test_extend_keys_in_config(in_tmp):
    pyproject(in_tmp, 'select = ["DDP901"]\nextend-select = ["DDP902"]\n')
    assert codes_in(lint("a.py").stdout) == ["DDP901", "DDP902"]
    pyproject(in_tmp, 'extend-ignore = ["DDP902"]\n')
    assert codes_in(lint("a.py").stdout) == ["DDP901", "DDP903"]


def test_extend_flags_check_their_codes(in_tmp):
    result = lint("--extend-select", "XYZ1", "a.py")
    assert result.exit_code == 2 and "--extend-select: unknown rule code 'XYZ1'" in result.stderr


def test_stdin_is_linted_under_its_filename(in_tmp):
    result = lint("-", "--stdin-filename", "pkg/train.py", stdin=ALL_MARKERS)
    assert result.exit_code == 1
    assert "pkg/train.py:2:1: DDP901 " in result.stdout
    # no path at all with --stdin-filename also reads stdin
    assert lint("--stdin-filename", "pkg/train.py", stdin=ALL_MARKERS).stdout == result.stdout
    unnamed = lint("-", stdin=ALL_MARKERS)
    assert "-:2:1: DDP901 " in unnamed.stdout


def test_stdin_honours_per_file_ignores_and_excludes(in_tmp):
    pyproject(in_tmp, 'exclude = ["vendor"]\n[tool.ddpcheck.per-file-ignores]\n"tests/*" = ["DDP901"]\n')
    ignored = lint("-", "--stdin-filename", "tests/test_x.py", stdin=ALL_MARKERS)
    assert codes_in(ignored.stdout) == ["DDP902", "DDP903"]
    excluded = lint("-", "--stdin-filename", "vendor/lib.py", stdin=ALL_MARKERS)
    assert excluded.exit_code == 0 and "DDP9" not in excluded.stdout


def test_stdin_cannot_mix_with_paths(in_tmp):
    assert lint("-", "a.py").exit_code == 2
    assert lint("a.py", "--stdin-filename", "x.py").exit_code == 2


def test_show_settings(in_tmp):
    pyproject(in_tmp, 'ignore = ["DDP902"]\nfail-on = "error"\ncache-dir = "build/lint-cache"\n')
    result = lint("--show-settings", "--extend-ignore", "DDP903")
    assert result.exit_code == 0
    rows = dict(line.split(" = ", 1) for line in result.stdout.splitlines())
    assert {k.strip(): v for k, v in rows.items()}["fail-on"] == "error"
    settings = {k.strip(): v for k, v in rows.items()}
    assert "DDP901" in settings["enabled rules"] and "DDP902" not in settings["enabled rules"]
    assert "DDP903" not in settings["enabled rules"]
    assert settings["config file"].endswith("pyproject.toml")
    assert not list(in_tmp.glob(".ddpcheck_cache"))


def test_rule_by_name_or_code():
    by_name = CliRunner().invoke(main, ["rule", "missing-set-epoch"])
    by_code = CliRunner().invoke(main, ["rule", "ddp101"])
    assert by_name.exit_code == 0 and by_name.stdout == by_code.stdout
    assert by_name.stdout.startswith("# DDP101 missing-set-epoch")
    unknown = CliRunner().invoke(main, ["rule", "missing-set-epok"])
    assert unknown.exit_code == 2 and "unknown rule 'missing-set-epok'" in unknown.stderr


@pytest.mark.parametrize("code", sorted(REGISTRY))
def test_a_rule_page_says_whether_the_rule_is_fixable(code):
    page = CliRunner().invoke(main, ["rule", code]).stdout
    fix_line = page[page.index("**Fix:**"):].split("\n\n")[0]
    assert ("ddpcheck lint --fix" in fix_line) == REGISTRY[code].fixable, fix_line
    if REGISTRY[code].fixable:
        assert ("--unsafe-fixes" in fix_line) == (code in ("DDP201", "DDP303", "DDP307"))
