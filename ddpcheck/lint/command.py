"""What `ddpcheck lint` does, apart from parsing its options: resolve config
and flags into per-file settings, discover files (or read stdin), lint them
(through the result cache), fix them when asked, print, and pick the exit
code. Kept apart from click so tests can drive it directly."""

from __future__ import annotations

import codecs
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ddpcheck.errors import error_line
from ddpcheck.lint import report
from ddpcheck.lint.config import (Config, ConfigError, check_selectors, ignored_for, known_codes, load_config,
                                  parse_code_list, resolve_enabled, selector_matches)
from ddpcheck.lint.discovery import discover
from ddpcheck.lint.pathmatch import matches_any, relative_posix
from ddpcheck.settings import LintSettings
from ddpcheck.findings import ErrorKind, FileError, FileResult, Finding, Severity
from ddpcheck.lint.runner import LintTask, default_jobs, lint_files

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
# Info findings are advice: shown, but they do not fail a CI job unless asked.
DEFAULT_FAIL_ON = Severity.WARNING
OUTPUT_FORMATS = ("concise", "full", "json", "github", "sarif", "junit")
STDIN = "-"
CACHE_DIR_ENV = "DDPCHECK_CACHE_DIR"


@dataclass(frozen=True)
class LintOptions:
    paths: tuple[str, ...] = (".",)
    select: str | None = None   # raw --select text; None: from config
    ignore: str | None = None
    extend_select: str | None = None
    extend_ignore: str | None = None
    output_format: str = "concise"
    fail_on: Severity | None = None
    statistics: bool = False
    quiet: bool = False
    color: bool = False
    config_path: str | None = None
    jobs: int | None = None
    exit_zero: bool = False
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    show_fixes: bool = False
    add_noqa: bool = False
    stdin_filename: str | None = None
    show_settings: bool = False
    no_cache: bool = False
    cache_dir: str | None = None


@dataclass(frozen=True)
class Plan:
    config: Config
    enabled: frozenset[str]
    fail_on: Severity
    cache_dir: Path | None = None   # None: --no-cache


def _flag_codes(text: str | None, flag: str, codes: list[str]) -> tuple[str, ...] | None:
    if text is None:
        return None
    selectors = parse_code_list(text)
    check_selectors(selectors, flag, codes)
    return selectors


def plan(options: LintOptions) -> Plan:
    """Config + flags -> what to run. Raises ConfigError (one line) on mistakes.
    `--select` / `--ignore` replace the config's lists; `--extend-select` /
    `--extend-ignore` (and the config keys of the same names) add to them."""
    start = options.stdin_filename if options.paths == (STDIN,) and options.stdin_filename else options.paths[0]
    if start == STDIN:
        start = "."
    config = load_config(options.config_path, Path(start))
    codes = known_codes()
    select = _flag_codes(options.select, "--select", codes)
    if select is not None and not select:  # `--select=` from an unset CI variable: never a silent pass
        raise ConfigError("--select is empty: name rule codes or prefixes (--select DDP1,DDP301), "
                          "or leave it out to run every rule")
    ignore = _flag_codes(options.ignore, "--ignore", codes)
    extend_select = _flag_codes(options.extend_select, "--extend-select", codes) or ()
    extend_ignore = _flag_codes(options.extend_ignore, "--extend-ignore", codes) or ()
    select = config.select if select is None else select
    if select is not None:
        select = select + config.extend_select + extend_select
    ignore = (config.ignore if ignore is None else ignore) + config.extend_ignore + extend_ignore
    fail_on = options.fail_on or config.fail_on or DEFAULT_FAIL_ON
    enabled = resolve_enabled(select, ignore, codes)
    if not enabled:
        raise ConfigError(f"no rule left to run: ignore ({', '.join(ignore)}) removes every selected rule")
    return Plan(config=config, enabled=enabled, fail_on=fail_on,
                cache_dir=None if options.no_cache else cache_folder(options, config))


def cache_folder(options: LintOptions, config: Config) -> Path:
    """--cache-dir, else $DDPCHECK_CACHE_DIR, else the config's cache-dir (relative to its folder), else
    `.ddpcheck_cache` in the project root (the pyproject's folder, or the cwd)."""
    from ddpcheck.lint.cache import DEFAULT_DIR

    if options.cache_dir:
        return Path(options.cache_dir)
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = Path(config.root) if config.root else Path.cwd()
    return base / (config.cache_dir or DEFAULT_DIR)


