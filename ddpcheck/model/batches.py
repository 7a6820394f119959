"""Batches: global (all ranks together) or per rank, divided by the world size.

One module, so DDP103 (a global batch used as the per-rank batch) and DDP504
(the effective batch grows with the GPU count but the lr does not) answer "is
this batch derived from a global one?" from the same facts and cannot
contradict each other: a batch read from a global-batch name and never
divided is DDP103's to report, and DDP504 leaves it alone.
"""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.memo import query
from ddpcheck.model.reads import Division, last_parts, reads, reads_name
from ddpcheck.model.names import dotted_name
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.vocabulary import GLOBAL_BATCH, WORLD_SIZE
from ddpcheck.model.children import children

_DIVIDE_ASSIGN = ("DivideAssign", "FloorDivideAssign")


def is_global_batch_name(name: str) -> bool:
    """`global_batch_size`, `args.total_batch`, `cfg['batch_size_all']`."""
    return any(GLOBAL_BATCH.search(part) for part in last_parts([name]))


@query
def world_names(model: ScriptModel) -> frozenset[str]:
    """Names that carry the world size without saying so:
    `eff_batch_size = args.batch_size * misc.get_world_size()`."""
    tokens: set[str] = set()
    values = [(a.key, reads(model, a.value)) for a in model.assigns
              if a.value is not None and not WORLD_SIZE.search(a.key)]
    for _ in range(3):
        grown = False
        for key, names in values:
            if key not in tokens and reads_world(model, names, tokens):
                tokens.add(key)
                grown = True
        if not grown:
            break
    return frozenset(tokens)


def reads_world(model: ScriptModel, names: frozenset[str], tokens: frozenset[str] | set[str] | None = None) -> bool:
    """One of `names` is the world size (`dist.get_world_size`, `args.ngpus`,
    `os.environ['WORLD_SIZE']`) or a name computed from it."""
    if any(WORLD_SIZE.search(n) for n in names):
        return True
    tokens = world_names(model) if tokens is None else tokens
    return any(reads_name(names, t) for t in tokens)


def divisions(model: ScriptModel, expr: cst.BaseExpression | None) -> tuple[Division, ...]:
    """`x / n` and `x // n` inside `expr` (recorded by the builder for facts)."""
    if expr is None:
        return ()
    found = model.divisions_of.get(id(expr))
    if found is not None or id(expr) in model.reads_of:
        return found or ()
    out, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            out.append(Division(node, reads(model, node.left), reads(model, node.right)))
        stack.extend(children(node))
    return tuple(out)


def divides_by_world(model: ScriptModel, expr: cst.BaseExpression | None) -> bool:
    """`expr` divides something by the world size."""
    return any(reads_world(model, d.divisor) for d in divisions(model, expr))


@query
def divided_by_world(model: ScriptModel, key: str) -> bool:
    """Somewhere the script divides the value held in `key` (matched by its
    last component: `args.batch_size`, `cfg.batch_size`) by the world size:
    `batch_size //= world_size`, `args.batch_size = args.batch_size // ngpus`."""
    last = key.rpartition(".")[2]
    for a in model.assigns:
        if a.value is None or a.key.rpartition(".")[2] != last:
            continue
        if a.augmented in _DIVIDE_ASSIGN and reads_world(model, reads(model, a.value)):
            return True
        if divides_by_world(model, a.value):
            return True
    return False


def derived_from_global(model: ScriptModel, batch: cst.BaseExpression) -> bool:
    """The per-rank batch `batch` is derived from a global one: divided by the
    world size where it is passed or where it is assigned, or read from a
    global-batch name (undivided, that is DDP103's finding)."""
    names = reads(model, batch)
    if any(is_global_batch_name(n) for n in names) or divides_by_world(model, batch):
        return True
    key = dotted_name(batch)
    if key is None:
        return False
    if divided_by_world(model, key):
        return True
    last = key.rpartition(".")[2]
    return any(a.value is not None and a.key.rpartition(".")[2] == last
               and any(is_global_batch_name(n) for n in reads(model, a.value))
               for a in model.assigns)
