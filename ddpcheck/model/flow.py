"""Value flow: what an expression may hold, followed the way a reader follows it.

The question every data and checkpoint rule asks is "which object is this?":
is the `loader` that `train()` iterates the one built with a DistributedSampler,
is the `model` that `save_checkpoint()` saves the DDP wrapper. This module
answers it once, for every rule.

    value_of(model, expr, scope) -> Value
        The objects `expr` (read in function `scope`, None: module level) may
        hold. Followed: assignments (`a = b`, tuple unpacking, `x if c else y`,
        `x or y`, chained `.cuda()` / `.to()`), returns of local functions in
        the file or in local helper modules (tuples included:
        `loader, sampler = build_loader(args)`), attributes of `self` across
        the methods of a class, namespace attributes and keys (`args.x`,
        `config.x`, `cfg["x"]`) set in another function of the file, module
        globals. A parameter stays symbolic (`Param`) in the answer; see below.

    resolved(model, value) -> Value
        `value` with the parameters of this file's functions replaced by what
        the file's own call sites pass (positional, keyword, defaults;
        `Trainer(...)` for `__init__`, `self.f(...)` for methods). A
        parameter stays a `Param` when the function is also used in a way that
        is not a call we can bind (`mp.spawn(main_worker, ...)`, a callback,
        `*args` at the call), or has no caller in the file.

    value_at(model, expr, scope) -> Value      resolved(value_of(...))

    bind(model, call, value) -> Value
        A value computed inside the function `call` lands in (in this file
        or a helper module), seen from the call: its `Param`s become what
        the call passes. This is how a value crosses into and out of a module.

    iterated(model, expr, scope) -> Value
        What a `for` over `expr` consumes: through `enumerate`, `tqdm`, `zip`,
        `iter`, `itertools.cycle`/`chain`/`islice`, `metric_logger.log_every(...)`
        and other wrappers of the loader, and through local generators
        (`def sample_data(loader): while True: for b in loader: yield b`;
        `yield from loader`).

    passes(model, fn) -> tuple[Pass, ...]
        Every complete `for` pass over a value that running `fn` performs,
        directly or in the functions it calls (the callee's parameters bound
        to the call's arguments), with the loop that repeats the pass (its
        epoch loop) when there is one on the way.

    arguments_for(model, fn, name) -> tuple[Argument, ...] | None
        The expressions the file's call sites pass for parameter `name` of
        `fn`; None when some use of `fn` cannot be bound (see `resolved`).

A Value is a frozenset of atoms:
    Made(model, site)     the result of a call ddpcheck does not look inside:
                          `DataLoader(...)`, `DistributedSampler(...)`,
                          `DDP(model)`, `Trainer(...)`, a library call
    Param(model, fn, name) a parameter whose arguments are not (all) known
    Const(value)          a literal (`True`, `0`, `"module."`, None); `constant_of()`
                          answers "which literal, for certain"
    Opaque(why)           something not followed (a literal, arithmetic, a
                          name nothing in the file assigns)

Either-or values keep every arm: `DistributedSampler(ds) if args.distributed
else RandomSampler(ds)` holds both Made atoms, and each atom's site keeps the
branches it was made under (`site.ctx`), so "distributed when the distributed
arm runs" is a question a rule can ask. Unknown stays unknown: a rule reports
from a Made atom it recognises, never from a Param or an Opaque one, and treats
`value.known is False` as "could be anything".

Every query is memoised with `@query` (model/query.py); recursion (`a = b;
b = a`, a function calling itself) answers the conservative EMPTY and is not
cached below the cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import libcst as cst

from ddpcheck.model.names import dotted_name
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, Loop, ScriptModel


# -- atoms and values ------------------------------------------------------------

@dataclass(frozen=True)
class Made:
    """The object a call returned, the call being one we do not look inside."""

    model: ScriptModel
    site: CallSite

    def __repr__(self) -> str:
        return f"Made({self.site.func or '?'}(...))"

    def is_api(self, *names: str) -> bool:
        from ddpcheck.model.values import is_api_call
        return is_api_call(self.model, self.site, *names)


@dataclass(frozen=True)
class Param:
    """A parameter of `fn` whose arguments are not (all) known here."""

    model: ScriptModel
    fn: FunctionInfo
    name: str

    def __repr__(self) -> str:
        return f"Param({self.fn.name}.{self.name})"


@dataclass(frozen=True)
class Const:
    """A literal: `True`, `0`, `"module."`, None."""

    value: object


@dataclass(frozen=True)
class Opaque:
    """A value not followed; `why` says what it was (for debugging and tests)."""

    why: str


Atom = Made | Param | Const | Opaque


@dataclass(frozen=True)
class Value:
    atoms: frozenset = frozenset()

    def __or__(self, other: "Value") -> "Value":
        if not other.atoms:
            return self
        if not self.atoms:
            return other
        return Value(self.atoms | other.atoms)

    def __bool__(self) -> bool:
        return bool(self.atoms)

    @property
    def known(self) -> bool:
        """Every atom is a Made or Const one: nothing unknown can hide in this value."""
        return bool(self.atoms) and all(isinstance(a, (Made, Const)) for a in self.atoms)

    @property
    def constant(self) -> object:
        """The literal this value certainly is, else UNKNOWN_CONSTANT."""
        if len(self.atoms) == 1:
            (atom,) = self.atoms
            if isinstance(atom, Const):
                return atom.value
        return UNKNOWN_CONSTANT

    @property
    def made(self) -> tuple[Made, ...]:
        return tuple(a for a in self.atoms if isinstance(a, Made))

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(a for a in self.atoms if isinstance(a, Param))

    def made_by(self, *names: str) -> tuple[Made, ...]:
        """The atoms made by torch's `names` (`"DataLoader"`, `"DistributedSampler"`)."""
        return tuple(a for a in self.made if a.is_api(*names))

    def holds(self, model: ScriptModel, site: CallSite) -> bool:
        return Made(model, site) in self.atoms