def file_settings(files: list[str], the_plan: Plan, named: frozenset[str] = frozenset()) -> list[LintTask]:
    """Each file with its settings (the enabled rules minus its
    per-file-ignores) and whether it was named on the command line."""
    config = the_plan.config
    cache: dict[frozenset[str], LintSettings] = {}
    tasks = []
    for path in files:
        off = ignored_for(path, config)
        enabled = frozenset(c for c in the_plan.enabled if not any(selector_matches(c, s) for s in off))
        if enabled not in cache:
            cache[enabled] = LintSettings(enabled=enabled, main_process_guards=config.main_process_guards,
                                          root=config.root, test_files=config.test_files,
                                          script_files=config.script_files, invoked_from=str(Path.cwd()))
        tasks.append(LintTask(path, cache[enabled], path in named))
    return tasks


def exit_code(results: list[FileResult], had_input_error: bool, fail_on: Severity, exit_zero: bool = False) -> int:
    if had_input_error or report.unreadable(results):
        return EXIT_ERROR
    if not exit_zero and any(f.severity >= fail_on for r in results for f in r.findings):
        return EXIT_FINDINGS
    return EXIT_OK


def _error(message: str) -> int:
    click.echo(error_line(message), err=True)
    return EXIT_ERROR


def run_lint(options: LintOptions) -> int:
    try:
        the_plan = plan(options)
    except ConfigError as exc:
        return _error(str(exc))
    if options.show_settings:
        click.echo(settings_text(options, the_plan))
        return EXIT_OK
    if STDIN in options.paths:
        if options.paths != (STDIN,):
            return _error("`-` (stdin) cannot be combined with other paths")
        return run_stdin(options, the_plan)

    found = discover(options.paths, exclude=the_plan.config.exclude, root=the_plan.config.root)
    input_errors = [(p.path, FileError(ErrorKind.UNREADABLE, p.message)) for p in found.problems if p.fatal]
    for problem in found.problems:
        if problem.fatal or not options.quiet:
            kind = "error" if problem.fatal else "warning"
            click.echo(f"ddpcheck: {kind}: {problem.path}: {problem.message}", err=True)

    tasks = file_settings(found.files, the_plan, found.named)
    results = lint_cached(tasks, options.jobs or default_jobs(), the_plan.cache_dir)
    for bad in report.unreadable(results):
        click.echo(report.input_error_line(bad.path, bad.error), err=True)

    if options.add_noqa:
        return run_add_noqa(results, bool(input_errors))
    if options.fix or options.diff:
        return run_fix(options, the_plan, tasks, results, input_errors, len(found.files))

    print_results(options, results, input_errors, len(found.files))
    return exit_code(results, bool(input_errors), the_plan.fail_on, options.exit_zero)


def lint_cached(tasks: list[LintTask], jobs: int, cache_dir: Path | None) -> list[FileResult]:
    """lint_files, reading unchanged files' results from the cache."""
    if cache_dir is None:
        return lint_files(tasks, jobs)
    from ddpcheck.lint.cache import ResultCache, cacheable

    cache = ResultCache(cache_dir)
    hits: list[FileResult] = []
    misses = []
    for task in tasks:
        cached = cache.lookup(task.path, task.settings, task.named)
        if cached is None:
            misses.append(task)
        else:
            hits.append(cached)
    fresh = lint_files(misses, jobs) if misses else []
    task_of = {t.path: t for t in misses}
    for result in fresh:
        task = task_of[result.path]
        cache.store(result, task.settings, cacheable(result), task.named)
    return sorted(hits + fresh, key=lambda r: r.path)


# --- stdin -------------------------------------------------------------------------

