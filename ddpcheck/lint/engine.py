"""Lint one file: read it, pre-filter cheaply, parse once, build the ScriptModel,
run the enabled rules over it, drop `# noqa` lines.

This module never imports torch: the lint path stays light enough for a
pre-commit hook."""

from __future__ import annotations

import re

from ddpcheck.findings import FileResult, Finding, PartialAnalysis, SourceError
from ddpcheck.parse.source import read_source
from ddpcheck.settings import LintSettings


# A file can only contain a DDP pitfall if it touches distributed training. The
# checks are plain regex scans (well under a millisecond per file), so the large
# majority of a big repo, which never does, costs almost nothing. Two ways in:
# it names an API or idiom that only multi-GPU code uses ...
DDP_SIGNALS = re.compile(
    r"DistributedSampler|DataParallel\s*\(|DataParallel as|init_process_group|SyncBatchNorm|local_rank"
    r"|LOCAL_RANK|CUDA_VISIBLE_DEVICES|set_epoch|init_distributed|setup_distributed|ddp_setup|setup_ddp"
    r"|save_on_master|torchrun|is_main_process|rank_zero_only"
)
# ... or it runs a collective under what looks like a rank test (DDP401's
# hang). Generic names (`reduce`, `gather`, `scatter`) only count behind a
# `dist.`-like prefix: functools.reduce and Tensor.scatter are everywhere.
COLLECTIVE = re.compile(
    r"\b(barrier|all_reduce|all_gather|broadcast|reduce_scatter|all_to_all|all_gather_object"
    r"|broadcast_object_list|gather_object|scatter_object_list|monitored_barrier)\s*\("
    r"|\b(dist|distributed|c10d|comm)\.(reduce|gather|scatter)\s*\("
)
RANK_TEST = re.compile(
    r"\brank\s*(==|!=|<|>|%|in\b|not in)|_rank\s*(==|!=|in\b|not in)|get_rank\(\)"
    r"|is_main|is_master|master_process|rank_zero|is_global_zero"
)


def might_have_findings(text: str) -> bool:
    if DDP_SIGNALS.search(text) is not None:
        return True
    return COLLECTIVE.search(text) is not None and RANK_TEST.search(text) is not None


def lint_path(path: str, settings: LintSettings) -> FileResult:
    """Lint one file; never raises for problems with the input."""
    try:
        text = read_source(path)
    except SourceError as exc:
        return FileResult(path=path, error=str(exc))
    return lint_text(text, path, settings)


def lint_text(text: str, path: str, settings: LintSettings) -> FileResult:
    """Lint source text already read (a file, or stdin under --stdin-filename)."""
    try:
        findings = lint_source(text, path, settings)
    except SourceError as exc:
        return FileResult(path=path, error=str(exc))
    except PartialAnalysis as exc:
        from ddpcheck.lint.noqa import apply_noqa

        return FileResult(path=path, findings=tuple(apply_noqa(exc.findings, text, settings.enabled, path)),
                          error=str(exc), helpers=_helpers_read(path))
    return FileResult(path=path, findings=tuple(findings), helpers=_helpers_read(path))


def _helpers_read(path: str) -> tuple[str, ...]:
    import sys

    if "ddpcheck.model.project" not in sys.modules:
        return ()   # nothing was analysed in this process: no helper was read
    from ddpcheck.model.project import ProjectIndex

    return ProjectIndex.helpers_read(path)


def lint_source(text: str, path: str, settings: LintSettings) -> list[Finding]:
    """All findings for one source text, sorted, `# noqa` applied.

    Raises SourceError for text that is not valid Python."""
    if not settings.enabled:
        return []
    findings: list[Finding] = []
    if might_have_findings(text):
        from ddpcheck.lint import analyze as analysis  # libcst import deferred: pre-filtered files never pay it

        findings = analysis.analyze(text, path, settings)
    if "noqa" not in text.lower():
        return findings
    from ddpcheck.lint.noqa import apply_noqa

    return apply_noqa(findings, text, settings.enabled, path)
