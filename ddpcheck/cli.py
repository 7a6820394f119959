"""Command line: `ddpcheck lint`, `ddpcheck rules`, `ddpcheck rule CODE`
(and `ddpcheck preflight`, defined in ddpcheck.preflight).

Exit codes of `lint`: 0 nothing at or above --fail-on; 1 findings at or above
--fail-on; 2 a usage or config error, or an input that could not be read
(2 wins over 1). Importing this module must never import torch: the lint path
has to stay light enough for a pre-commit hook."""

from __future__ import annotations

import os
import sys

import click

from ddpcheck import __version__
from ddpcheck.errors import EXIT_USAGE as EXIT_ERROR  # noqa: F401  (one error path for every command)
from ddpcheck.errors import fail
from ddpcheck.findings import Severity


def registry() -> dict:
    import ddpcheck.rules  # noqa: F401  (importing registers every rule)
    from ddpcheck.rules.base import REGISTRY

    return REGISTRY


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="ddpcheck")
def main() -> None:
    """Find PyTorch multi-GPU (DDP / DataParallel / torchrun) pitfalls before the job starts."""


# --- lint ------------------------------------------------------------------------

def _use_color(no_color: bool, output_format: str) -> bool:
    # NO_COLOR (no-color.org): any non-empty value turns colors off.
    if no_color or output_format != "text" or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", metavar="CODES", help="Comma-separated rule codes or prefixes to run (DDP101,DDP3). Default: all.")
@click.option("--ignore", metavar="CODES", help="Comma-separated rule codes or prefixes to skip.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "github"]), default="text",
              show_default=True, help="text for people, json for tools, github for GitHub Actions annotations.")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"], case_sensitive=False), default=None,
              help="Lowest severity that makes the exit code 1. [default: warning, or fail-on from config]")
@click.option("--statistics", is_flag=True, help="Print a count per rule instead of each finding.")
@click.option("-q", "--quiet", is_flag=True, help="Print only findings and errors: no summary, no warnings.")
@click.option("--no-color", is_flag=True, help="No colors (also off when NO_COLOR is set or output is not a terminal).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="pyproject.toml to read [tool.ddpcheck] from (default: the nearest one).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker processes. [default: number of CPUs]")
def lint(paths, select, ignore, output_format, fail_on, statistics, quiet, no_color, config_path, jobs) -> None:
    """Check training scripts for DDP pitfalls (PATHS: files or folders, default `.`)."""
    from ddpcheck.lint.command import LintOptions, run_lint

    if statistics and output_format == "github":
        raise click.UsageError("--statistics works with --format text or json")
    options = LintOptions(
        paths=tuple(paths) or (".",),
        select=select,
        ignore=ignore,
        output_format=output_format,
        fail_on=Severity.parse(fail_on) if fail_on else None,
        statistics=statistics,
        quiet=quiet,
        color=_use_color(no_color, output_format),
        config_path=config_path,
        jobs=jobs,
    )
    try:
        code = run_lint(options)
    except KeyboardInterrupt:
        click.echo("ddpcheck: interrupted", err=True)
        code = 130
    sys.exit(code)


# --- rules / rule ----------------------------------------------------------------

SUMMARY_WIDTH = 90


def one_line(text: str) -> str:
    """A short summary of a rule message for the rules table: its first
    sentence, cut at its first clause (`: ` / `; `) when that is too long."""
    text = " ".join(text.split())
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    if len(text) > SUMMARY_WIDTH:
        cuts = [i for i in (text.find(": "), text.find("; ")) if 20 <= i <= SUMMARY_WIDTH]
        text = text[: min(cuts)] if cuts else text[: SUMMARY_WIDTH - 3].rstrip() + "..."
    return text


@main.command("rules")
def rules_command() -> None:
    """List every rule: code, name, severity, summary."""
    from tabulate import tabulate

    rows = [(code, rule.name, str(rule.severity), one_line(rule.message))
            for code, rule in sorted(registry().items())]
    if not rows:
        click.echo("No rules registered.")
        return
    click.echo(tabulate(rows, headers=["code", "name", "severity", "summary"]))
    click.echo("\nMore on one rule: ddpcheck rule CODE")


@main.command("rule")
@click.argument("code")
def rule_command(code: str) -> None:
    """Show a rule's reference page (what it does, why it bites, examples)."""
    from ddpcheck.pages import PageNotFound, load_page

    rules = registry()
    code = code.strip().upper()
    if code not in rules:
        fail(f"unknown rule {code!r} (known: {', '.join(sorted(rules)) or 'none registered'})")
    try:
        page = load_page(code)
    except PageNotFound:
        fail(f"{code}: no reference page shipped for this rule; see `ddpcheck rules`")
    click.echo(page.rstrip("\n"))


# --- preflight -------------------------------------------------------------------

# Defined by ddpcheck.preflight; importing it does not import torch (the
# command imports torch only when it runs), so `ddpcheck lint` stays light.
from ddpcheck.preflight.command import preflight  # noqa: E402

main.add_command(preflight)