def run_stdin(options: LintOptions, the_plan: Plan) -> int:
    """Lint (or fix) the source on stdin as if it were `--stdin-filename`:
    per-file-ignores and excludes apply to that name. With --fix the fixed
    source goes to stdout and the findings to stderr (editors replace the
    buffer with stdout)."""
    from ddpcheck.lint.engine import lint_text

    name = options.stdin_filename or STDIN
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        click.echo(report.input_error_line(name, FileError(ErrorKind.ENCODING, f"not valid UTF-8 (byte {exc.start})")),
                   err=True)
        if options.fix:
            click.echo(raw.decode("utf-8", errors="surrogateescape"), nl=False)
        return EXIT_ERROR
    config = the_plan.config
    excluded = (options.stdin_filename is not None and bool(config.exclude)
                and matches_any(relative_posix(name, config.root), config.exclude))
    if excluded:
        if options.fix:
            click.echo(text, nl=False)
        return EXIT_OK
    (task,) = file_settings([name], the_plan, frozenset([name]))
    settings = task.settings
    if options.fix or options.diff:
        from ddpcheck.lint.fixes import fix_text, unified_diff

        outcome = fix_text(text, name, settings, options.unsafe_fixes)
        if options.diff:
            diff = unified_diff(outcome, "utf-8-sig" if raw.startswith(codecs.BOM_UTF8) else "utf-8")
            click.echo(diff, nl=False)
            if not options.quiet:
                click.echo(f"Would fix {report.plural(len(outcome.applied), 'finding')}.", err=True)
            return EXIT_FINDINGS if diff else EXIT_OK
        click.echo(outcome.fixed, nl=False)
        result = outcome.result
        with _to_stderr():
            print_results(options, [result], [], 1, sources={name: outcome.fixed})
        return exit_code([result], False, the_plan.fail_on, options.exit_zero)
    result = lint_text(text, name, settings)
    if result.error is not None:
        click.echo(report.input_error_line(name, result.error), err=True)
    print_results(options, [result], [], 1, sources={name: text})
    return exit_code([result], False, the_plan.fail_on, options.exit_zero)


class _to_stderr:
    """Route click.echo's stdout to stderr for a block (stdin --fix)."""

    def __enter__(self):
        self.saved = sys.stdout
        sys.stdout = sys.stderr

    def __exit__(self, *exc):
        sys.stdout = self.saved


# --- --fix / --diff ----------------------------------------------------------------------

def run_fix(options: LintOptions, the_plan: Plan, tasks, results: list[FileResult],
            input_errors: list[tuple[str, str]], files_checked: int) -> int:
    """Fix the files whose findings carry an applicable fix: write them (--fix)
    or print the unified diff (--diff, nothing written)."""
    from ddpcheck.lint.fixes import fix_text, unified_diff
    from ddpcheck.parse.source import read_source_encoded
    from ddpcheck.findings import SourceError

    task_of = {t.path: t for t in tasks}
    by_path = {r.path: r for r in results}
    applied: dict[str, tuple[Finding, ...]] = {}
    diffs: list[str] = []
    write_errors: list[tuple[str, FileError]] = []
    for r in results:
        if r.error is not None or not any(report.fixable(f, options.unsafe_fixes) for f in r.findings):
            continue
        try:
            text, encoding = read_source_encoded(r.path)
        except SourceError:
            continue
        outcome = fix_text(text, r.path, task_of[r.path].settings, options.unsafe_fixes)
        if not outcome.changed:
            continue
        applied[r.path] = outcome.applied
        if options.diff:
            diffs.append(unified_diff(outcome, encoding))
            continue
        try:
            _write_source(r.path, outcome.fixed, encoding)
        except OSError as exc:
            write_errors.append((r.path, FileError(ErrorKind.UNREADABLE,
                                                   f"cannot write the fixed file: {exc.strerror or exc}")))
            continue
        by_path[r.path] = outcome.result
    fixed_count = sum(len(v) for v in applied.values())
    if options.diff:
        for diff in diffs:
            click.echo(diff, nl=False)
        if not options.quiet:
            click.echo(f"Would fix {report.plural(fixed_count, 'finding')}"
                       f" in {report.plural(len(applied), 'file')}." if fixed_count else "No fixes available.",
                       err=True)
        if input_errors or report.unreadable(results):
            return EXIT_ERROR
        return EXIT_FINDINGS if diffs else EXIT_OK
    for path, message in write_errors:
        click.echo(report.input_error_line(path, message), err=True)
    final = sorted(by_path.values(), key=lambda r: r.path)
    if the_plan.cache_dir is not None and applied:
        from ddpcheck.lint.cache import ResultCache, cacheable

        cache = ResultCache(the_plan.cache_dir)
        for path in applied:
            cache.store(by_path[path], task_of[path].settings, cacheable(by_path[path]), task_of[path].named)
    print_results(options, final, input_errors + write_errors, files_checked, fixed=applied)
    return exit_code(final, bool(input_errors or write_errors), the_plan.fail_on, options.exit_zero)


def _write_source(path: str, text: str, encoding: str) -> None:
    """Write a fixed file back in the encoding it was read in (`utf-8-sig` puts
    the BOM back, a PEP 263 cookie's encoding stays); libcst kept its line endings."""
    data = text.encode(encoding)
    tmp = f"{path}.ddpcheck-fix.tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    try:
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
    except OSError:
        pass
    os.replace(tmp, path)


# --- --add-noqa -------------------------------------------------------------------------

