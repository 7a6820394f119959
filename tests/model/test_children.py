"""`children(node)` is libcst's `node.children` (the same objects, in the same
order) without the visitor that rebuilds the node; `IS_NODE` is isinstance."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from ddpcheck.model.children import IS_NODE, children

REPO = Path(__file__).resolve().parents[2]

_EVERY_SYNTAX = '''
"""doc"""
from __future__ import annotations
import os.path as osp, sys
from . import a
from ..b import (c as d, e,)
from m import *
@decorator(1)
async def f(a, /, b: int = 2, *args, c, d=3, **kw) -> "T":
    global g
    nonlocal_ = lambda x, *y, z=1, **w: (x, y)
    async with open(a) as fh, ctx():
        async for i in aiter():
            await g
    x: list[int] = [i for i in range(3) if i if not i]
    y = {k: v for k, v in d.items()}
    z = {*a, *b}
    s = f"{a!r:>{width}} {b=}" "plain" r"raw"
    bs = b"a" rb"b"
    t = a if b else c
    u = (yield), (yield from g)
    v = a[1:2, ::3, ...]
    w = not a and b or c is not d in e
    x @= y ** -z
    del a[0], b.c
    assert a, "msg"
    raise ValueError() from None
    try:
        pass
    except* (A, B) as err:
        pass
    else:
        pass
    finally:
        pass
    while x := next(it):
        break
    else:
        continue
    match cmd:
        case [Point(x=0, y=0) as p, *rest] if p:
            pass
        case {"k": 1, **others} | str() | None:
            pass
        case _:
            pass
class C(Base, metaclass=M):
    a: int
    def m(self): return super().m()
type Alias[T: int, *Ts, **P] = list[T]
def generic[T](x: T) -> T: ...
'''


def _check(module: cst.Module) -> int:
    seen, stack = 0, [module]
    while stack:
        node = stack.pop()
        seen += 1
        expected = node.children
        got = children(node)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected)), type(node).__name__
        stack.extend(expected)
    return seen


def test_children_are_libcsts_for_every_kind_of_syntax():
    assert _check(cst.parse_module(_EVERY_SYNTAX)) > 500


def test_children_are_libcsts_on_the_fixtures():
    files = sorted(REPO.glob("fixtures/**/*.py"))[::8]   # a spread of them: libcst's own property is slow
    assert files
    for path in files:
        try:
            module = cst.parse_module(path.read_text(encoding="utf-8"))
        except cst.ParserSyntaxError:
            continue
        _check(module)


def test_is_node_is_isinstance():
    module = cst.parse_module("x = f(a, *b)  # c\n")
    values = [module, module.body[0], cst.MaybeSentinel.DEFAULT, None, "x", 1, (), []]
    for value in values:
        assert IS_NODE[type(value)] is isinstance(value, cst.CSTNode)


def test_dotted_name_compares_types_of_classes_without_subclasses():
    from ddpcheck.model.names import dotted_name

    # the classes model/ compares by type (names, builder, wrappers)
    for node_class in (cst.Name, cst.Attribute, cst.Tuple, cst.List, cst.StarredElement, cst.Subscript, cst.Expr,
                       cst.Call, cst.FunctionDef, cst.DictComp, cst.Try):
        assert not node_class.__subclasses__(), node_class
    expr = cst.parse_expression("a.b.c")
    assert dotted_name(expr) == "a.b.c" and dotted_name(expr.value) == "a.b"
    assert dotted_name(cst.parse_expression("a")) == "a"
    assert dotted_name(cst.parse_expression("f().b")) is None and dotted_name(None) is None
