"""Per-rank paths: a file or folder name that differs on each rank
(`f"queue{rank}.pth"`, `log_dir=f"runs/rank{args.rank}"`). Every rank writing
its own path is deliberate per-rank state, not N processes fighting over one
file, so the rules about writes from every rank (DDP301, DDP307) leave them
alone."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.flow import (
    Const, Imported, Item, Made, Member, Param, bindings_seen, called_qual, resolve_call, resolve_import, sole_binding, value_at, value_of,
)
from ddpcheck.model.library import ENTER_RETURNS_SELF
from ddpcheck.model.memo import query
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import STRING_LITERALS, literal_text, reads
from ddpcheck.model.script import FunctionInfo, ScriptModel
from ddpcheck.model.vocabulary import WORLD_SIZE
from ddpcheck.model.children import children

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
                # unpacked from a tuple written out (`save_dir, rank = Path(d), opt.rank`): its own element only
                source = getattr(b, "written", None)
                if source is None:
                    source = getattr(b, "source", None)
                if source is not None and b.augmented is None:
                    stack.append(source)
                elif getattr(b, "kind", None) == "for":
                    start = _strided_start(b.node)
                    if start is not None:
                        stack.append(start)
        stack.extend(children(node))
    return tuple(found)


# Calls whose result is the path they are given, spelled another way.
_SAME_PATH = frozenset({"str", "fspath", "Path", "PurePath", "PosixPath"})
_JOINS = frozenset({"os.path.join", "posixpath.join", "join", "Path", "PurePath", "PosixPath"})
_FIELD = re.compile(r"\{(\d*)\}")


@query(on_cycle=None)
def path_spelling(model: ScriptModel, expr: cst.BaseExpression) -> str | None:
    """How a path is spelled once the names it reads are replaced by what
    they certainly hold: `os.path.join(out, "best.pth")`, `f"{out}/best.pth"`,
    `"{}/best.pth".format(out)`, `Path(out) / "best.pth"` and a variable bound
    to one of them are all `{out}/best.pth`; a name with no one value here (a
    parameter, an option `args.out`) stays a name (`{args.out}`); a file
    opened with `open(p)` is `p`'s spelling. None when some part can hold
    several things or is not a path expression."""
    text = _spell(model, expr)
    if text is None:
        return None
    text = re.sub(r"/+", "/", text)
    return text[2:] if text.startswith("./") else text


def constant_path(model: ScriptModel, expr: cst.BaseExpression) -> str | None:
    """The one literal path `expr` holds once the parameters it reads are
    bound by the calls of this file (`self.args.ckpt_path` in a method of a
    class built with `Trainer(args)`, where `args = Args()` and the class
    attribute `Args.ckpt_path` is a literal), written as path_spelling
    writes a literal; None when it may hold anything else."""
    value = value_at(model, expr)
    if len(value.atoms) != 1:
        return None
    (atom,) = value.atoms
    if type(atom) is not Const or not isinstance(atom.value, str):
        return None
    text = re.sub(r"/+", "/", atom.value)
    return text[2:] if text.startswith("./") else text


def _spell(model: ScriptModel, expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
        return literal_text(expr) if isinstance(expr, cst.SimpleString) else (
            expr.evaluated_value if isinstance(expr.evaluated_value, str) else None)
    if isinstance(expr, cst.FormattedString):
        out = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                out.append(part.value)
                continue
            if part.format_spec or part.conversion:
                return None
            inner = path_spelling(model, part.expression)
            if inner is None:
                return None
            out.append(inner)
        return "".join(out)
    if isinstance(expr, cst.BinaryOperation):
        left, right = path_spelling(model, expr.left), path_spelling(model, expr.right)
        if left is None or right is None:
            return None
        if isinstance(expr.operator, cst.Add):
            return left + right
        if isinstance(expr.operator, cst.Divide):
            return f"{left}/{right}"
        return None
    if isinstance(expr, cst.Call):
        return _spell_call(model, expr)
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)):
        return _spell_name(model, expr)
    return None


def _spell_call(model: ScriptModel, expr: cst.Call) -> str | None:
    args = [a for a in expr.args if a.keyword is None]
    if any(a.star for a in expr.args):
        return None
    site = model.site_of.get(id(expr))
    qual = (called_qual(model, site) if site is not None else None) or dotted_name(expr.func) or ""
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format":
        template = path_spelling(model, expr.func.value)
        if template is None or any(a.keyword is not None for a in expr.args):
            return None
        spelled = [path_spelling(model, a.value) for a in args]
        if any(s is None for s in spelled):
            return None
        fields = iter(range(len(spelled)))
        try:
            return _FIELD.sub(lambda m: spelled[int(m.group(1)) if m.group(1) else next(fields)], template)
        except (IndexError, StopIteration):
            return None
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "joinpath":
        parts = [path_spelling(model, expr.func.value)] + [path_spelling(model, a.value) for a in args]
        return None if any(p is None for p in parts) else "/".join(parts)
    if qual in _JOINS or qual.rpartition(".")[2] in ("join", "Path", "PurePath") and "path" in qual.lower():
        parts = [path_spelling(model, a.value) for a in args]
        return None if not parts or any(p is None for p in parts) else "/".join(parts)
    if qual.rpartition(".")[2] in _SAME_PATH and len(args) == 1:
        return path_spelling(model, args[0].value)
    return None


def _spell_name(model: ScriptModel, expr: cst.BaseExpression) -> str | None:
    value = value_of(model, expr)
    if len(value.atoms) > 1:
        return None   # bound differently on different paths
    if value.atoms:
        (atom,) = value.atoms
        spelled = _imported_constant(atom) if type(atom) is Imported else _spell_atom(atom)
        if spelled is not None:
            return spelled
    # a name bound to what the engine does not model as a value (an f-string)
    binding = sole_binding(model, expr)
    source = getattr(binding, "value", None)
    if binding is None or binding.kind != "assign" or source is None or binding.augmented is not None \
            or binding.path:
        return None
    return path_spelling(model, source)


def _spell_atom(atom) -> str | None:
    """A string constant; a parameter, and what is read from it, by name
    (`{cfg.run_dir}`, whichever function reads it); an object by where it
    was made (`args.out` of the one `parse_args()` object is the same
    wherever it is read); a path built or opened by a call, as spelled there."""
    kind = type(atom)
    if kind is Const:
        return atom.value if isinstance(atom.value, str) else None
    if kind is Param:
        return "{" + atom.name + "}"
    if kind is Member or kind is Item and isinstance(atom.key, str):
        inner = _spell_atom(atom.receiver)
        if inner is None or not (inner.startswith("{") and inner.endswith("}")):
            return None
        step = f".{atom.name}" if kind is Member else f"[{atom.key!r}]"
        return inner[:-1] + step + "}"
    if kind is Made:
        qual = called_qual(atom.model, atom.site) or ""
        if qual in ENTER_RETURNS_SELF:
            opened = atom.site.arg("file", 0)
            return path_spelling(atom.model, opened) if opened is not None else None
        spelled = _spell_call(atom.model, atom.site.node)
        if spelled is not None:
            return spelled
        return "{" + f"{qual or atom.site.func or 'call'}@{atom.model.path}:{atom.site.ctx.order}" + "}"
    return None


def _imported_constant(atom) -> str | None:
    """A string constant of a module of the tree that this one imports
    (`from config import CKPT_NAME`), as that module binds it once it has run."""
    found = resolve_import(atom.model, atom, assigned=True).constant
    return found if isinstance(found, str) else None


def _plain_subscript(expr: cst.Subscript) -> bool:
    """`cfg["out_dir"]`: a dotted name read at a literal key."""
    return (dotted_name(expr.value) is not None and len(expr.slice) == 1
            and isinstance(expr.slice[0].slice, cst.Index)
            and isinstance(expr.slice[0].slice.value, cst.SimpleString))


def _strided_start(loop: cst.CSTNode) -> cst.BaseExpression | None:
    """`for i in range(first + rank, n, world_size)`: each rank takes every
    world_size-th index from an offset of its own, so no two ranks see the
    same `i`: the start names what the indices differ by. None for any other
    loop (`range(rank, n)` overlaps across ranks)."""
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Call):
        return None
    call = loop.iter
    if dotted_name(call.func) != "range" or len(call.args) != 3 or any(a.keyword or a.star for a in call.args):
        return None
    step = call.args[2].value
    names = [dotted_name(n) or "" for n in _names_in(step)]
    return call.args[0].value if any(WORLD_SIZE.search(n) for n in names) else None


def _names_in(expr: cst.CSTNode) -> list[cst.CSTNode]:
    found, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            found.append(node)
            if isinstance(node, cst.Attribute):
                continue
        stack.extend(children(node))
    return found


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


__all__ = ["per_rank_path", "path_parts", "path_spelling", "constant_path", "in_memory", "PER_RANK", "PATH_BUILDERS", "IN_MEMORY"]