EMPTY = Value()
UNKNOWN_CONSTANT = object()


def union(values: Iterable[Value]) -> Value:
    atoms: set = set()
    for v in values:
        atoms |= v.atoms
    return Value(frozenset(atoms)) if atoms else EMPTY


def opaque(why: str) -> Value:
    return Value(frozenset({Opaque(why)}))


# Methods that return the object itself (or the same module moved): `DDP(m).cuda()`.
CHAIN_METHODS = frozenset({"cuda", "to", "float", "half", "bfloat16", "train", "eval", "cpu", "double",
                           "requires_grad_", "share_memory"})
# Calls whose iteration is the iteration of their arguments.
ITERATION_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "trange", "cycle", "chain", "islice",
                                "reversed", "log_every", "track", "progress_bar", "Prefetcher",
                                "DataPrefetcher", "data_prefetcher", "CudaDataLoader", "prefetch"})
# Calls that take a loader but do not iterate it: `range(len(loader))`.
NOT_ITERATING = frozenset({"range", "len", "int", "float", "str", "print", "min", "max", "isinstance",
                           "hasattr", "getattr", "type", "id", "DistributedDataParallel", "DataParallel"})
# Calls that hand the loader to a library that re-shards it and manages its sampler
# (accelerate, ignite, Lightning Fabric): what iterating the result does is theirs.
MANAGED_LOADERS = frozenset({"prepare", "prepare_data_loader", "auto_dataloader", "setup_dataloaders",
                             "distribute_dataloader"})
_ITERABLE_KEYWORDS = frozenset({"iterable", "loader", "data_loader", "dataloader", "iterator"})
_MAX_DEPTH = 8


# -- which function a name is read in ------------------------------------------

def _key(expr: cst.BaseExpression) -> str | None:
    """`x`, `self.x`, `args.x`, `cfg['x']`: the key assignments are recorded under."""
    d = dotted_name(expr)
    if d:
        return d
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        base = dotted_name(expr.value)
        idx = expr.slice[0].slice
        if base and isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString):
            return f"{base}[{idx.value.evaluated_value!r}]"
    return None


def assignments_anywhere(model: ScriptModel, key: str) -> tuple:
    """Every write of `key` in the file, whatever function it is in (for a
    namespace attribute set in one function and read in another)."""
    return _assigns_by_key(model).get(key, ())


@query(on_cycle=None)
def _assigns_by_key(model: ScriptModel) -> dict:
    by_key: dict = {}
    for a in model.assigns:
        by_key.setdefault(a.key, []).append(a)
    return {k: tuple(v) for k, v in by_key.items()}


