"""The `with` statements around a statement, within its function.

`with torch_distributed_zero_first(LOCAL_RANK):`, `with
accelerator.main_process_first():`, `with FileLock(path):` change who runs
the code inside and when. The builder's contexts do not carry them, so this
is answered on demand: one statement-level walk of the function (no
expressions), memoised, done only for functions a rule asks about."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.children import children
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel

_BLOCKS = (cst.If, cst.For, cst.While, cst.With, cst.Try, cst.TryStar, cst.Else, cst.ExceptHandler,
           cst.ExceptStarHandler, cst.Finally, cst.IndentedBlock, cst.SimpleStatementSuite)


@query(on_cycle={})
def with_items_by_statement(model: ScriptModel, fn: FunctionInfo | None) -> dict[int, tuple[cst.WithItem, ...]]:
    """id(statement) -> the items of the `with` statements enclosing it
    (outermost first), for every statement of `fn` (None: module level) that
    sits inside at least one `with`."""
    found: dict[int, tuple[cst.WithItem, ...]] = {}
    body = fn.node.body if fn is not None else model.module
    stack: list[tuple[cst.CSTNode, tuple[cst.WithItem, ...]]] = [
        (c, ()) for c in children(body)]
    while stack:
        node, items = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            continue
        if items:
            found[id(node)] = items
        if isinstance(node, cst.With):
            stack.append((node.body, items + tuple(node.items)))
            continue
        if isinstance(node, _BLOCKS):
            stack.extend((c, items) for c in children(node))
    return found


def with_items_around(model: ScriptModel, site: CallSite) -> tuple[cst.WithItem, ...]:
    """The `with` items whose body holds the call's statement (outermost first)."""
    if site.stmt is None:
        return ()
    return with_items_by_statement(model, site.ctx.function).get(id(site.stmt), ())


__all__ = ["with_items_around", "with_items_by_statement"]
