"""Per-rank paths: a file or folder name that differs on each rank
(`f"queue{rank}.pth"`, `log_dir=f"runs/rank{args.rank}"`). Every rank writing
its own path is deliberate per-rank state, not N processes fighting over one
file, so the rules about writes from every rank (DDP301, DDP307) leave them
alone."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import reads
from ddpcheck.model.script import FunctionInfo, ScriptModel

PER_RANK = re.compile(r"rank|process_index|gpu_id|local_gpu")


def per_rank_path(model: ScriptModel, target: cst.BaseExpression | None, scope: FunctionInfo | None) -> bool:
    """The path expression, or what the names it reads were assigned (two
    steps back: `path = join(root, f"{prefix}.rank_{r}")` ... `f"{path}.pth"`),
    mentions the rank."""
    if target is None:
        return False
    texts = [model.module.code_for_node(target)]
    frontier = [target]
    seen: set[str] = set()
    for _ in range(2):
        nxt = []
        for expr in frontier:
            keys = set(reads(model, expr))
            key = dotted_name(expr)
            if key is not None:
                keys.add(key)
            for k in keys - seen:
                seen.add(k)
                for a in model.assignments(k, scope):
                    if a.value is not None:
                        texts.append(model.module.code_for_node(a.value))
                        nxt.append(a.value)
        frontier = nxt
    return any(PER_RANK.search(t) for t in texts)


__all__ = ["per_rank_path", "PER_RANK"]
