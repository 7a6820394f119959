"""analyze(): parse once, build the ScriptModel, run the enabled rules, turn
hits into findings with positions. `rule_hits` is the same run kept as hits
(with their autofix edits) for `ddpcheck lint --fix`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpcheck.model.builder import build_model
from ddpcheck.model.project import ProjectIndex
from ddpcheck.findings import Applicability, Finding, PartialAnalysis
from ddpcheck.parse.syntax import parse


@dataclass(frozen=True)
class LocatedHit:
    """A rule's hit with the finding it is reported as."""

    finding: Finding
    hit: object   # rules.base.Hit (its `edit` refers to nodes of `RuleRun.module`)


@dataclass(frozen=True)
class RuleRun:
    module: cst.Module
    located: tuple[LocatedHit, ...]
    crashed: tuple[str, ...]   # "DDP101 (KeyError: ...)" for each rule that raised


def rule_hits(text: str, path: str, settings) -> RuleRun:
    from ddpcheck.rules import REGISTRY  # imports every rule module

    module = parse(text)
    model = build_model(path, module, settings)
    model.project = ProjectIndex(settings)
    hits = []
    crashed = []
    for code in sorted(settings.enabled):
        rule_cls = REGISTRY.get(code)
        if rule_cls is None:
            continue
        rule = rule_cls()
        try:
            hits.extend((rule, hit) for hit in rule.check(model))
        except RecursionError:
            crashed.append(f"{code} (too deeply nested)")
        except Exception as exc:  # a bug in one rule must not hide the others' findings
            crashed.append(f"{code} ({type(exc).__name__}: {exc})")
    located = _locate(module, path, hits) if hits else []
    return RuleRun(module=module, located=tuple(located), crashed=tuple(crashed))


def analyze(text: str, path: str, settings) -> list[Finding]:
    run = rule_hits(text, path, settings)
    findings = sorted({(x.finding.line, x.finding.code, x.finding.message): x.finding
                       for x in run.located}.values())
    if run.crashed:
        raise PartialAnalysis(findings, f"internal error in {', '.join(run.crashed)}; please report this")
    return findings


def _locate(module: cst.Module, path: str, hits: list) -> list[LocatedHit]:
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    located = []
    for rule, hit in hits:
        pos = positions.get(hit.node)
        line, col = (pos.start.line, pos.start.column + 1) if pos else (1, 1)
        edit = getattr(hit, "edit", None)
        applicability = None if edit is None else (Applicability.SAFE if edit.safe else Applicability.UNSAFE)
        f = Finding(
            path=path, line=line, col=col, code=rule.code, name=rule.name,
            severity=rule.severity, message=hit.message or rule.message, fix=hit.fix or rule.fix,
            short=getattr(rule, "short", ""), applicability=applicability,
        )
        located.append(LocatedHit(f, hit))
    return located
