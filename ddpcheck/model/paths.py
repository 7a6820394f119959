"""Per-rank paths: a file or folder name that differs on each rank
(`f"queue{rank}.pth"`, `log_dir=f"runs/rank{args.rank}"`). Every rank writing
its own path is deliberate per-rank state, not N processes fighting over one
file, so the rules about writes from every rank (DDP301, DDP307) leave them
alone."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.names import dotted_name
from ddpcheck.model.script import FunctionInfo, ScriptModel

PER_RANK = re.compile(r"rank|process_index|gpu_id|local_gpu")


def per_rank_path(model: ScriptModel, target: cst.BaseExpression | None, scope: FunctionInfo | None) -> bool:
    """The path expression (or what the name it reads was assigned) mentions the rank."""
    if target is None:
        return False
    texts = [model.module.code_for_node(target)]
    key = dotted_name(target)
    if key is not None:
        texts += [model.module.code_for_node(a.value)
                  for a in model.assignments(key, scope) if a.value is not None]
    return any(PER_RANK.search(t) for t in texts)


__all__ = ["per_rank_path", "PER_RANK"]