@query(on_cycle=None)
def _call_by_func_node(model: ScriptModel) -> dict:
    return {id(c.node.func): c for c in model.calls}


def loops_in(model: ScriptModel, fn: FunctionInfo | None) -> tuple[Loop, ...]:
    """The loops whose statement is directly in `fn` (None: module level)."""
    return _loops_by_function(model).get(fn, ())


@query(on_cycle=None)
def _loops_by_function(model: ScriptModel) -> dict:
    by_fn: dict = {}
    for loop in model.loops:
        by_fn.setdefault(loop.ctx.function, []).append(loop)
    return {k: tuple(v) for k, v in by_fn.items()}


def namespace_key(key: str) -> bool:
    """`args.x`, `config.x`, `cfg['x']`: an attribute or key of an object
    other than `self`, shared by every function that holds the object."""
    return ("." in key or "[" in key) and not key.startswith("self.")


def is_param(scope: FunctionInfo | None, name: str) -> FunctionInfo | None:
    """The function (scope or one it is nested in) that has `name` as a parameter."""
    fn = scope
    while fn is not None:
        if name in fn.params:
            return fn
        fn = fn.ctx.function
    return None


# -- value_of ---------------------------------------------------------------------

@query(on_cycle=EMPTY)
def value_of(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
             stmt: cst.CSTNode | None = None) -> Value:
    """What `expr`, read in `scope`, may hold (parameters stay symbolic).
    `stmt`, the statement the read is in, when known: `loader = wrap(loader)`
    reads `loader` from before that assignment, not from it."""
    if expr is None:
        return opaque("nothing")
    if isinstance(expr, cst.IfExp):
        return value_of(model, expr.body, scope, stmt) | value_of(model, expr.orelse, scope, stmt)
    if isinstance(expr, cst.BooleanOperation):   # `sampler or None`, `a and b`
        return value_of(model, expr.left, scope, stmt) | value_of(model, expr.right, scope, stmt)
    if isinstance(expr, cst.NamedExpr):
        return value_of(model, expr.value, scope, stmt)
    if isinstance(expr, cst.Await):
        return value_of(model, expr.expression, scope, stmt)
    if isinstance(expr, cst.Call):
        return _call_value(model, expr, scope)
    literal = _literal(expr)
    if literal is not UNKNOWN_CONSTANT:
        return Value(frozenset({Const(literal)}))
    key = _key(expr)
    if key is not None:
        found = _name_value(model, key, scope, stmt)
        if isinstance(expr, cst.Subscript) and not any(isinstance(a, (Made, Param, Const)) for a in found.atoms):
            # `loaders["train"]` with `loaders = {"train": DataLoader(...), ...}`
            return entry_of(model, expr.value, expr.slice[0].slice.value.evaluated_value, scope)
        return found
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        idx = expr.slice[0].slice
        if isinstance(idx, cst.Index) and isinstance(idx.value, cst.Integer):
            return element_of(model, expr.value, idx.value.evaluated_value, scope)
    return opaque(type(expr).__name__)


@query(on_cycle=EMPTY)
def entry_of(model: ScriptModel, expr: cst.BaseExpression, name: object, scope: FunctionInfo | None) -> Value:
    """The entry `name` of the dict `expr` holds: a dict literal, or a name
    assigned one (`loaders = {"train": train_loader, "val": val_loader}`)."""
    if isinstance(expr, cst.Dict):
        for el in expr.elements:
            if isinstance(el, cst.DictElement) and _literal(el.key) == name:
                return value_of(model, el.value, scope)
        return opaque("no such entry")
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "dict":
        for a in expr.args:
            if a.keyword is not None and a.keyword.value == name:
                return value_of(model, a.value, scope)
        return opaque("no such entry")
    if isinstance(expr, cst.Call):
        site = model.site_of.get(id(expr))
        target = model.resolve_call(site) if site is not None else None
        if target is None or not target[1].returns:
            return opaque("entry of a call not followed")
        tmodel, fn = target
        return bind(model, site, union(entry_of(tmodel, ret, name, fn) for ret, _ctx in fn.returns))
    key = _key(expr)
    if key is not None:
        assigns = [a for a in model.assignments(key, scope) if a.augmented is None and a.value is not None]
        if assigns:
            return union(entry_of(model, a.value, name, a.ctx.function) for a in assigns)
    return opaque("entry")


