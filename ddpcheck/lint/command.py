"""What `ddpcheck lint` does, apart from parsing its options: resolve config
and flags into per-file settings, discover files, lint them, print, and pick
the exit code. Kept apart from click so tests can drive it directly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from ddpcheck.errors import error_line

from ddpcheck.lint import report
from ddpcheck.lint.config import (Config, ConfigError, check_selectors, ignored_for, known_codes, load_config,
                             parse_code_list, resolve_enabled, selector_matches)
from ddpcheck.lint.discovery import discover
from ddpcheck.settings import LintSettings
from ddpcheck.findings import FileResult, Severity
from ddpcheck.lint.runner import default_jobs, lint_files

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
# Info findings are advice: shown, but they do not fail a CI job unless asked.
DEFAULT_FAIL_ON = Severity.WARNING


@dataclass(frozen=True)
class LintOptions:
    paths: tuple[str, ...] = (".",)
    select: str | None = None   # raw --select text; None: from config
    ignore: str | None = None
    output_format: str = "text"
    fail_on: Severity | None = None
    statistics: bool = False
    quiet: bool = False
    color: bool = False
    config_path: str | None = None
    jobs: int | None = None


@dataclass(frozen=True)
class Plan:
    config: Config
    enabled: frozenset[str]
    fail_on: Severity


def plan(options: LintOptions) -> Plan:
    """Config + flags -> what to run. Raises ConfigError (one line) on mistakes.
    A flag replaces the config value of the same name."""
    config = load_config(options.config_path, Path(options.paths[0]))
    codes = known_codes()
    select, ignore = config.select, config.ignore
    if options.select is not None:
        select = parse_code_list(options.select)
        check_selectors(select, "--select", codes)
    if options.ignore is not None:
        ignore = parse_code_list(options.ignore)
        check_selectors(ignore, "--ignore", codes)
    fail_on = options.fail_on or config.fail_on or DEFAULT_FAIL_ON
    return Plan(config=config, enabled=resolve_enabled(select, ignore, codes), fail_on=fail_on)


def file_settings(files: list[str], the_plan: Plan) -> list[tuple[str, LintSettings]]:
    """Each file with its settings: the enabled rules minus its per-file-ignores."""
    config = the_plan.config
    cache: dict[frozenset[str], LintSettings] = {}
    tasks = []
    for path in files:
        off = ignored_for(path, config)
        enabled = frozenset(c for c in the_plan.enabled if not any(selector_matches(c, s) for s in off))
        if enabled not in cache:
            cache[enabled] = LintSettings(enabled=enabled, main_process_guards=config.main_process_guards,
                                          root=config.root)
        tasks.append((path, cache[enabled]))
    return tasks


def exit_code(results: list[FileResult], had_input_error: bool, fail_on: Severity) -> int:
    if had_input_error or report.unreadable(results):
        return EXIT_ERROR
    if any(f.severity >= fail_on for r in results for f in r.findings):
        return EXIT_FINDINGS
    return EXIT_OK


def run_lint(options: LintOptions) -> int:
    try:
        the_plan = plan(options)
    except ConfigError as exc:
        click.echo(error_line(str(exc)), err=True)
        return EXIT_ERROR

    found = discover(options.paths, exclude=the_plan.config.exclude, root=the_plan.config.root)
    input_errors = [(p.path, p.message) for p in found.problems if p.fatal]
    for problem in found.problems:
        if problem.fatal or not options.quiet:
            kind = "error" if problem.fatal else "warning"
            click.echo(f"ddpcheck: {kind}: {problem.path}: {problem.message}", err=True)

    results = lint_files(file_settings(found.files, the_plan), options.jobs or default_jobs())
    for bad in report.unreadable(results):
        click.echo(report.input_error_line(bad.path, bad.error), err=True)

    print_results(options, results, input_errors, len(found.files))
    return exit_code(results, bool(input_errors), the_plan.fail_on)


def print_results(options: LintOptions, results: list[FileResult], input_errors: list[tuple[str, str]],
                  files_checked: int) -> None:
    findings = report.all_findings(results)
    if options.output_format == "json":
        click.echo(report.json_document(results, input_errors, files_checked, options.statistics))
        return
    if options.output_format == "github":
        for path, message in input_errors + [(r.path, r.error) for r in report.unreadable(results)]:
            click.echo(report.github_input_error(path, message))
        for finding in findings:
            click.echo(report.github_finding(finding))
    elif options.statistics:
        if findings:
            click.echo(report.statistics_table(findings))
    else:
        for finding in findings:
            click.echo(report.text_finding(finding, options.color), color=options.color)
    if not options.quiet:
        unreadable_count = len(input_errors) + len(report.unreadable(results))
        if findings and options.output_format == "text":
            click.echo()
        click.echo(report.summary(findings, files_checked, unreadable_count))
