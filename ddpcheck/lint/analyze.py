"""analyze(): parse once, build the ScriptModel, run the enabled rules, turn
hits into findings with positions."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.builder import build_model
from ddpcheck.model.positions import positions_of
from ddpcheck.model.project import ProjectIndex
from ddpcheck.findings import Finding, PartialAnalysis
from ddpcheck.parse.syntax import parse
from ddpcheck.settings import LintSettings


def analyze(text: str, path: str, settings: LintSettings) -> list[Finding]:
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
    findings = _findings(module, path, hits) if hits else []
    if crashed:
        raise PartialAnalysis(findings, f"internal error in {', '.join(crashed)}; please report this")
    return findings


def _findings(module: cst.Module, path: str, hits: list) -> list[Finding]:
    positions = positions_of(module, (hit.node for _, hit in hits))   # only the reported nodes
    findings = {}
    for rule, hit in hits:
        pos = positions.get(id(hit.node))
        line, col = (pos[0], pos[1] + 1) if pos else (1, 1)
        f = Finding(
            path=path, line=line, col=col, code=rule.code, name=rule.name,
            severity=hit.severity or rule.severity, message=hit.message or rule.message, fix=hit.fix or rule.fix,
        )
        findings[(f.line, f.code, f.message)] = f
    return sorted(findings.values())
