"""Does a name hold the DDP / DataParallel wrapper at a given line?

`model = DDP(model)` ... `model.state_dict()`: yes. After
`model = model.module` or a fresh `model = build()`: no. A wrap in the other
arm of an `if`, or in a world that never reaches the line (the DDP wrap under
`if args.distributed:` and the line in its `else`), does not count.
`self.model` wrapped in one method is the wrapper in the other methods of the
class (set-up runs first), unless the class unwraps it somewhere."""

from __future__ import annotations

import re

from ddpcheck.model.query import query
from ddpcheck.model.script import Assign, Ctx, ScriptModel
from ddpcheck.model.values import WrapInfo, _direct_values, exclusive, wraps

# A test that tells the wrapper apart from the model it wraps:
# `model.module if hasattr(model, "module") else model`, `isinstance(model, DDP)`.
UNWRAP_TEST = re.compile(r"\bmodule\b|isinstance|hasattr|DataParallel|DistributedDataParallel|\bDDP\b|\bDP\b")


def _unwraps(model: ScriptModel, key: str, value) -> bool:
    text = model.module.code_for_node(value)
    return f"{key}.module" in text


@query
def wrapper_held(model: ScriptModel, key: str, ctx: Ctx) -> WrapInfo | None:
    """The wrap whose result `key` holds at `ctx`, or None."""
    result = _wrapper_held(model, key, ctx)
    return result


def _wrapper_held(model: ScriptModel, key: str, ctx: Ctx) -> WrapInfo | None:
    candidates = [w for w in wraps(model) if w.key == key]
    if not candidates:
        return None
    here = model.worlds(ctx)
    scope = ctx.function
    assigns = [a for a in model.assignments(key, scope) if a.augmented is None]
    if key.startswith("self."):
        same_fn = [a for a in assigns if a.ctx.function is scope]
        if not any(a.ctx.order < ctx.order for a in same_fn):
            # set in other methods: the wrapper, unless the class unwraps it
            if any(a.value is not None and _unwraps(model, key, a.value) for a in assigns):
                return None
            return next((w for w in candidates if w.site.ctx.function is not scope), None)
        assigns = same_fn
    reaching = reaching_assignments(assigns, ctx)
    held = []
    for a in reaching:
        if a.value is None:
            continue
        values = list(_direct_values(a.value))
        held += [c for c in candidates if any(v is c.site.node for v in values)]
    held = [w for w in held if model.worlds(w.site.ctx) & here and not _opposite_arms(model, w.site.ctx, ctx)]
    if not held:
        return None   # no reaching assignment is a wrap (`model = model.module`, a new model)
    return next((w for w in held if w.kind == "DistributedDataParallel"), held[0])


def reaching_assignments(assigns: list[Assign], ctx: Ctx) -> list[Assign]:
    """Of `assigns` (to one name, visible from `ctx`), the ones whose value the
    name can hold at `ctx`: the latest one before it on the same path, and the
    ones in the other arms of the `if`s it sits in (`if dist: model =
    DDP(model) else: model = model.cuda()`). A module-level name read inside a
    function: its module-level assignments, latest first."""
    local = [a for a in assigns if a.ctx.function is ctx.function]
    if local:
        before = [a for a in local if a.ctx.order < ctx.order and not exclusive(a.ctx, ctx)]
    else:
        before = list(assigns)
    reaching: list[Assign] = []
    for a in sorted(before, key=lambda a: -a.ctx.order):
        if reaching and not all(exclusive(a.ctx, r.ctx) for r in reaching):
            break
        reaching.append(a)
    return reaching


def _opposite_arms(model: ScriptModel, a: Ctx, b: Ctx) -> bool:
    """`if args.local_rank != -1: model = DDP(model)` ... later
    `if args.local_rank != -1: ... else: <here>`: two `if`s with the same test,
    `a` in the true arm of one and `b` in the false arm of the other."""
    arms = {model.module.code_for_node(br.test): br.positive for br in a.branches}
    return any(arms.get(model.module.code_for_node(br.test), br.positive) != br.positive for br in b.branches)


__all__ = ["wrapper_held", "reaching_assignments", "UNWRAP_TEST"]
