"""Command line: `ddpcheck lint`, `ddpcheck rules`, `ddpcheck rule CODE`
(and `ddpcheck preflight`, defined in ddpcheck.preflight).

Exit codes of `lint`: 0 nothing at or above --fail-on (or --exit-zero); 1
findings at or above --fail-on (with --diff: there is a diff); 2 a usage or
config error, or an input that could not be read (2 wins over 1). Importing this module must never import torch: the lint path
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Documentation: https://github.com/ddpcheck/ddpcheck/tree/main/docs")
@click.version_option(__version__, "--version", "-V", prog_name="ddpcheck")
def main() -> None:
    """Find PyTorch multi-GPU (DDP / DataParallel / torchrun) pitfalls before the job starts.

    ddpcheck COMMAND --help says more about each command."""


# --- lint ------------------------------------------------------------------------

def _use_color(no_color: bool, output_format: str) -> bool:
    # NO_COLOR (no-color.org): any non-empty value turns colors off.
    if no_color or output_format not in ("concise", "full", "text") or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


# `text` (the long form of earlier versions) is kept as an alias of `full`.
FORMAT_ALIASES = {"text": "full"}


@main.command(short_help="Check training scripts for DDP pitfalls (files or folders; default: the current "
                         "folder).")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", metavar="CODES", help="Comma-separated rule codes or prefixes to run (DDP101,DDP3). Default: all.")
@click.option("--extend-select", metavar="CODES", help="Codes or prefixes to run on top of the selection (config or --select).")
@click.option("--ignore", metavar="CODES", help="Comma-separated rule codes or prefixes to skip.")
@click.option("--extend-ignore", metavar="CODES", help="Codes or prefixes to skip on top of the config's ignore list.")
@click.option("--output-format", "--format", "output_format",
              type=click.Choice(["concise", "full", "json", "github", "sarif", "junit", "text"]), default=None,
              help="concise: one line a finding [default]; full: with the explanation, the fix and the source; "
                   "json; github: Actions annotations; sarif: SARIF 2.1.0 for code scanning; junit: JUnit XML.")
@click.option("--fix", is_flag=True, help="Apply the safe fixes to the files, then report what is left.")
@click.option("--unsafe-fixes", is_flag=True, help="Also offer and apply the fixes that may change behaviour.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff instead of writing them (exit 1 if any).")
@click.option("--show-fixes", is_flag=True, help="With --fix: list what was fixed.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings are reported (2 still means an error).")
@click.option("--add-noqa", is_flag=True, help="Write a `# noqa: CODE` comment on every line that has a finding.")
@click.option("--stdin-filename", metavar="PATH",
              help="The name of the file read from stdin (`-`): config, per-file-ignores and excludes apply to it.")
@click.option("--show-settings", is_flag=True, help="Print the resolved settings and exit.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache.")
@click.option("--cache-dir", metavar="PATH", help="Result cache folder. [default: .ddpcheck_cache in the project root]")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"], case_sensitive=False), default=None,
              help="Lowest severity that makes the exit code 1. [default: warning, or fail-on from config]")
@click.option("--statistics", is_flag=True, help="Print a count per rule instead of each finding.")
@click.option("-q", "--quiet", is_flag=True, help="Print only findings and errors: no summary, no warnings.")
@click.option("--no-color", is_flag=True, help="No colors (also off when NO_COLOR is set or output is not a terminal).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="pyproject.toml to read [tool.ddpcheck] from (default: the nearest one).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker processes. [default: number of CPUs]")
def lint(paths, select, extend_select, ignore, extend_ignore, output_format, fix, unsafe_fixes, diff, show_fixes,
         exit_zero, add_noqa, stdin_filename, show_settings, no_cache, cache_dir, fail_on, statistics, quiet,
         no_color, config_path, jobs) -> None:
    """Check training scripts for DDP pitfalls (PATHS: files or folders, default `.`; `-` reads stdin)."""
    from ddpcheck.lint.command import LintOptions, run_lint

    output_format = FORMAT_ALIASES.get(output_format, output_format) or "concise"
    if statistics and output_format not in ("concise", "full", "json"):
        raise click.UsageError("--statistics works with --output-format concise, full or json")
    if add_noqa and (fix or diff):
        raise click.UsageError("--add-noqa cannot be combined with --fix or --diff")
    if stdin_filename and paths and tuple(paths) != ("-",):
        raise click.UsageError("--stdin-filename names the source read from stdin: pass `-` (or no path)")
    if add_noqa and tuple(paths) == ("-",):
        raise click.UsageError("--add-noqa writes files: it cannot read stdin")
    paths = tuple(paths) or (("-",) if stdin_filename else (".",))
    options = LintOptions(
        paths=paths,
        select=select,
        ignore=ignore,
        extend_select=extend_select,
        extend_ignore=extend_ignore,
        output_format=output_format,
        fail_on=Severity.parse(fail_on) if fail_on else None,
        statistics=statistics,
        quiet=quiet,
        color=_use_color(no_color, output_format),
        config_path=config_path,
        jobs=jobs,
        exit_zero=exit_zero,
        fix=fix,
        unsafe_fixes=unsafe_fixes,
        diff=diff,
        show_fixes=show_fixes,
        add_noqa=add_noqa,
        stdin_filename=stdin_filename,
        show_settings=show_settings,
        no_cache=no_cache,
        cache_dir=cache_dir,
    )
    try:
        code = run_lint(options)
    except KeyboardInterrupt:
        click.echo("ddpcheck: interrupted", err=True)
        code = 130
    sys.exit(code)


# --- rules / rule ----------------------------------------------------------------

@main.command("rules", short_help="List every rule: code, name, severity, fix, summary.")
def rules_command() -> None:
    """List every rule: code, name, severity, fixable, summary."""
    from tabulate import tabulate

    rows = [(code, rule.name, str(rule.severity), "yes" if getattr(rule, "fixable", False) else "",
             getattr(rule, "short", "") or rule.message)
            for code, rule in sorted(registry().items())]
    if not rows:
        click.echo("No rules registered.")
        return
    click.echo(tabulate(rows, headers=["code", "name", "severity", "fix", "summary"]))
    click.echo("\nMore on one rule: ddpcheck rule CODE (or its name)")


def lookup_rule(text: str) -> str | None:
    """A rule's code from its code or its name (`missing-set-epoch`)."""
    rules = registry()
    wanted = text.strip()
    if wanted.upper() in rules:
        return wanted.upper()
    by_name = {rule.name: code for code, rule in rules.items()}
    return by_name.get(wanted.lower().replace("_", "-"))


@main.command("rule", short_help="Show one rule's reference page, by code or by name.")
@click.argument("code")
def rule_command(code: str) -> None:
    """Show a rule's reference page (CODE: its code, DDP101, or name, missing-set-epoch)."""
    from ddpcheck.pages import PageNotFound, load_page

    rules = registry()
    found = lookup_rule(code)
    if found is None:
        fail(f"unknown rule {code.strip()!r} (known: {', '.join(sorted(rules)) or 'none registered'}; "
             "or a rule name from `ddpcheck rules`)")
    try:
        page = load_page(found)
    except PageNotFound:
        fail(f"{found}: no reference page shipped for this rule; see `ddpcheck rules`")
    click.echo(page.rstrip("\n"))


# --- preflight -------------------------------------------------------------------

# Defined by ddpcheck.preflight; importing it does not import torch (the
# command imports torch only when it runs), so `ddpcheck lint` stays light.
from ddpcheck.preflight.command import preflight  # noqa: E402

main.add_command(preflight)
