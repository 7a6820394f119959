"""Lint one file: read it, pre-filter cheaply, parse once, build the ScriptModel,
run the enabled rules over it, drop `# noqa` lines.

This module never imports torch: the lint path stays light enough for a
pre-commit hook."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from ddpcheck.findings import ErrorKind, FileError, FileResult, Finding, SourceError
from ddpcheck.lint.pathmatch import matches_any, relative_posix
from ddpcheck.model.scan import scan_text   # a text scan: no libcst
from ddpcheck.parse.source import read_source
from ddpcheck.parse.syntax import check_syntax
from ddpcheck.settings import LintSettings
from ddpcheck.triggers import USES_DISTRIBUTED, Prefilter, declared

if TYPE_CHECKING:  # pragma: no cover
    from ddpcheck.model.project import Project


# A file can only contain a DDP pitfall if it holds the words one of the
# rules declares it needs (ddpcheck/triggers.py): plain word scans,
# confirmed by a regular expression, so the large majority of a big repo,
# which never touches distributed training, costs almost nothing.
@functools.lru_cache(maxsize=8)
def prefilter_for(codes: frozenset[str]) -> Prefilter:
    """The prefilter of a run that enables `codes` (built once per set)."""
    return Prefilter(declared(), codes)


def might_have_findings(text: str, codes=None) -> bool:
    """`text` contains what some rule of `codes` (all rules when None) needs to fire."""
    return prefilter_for(frozenset(declared() if codes is None else codes))(text)


def worth_analysing(text: str, enabled: frozenset[str]) -> bool:
    """Whether a lint run that enables `enabled` must parse and model `text`:
    one of them analyses the model (all but the `# noqa` check) and the
    trigger of some rule, enabled or not, matches the text. Not the enabled
    rules' triggers alone: a rule can fire in a file that holds none of its
    own words (a save on every rank in a script whose process group is
    started by a helper module, the script itself naming only `get_rank()`
    and `barrier()`), and a rule's findings must not depend on which other
    rules were selected with it."""
    known = declared()
    if not any(known.get(code, (USES_DISTRIBUTED,)) for code in enabled):
        return False
    return might_have_findings(text, frozenset(known) | enabled)


# A script's entry point: `if __name__ == "__main__":` at the top level.
_MAIN_GUARD = re.compile(r"""^if\s+(__name__\s*==\s*(['"])__main__\2|(['"])__main__\3\s*==\s*__name__)\s*:""",
                         re.MULTILINE)


def is_entry_script(text: str, path: str, settings: LintSettings) -> bool:
    """The file is run as a program: a top-level `if __name__ == "__main__":`,
    or config's `script-files` names it."""
    if "__main__" in text and _MAIN_GUARD.search(text):
        return True
    if settings.script_files:
        return matches_any(relative_posix(path, settings.root), settings.script_files)
    return False


class Projects:
    """The projects (model/project.py) of one process's share of a lint run:
    one per group of settings that changes what the engine knows (the root,
    the main-process guards), made when a file first needs analysing and kept
    for every file that process lints, so a helper module is parsed once per
    worker, not once per file."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, "Project"] = {}

    def for_settings(self, settings: LintSettings) -> "Project":
        from ddpcheck.lint.analyze import project_for   # libcst: only once a file needs analysing

        key = (settings.root, settings.main_process_guards)
        project = self._by_key.get(key)
        if project is None:
            project = self._by_key[key] = project_for(settings)
        return project

    def imports_worth_analysing(self, text: str, path: str, settings: LintSettings) -> tuple[bool, tuple[str, ...]]:
        """For a script that fails the prefilter: whether a local module it
        imports (however deep) passes it, and the modules looked at (the
        script's result depends on them). Each module's verdict is kept by
        the project with its other per-file caches (Project.text_verdict)."""
        project = self.for_settings(settings)
        modules = project.imported_modules(path, scan_text(text))
        enabled = settings.enabled
        question = ("passes the prefilter", enabled)
        return any(project.text_verdict(module, question, lambda t: worth_analysing(t, enabled))
                   for module in modules), modules


def lint_path(path: str, settings: LintSettings, named: bool = False, projects: Projects | None = None) -> FileResult:
    """Lint one file; never raises for problems with the input.

    `named`: the file was named on the command line (pre-commit passes
    files by name), so a syntax error in it is reported even when the
    prefilter would skip it. `projects`: the projects of the lint run the
    file is part of (the runner keeps them per worker); a run of its own when
    not given."""
    try:
        text = read_source(path)
    except SourceError as exc:
        return FileResult(path=path, error=exc.error)
    return lint_text(text, path, settings, named, projects)


def lint_text(text: str, path: str, settings: LintSettings, named: bool = False,
              projects: Projects | None = None) -> FileResult:
    """All findings for one source text (a file, or stdin under
    --stdin-filename), sorted, `# noqa` applied; the problem with the text,
    if any, as a typed error."""
    wanted = worth_analysing(text, settings.enabled)
    imported: tuple[str, ...] = ()
    if not wanted and is_entry_script(text, path, settings):
        # A script whose distributed run lives in the project's modules
        # (`Learner(conf).train()`): the rules that report a helper's chain at
        # the call need the script analysed. When skipped, its result still
        # depends on those modules (the result cache keys on them).
        wanted, imported = (projects if projects is not None else Projects()).imports_worth_analysing(
            text, path, settings)
    if not wanted and not named:
        return _noqa_only(text, path, settings, imported)
    try:
        check_syntax(text, path)   # Python's verdict first: exact positions, and no libcst crash on what it refuses
        if not wanted:
            return _noqa_only(text, path, settings, imported)
        from ddpcheck.lint.analyze import analyze  # libcst import deferred: pre-filtered files never pay it

        project = projects.for_settings(settings) if projects is not None else None
        analysis = analyze(text, path, settings, project)
    except SourceError as exc:
        return FileResult(path=path, error=exc.error)
    from ddpcheck.lint.noqa import apply_noqa

    findings = tuple(apply_noqa(list(analysis.findings), text, settings.enabled, path))
    error = None
    if analysis.crashed:
        crashed = ", ".join(str(c) for c in analysis.crashed)
        error = FileError(ErrorKind.INTERNAL, f"internal error in {crashed}; please report this")
    return FileResult(path=path, findings=findings, error=error, helpers=analysis.helpers)


def _noqa_only(text: str, path: str, settings: LintSettings, helpers: tuple[str, ...] = ()) -> FileResult:
    """A file no rule needs to parse: only its `# noqa` comments can be wrong
    (DDP001: every `# noqa: DDPnnn` there suppresses nothing). `helpers`: the
    modules whose text made that decision."""
    if not settings.enabled or "noqa" not in text.lower():
        return FileResult(path=path, helpers=helpers)
    from ddpcheck.lint.noqa import apply_noqa

    return FileResult(path=path, findings=tuple(apply_noqa([], text, settings.enabled, path)), helpers=helpers)


def lint_source(text: str, path: str, settings: LintSettings) -> list[Finding]:
    """All findings for one source text, sorted, `# noqa` applied (tests,
    rule pages). Raises SourceError for text that is not valid Python and
    when a rule crashed."""
    result = lint_text(text, path, settings)
    if result.error is not None:
        raise SourceError.of(result.error)
    return list(result.findings)
