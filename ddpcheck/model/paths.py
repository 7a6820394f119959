"""Per-rank paths: a file or folder name that differs on each rank
(`f"queue{rank}.pth"`, `log_dir=f"runs/rank{args.rank}"`). Every rank writing
its own path is deliberate per-rank state, not N processes fighting over one
file, so the rules about writes from every rank (DDP301, DDP307) leave them
alone."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.flow import Made, bindings_seen, called_qual, resolve_call, value_at
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import STRING_LITERALS, literal_text, reads
from ddpcheck.model.script import FunctionInfo, ScriptModel

PER_RANK = re.compile(r"rank|process_index|gpu_id|local_gpu")

# Calls that build a path or a string from their arguments: what those are
# made of is part of the name; any other call only adds its own name
# (`get_rank()`), not what it is given (`validate(model, ...)`), unless it is
# a function of the tree whose return is built from its parameters
# (`def with_count(name): return f"{name}.iter{n}"`, see `_returns_from_arguments`).
PATH_BUILDERS = frozenset({
    "join", "Path", "PurePath", "str", "format", "joinpath", "with_name", "with_suffix", "with_stem",
    "replace", "expanduser", "abspath", "realpath", "normpath", "dirname", "basename", "fspath",
})


def path_parts(model: ScriptModel, target: cst.BaseExpression) -> tuple[str, ...]:
    """The names and string literals a path is built from, following the
    names it reads to the values bound to them (reaching definitions), into
    the arguments of path and string builders only, and not into the test
    of a conditional (`'best.pth' if is_best else ...` is named by either arm):
    `path = join(root, f"{prefix}.rank_{r}")` ... `f"{path}.pth"` is built from the rank."""
    found: list[str] = []
    seen: set[int] = set()
    stack: list[cst.CSTNode] = [target]
    while stack:
        node = stack.pop()
        if id(node) in seen or isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        seen.add(id(node))
        if isinstance(node, STRING_LITERALS):
            text = literal_text(node)
            if text is not None:
                found.append(text)
            continue
        if isinstance(node, cst.IfExp):
            stack += [node.body, node.orelse]
            continue
        if isinstance(node, cst.Call):
            name = dotted_name(node.func)
            if name is not None:
                found.append(name)
            if (name or "").rpartition(".")[2] in PATH_BUILDERS or isinstance(node.func, cst.Attribute) and name is None \
                    or _returns_from_arguments(model, node):
                stack.append(node.func)
                stack += [a.value for a in node.args]
            continue
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            if name is not None:
                found.append(name)
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
            # what the name was bound to, here or where it lives (a module-level root)
            for b in bindings_seen(model, node):
                source = getattr(b, "source", None)
                if source is not None and b.augmented is None:
                    stack.append(source)
        stack.extend(c for c in node.children if isinstance(c, cst.CSTNode))
    return tuple(found)


def _returns_from_arguments(model: ScriptModel, node: cst.Call) -> bool:
    """`node` runs one function of the tree whose returned values read its
    parameters (not only `self`): what it is given is part of what it returns."""
    site = model.site_of.get(id(node))
    target = resolve_call(model, site) if site is not None else None
    if target is None:
        return False
    tmodel, fn = target
    params = set(fn.params) - {"self", "cls"}
    return any(n.partition(".")[0] in params for expr, _ in fn.returns for n in reads(tmodel, expr))


def per_rank_path(model: ScriptModel, target: cst.BaseExpression | None, scope: FunctionInfo | None = None) -> bool:
    """The path is built from the rank: its strings or the names it reads,
    or what those names were bound to, mention it."""
    if target is None:
        return False
    return any(PER_RANK.search(t) for t in path_parts(model, target))


# File-like objects in memory: writing to one touches no file.
IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})


def in_memory(model: ScriptModel, target: cst.BaseExpression | None) -> bool:
    """The target is certainly a buffer in the process's memory
    (`buf = io.BytesIO(); torch.save(obj, buf)`): each rank has its own."""
    if target is None:
        return False
    value = value_at(model, target)
    return value.known and all(isinstance(a, Made) and called_qual(a.model, a.site) in IN_MEMORY
                               for a in value.atoms)


__all__ = ["per_rank_path", "path_parts", "in_memory", "PER_RANK", "PATH_BUILDERS", "IN_MEMORY"]
