"""Path feasibility on correlated tests: can two places run in one pass?

`if A: if B: model = DataParallel(model)` ... `if A and B: sd =
model.module.state_dict() else: sd = model.state_dict()`: the `else` arm
never sees the wrap, since the conjunction of the nested tests is the `and`
test. The same holds across a call: `save(model, is_wrapped=env["ddp"])`
with `raw = m.module if is_wrapped else m` in `save`, and the wrap under `if
env["ddp"]:` in the caller: the `else` arm of the conditional expression
only ever holds the plain model.

Tests are split into `not` / `and` / `or` over atoms, and an atom is the same
atom at two places only when it provably holds the same value there: the
same expression, whose every read sees the same bindings (no name rebound in
between, `x = env["ddp"]` read as `env["ddp"]` where it was bound), made of
reads, constants, comparisons, arithmetic and calls that answer the same for
the whole run (`torch.cuda.device_count()`, `dist.is_initialized()`,
`int(...)`). A parameter tested in a function entered from a known call is
the argument that call passes (or the default it leaves). Anything else is
an atom of its own, unrelated to every other: unknown stays unknown, and two
places are only said never to run together when every assignment of the
atoms that lets both run contradicts itself."""

from __future__ import annotations

from itertools import product

import libcst as cst

from ddpcheck.model.dataflow import Entry
from ddpcheck.model.flow import (
    argument_expr, arguments_for, called_qual, sole_binding, store_before_call, value_of, visible_bindings,
)
from ddpcheck.model.memo import query
from ddpcheck.model.names import WRAPPER_CLASSES, dotted_name, is_torch_api, wrapper_classes_named
from ddpcheck.model.script import Ctx, ScriptModel

# Calls whose answer does not change during a run (the machine's devices, the
# launch environment, pure conversions).
_STABLE_CALLS = frozenset({
    "device_count", "is_available", "is_initialized", "get_world_size", "get_rank", "getenv",
    "int", "bool", "str", "float", "len",
})

# the most atoms whose assignments are enumerated; past it, nothing is concluded
_MAX_ATOMS = 10

_NEGATED = {cst.NotEqual: cst.Equal, cst.IsNot: cst.Is, cst.NotIn: cst.In}


class _Unique:
    """An atom related to no other (its value is not known to be shared)."""

    __slots__ = ()


class Literal:
    """One test at one place, taken (`positive`) or not: `test` read in
    `model`; `frame` = (caller's model, call, function) when `test` is read
    in `function` entered from `call`, whose parameters are then what the
    call passes."""

    __slots__ = ("model", "test", "positive", "frame")

    def __init__(self, model: ScriptModel, test: cst.BaseExpression, positive: bool, frame=None) -> None:
        self.model, self.test, self.positive, self.frame = model, test, positive, frame


def ctx_literals(model: ScriptModel, ctx: Ctx, frame=None) -> list[Literal]:
    """The tests that lead to `ctx`, each with the arm taken."""
    return [Literal(model, b.test, b.positive, frame) for b in ctx.branches]


def feasible(literals: list[Literal]) -> bool:
    """Some assignment of the atoms' truth takes every literal's arm. True
    (feasible) when it cannot be decided."""
    atoms: dict[object, int] = {}
    formulas = []
    for lit in literals:
        f = _formula(lit.model, lit.test, lit.frame, atoms, frozenset())
        formulas.append(f if lit.positive else ("not", f))
    if len(atoms) > _MAX_ATOMS:
        return True
    for values in product((False, True), repeat=len(atoms)):
        if all(_evaluate(f, values) for f in formulas):
            return True
    return False


def never_together(model: ScriptModel, a: Ctx, b: Ctx) -> bool:
    """`a` and `b` (in the same file) cannot both be reached in one pass:
    their tests contradict each other (`if A: if B: <a>` and `if A and B:
    ... else: <b>`)."""
    if not a.branches or not b.branches:
        return False
    return not _ctx_feasible_with(model, a, b)


def _evaluate(f, values) -> bool:
    kind = f[0]
    if kind == "atom":
        return values[f[1]]
    if kind == "not":
        return not _evaluate(f[1], values)
    if kind == "and":
        return all(_evaluate(x, values) for x in f[1])
    if kind == "or":
        return any(_evaluate(x, values) for x in f[1])
    return f[1]   # "const"


