"""The words that can make a rule fire, declared by each rule, and the
prefilter built from those declarations.

A rule declares `triggers = (Trigger(...), ...)`: a file can only hold what
it looks for when it contains one word of every group of one of its
triggers (and, when given, matches the trigger's regular expression). A
lint run parses a file when the trigger of one rule matches it, whichever
rules it enables (lint/engine.py: worth_analysing): a rule can still fire in
a file without its own words (what it looks for reached through a helper
module), and its findings must not depend on which other rules were
selected with it. `Prefilter(codes)` is the union of the triggers of
`codes`. Plain `in` scans for the words go first (at memchr speed), the
regular expressions only confirm.

The prefilter reads the declarations from the rule modules' source with
Python's own parser, without importing them: importing the rules imports
libcst, which a run whose files all fail the prefilter (a pre-commit hook on
unrelated files, a run answered from the result cache) never needs; so this
module sits beside the rules package, not in it. A test checks that what is
read equals each rule class's attribute. A leaf module.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Trigger:
    """One word of each group of `words` must be in the file, and `confirm`
    (a regular expression, each one given) must match it."""

    words: tuple[tuple[str, ...], ...]
    confirm: tuple[str, ...] = ()

    def matches(self, text: str) -> bool:
        if not all(any(w in text for w in group) for group in self.words):
            return False
        return all(_compiled(p).search(text) is not None for p in self.confirm)


_PATTERNS: dict[str, re.Pattern] = {}


def _compiled(pattern: str) -> re.Pattern:
    found = _PATTERNS.get(pattern)
    if found is None:
        found = _PATTERNS[pattern] = re.compile(pattern)
    return found


# -- the words rules share --------------------------------------------------------------

# A file that names an API or idiom only multi-GPU code uses. Every match of
# the pattern contains one of the words.
DISTRIBUTED_WORDS = (
    "DistributedSampler", "DataParallel", "init_process_group", "SyncBatchNorm", "local_rank", "LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES", "set_epoch", "init_distributed", "setup_distributed", "ddp_setup", "setup_ddp",
    "save_on_master", "torchrun", "is_main_process", "rank_zero_only", "fully_shard", "deepspeed.initialize",
    "torch.distributed.checkpoint",
)
DISTRIBUTED_PATTERN = (
    r"DistributedSampler|DataParallel\s*\(|DataParallel as|init_process_group|SyncBatchNorm|local_rank"
    r"|LOCAL_RANK|CUDA_VISIBLE_DEVICES|set_epoch|init_distributed|setup_distributed|ddp_setup|setup_ddp"
    r"|save_on_master|torchrun|is_main_process|rank_zero_only"
    r"|FullyShardedDataParallel|fully_shard\b|deepspeed\.initialize|torch\.distributed\.checkpoint"
)
USES_DISTRIBUTED = Trigger((DISTRIBUTED_WORDS,), (DISTRIBUTED_PATTERN,))

# A collective under what looks like a rank test (a hang). Generic names
# (`reduce`, `gather`, `scatter`) only count behind a `dist.`-like prefix:
# functools.reduce and Tensor.scatter are everywhere.
RANK_WORDS = ("rank", "is_main", "is_master", "master_process", "is_global_zero")
COLLECTIVE_WORDS = ("barrier", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
                    "gather_object", "scatter_object_list", ".reduce", ".gather", ".scatter")
RANK_PATTERN = (r"\brank\s*(==|!=|<|>|%|in\b|not in)|_rank\s*(==|!=|in\b|not in)|get_rank\(\)"
                r"|is_main|is_master|master_process|rank_zero|is_global_zero")
COLLECTIVE_PATTERN = (r"\b(barrier|all_reduce|all_gather|broadcast|reduce_scatter|all_to_all|all_gather_object"
                      r"|broadcast_object_list|gather_object|scatter_object_list|monitored_barrier)\s*\("
                      r"|\b(dist|distributed|c10d|comm)\.(reduce|gather|scatter)\s*\(")
COLLECTIVE_UNDER_RANK = Trigger((RANK_WORDS, COLLECTIVE_WORDS), (RANK_PATTERN, COLLECTIVE_PATTERN))

# A script made distributed by its launcher alone: a library trainer starts
# the process group itself when torchrun's environment is set.
TRAINER_WORDS = ("Trainer", "Accelerator", "Fabric")
TRAINER_PATTERN = r"\b(transformers|trl|accelerate|lightning|pytorch_lightning)\b"
LIBRARY_TRAINER = Trigger((TRAINER_WORDS,), (TRAINER_PATTERN,))


# -- reading the declarations -------------------------------------------------------------

_SHARED = {name: value for name, value in globals().items() if isinstance(value, (Trigger, tuple, str))}


def _evaluate(node: ast.AST):
    """A trigger declaration's expression: Trigger(...) calls, tuples,
    strings, and the shared names above."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in _SHARED:
        return _SHARED[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Trigger":
        args = [_evaluate(a) for a in node.args]
        kwargs = {k.arg: _evaluate(k.value) for k in node.keywords}
        return Trigger(*args, **kwargs)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _evaluate(node.left) + _evaluate(node.right)
    raise ValueError(f"a trigger declaration can only use Trigger(...), tuples, strings and shared names "
                     f"(line {getattr(node, 'lineno', '?')})")


def read_declarations(folder: Path) -> dict[str, tuple[Trigger, ...]]:
    """rule code -> its declared triggers, from the rule modules' source."""
    found: dict[str, tuple[Trigger, ...]] = {}
    for path in sorted(folder.glob("ddp[0-9][0-9][0-9]_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            code, triggers = None, ()
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    if stmt.targets[0].id == "code" and isinstance(stmt.value, ast.Constant):
                        code = stmt.value.value
                    elif stmt.targets[0].id == "triggers":
                        triggers = _evaluate(stmt.value)
            if code is not None:
                found[code] = triggers
    return found


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, tuple[Trigger, ...]]:
    """The declarations of the rules shipped with ddpcheck (read once: they are
    part of the installed package, like its code)."""
    return read_declarations(Path(__file__).parent / "rules")


class Prefilter:
    """Whether a file can hold a finding of one of `codes`."""

    def __init__(self, triggers_by_code: dict[str, tuple[Trigger, ...]], codes) -> None:
        unique: list[Trigger] = []
        for code in sorted(codes):
            # a rule registered at run time, not shipped here (a plugin, a test's fake rule):
            # the words every distributed-training rule needs
            for t in triggers_by_code.get(code, (USES_DISTRIBUTED,)):
                if t not in unique:
                    unique.append(t)
        self.triggers = tuple(unique)
        # the first word of any trigger must be there: one quick test for most files
        self.any_word = tuple(sorted({w for t in unique for w in t.words[0]})) if unique else ()

    def __call__(self, text: str) -> bool:
        if not any(w in text for w in self.any_word):
            return False
        return any(t.matches(text) for t in self.triggers)


__all__ = ["Trigger", "Prefilter", "declared", "read_declarations", "USES_DISTRIBUTED", "COLLECTIVE_UNDER_RANK",
           "LIBRARY_TRAINER"]