_NAMED_CONSTANTS = {"True": True, "False": False, "None": None}


def _literal(expr: cst.BaseExpression) -> object:
    if isinstance(expr, cst.Name) and expr.value in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[expr.value]
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        try:
            return expr.evaluated_value
        except Exception:   # pragma: no cover - odd string prefixes
            return UNKNOWN_CONSTANT
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and \
            isinstance(expr.expression, (cst.Integer, cst.Float)):
        return -expr.expression.evaluated_value
    return UNKNOWN_CONSTANT


def constant_of(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None) -> object:
    """The literal `expr` certainly holds (through names, parameters and
    defaults), else UNKNOWN_CONSTANT."""
    return value_at(model, expr, scope).constant


def _in_statement(node: cst.CSTNode, stmt: cst.CSTNode | None) -> bool:
    if stmt is None:
        return False
    if node is stmt:
        return True
    return isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and any(s is node for s in stmt.body)


def _name_value(model: ScriptModel, key: str, scope: FunctionInfo | None, stmt: cst.CSTNode | None = None) -> Value:
    assigns = [a for a in model.assignments(key, scope) if a.augmented is None and not _in_statement(a.node, stmt)]
    if not assigns and "." not in key and "[" not in key:
        fn = is_param(scope, key)
        if fn is not None:
            return Value(frozenset({Param(model, fn, key)}))
    if not assigns and namespace_key(key):
        # a namespace attribute or key set in another function (`config.x = ...`
        # in setup(), read in train()): every write of it in the file
        assigns = [a for a in assignments_anywhere(model, key) if a.augmented is None]
    if not assigns:
        return opaque(f"unassigned {key}")
    values = []
    for a in assigns:
        if a.value is not None:
            values.append(value_of(model, a.value, a.ctx.function))
        elif a.unpacked is not None:
            values.append(element_of(model, a.unpacked[0], a.unpacked[1], a.ctx.function))
        else:
            values.append(opaque(f"starred {key}"))
    return union(values)