def _formula(model, expr, frame, atoms: dict, followed: frozenset):
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return ("not", _formula(model, expr.expression, frame, atoms, followed))
    if isinstance(expr, cst.BooleanOperation):
        parts = []
        op = type(expr.operator)
        while isinstance(expr, cst.BooleanOperation) and type(expr.operator) is op:
            parts.append(expr.right)
            expr = expr.left
        parts.append(expr)
        inner = tuple(_formula(model, p, frame, atoms, followed) for p in reversed(parts))
        return ("and" if op is cst.And else "or", inner)
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return ("const", expr.value == "True")
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and \
            type(expr.comparisons[0].operator) in _NEGATED:
        # `x != y` is `not (x == y)`, `x is not None` is `not (x is None)`
        op = _NEGATED[type(expr.comparisons[0].operator)]
        key = _comparison_key(model, expr, op, frame)
        return ("not", _atom(atoms, key))
    if frame is not None and isinstance(expr, cst.Call):
        truth = _wrapper_isinstance(model, expr, frame)
        if truth is not None:
            return ("const", truth)
    if frame is not None and isinstance(expr, cst.Name):
        # a parameter tested for truth: what the call passes, with its own tests
        arg = _argument(model, expr, frame)
        if arg is not None:
            return _formula(arg[0], arg[1], None, atoms, followed)
    if isinstance(expr, cst.Name):
        # `ddp = env["ddp"]` ... `if ddp:`: the test of what was bound, where it was bound
        b = sole_binding(model, expr)
        if b is not None and id(b) not in followed and b.kind == "assign" and b.value is not None \
                and b.augmented is None and b.path == () \
                and isinstance(b.value, (cst.BooleanOperation, cst.UnaryOperation, cst.Comparison)):
            return _formula(model, b.value, None, atoms, followed | {id(b)})
    return _atom(atoms, _key(model, expr, frame))


def _atom(atoms: dict, key):
    if key is None:
        key = _Unique()
    if key not in atoms:
        atoms[key] = len(atoms)
    return ("atom", atoms[key])


def _comparison_key(model, expr: cst.Comparison, op, frame):
    left = _key(model, expr.left, frame)
    right = _key(model, expr.comparisons[0].comparator, frame)
    if left is None or right is None:
        return None
    return ("cmp", left, op.__name__, right)


def _argument(model, name: cst.Name, frame):
    """(model, expression) a parameter read as `name` holds: the argument
    the frame's call passes, or the default it leaves; None when `name` is
    not the function's parameter as passed or the call hides it."""
    caller_model, call, fn = frame
    b = sole_binding(model, name)
    if b is None or b.kind != "param" or b.ctx.function is not fn:
        return None
    bound, arg = argument_expr(call, fn, name.value)
    if not bound:
        return None
    if arg is None:
        default = _default(fn, name.value)
        return (model, default) if default is not None else None
    return caller_model, arg


def _wrapper_isinstance(model, test: cst.Call, frame) -> bool | None:
    """`isinstance(p, C)` on a parameter `p` of the frame's function, with C
    torch's DataParallel / DistributedDataParallel (or a tuple of them): its
    truth when every object the call passes for `p` is made by one of those
    classes (`save(model)` with `model = DDP(net)` makes `isinstance(model,
    DDP)` true there); None when anything else decides it."""
    if dotted_name(test.func) != "isinstance" or len(test.args) != 2 or any(a.star for a in test.args):
        return None
    subject, classes = test.args[0].value, test.args[1].value
    kinds = wrapper_classes_named(model.imports, classes)
    arg = _argument(model, subject, frame) if kinds is not None and isinstance(subject, cst.Name) else None
    if arg is None:
        return None
    value = value_of(arg[0], arg[1])
    made = value.made
    if not made or len(made) != len(value.atoms):
        return None   # something else than objects made by calls: not known
    held = set()
    for atom in made:
        qual = called_qual(atom.model, atom.site) or ""
        if "." not in qual or not is_torch_api(qual, *WRAPPER_CLASSES):
            return None
        held.add(qual.rpartition(".")[2])
    if held <= kinds:
        return True
    return False if not held & kinds else None


