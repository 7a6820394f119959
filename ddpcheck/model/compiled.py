"""Does a name hold a `torch.compile(...)` result at a given line?

`torch.compile(model)` returns an OptimizedModule that keeps the model as
`_orig_mod`, so its `state_dict()` keys read `_orig_mod.conv1.weight`.
In-place `model.compile()` returns None and changes no key; a compiled module
later wrapped in DDP is the wrapper's business (DDP302), and a name assigned
from anything else at the line (`model = model._orig_mod`) does not hold it."""

from __future__ import annotations

from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, Ctx, ScriptModel, owner_class
from ddpcheck.model.values import _direct_values, key_of
from ddpcheck.model.reaching import reaching_assignments

COMPILE_FUNCTIONS = ("torch.compile",)


@query(on_cycle=())
def compile_calls(model: ScriptModel) -> tuple[CallSite, ...]:
    """`torch.compile(model, ...)` calls (however torch was imported)."""
    return tuple(c for c in model.calls if c.qual in COMPILE_FUNCTIONS and c.node.args)


@query(on_cycle=None)
def compiled_held(model: ScriptModel, key: str, ctx: Ctx) -> CallSite | None:
    """The `torch.compile(...)` call whose result `key` holds at `ctx`, or None."""
    calls = [c for c in compile_calls(model) if key_of(model, c) == key]
    if key.startswith("self."):
        # `self.model` of another class is another object
        calls = [c for c in calls if owner_class(c.ctx) == owner_class(ctx)]
    if not calls:
        return None
    scope = ctx.function
    assigns = [a for a in model.assignments(key, scope) if a.augmented is None]
    if key.startswith("self.") and not any(a.ctx.function is scope and a.ctx.order < ctx.order for a in assigns):
        # set up in another method (`__init__`): compiled, unless the class unwraps it somewhere
        if any(a.value is not None and "_orig_mod" in model.module.code_for_node(a.value) for a in assigns):
            return None
        return next((c for c in calls if c.ctx.function is not scope), None)
    if key.startswith("self."):
        assigns = [a for a in assigns if a.ctx.function is scope]
    here = model.worlds(ctx)
    for a in reaching_assignments(assigns, ctx):
        if a.value is None:
            continue
        for v in _direct_values(a.value):
            for c in calls:
                if v is c.node and model.worlds(c.ctx) & here:
                    return c
    return None


__all__ = ["compile_calls", "compiled_held", "COMPILE_FUNCTIONS"]