@query(on_cycle=EMPTY)
def element_of(model: ScriptModel, expr: cst.BaseExpression, index: int, scope: FunctionInfo | None) -> Value:
    """The `index`-th element of the tuple `expr` holds: a tuple literal, or a
    local function's `return a, b`."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        els = expr.elements
        if any(isinstance(e, cst.StarredElement) for e in els[: index + 1]):
            return opaque("starred element")
        return value_of(model, els[index].value, scope) if index < len(els) else opaque("short tuple")
    if isinstance(expr, cst.Call):
        site = model.site_of.get(id(expr))
        target = model.resolve_call(site) if site is not None else None
        if target is None:
            return opaque("element of a call not followed")
        tmodel, fn = target
        if not fn.returns:
            return opaque("no return")
        inner = union(element_of(tmodel, ret, index, fn) for ret, _ctx in fn.returns)
        return bind(model, site, inner)
    key = _key(expr)
    if key is not None:
        assigns = [a for a in model.assignments(key, scope) if a.augmented is None and a.value is not None]
        if assigns:
            return union(element_of(model, a.value, index, a.ctx.function) for a in assigns)
    return opaque("element")


def _call_value(model: ScriptModel, expr: cst.Call, scope: FunctionInfo | None) -> Value:
    site = model.site_of.get(id(expr))
    if site is None:
        return opaque("call")
    func = expr.func
    if isinstance(func, cst.Attribute) and func.attr.value in CHAIN_METHODS:
        return value_of(model, func.value, scope)
    target = model.resolve_call(site)
    if target is None or is_generator(target[1]) or constructs(site, target[1]):
        return Value(frozenset({Made(model, site)}))   # `Trainer(...)` runs __init__ but holds the new object
    tmodel, fn = target
    if not fn.returns:
        return opaque(f"{fn.name}() returns nothing")
    inner = union(value_of(tmodel, ret, fn) for ret, _ctx in fn.returns)
    return bind(model, site, inner)


def constructs(site: CallSite, fn: FunctionInfo) -> bool:
    """The call builds an object of `fn`'s class (`Logger(...)` resolved to
    `Logger.__init__`), not a direct `super().__init__(...)`."""
    return fn.name == "__init__" and fn.class_name is not None and site.attr != "__init__"


def is_generator(fn: FunctionInfo) -> bool:
    return bool(fn.yields)


# -- parameters ---------------------------------------------------------------------

@dataclass(frozen=True)
class Argument:
    """What one call site passes for a parameter."""

    model: ScriptModel
    call: CallSite
    expr: cst.BaseExpression | None   # None: the parameter's default applies
    scope: FunctionInfo | None         # where `expr` is read
    stmt: cst.CSTNode | None = None    # the statement it is read in


def argument_expr(call: CallSite, fn: FunctionInfo, name: str) -> tuple[bool, cst.BaseExpression | None]:
    """(bound, expr) for parameter `name` of `fn` at `call`: bound False when
    a `*args` / `**kwargs` at the call makes it unknowable; expr None when the
    default applies."""
    params = list(fn.params)
    node = call.node
    is_ctor = fn.name == "__init__" and isinstance(node.func, cst.Name)
    if fn.class_name and params and params[0] in ("self", "cls") and (call.receiver is not None or is_ctor):
        if name == params[0]:
            return False, None
        params = params[1:]
    for a in node.args:
        if a.keyword is not None and a.keyword.value == name:
            return True, a.value
    positional = [p.name.value for p in (*fn.node.params.posonly_params, *fn.node.params.params)]
    if positional and positional[0] in ("self", "cls") and len(params) < len(fn.params):
        positional = positional[1:]
    if name in positional:
        pos = positional.index(name)
        plain = []
        for a in node.args:
            if a.keyword is not None:
                continue
            if a.star:
                return False, None
            plain.append(a.value)
        if pos < len(plain):
            return True, plain[pos]
    if any(a.star == "**" for a in node.args):
        return False, None
    if any(a.star == "*" for a in node.args) and name in positional:
        return False, None
    return True, None


def _default(fn: FunctionInfo, name: str) -> cst.BaseExpression | None:
    for p in (*fn.node.params.posonly_params, *fn.node.params.params, *fn.node.params.kwonly_params):
        if p.name.value == name:
            return p.default
    return None


@query(on_cycle=None)
def arguments_for(model: ScriptModel, fn: FunctionInfo, name: str) -> tuple[Argument, ...] | None:
    """What the file's call sites pass for `fn`'s parameter `name`; None when
    some use of `fn` is not a call we can bind, or nothing calls it."""
    calls = _call_by_func_node(model)
    found = []
    for ref in model.refs_to(fn):
        call = calls.get(id(ref.node))
        if call is None:
            return None   # handed on (`mp.spawn(main_worker)`, a callback): callers unknown
        target = model.resolve_call(call) if not (fn.name == "__init__" and isinstance(call.node.func, cst.Name)) \
            else (model, fn)
        if target is None or target[1] is not fn:
            continue   # another function of the same name (a method of another class)
        bound, expr = argument_expr(call, fn, name)
        if not bound:
            return None
        if expr is None:
            default = _default(fn, name)
            if default is None:
                continue   # a required parameter not passed: not a working call
            found.append(Argument(model, call, default, fn.ctx.function))
        else:
            found.append(Argument(model, call, expr, call.ctx.function, call.stmt))
    return tuple(found) if found else None


@query(on_cycle=EMPTY)
def param_value(model: ScriptModel, fn: FunctionInfo, name: str) -> Value:
    """What parameter `name` of `fn` holds, through the file's call sites."""
    args = arguments_for(model, fn, name)
    if args is None:
        return Value(frozenset({Param(model, fn, name)}))
    return union(value_at(a.model, a.expr, a.scope, a.stmt) for a in args)


def resolved(model: ScriptModel, value: Value) -> Value:
    """`value` with the Params of `model`'s functions replaced by what the
    file's call sites pass."""
    if not value.params:
        return value
    out = []
    for atom in value.atoms:
        if isinstance(atom, Param) and atom.model is model:
            out.append(param_value(model, atom.fn, atom.name))
        else:
            out.append(Value(frozenset({atom})))
    return union(out)


def value_at(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
             stmt: cst.CSTNode | None = None) -> Value:
    return resolved(model, value_of(model, expr, scope, stmt))