def _default(fn, name: str):
    params = fn.node.params
    for p in (*params.posonly_params, *params.params, *params.kwonly_params):
        if p.name.value == name:
            return p.default
    return None


def _key(model, expr, frame):
    """What identifies the value of `expr` (see the module's docstring);
    None: a value of its own. Without a frame the answer is memoised."""
    if frame is None:
        return _value_key(model, expr)
    return _structural_key(model, expr, frame)


@query(on_cycle=None)
def _value_key(model: ScriptModel, expr: cst.BaseExpression):
    return _structural_key(model, expr, None)


def _structural_key(model, expr, frame):
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return ("const", expr.value)
    if isinstance(expr, cst.Name) and expr.value in ("None", "True", "False"):
        return ("const", expr.value)
    if isinstance(expr, cst.UnaryOperation):
        inner = _key(model, expr.expression, frame)
        return None if inner is None else ("unary", type(expr.operator).__name__, inner)
    if isinstance(expr, cst.Comparison):
        if len(expr.comparisons) != 1:
            return None
        op = type(expr.comparisons[0].operator)
        if op not in _NEGATED:
            return _comparison_key(model, expr, op, frame)
        inner = _comparison_key(model, expr, _NEGATED[op], frame)
        return None if inner is None else ("not", inner)
    if isinstance(expr, cst.BinaryOperation):
        left, right = _key(model, expr.left, frame), _key(model, expr.right, frame)
        if left is None or right is None:
            return None
        return ("bin", type(expr.operator).__name__, left, right)
    if isinstance(expr, cst.Call):
        name = (dotted_name(expr.func) or "").rpartition(".")[2]
        if name not in _STABLE_CALLS or any(a.star for a in expr.args):
            return None
        args = tuple(_key(model, a.value, frame) for a in expr.args)
        if any(a is None for a in args):
            return None
        qual = model.imports.qualify(dotted_name(expr.func) or "")
        return ("call", qual, tuple(a.keyword.value if a.keyword else None for a in expr.args), args)
    if isinstance(expr, cst.Name):
        if frame is not None:
            arg = _argument(model, expr, frame)
            if arg is not None:
                return _key(arg[0], arg[1], None)
        b = sole_binding(model, expr)
        if b is not None and b.kind == "assign" and b.value is not None and b.augmented is None and b.path == ():
            inner = _key(model, b.value, None)   # value numbering: `ddp = env["ddp"]`
            if inner is not None:
                return inner
        if b is not None and b.kind == "param" and b.ctx.function is not None:
            # `train(model, env)`: the parameter is what every call of the file passes, when that
            # is one same value (`env` of main())
            passed = arguments_for(model, b.ctx.function, expr.value)
            if passed:
                keys = {_key(a.model, a.expr, None) for a in passed}
                if len(keys) == 1 and None not in keys:
                    return keys.pop()
        seen = visible_bindings(model, expr)
        if not seen:
            return None
        return ("name", expr.value, frozenset(id(x) for x in seen))
    if isinstance(expr, (cst.Attribute, cst.Subscript)):
        return _member_key(model, expr, frame)
    return None


def _member_key(model, expr, frame):
    if isinstance(expr, cst.Attribute):
        base, member = expr.value, ("attr", expr.attr.value)
    else:
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return None
        index = _key(model, expr.slice[0].slice.value, None)
        if index is None or index[0] != "const":
            return None
        base, member = expr.value, ("item", index)
    base_key = _key(model, base, frame)
    if base_key is None:
        return None
    reach = model.reach.get(id(expr))
    if reach is None:
        return None
    # stores of the member itself on the way (`env["ddp"] = False`) make it another value
    stores = frozenset(id(b) for b in reach if not isinstance(b, Entry))
    if frame is not None:
        if stores:
            return None
        # nothing stores it in the function entered from the call: it is what the caller's
        # same member holds at the call (`train(args, g)` ... `if args.distributed:` in train)
        at_call = _stores_at_call(frame, base, expr)
        if at_call is None:
            return None
        stores = at_call
    return ("member", base_key, member, stores)