def run_add_noqa(results: list[FileResult], had_input_error: bool) -> int:
    """Write a `# noqa: CODE` on every reported line (adopting ddpcheck on a
    big repo: today's findings are accepted, new ones fail)."""
    from ddpcheck.lint.noqa import add_noqa
    from ddpcheck.parse.source import read_source_encoded
    from ddpcheck.findings import SourceError

    added = 0
    for r in results:
        findings = [f for f in r.findings if f.code != "DDP001"]
        if r.error is not None or not findings:
            continue
        try:
            text, encoding = read_source_encoded(r.path)
        except SourceError:
            continue
        new_text, changed = add_noqa(text, findings)
        if changed:
            _write_source(r.path, new_text, encoding)
            added += changed
    click.echo(f"Added {report.plural(added, 'noqa directive')}.", err=True)
    return EXIT_ERROR if had_input_error or report.unreadable(results) else EXIT_OK


# --- printing ---------------------------------------------------------------------------

def print_results(options: LintOptions, results: list[FileResult], input_errors: list[tuple[str, FileError]],
                  files_checked: int, sources: dict[str, str] | None = None,
                  fixed: dict[str, tuple[Finding, ...]] | None = None) -> None:
    findings = report.all_findings(results)
    fmt = options.output_format
    if fmt == "json":
        click.echo(report.json_document(results, input_errors, files_checked, options.statistics))
        return
    if fmt == "sarif":
        from ddpcheck.rules import REGISTRY  # importing the package registers every rule

        click.echo(report.sarif_document(results, input_errors, REGISTRY))
        return
    if fmt == "junit":
        click.echo(report.junit_document(results, input_errors))
        return
    if fmt == "github":
        for path, error in input_errors + [(r.path, r.error) for r in report.unreadable(results)]:
            click.echo(report.github_input_error(path, error))
        for finding in findings:
            click.echo(report.github_finding(finding))
    elif options.statistics:
        if findings:
            click.echo(report.statistics_table(findings))
    elif fmt == "full":
        texts = dict(sources or {})
        for finding in findings:
            if finding.path not in texts:
                texts[finding.path] = _read_or_none(finding.path)
            click.echo(report.full_finding(finding, options.color, texts[finding.path], options.unsafe_fixes) + "\n",
                       color=options.color)
    else:
        for finding in findings:
            click.echo(report.concise_finding(finding, options.color, options.unsafe_fixes), color=options.color)
    if fixed and options.show_fixes and fmt in ("concise", "full"):
        click.echo(report.fixes_applied(fixed))
    if not options.quiet:
        unreadable_count = len(input_errors) + len(report.unreadable(results))
        if findings and fmt == "concise":
            click.echo()
        fixed_count = sum(len(v) for v in (fixed or {}).values())
        click.echo(report.summary(findings, files_checked, unreadable_count, fixed_count))
        hint = report.fix_hint(findings, options.unsafe_fixes)
        if hint and fmt in ("concise", "full"):
            click.echo(hint)


def _read_or_none(path: str) -> str | None:
    from ddpcheck.parse.source import read_source
    from ddpcheck.findings import SourceError

    try:
        return read_source(path)
    except SourceError:
        return None


def settings_text(options: LintOptions, the_plan: Plan) -> str:
    """--show-settings: the resolved configuration, one `key = value` a line."""
    config = the_plan.config
    rows = [
        ("config file", str(config.path) if config.path else "(none: defaults)"),
        ("project root", config.root or str(Path.cwd())),
        ("enabled rules", ", ".join(sorted(the_plan.enabled)) or "(none)"),
        ("select", ", ".join(config.select) if config.select is not None else "ALL"),
        ("extend-select", ", ".join(config.extend_select) or "-"),
        ("ignore", ", ".join(config.ignore) or "-"),
        ("extend-ignore", ", ".join(config.extend_ignore) or "-"),
        ("per-file-ignores", "; ".join(f"{p} = {', '.join(c)}" for p, c in config.per_file_ignores) or "-"),
        ("exclude", ", ".join(config.exclude) or "-"),
        ("main-process-guards", ", ".join(config.main_process_guards) or "-"),
        ("test-files", ", ".join(config.test_files) or "-"),
        ("script-files", ", ".join(config.script_files) or "-"),
        ("fail-on", str(the_plan.fail_on)),
        ("output-format", options.output_format),
        ("cache", str(the_plan.cache_dir) if the_plan.cache_dir is not None else "off (--no-cache)"),
        ("fix", "on" + (" (with unsafe fixes)" if options.unsafe_fixes else "") if options.fix else "off"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}} = {v}" for k, v in rows)