def bind(model: ScriptModel, call: CallSite, value: Value) -> Value:
    """`value`, computed in the function `call` lands in, seen from `call`."""
    if not value.params:
        return value
    target = model.resolve_call(call)
    fn = target[1] if target is not None else None
    out = []
    for atom in value.atoms:
        if isinstance(atom, Param) and atom.fn is fn:
            bound, expr = argument_expr(call, fn, atom.name)
            if not bound:
                out.append(opaque(f"*args for {atom.name}"))
            elif expr is None:
                default = _default(fn, atom.name)
                out.append(value_of(atom.model, default, fn.ctx.function) if default is not None
                           else opaque(f"{atom.name} not passed"))
            else:
                out.append(value_of(model, expr, call.ctx.function, call.stmt))
        else:
            out.append(Value(frozenset({atom})))
    return union(out)


# -- iteration -------------------------------------------------------------------

def _wrapper_name(site: CallSite) -> str | None:
    if site.func is not None:
        return site.func.rpartition(".")[2]
    return site.attr


@query(on_cycle=EMPTY)
def iterated(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None) -> Value:
    """What a `for` over `expr` (read in `scope`) consumes."""
    return _consumed(model, value_of(model, expr, scope), 0)


def _consumed(model: ScriptModel, value: Value, depth: int) -> Value:
    if depth > _MAX_DEPTH:
        return opaque("too deep")
    out = []
    for atom in value.atoms:
        if not isinstance(atom, Made):
            out.append(Value(frozenset({atom})))
            continue
        m, site = atom.model, atom.site
        if atom.is_api("DataLoader"):
            out.append(Value(frozenset({atom})))
            continue
        target = m.resolve_call(site)
        if target is not None and is_generator(target[1]):
            out.append(bind(m, site, generator_consumes(*target)))
            continue
        if target is None and _wrapper_name(site) in MANAGED_LOADERS:
            out.append(opaque(f"{_wrapper_name(site)}() manages the loader"))
            continue
        if target is None and _wrapper_name(site) not in NOT_ITERATING:
            # enumerate(loader), tqdm(loader), zip(a, b), metric_logger.log_every(loader, 10), a
            # prefetcher around the loader: iterating it iterates its arguments
            args = [a.value for a in site.node.args
                    if not a.star and (a.keyword is None or a.keyword.value in _ITERABLE_KEYWORDS)]
            if _wrapper_name(site) in ITERATION_WRAPPERS or args:
                out.append(Value(frozenset({atom})))
                for a in args:
                    out.append(_consumed(m, value_of(m, a, site.ctx.function), depth + 1))
                continue
        out.append(Value(frozenset({atom})))
    return union(out)


@query(on_cycle=EMPTY)
def generator_consumes(model: ScriptModel, fn: FunctionInfo) -> Value:
    """What iterating the generator `fn` consumes: the `for` loops that feed
    its `yield`s, and what it `yield from`s (parameters stay symbolic)."""
    out = []
    for y in fn.yields:
        if y.delegates:
            out.append(iterated(model, y.value, fn))
            continue
        for loop in y.ctx.loops:
            if loop.is_for:
                out.append(iterated(model, loop.iter, fn))
    return union(out)


