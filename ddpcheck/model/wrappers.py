"""Does a name hold the DDP / DataParallel wrapper at a given line?

`model = DDP(model)` ... `model.state_dict()`: yes. After
`model = model.module` or a fresh `model = build()`: no. A wrap in the other
arm of an `if`, or in a world that never reaches the line (the DDP wrap under
`if args.distributed:` and the line in its `else`), does not count.
`self.model` wrapped in one method is the wrapper in the other methods of the
class (set-up runs first), unless the class unwraps it somewhere."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.flow import arguments_for, constant_of, loops_in
from ddpcheck.model.names import dotted_name
from ddpcheck.model.memo import query
from ddpcheck.model.reaching import reaching_assignments
from ddpcheck.model.reads import reads, reads_name
from ddpcheck.model.script import Assign, CallSite, Ctx, FunctionInfo, ScriptModel, owner_class
from ddpcheck.model.values import WrapInfo, _direct_values, exclusive, wraps

# Names whose reading in a test tells the wrapper apart from the model it wraps:
# `model.module if hasattr(model, "module") else model`, `isinstance(model, DDP)`.
_UNWRAP_NAMES = frozenset({"module", "isinstance", "hasattr", "DataParallel", "DistributedDataParallel", "DDP", "DP"})


def tells_wrapper_apart(model: ScriptModel, test: cst.BaseExpression) -> bool:
    """A test that tells the wrapper apart: `hasattr(model, "module")`,
    `isinstance(model, DDP)`, `model.module is not None`."""
    return any(n.rpartition(".")[2] in _UNWRAP_NAMES for n in reads(model, test))


def _unwraps(model: ScriptModel, key: str, value) -> bool:
    return reads_name(reads(model, value), f"{key}.module")


@query
def wrapper_held(model: ScriptModel, key: str, ctx: Ctx) -> WrapInfo | None:
    """The wrap whose result `key` holds at `ctx`, or None."""
    result = _wrapper_held(model, key, ctx)
    return result


def _wrapper_held(model: ScriptModel, key: str, ctx: Ctx) -> WrapInfo | None:
    candidates = [w for w in wraps(model) if w.key == key]
    if key.startswith("self."):
        # `self.model` of another class is another object
        candidates = [w for w in candidates if owner_class(w.site.ctx) == owner_class(ctx)]
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
    held = [w for w in held if model.worlds(w.site.ctx) & here and not opposite_arms(model, w.site.ctx, ctx)]
    if not held:
        return None   # no reaching assignment is a wrap (`model = model.module`, a new model)
    return next((w for w in held if w.kind == "DistributedDataParallel"), held[0])


def opposite_arms(model: ScriptModel, a: Ctx, b: Ctx) -> bool:
    """`if args.local_rank != -1: model = DDP(model)` ... later
    `if args.local_rank != -1: ... else: <here>`: two `if`s with the same test,
    `a` in the true arm of one and `b` in the false arm of the other."""
    arms = {model.module.code_for_node(br.test): br.positive for br in a.branches}
    return any(arms.get(model.module.code_for_node(br.test), br.positive) != br.positive for br in b.branches)




# -- through parameters ------------------------------------------------------------

@query(on_cycle=None)
def wrapper_passed(model: ScriptModel, fn: FunctionInfo, param: str) -> tuple[WrapInfo, CallSite] | None:
    """A call in the file hands the wrapper to `fn` as `param`
    (`save_checkpoint(model, path)` right after `model = DDP(model)`): the
    wrap and the call. Followed up through callers that pass their own
    parameter on. None when no caller visibly passes the wrapper."""
    for arg in arguments_for(model, fn, param) or ():
        if arg.expr is None or arg.model is not model:
            continue
        found = wrapper_in(model, arg.expr, arg.call.ctx)
        if found is not None:
            return found[0], arg.call
    return None


def wrapper_in(model: ScriptModel, expr: cst.BaseExpression, ctx: Ctx) -> tuple[WrapInfo, CallSite | None] | None:
    """The wrapper `expr` holds at `ctx`: a name holding it there, or a
    parameter some caller passes it to. (wrap, the call that passed it)."""
    key = dotted_name(expr)
    if key is None:
        return None
    fn = ctx.function
    if "." not in key and fn is not None and key in fn.params and \
            not [a for a in model.assignments(key, fn) if a.ctx.function is fn]:
        # a parameter shadows a module-level name of the same spelling: only its callers tell
        return wrapper_passed(model, fn, key)
    held = wrapper_held(model, key, ctx)
    if held is not None:
        return held, None
    return _through_alias(model, key, ctx)


def _through_alias(model: ScriptModel, key: str, ctx: Ctx, depth: int = 0) -> tuple[WrapInfo, CallSite | None] | None:
    """`model_ = model` then `model_.state_dict()`: the alias holds what the
    name it copies held there (every reaching assignment must be such a copy)."""
    if depth > 3 or key.startswith("self."):
        return None
    reaching = reaching_assignments(
        [a for a in model.assignments(key, ctx.function) if a.augmented is None], ctx)
    if not reaching or not all(isinstance(a.value, (cst.Name, cst.Attribute)) for a in reaching):
        return None
    found = [wrapper_in(model, a.value, a.ctx) for a in reaching]
    return found[0] if found[0] is not None and all(f is not None for f in found) else None


# -- renaming the keys -------------------------------------------------------------

PREFIX = "module."
_STRIP_METHODS = {"replace", "removeprefix", "lstrip", "split", "partition"}
_STRIP_FUNCTIONS = {"consume_prefix_in_state_dict_if_present", "remove_prefix", "strip_prefix",
                    "remove_module_prefix", "strip_module_prefix", "unwrap_state_dict"}


def _is_prefix(model: ScriptModel, expr: cst.BaseExpression | None, scope) -> bool:
    if expr is None:
        return False
    value = constant_of(model, expr, scope)
    return isinstance(value, str) and value in (PREFIX, "module", "^module\\.", "module\\.", r"^module.")


def _len_of_prefix(model: ScriptModel, expr: cst.BaseExpression, scope) -> bool:
    """`7` or `len("module.")` (or `len(prefix)` with `prefix = "module."`)."""
    if constant_of(model, expr, scope) == len(PREFIX):
        return True
    return (isinstance(expr, cst.Call) and dotted_name(expr.func) == "len" and len(expr.args) == 1
            and _is_prefix(model, expr.args[0].value, scope))


def renames_key(model: ScriptModel, key: cst.BaseExpression, scope) -> bool:
    """A key expression that drops DDP's `module.` prefix: `k[7:]`,
    `k[len("module."):]`, `k.replace("module.", "")`, `k.removeprefix("module.")`,
    `k.split("module.")[-1]`, `re.sub(r"^module\\.", "", k)`, or a conditional
    one of these (`k[7:] if k.startswith("module.") else k`)."""
    if isinstance(key, cst.IfExp):
        return renames_key(model, key.body, scope) or renames_key(model, key.orelse, scope)
    if isinstance(key, cst.Subscript) and len(key.slice) == 1:
        sl = key.slice[0].slice
        if isinstance(sl, cst.Slice) and sl.lower is not None and _len_of_prefix(model, sl.lower, scope):
            return True
        return renames_key(model, key.value, scope)   # `k.split("module.")[-1]`
    if isinstance(key, cst.Call):
        func = key.func
        if isinstance(func, cst.Attribute) and func.attr.value in _STRIP_METHODS and key.args:
            return _is_prefix(model, key.args[0].value, scope)
        name = dotted_name(func) or ""
        if name.rpartition(".")[2] == "sub" and key.args:
            return _is_prefix(model, key.args[0].value, scope)
        if name.rpartition(".")[2] in _STRIP_FUNCTIONS:
            return True
    if isinstance(key, cst.Name):
        # `name = k[7:]` ... `{name: v}`: the key was renamed on its own line
        return any(a.value is not None and renames_key(model, a.value, a.ctx.function)
                   for a in model.assignments(key.value, scope))
    return False


def strips_prefix(model: ScriptModel, expr: cst.BaseExpression, scope) -> bool:
    """`expr` is a state dict whose keys lost the `module.` prefix: a dict
    comprehension renaming its keys, a helper that strips it, or a name
    holding one (or handed to torch's `consume_prefix_in_state_dict_if_present`)."""
    if isinstance(expr, cst.DictComp):
        return renames_key(model, expr.key, scope)
    if isinstance(expr, cst.Call):
        name = (dotted_name(expr.func) or "").rpartition(".")[2]
        if name in _STRIP_FUNCTIONS:
            return True
        if name in ("OrderedDict", "dict") and expr.args and isinstance(expr.args[0].value, (cst.GeneratorExp, cst.ListComp)):
            elt = expr.args[0].value.elt
            return isinstance(elt, cst.Tuple) and bool(elt.elements) and renames_key(model, elt.elements[0].value, scope)
        return False
    key = dotted_name(expr)
    if key is None:
        return False
    if key in _handed_to_strip(model, scope):
        return True
    if _filled_renamed(model, key, scope):
        return True
    assigns = [a for a in model.assignments(key, scope) if a.value is not None and a.augmented is None]
    return bool(assigns) and all(strips_prefix(model, a.value, a.ctx.function) for a in assigns)


@query(on_cycle=frozenset())
def _handed_to_strip(model: ScriptModel, scope) -> frozenset[str]:
    """Names handed to a prefix-stripping function in `scope`
    (`consume_prefix_in_state_dict_if_present(state_dict, "module.")`)."""
    return frozenset(dotted_name(c.node.args[0].value) for c in model.calls_in(scope)
                     if c.attr in _STRIP_FUNCTIONS and c.node.args and dotted_name(c.node.args[0].value))


def _filled_renamed(model: ScriptModel, key: str, scope) -> bool:
    """`for k, v in sd.items(): new_sd[k[7:]] = v`: a dict filled key by key
    under renamed keys."""
    for loop in loops_in(model, scope):
        if not loop.is_for:
            continue
        body = loop.node.body
        stmts = body.body if isinstance(body, cst.IndentedBlock) else ()
        for stmt in stmts:
            smalls = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()
            for small in smalls:
                if not isinstance(small, cst.Assign):
                    continue
                for t in small.targets:
                    target = t.target
                    if isinstance(target, cst.Subscript) and dotted_name(target.value) == key and \
                            len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index) and \
                            renames_key(model, target.slice[0].slice.value, scope):
                        return True
    return False


__all__ = ["wrapper_held", "wrapper_passed", "wrapper_in", "renames_key", "strips_prefix",
           "tells_wrapper_apart", "opposite_arms"]
