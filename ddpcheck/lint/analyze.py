"""analyze(): parse once, build the ScriptModel, run the enabled rules, turn
hits into findings with positions. `rule_hits` is the same run kept as hits
(with their autofix edits) for `ddpcheck lint --fix`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.lint.pathmatch import matches_any, relative_posix
from ddpcheck.model.filekind import LIBRARY, SCRIPT, TEST, library_module, test_functions
from ddpcheck.model.memo import TooComplex
from ddpcheck.model.positions import positions_of
from ddpcheck.model.processes import one_process
from ddpcheck.model.project import Project
from ddpcheck.model.script import ScriptModel
from ddpcheck.findings import Applicability, Finding
from ddpcheck.parse.syntax import parse
from ddpcheck.settings import LintSettings


@dataclass(frozen=True)
class RuleCrash:
    """A rule raised on this file: a bug in ddpcheck, reported, not swallowed."""

    code: str
    reason: str   # "KeyError: 'x'", "too deeply nested"

    def __str__(self) -> str:
        return f"{self.code} ({self.reason})"


@dataclass(frozen=True)
class Analysis:
    """What the rules found; when some rules crashed, the others' findings
    are still good and are kept (a partial result is a value, not an
    exception)."""

    findings: tuple[Finding, ...] = ()
    crashed: tuple[RuleCrash, ...] = ()
    helpers: tuple[str, ...] = ()   # the local modules the analysis read (absolute paths)


@dataclass(frozen=True)
class LocatedHit:
    """A rule's hit with the finding it is reported as."""

    finding: Finding
    hit: object   # rules.base.Hit (its `edit` refers to nodes of `RuleRun.module`)


@dataclass(frozen=True)
class RuleRun:
    module: cst.Module
    located: tuple[LocatedHit, ...]
    crashed: tuple[RuleCrash, ...]
    helpers: tuple[str, ...] = ()


def project_for(settings: LintSettings) -> Project:
    """A project for one lint run with `settings` (which rules run does not
    change what the engine knows, so one project serves every file of a run)."""
    return Project(settings)


def rule_hits(text: str, path: str, settings: LintSettings, project: Project | None = None) -> RuleRun:
    """Run the enabled rules on `text`, keeping each hit beside its finding.
    `project`: the run's project (a fresh one when not given). Raises
    SourceError when libcst cannot read it."""
    from ddpcheck.rules import REGISTRY  # imports every rule module

    module = parse(text)
    if project is None:
        project = project_for(settings)
    model = project.build(path, module, text)
    hits = []
    crashed = []
    memo = project.memo
    try:
        memo.new_slice()   # each step below gets a slice of the file's budget (model/memo.py)
        kind = file_kind(model, settings)
    except TooComplex:
        # what the file is is unknown within the file's budget: no rule can judge it
        return RuleRun(module=module, located=(), crashed=(), helpers=project.helpers_read(path))
    single = None   # asked only when a rule needs two ranks or more
    for code in sorted(settings.enabled):
        rule_cls = REGISTRY.get(code)
        if rule_cls is None or kind not in rule_cls.kinds:
            continue
        if rule_cls.needs_ranks:
            if single is None:
                try:
                    memo.new_slice()
                    single = one_process(model) is not None
                except TooComplex:
                    single = True   # unknown whether it runs on several ranks: such rules say nothing
            if single:
                continue
        rule = rule_cls()
        memo.new_slice()
        try:
            hits.extend((rule, hit) for hit in rule.check(model))
        except TooComplex:
            # a question this rule asked is unknown (too much work for the engine's
            # budget): the rule reports nothing more here, and that is no error
            continue
        except RecursionError:
            crashed.append(RuleCrash(code, "too deeply nested"))
        except Exception as exc:  # a bug in one rule must not hide the others' findings
            crashed.append(RuleCrash(code, f"{type(exc).__name__}: {exc}"))
    if kind == LIBRARY and any(TEST not in rule.kinds for rule, _ in hits):
        hits = _outside_test_functions(model, hits)
    located = _locate(module, path, hits) if hits else []
    return RuleRun(module=module, located=tuple(located), crashed=tuple(crashed),
                   helpers=project.helpers_read(path))


def file_kind(model: ScriptModel, settings: LintSettings) -> str:
    """"script", "test" or "library" (model/filekind.py): config's
    `script-files`, then `test-files`, then what the module is."""
    rel = relative_posix(model.path, settings.root)
    if settings.script_files and matches_any(rel, settings.script_files):
        return SCRIPT
    if settings.test_files and matches_any(rel, settings.test_files):
        return TEST
    return LIBRARY if library_module(model) else SCRIPT


def _outside_test_functions(model: ScriptModel, hits: list) -> list:
    """Drop the hits of rules that do not look at tests when they sit in a
    library's test function (`def test_...`, `def ..._for_test`)."""
    tests = test_functions(model)
    if not tests:
        return hits
    starts = positions_of(model.module, [fn.node for fn in tests])
    spans = []
    for fn in tests:
        pos = starts.get(id(fn.node))
        if pos is not None:
            body = model.module.code_for_node(fn.node.with_changes(leading_lines=())).rstrip("\n")
            spans.append((pos[0], pos[0] + body.count("\n")))
    wanted = positions_of(model.module, (hit.node for _, hit in hits))
    kept = []
    for rule, hit in hits:
        pos = wanted.get(id(hit.node))
        inside = pos is not None and any(a <= pos[0] <= b for a, b in spans)
        if not inside or TEST in rule.kinds:
            kept.append((rule, hit))
    return kept


def analyze(text: str, path: str, settings: LintSettings, project: Project | None = None) -> Analysis:
    """Run the enabled rules on `text`, which Python's parser has accepted
    (the engine checks first). Raises SourceError when libcst cannot read it."""
    run = rule_hits(text, path, settings, project)
    findings = sorted({(x.finding.line, x.finding.code, x.finding.message): x.finding
                       for x in run.located}.values())
    return Analysis(tuple(findings), run.crashed, run.helpers)


def _locate(module: cst.Module, path: str, hits: list) -> list[LocatedHit]:
    positions = positions_of(module, (hit.node for _, hit in hits))   # only the reported nodes
    located = []
    for rule, hit in hits:
        pos = positions.get(id(hit.node))
        line, col = (pos[0], pos[1] + 1) if pos else (1, 1)
        edit = getattr(hit, "edit", None)
        applicability = None if edit is None else (Applicability.SAFE if edit.safe else Applicability.UNSAFE)
        f = Finding(
            path=path, line=line, col=col, code=rule.code, name=rule.name,
            severity=hit.severity or rule.severity, message=hit.message or rule.message, fix=hit.fix or rule.fix,
            short=getattr(rule, "short", ""), applicability=applicability,
        )
        located.append(LocatedHit(f, hit))
    return located