def _stores_at_call(frame, base: cst.BaseExpression, expr: cst.BaseExpression) -> frozenset | None:
    """The stores of `expr` (`args.distributed`, read in the function the
    frame's call enters, its base a parameter) that reach that call, as the
    caller spells the member (`args.distributed` for `train(args, ...)`):
    the last store of it, or of what it is read from, made before the call
    on every path to it (in no branch or loop the call is not in); frozenset()
    when nothing of the caller's function stores it; None when it cannot be told."""
    caller_model, call, fn = frame
    if not isinstance(base, cst.Name) or not isinstance(expr, cst.Attribute):
        return None
    bound, arg = argument_expr(call, fn, base.value)
    head = dotted_name(arg) if bound and arg is not None else None
    if head is None:
        return None
    known, last = store_before_call(caller_model, call, f"{head}.{expr.attr.value}")
    if not known:
        return None
    return frozenset() if last is None else frozenset({id(last)})


@query(on_cycle=True)
def _ctx_feasible_with(model: ScriptModel, a: Ctx, b: Ctx) -> bool:
    return feasible(ctx_literals(model, a) + ctx_literals(model, b))



def param_arms(model: ScriptModel, expr: cst.BaseExpression, ctx: Ctx, fn, name: str,
               _seen: frozenset = frozenset()) -> list[list[tuple[cst.BaseExpression, bool]]] | None:
    """The arms along which `expr`, read at `ctx` in `fn`, holds `fn`'s
    parameter `name` itself, each as the tests taken on the way (`raw =
    m.module if is_wrapped else m` ... `raw`: `m` only where `is_wrapped` is
    false; `if is_wrapped: m = m.module` ... `m`: the parameter as passed only
    where it is false). None: not known (the read follows it through
    something else)."""
    if not isinstance(expr, cst.Name) or id(expr) in _seen:
        return None
    reach = model.reach.get(id(expr))
    if not reach:
        return None
    arms: list[list[tuple[cst.BaseExpression, bool]]] = []
    for b in reach:
        if isinstance(b, Entry):
            return None
        if b.kind == "param":
            if b.ctx.function is not fn or b.key != name:
                return None
            arms.append(_skipped_rebinds(reach, ctx))
            continue
        if b.kind != "assign" or b.value is None or b.augmented is not None or b.path != ():
            return None
        tests = [(br.test, br.positive) for br in b.ctx.branches if br.function is fn]
        inner = _value_arms(model, b.value, b.ctx, fn, name, _seen | {id(expr)})
        if inner is None:
            return None
        arms += [tests + arm for arm in inner]
    return arms


def _skipped_rebinds(reach, ctx: Ctx) -> list[tuple[cst.BaseExpression, bool]]:
    """Where a parameter's own binding still reaches a read that an
    assignment in one arm of an `if` also reaches (`if wrapped: m =
    m.module` ... `m`): that arm was not taken, since the assignment runs
    whenever it is (no loop or `try` between them, the read after it)."""
    found = []
    mine = [(id(br.test), br.positive) for br in ctx.branches]
    for a in reach:
        if isinstance(a, Entry) or a.kind != "assign" or a.ctx.opaque or ctx.opaque:
            continue
        theirs = [(id(br.test), br.positive) for br in a.ctx.branches]
        if theirs[:len(mine)] != mine or len(theirs) != len(mine) + 1 or a.ctx.loops != ctx.loops \
                or a.ctx.order > ctx.order or a.ctx.function is not ctx.function:
            continue
        extra = a.ctx.branches[-1]
        found.append((extra.test, not extra.positive))
    return found


def _value_arms(model, value, ctx, fn, name, seen):
    if isinstance(value, cst.IfExp):
        body = _value_arms(model, value.body, ctx, fn, name, seen)
        orelse = _value_arms(model, value.orelse, ctx, fn, name, seen)
        if body is None or orelse is None:
            return None
        return [[(value.test, True)] + a for a in body] + [[(value.test, False)] + a for a in orelse]
    if isinstance(value, cst.Attribute) and value.attr.value == "module":
        return []   # the module the wrapper wraps: never the wrapper itself
    if isinstance(value, cst.Name):
        return param_arms(model, value, ctx, fn, name, seen)
    return None


__all__ = ["Literal", "ctx_literals", "feasible", "never_together", "param_arms"]
