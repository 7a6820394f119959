"""`ddpcheck --help` shows each command's purpose in full; `preflight --help`
groups its options by mode."""

from __future__ import annotations

import re

from click.testing import CliRunner

from ddpcheck import cli
from ddpcheck.preflight.command import HELP_BOTH, HELP_FACTORY, HELP_SCRIPT, preflight
from ddpcheck.preflight.script.command import FACTORY_ONLY


def _help(*args: str, width: int = 80) -> str:
    result = CliRunner().invoke(cli.main, [*args, "--help"], terminal_width=width, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_command_purpose_is_shown_whole():
    for width in (80, 120):
        shown = _words(_help(width=width).split("Commands:")[1])
        assert "..." not in shown
        for name, command in cli.main.commands.items():
            purpose = _words(command.get_short_help_str())
            assert purpose.endswith("."), (name, purpose)
            assert f"{name} {purpose}" in shown, (name, purpose)


def _sections(text: str) -> dict[str, list[str]]:
    """Section title -> the option flags listed under it."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current is not None and re.match(r"^  (-)", line):
            first = line.split("  ")[1]
            if first.startswith("-- SCRIPT"):
                sections[current].append("-- SCRIPT")
                continue
            flag = re.findall(r"--?[\w-]+", first)[0]
            sections[current].append("--help" if flag == "-h" else flag)
    return sections


def test_preflight_help_groups_options_by_mode():
    sections = _sections(_help("preflight"))
    assert list(sections)[:3] == [HELP_BOTH, HELP_FACTORY, HELP_SCRIPT]
    assert sorted(sections[HELP_BOTH]) == ["--allow-unsandboxed", "--backend", "--format", "--gpus",
                                           "--help", "--timeout"]
    assert sorted(sections[HELP_FACTORY]) == sorted(
        "--" + ("drop-last" if name == "drop_last" else name.replace("_", "-")) for name in FACTORY_ONLY)
    assert sections[HELP_SCRIPT] == ["-- SCRIPT", "--steps", "--nodes"]


def test_every_preflight_option_is_listed_once():
    listed = [flag for flags in _sections(_help("preflight")).values() for flag in flags]
    options = [p for p in preflight.params if p.__class__.__name__ == "Option"]
    assert len(listed) == len(set(listed)) == len(options) + 2   # + --help and the script row
