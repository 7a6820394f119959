"""The names an expression reads, recorded by the builder for every fact.

`args.batch_size // dist.get_world_size()` reads `args.batch_size`, `args`,
`dist.get_world_size`, `dist`: every Name and every dotted prefix of an
attribute chain, `cfg['lr']` for a subscript by a string constant, and
`os.environ['WORLD_SIZE']` for each environment variable read (however
spelled: `os.environ.get("WORLD_SIZE")`, `os.getenv(...)`). Rules and queries
ask these sets instead of regenerating source and searching it with a regex,
so a comment or a string literal inside an expression never counts as a use.

The builder records, in the same walk, the reads of each assignment value,
call (and each of its arguments), branch test, loop iterable and returned
value, plus the divisions inside them (`x / n`, `x // n`: what the dividend
and the divisor read), which is how "divided by the world size" is answered.
`reads(model, expr)` answers for any other expression with the same rules.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterable

import libcst as cst

from ddpcheck.model.children import IS_NODE, children
from ddpcheck.model.names import dotted_name, environ_key, string_value

EMPTY: frozenset[str] = frozenset()
ENV_READ_CALLS = {"os.environ.get", "os.getenv", "os.environ.setdefault", "os.environ.pop"}

# Fields of a libcst node that never hold code that matters (the builder's walk
# and `reads` skip them): formatting tokens, and the names
# that are bindings rather than uses (a def's name, a parameter, a keyword
# argument, an attribute after the dot, an `as` alias).
_SKIP_FIELD = re.compile(
    r"whitespace|^(lpar|rpar|lbracket|rbracket|lbrace|rbrace|comma|semicolon|colon|dot|equal|arrow|star"
    r"|leading_lines|lines_after_decorators|header|footer|newline|operator|asynchronous|walrus"
    r"|keyword|name|attr|asname|default_indicator|prefix|quote|indent|encoding|default_newline"
    r"|default_indent|has_trailing_newline|first_line|last_line|semicolon)$"
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(node_type: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(node_type)
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(node_type) if not _SKIP_FIELD.search(f.name))
        _CHILD_FIELDS[node_type] = fields
    return fields




@dataclass(frozen=True)
class Division:
    """`dividend / divisor` or `//` somewhere inside a recorded expression."""

    node: cst.BinaryOperation
    dividend: frozenset[str]
    divisor: frozenset[str]


def code_nodes(root: cst.CSTNode):
    """Every node under `root` (itself included) in the fields that hold code,
    as the builder walks them, in no particular order: a walk of our own,
    since libcst's visitor rebuilds every node it passes."""
    return _walk(root, _child_fields, None)


# Fields that only ever hold formatting tokens (never a name): `every_node` skips them.
_FORMATTING_FIELD = re.compile(
    r"whitespace|^(lpar|rpar|lbracket|rbracket|lbrace|rbrace|comma|semicolon|colon|dot|equal|arrow"
    r"|leading_lines|lines_after_decorators|header|footer|newline|default_indicator)$"
)
_ALL_FIELDS: dict[type, tuple[str, ...]] = {}


def _all_fields(node_type: type) -> tuple[str, ...]:
    fields = _ALL_FIELDS.get(node_type)
    if fields is None:
        fields = _ALL_FIELDS[node_type] = tuple(
            f.name for f in dataclasses.fields(node_type) if not _FORMATTING_FIELD.search(f.name))
    return fields


def every_node(root: cst.CSTNode, descend=None):
    """Every node under `root` (itself included), the names that `code_nodes`
    skips too (a def's name, a keyword, an attribute after the dot), as
    libcst's visitor reaches them but without rebuilding them; `descend(node)`
    False: not below that node (the node itself is still given)."""
    return _walk(root, _all_fields, descend)


def _walk(root: cst.CSTNode, fields_of, descend):
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        if descend is not None and node is not root and not descend(node):
            continue
        for field in fields_of(type(node)):
            value = getattr(node, field)
            if IS_NODE[type(value)]:
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if IS_NODE[type(v)])


def env_name(var: str) -> str:
    return f"os.environ[{var!r}]"


def subscript_name(node: cst.Subscript) -> str | None:
    """`cfg['lr']` for a subscript of a dotted name by one string constant."""
    if len(node.slice) != 1:
        return None
    idx = node.slice[0].slice
    if not (isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString)):
        return None
    base = dotted_name(node.value)
    value = idx.value.evaluated_value
    return f"{base}[{value!r}]" if base and isinstance(value, str) else None


def chain_names(node: cst.Attribute) -> list[str]:
    """`a.b.c` -> ["a.b.c", "a.b"] (the Name `a` is read on its own)."""
    d = dotted_name(node)
    if d is None:
        return []
    parts = d.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 1, -1)]


def reads(model, expr: cst.CSTNode | None) -> frozenset[str]:
    """The names `expr` reads: the builder's record, or computed the same way."""
    if expr is None:
        return EMPTY
    found = model.reads_of.get(id(expr))
    if found is not None:
        return found
    return _compute(model, expr)


def _compute(model, expr: cst.CSTNode) -> frozenset[str]:
    names: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            names.add(node.value)
            continue
        if isinstance(node, cst.Attribute):
            names.update(chain_names(node))
        elif isinstance(node, cst.Subscript):
            key = subscript_name(node)
            if key:
                names.add(key)
            env = environ_key(model.imports, node)
            if env:
                names.add(env_name(env))
        elif isinstance(node, cst.Call):
            func = dotted_name(node.func)
            if func and model.imports.qualify(func) in ENV_READ_CALLS and node.args:
                var = string_value(node.args[0].value)
                if var:
                    names.add(env_name(var))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(node, cst.Attribute):
            stack.append(node.value)
            continue
        for field in _child_fields(type(node)):   # the fields the builder walks
            value = getattr(node, field)
            if IS_NODE[type(value)]:
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if IS_NODE[type(v)])
    return frozenset(names)


# a string literal, or the literal part of an f-string
STRING_LITERALS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedStringText)


def literal_text(node: cst.CSTNode) -> str | None:
    """The text a string literal node stands for; None for bytes."""
    if isinstance(node, cst.FormattedStringText):
        return node.value
    value = node.evaluated_value
    return value if isinstance(value, str) else None


def strings_in(expr: cst.CSTNode | None) -> tuple[str, ...]:
    """The text of the string literals inside an expression (`"best.pth"` in
    `os.path.join(out_dir, "best.pth")`; the literal parts of an f-string)."""
    found: list[str] = []
    stack = [expr] if expr is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, STRING_LITERALS):
            text = literal_text(node)
            if text is not None:
                found.append(text)
            continue
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(children(node))
    return tuple(found)


def last_parts(names: Iterable[str]) -> set[str]:
    """The last component of each name: `batch_size` for `args.batch_size`,
    `lr` for `cfg['lr']`."""
    out = set()
    for n in names:
        if n.endswith("]") and "[" in n:
            out.add(n[n.index("[") + 2:-2])
        else:
            out.add(n.rpartition(".")[2])
    return out


def reads_name(names: Iterable[str], key: str) -> bool:
    """`key` itself, or an attribute / subscript of it, is read."""
    return any(n == key or n.startswith(key + ".") or n.startswith(key + "[") for n in names)