# -- passes --------------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    """A complete `for` over `consumed`, performed when the function it was
    asked of runs."""

    consumed: Value              # Params are those of the function asked about
    loop: Loop | None            # the `for` doing the pass (None: an `iter()` drained with `next()`)
    loop_model: ScriptModel      # the file the pass is in
    epoch: Loop | None           # the loop that repeats the pass (None: runs once here)
    epoch_model: ScriptModel | None
    via: tuple[CallSite, ...] = ()   # the calls from the asked function down to the pass
    iter_call: CallSite | None = None   # `it = iter(loader)` ... `next(it)`: the iter() call

    @property
    def source(self) -> cst.BaseExpression | None:
        """The expression the pass iterates (`loader` in `for b in loader` / `iter(loader)`)."""
        if self.loop is not None:
            return self.loop.iter
        return self.iter_call.node.args[0].value if self.iter_call is not None and self.iter_call.node.args else None


@query(on_cycle=())
def passes(model: ScriptModel, fn: FunctionInfo | None) -> tuple[Pass, ...]:
    found: list[Pass] = []
    for loop in loops_in(model, fn):
        if not loop.is_for:
            continue
        consumed = iterated(model, loop.iter, fn)
        if not consumed:
            continue
        epoch = loop.ctx.loops[-1] if loop.ctx.loops else None
        found.append(Pass(consumed, loop, model, epoch, model if epoch else None))
    found += _iter_passes(model, fn)
    for call in model.calls_in(fn):
        target = model.resolve_call(call)
        if target is None or target[1] is fn or is_generator(target[1]):
            continue
        tmodel, callee = target
        for p in passes(tmodel, callee):
            consumed = bind(model, call, p.consumed)
            if not consumed:
                continue
            if p.epoch is None and call.ctx.loops:
                found.append(Pass(consumed, p.loop, p.loop_model, call.ctx.loops[-1], model, (call,) + p.via,
                                  p.iter_call))
            else:
                found.append(Pass(consumed, p.loop, p.loop_model, p.epoch, p.epoch_model, (call,) + p.via,
                                  p.iter_call))
    # generators created here: `loader = sample_data(loader)` runs its loops when it is iterated,
    # its epoch loop (the `while True`) is its own
    for call in model.calls_in(fn):
        target = model.resolve_call(call)
        if target is None or not is_generator(target[1]):
            continue
        tmodel, gen = target
        for p in passes(tmodel, gen):
            if p.epoch is not None:
                consumed = bind(model, call, p.consumed)
                if consumed:
                    found.append(Pass(consumed, p.loop, p.loop_model, p.epoch, p.epoch_model, (call,) + p.via,
                                      p.iter_call))
    return tuple(found)


def _iter_passes(model: ScriptModel, fn: FunctionInfo | None) -> list[Pass]:
    """`it = iter(loader)` (re)made inside a loop and drained with `next(it)`
    (FixMatch's `except StopIteration: it = iter(loader)`): a full pass per
    remake. An `iter()` whose result is never `next()`-ed by name is a peek,
    not a pass."""
    found = []
    calls = model.calls_in(fn)
    nexted = {dotted_name(c.node.args[0].value) for c in calls
              if c.func == "next" and c.node.args and not c.node.args[0].star}
    if not nexted:
        return found
    for a in model.assigns_in(fn):
        if a.key not in nexted or not isinstance(a.value, cst.Call) or a.augmented is not None:
            continue
        site = model.site_of.get(id(a.value))
        if site is None or site.func != "iter" or len(site.node.args) != 1:
            continue
        consumed = iterated(model, site.node.args[0].value, fn)
        if consumed:
            epoch = site.ctx.loops[-1] if site.ctx.loops else None
            found.append(Pass(consumed, None, model, epoch, model if epoch else None, iter_call=site))
    return found


def every_pass(model: ScriptModel) -> Iterator[tuple[FunctionInfo | None, Pass]]:
    """The passes of every function of the file and of its module level, their
    parameters resolved through the file's own calls."""
    for fn in (None, *model.functions):
        for p in passes(model, fn):
            yield fn, Pass(resolved(model, p.consumed), p.loop, p.loop_model, p.epoch, p.epoch_model, p.via,
                           p.iter_call)


@query(on_cycle=())
def epoch_passes(model: ScriptModel) -> tuple[Pass, ...]:
    """`every_pass` restricted to the passes repeated by an epoch loop."""
    return tuple(p for _fn, p in every_pass(model) if p.epoch is not None)


def consumed_per_epoch(model: ScriptModel, site: CallSite) -> bool:
    """The object made by `site` (a DataLoader of this file) is iterated in
    full once per iteration of some epoch loop, through any of the flows above."""
    return any(p.consumed.holds(model, site) for p in epoch_passes(model))


__all__ = [
    "Value", "Made", "Param", "Const", "Opaque", "UNKNOWN_CONSTANT", "constant_of", "EMPTY", "Argument", "Pass",
    "value_of", "value_at", "resolved", "bind", "element_of", "entry_of", "iterated", "generator_consumes",
    "passes", "every_pass", "loops_in", "epoch_passes", "consumed_per_epoch", "is_param", "arguments_for", "assignments_anywhere", "namespace_key", "param_value", "argument_expr", "union", "is_generator",
    "CHAIN_METHODS", "ITERATION_WRAPPERS",
]
