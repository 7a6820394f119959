"""Lint one file: read it, pre-filter cheaply, parse once, build the ScriptModel,
run the enabled rules over it, drop `# noqa` lines.

This module never imports torch: the lint path stays light enough for a
pre-commit hook."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ddpcheck.findings import ErrorKind, FileError, FileResult, Finding, SourceError
from ddpcheck.parse.source import read_source
from ddpcheck.parse.syntax import check_syntax
from ddpcheck.settings import LintSettings

if TYPE_CHECKING:  # pragma: no cover
    from ddpcheck.model.project import Project


# A file can only contain a DDP pitfall if it touches distributed training. The
# checks are plain regex scans (well under a millisecond per file), so the large
# majority of a big repo, which never does, costs almost nothing. Two ways in:
# it names an API or idiom that only multi-GPU code uses ...
DDP_SIGNALS = re.compile(
    r"DistributedSampler|DataParallel\s*\(|DataParallel as|init_process_group|SyncBatchNorm|local_rank"
    r"|LOCAL_RANK|CUDA_VISIBLE_DEVICES|set_epoch|init_distributed|setup_distributed|ddp_setup|setup_ddp"
    r"|save_on_master|torchrun|is_main_process|rank_zero_only"
    r"|FullyShardedDataParallel|fully_shard\b|deepspeed\.initialize|torch\.distributed\.checkpoint"
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


# Every match of each pattern above contains one of these plain words. Python's
# regex engine tries an alternation at every position of the text, while `in`
# scans for a word at memchr speed, so the words go first: on torch's own
# source this cut the prefilter from about 1.7 s to a fraction of it.
_DDP_WORDS = ("DistributedSampler", "DataParallel", "init_process_group", "SyncBatchNorm", "local_rank",
              "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "set_epoch", "init_distributed", "setup_distributed",
              "ddp_setup", "setup_ddp", "save_on_master", "torchrun", "is_main_process", "rank_zero_only",
              "fully_shard", "deepspeed.initialize", "torch.distributed.checkpoint")
_COLLECTIVE_WORDS = ("barrier", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
                     "gather_object", "scatter_object_list", ".reduce", ".gather", ".scatter")
_RANK_WORDS = ("rank", "is_main", "is_master", "master_process", "is_global_zero")


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(word in text for word in words)


def might_have_findings(text: str) -> bool:
    if _mentions(text, _DDP_WORDS) and DDP_SIGNALS.search(text) is not None:
        return True
    return (_mentions(text, _RANK_WORDS) and _mentions(text, _COLLECTIVE_WORDS)
            and RANK_TEST.search(text) is not None and COLLECTIVE.search(text) is not None)


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
    wanted = bool(settings.enabled) and might_have_findings(text)
    if not wanted and not named:
        return _noqa_only(text, path, settings)
    try:
        check_syntax(text, path)   # Python's verdict first: exact positions, and no libcst crash on what it refuses
        if not wanted:
            return _noqa_only(text, path, settings)
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


def _noqa_only(text: str, path: str, settings: LintSettings) -> FileResult:
    """A file no rule needs to parse: only its `# noqa` comments can be wrong
    (DDP001: every `# noqa: DDPnnn` there suppresses nothing)."""
    if not settings.enabled or "noqa" not in text.lower():
        return FileResult(path=path)
    from ddpcheck.lint.noqa import apply_noqa

    return FileResult(path=path, findings=tuple(apply_noqa([], text, settings.enabled, path)))


def lint_source(text: str, path: str, settings: LintSettings) -> list[Finding]:
    """All findings for one source text, sorted, `# noqa` applied (tests,
    rule pages). Raises SourceError for text that is not valid Python and
    when a rule crashed."""
    result = lint_text(text, path, settings)
    if result.error is not None:
        raise SourceError.of(result.error)
    return list(result.findings)
