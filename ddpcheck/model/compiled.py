"""Does a name hold a `torch.compile(...)` result at a given line?

`torch.compile(model)` returns an OptimizedModule that keeps the model as
`_orig_mod`, so its `state_dict()` keys read `_orig_mod.conv1.weight`.
In-place `model.compile()` returns None and changes no key; a compiled module
later wrapped in DDP is the wrapper's business (DDP302), and a name assigned
from anything else at the line (`model = model._orig_mod`) does not hold it."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.flow import Member, called_qual, value_of
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, Ctx, ScriptModel, exclusive
from ddpcheck.model.guards import worlds

COMPILE_FUNCTIONS = ("torch.compile",)


@query(on_cycle=())
def compile_calls(model: ScriptModel) -> tuple[CallSite, ...]:
    """`torch.compile(model, ...)` calls (however torch was imported)."""
    return tuple(c for c in model.calls if c.qual in COMPILE_FUNCTIONS and c.node.args)


@query(on_cycle=None)
def compiled_held(model: ScriptModel, expr: cst.BaseExpression, ctx: Ctx) -> CallSite | None:
    """The `torch.compile(...)` call whose result `expr` holds where it is
    read (through any name, attribute or call of the tree), or None; none
    when the value is also what some code takes `_orig_mod` of (the author
    unwraps it)."""
    value = value_of(model, expr)
    calls = [a for a in value.made if a.site.qual in COMPILE_FUNCTIONS or
             (called_qual(a.model, a.site) or "") in COMPILE_FUNCTIONS]
    if not calls:
        return None
    if any(isinstance(a, Member) and a.name == "_orig_mod" for a in value.atoms):
        return None
    here = worlds(model, ctx)
    for atom in calls:
        if atom.model is not model or (worlds(model, atom.site.ctx) & here and not exclusive(atom.site.ctx, ctx)):
            return atom.site
    return None


__all__ = ["compile_calls", "compiled_held", "COMPILE_FUNCTIONS"]
