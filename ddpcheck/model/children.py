"""`children(node)`: libcst's `node.children`, without libcst's visitor.

libcst computes `node.children` by running the node's
`_visit_and_replace_children` with a collecting visitor, which rebuilds the
node (a new object and its fields' checks) every time it is asked; walks over
a whole module with it (the dict comprehensions of a module, the statements
of a function) spent most of their time rebuilding nodes they then dropped.

Each node class's `_visit_and_replace_children` visits its fields in source
order (`visit_required(self, "name", ...)`, `visit_sequence(self, "body", ...)`
...); the collecting visitor keeps each visited node and goes no deeper. So
the children are the values of those fields, in that order, sequences
flattened, what is not a node (None, a MaybeSentinel, a string) left out. The
field order is read once per class from libcst's own source of that method
(the field name each `visit_*` call passes, in the order they are written,
which is the order Python evaluates them); a class whose source cannot be
read or does not have that shape keeps libcst's property. The result is the
same list of the same objects (tests/model/test_children.py checks every
node of the fixtures against `node.children`).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import libcst as cst

class _NodeTypes(dict):
    """type -> whether its instances are libcst nodes: `IS_NODE[type(v)]` is
    `isinstance(v, cst.CSTNode)` (a property of the type) without the ABC's
    `__instancecheck__` call each time, for the walks that ask it of every
    field of every node."""

    def __missing__(self, node_type: type) -> bool:
        found = self[node_type] = issubclass(node_type, cst.CSTNode)
        return found


IS_NODE: dict[type, bool] = _NodeTypes()

_VISITS = frozenset({"visit_required", "visit_optional", "visit_sentinel", "visit_sequence",
                     "visit_body_sequence", "visit_iterable", "visit_body_iterable"})
_ORDER: dict[type, tuple[str, ...] | None] = {}


def _field_order(node_type: type) -> tuple[str, ...] | None:
    """The fields `node_type._visit_and_replace_children` visits, in order;
    None where that cannot be read from its source (use libcst's property)."""
    try:
        source = textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    fields: list[str] = []
    for call in _calls_in_order(tree):
        func = call.func
        if isinstance(func, ast.Name) and func.id in _VISITS:
            if len(call.args) < 2 or not isinstance(call.args[1], ast.Constant) \
                    or not isinstance(call.args[1].value, str):
                return None
            if call.args[1].value not in fields:
                fields.append(call.args[1].value)
        elif isinstance(func, ast.Attribute) and func.attr in ("visit", "_visit_and_replace_children"):
            return None   # a hand-written visit: not the shape read here
    known = {f.name for f in getattr(node_type, "__dataclass_fields__", {}).values()}
    if any(f not in known for f in fields):
        return None
    return tuple(fields)


def _calls_in_order(tree: ast.AST) -> list[ast.Call]:
    """Every call of the tree in the order its text is written (a call's
    arguments after the call's own start)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda n: (n.lineno, n.col_offset))


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children`: the same nodes in the same (source) order."""
    node_type = type(node)
    try:
        fields = _ORDER[node_type]
    except KeyError:
        fields = _ORDER[node_type] = _field_order(node_type)
    if fields is None:
        return list(node.children)
    found: list[cst.CSTNode] = []
    is_node = IS_NODE
    for field in fields:
        value = getattr(node, field)
        if is_node[type(value)]:
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if is_node[type(v)])
    return found


__all__ = ["IS_NODE", "children"]
