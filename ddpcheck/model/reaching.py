"""Which assignments of a name reach a read of it: the latest one on every
path there, and the earlier ones that a conditional rebinding leaves in
place. Shared by the wrapper questions (model/wrappers.py), torch.compile
(model/compiled.py) and the rules that ask which binding a loop reads."""

from __future__ import annotations

from ddpcheck.model.script import Assign, Ctx
from ddpcheck.model.values import exclusive


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
        if reaching and not all(exclusive(a.ctx, r.ctx) for r in reaching) and any(
                always_runs_before(r.ctx, ctx) for r in reaching):
            break
        reaching.append(a)
    return reaching


def always_runs_before(a: Ctx, ctx: Ctx) -> bool:
    """Every path to `ctx` passes `a` (earlier in the same function, or at
    module level for a function's read): `a` sits in no `if` arm or loop that
    `ctx` is not in too. `if use_amp: model, opt =
    amp.initialize(model, opt)` does not: the value from before it still
    reaches the code after the `if`."""
    if a.opaque:
        return False
    if a.function is not ctx.function:   # module-level code, read from a function: it all ran first
        return not a.branches and not a.loops
    arms = {(id(b.test), b.positive) for b in ctx.branches}
    return (all((id(b.test), b.positive) in arms for b in a.branches)
            and all(loop in ctx.loops for loop in a.loops))


__all__ = ["reaching_assignments", "always_runs_before"]
