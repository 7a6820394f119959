"""Value flow: what an expression can hold, by Python's own semantics.

The question every data and checkpoint rule asks is "which object is this?":
is the `loader` that `train()` iterates the one built with a DistributedSampler,
is the `model` that `save_checkpoint()` saves the DDP wrapper. This module
answers it once, for every rule, on top of the reaching definitions the
builder records (model/dataflow.py).

    value_of(model, expr) -> Value
        The objects `expr` may hold where it is read. A name holds what the
        bindings reaching that read bind (flow-sensitive: branches merge,
        loops at their fixed point); a name bound in no enclosing scope on a
        path is looked up where it lives (the enclosing function, the module,
        the builtins). An attribute or key holds what its own bindings
        reaching the read bind, else what the object holds under that name:
        the attributes of an instance of a class of the tree are the
        bindings of `self.<name>` in the methods of its class and its bases
        (across modules), and of `obj.<name>` where `obj` holds it; a dict's
        entries are its literal's and the `d["k"] = v` stores into it.
        A call holds what the function it runs returns, its parameters bound
        to the arguments (positional, keyword, defaults, `*args` / `**kwargs`
        at the call and in the definition); a class call holds a new object
        of the class (allocation site: the call); a library call a new object
        made there, except the library methods that return their receiver
        (model/library.py: `model = model.eval()` keeps the model).
        Parameters stay symbolic (`Param`).

    value_at(model, expr) -> Value       value_of with the parameters of this
        file's functions replaced by what the file's own call sites pass.

    call_targets(model, site) / resolve_call(model, site) -> the functions of
        the tree a call runs: a function (through any alias: `step = train;
        step()`), a method through the class hierarchy of its receiver (across
        modules), a constructor (`__init__`, inherited too), `__call__` of an
        object, `super()`; imports resolved the way Python resolves them
        (model/project.py).

    iterated(model, expr) / passes(model, fn) / ...: what a `for` consumes.

A Value is a frozenset of atoms. Known objects: `Made` (made by a call the
engine does not look inside: a library call, or a class of the tree being
instantiated), `Const`, `Func`, `Class`, `Lib` (a library name), `Module`,
`Bound` (a method of the tree bound to its object), `Seq` (a tuple or list),
`Mapping` (a dict), `Super`, `Imported` (a name imported from a module, not
looked up until needed). Unknown: `Param` (a parameter whose arguments are
not all known), `Member` (an attribute of an object the engine does not
model: a library object's), `Opaque` (anything else). Unknown stays unknown:
`value.known` is False as soon as one atom is unknown, and rules never
report from an unknown value.

Every question is memoised once per run (model/memo.py); recursion (`a = b;
b = a`, a function calling itself) is a fixed point, never a depth limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import libcst as cst

from ddpcheck.model.dataflow import Entry
from ddpcheck.model.library import (
    BUILTINS, CLASS_METHOD, DUNDER_BUILTINS, ELEMENTS_OF_FIRST, ENTER_RETURNS_SELF, ITERABLE_KEYWORDS, ITERATION_WRAPPERS, MANAGED_LOADERS,
    NOT_ITERATING, PROPERTY, RETURNS_COPY_OF_FIRST_ARGUMENT, RETURNS_FIRST_ARGUMENT, RETURNS_RECEIVER, STATIC,
)
from ddpcheck.model.memo import keep, known, query
from ddpcheck.model.names import dotted_name, is_torch_api
from ddpcheck.model.reads import reads
from ddpcheck.model.scan import Need
from ddpcheck.model.script import CallSite, ClassInfo, Ctx, FunctionInfo, Loop, ScriptModel


# -- atoms and values ------------------------------------------------------------

@dataclass(frozen=True)
class Made:
    """The object a call made, the call being one whose result the engine
    does not look inside: a library call, or a class of the tree instantiated
    (the allocation site of that object)."""

    model: ScriptModel
    site: CallSite

    def __repr__(self) -> str:
        return f"Made({self.site.func or '?'}(...))"

    def is_api(self, *names: str) -> bool:
        return is_api_call(self.model, self.site, *names)


def _site_order(atom: Made) -> tuple[str, int]:
    return atom.model.path, atom.site.ctx.order


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


@dataclass(frozen=True)
class Func:
    """A function of the tree (not bound to an object)."""

    model: ScriptModel
    fn: FunctionInfo

    def __repr__(self) -> str:
        return f"Func({self.fn.qualname})"


@dataclass(frozen=True)
class Class:
    """A class of the tree."""

    model: ScriptModel
    cls: ClassInfo

    def __repr__(self) -> str:
        return f"Class({self.cls.name})"


@dataclass(frozen=True)
class Lib:
    """A library module, function or class, by its qualified name
    (`torch.utils.data.DataLoader`), or a builtin (`enumerate`)."""

    qual: str


@dataclass(frozen=True)
class Imported:
    """`from pkg.mod import name` (names: ("name",)), `import pkg.mod` (no
    names), and attributes read from them, before the module is looked up:
    looking it up may mean parsing it, which is done only when a question
    needs what it holds."""

    model: ScriptModel
    module: str
    level: int
    names: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Imported({'.' * self.level}{self.module}:{'.'.join(self.names)})"


@dataclass(frozen=True)
class Module:
    """A module of the tree."""

    model: ScriptModel


@dataclass(frozen=True)
class Bound:
    """A method of a class of the tree, bound to an object (`self.save`, `trainer.fit`)."""

    receiver: object
    model: ScriptModel
    fn: FunctionInfo

    def __repr__(self) -> str:
        return f"Bound({self.fn.qualname})"


@dataclass(frozen=True)
class Member:
    """An attribute of an object the engine does not model (a library
    object's method, an argparse namespace's option): unknown as a value,
    but a call of it is known by its name (`parser.add_argument`)."""

    receiver: object
    name: str


@dataclass(frozen=True)
class Item:
    """The entry `key` (a str) or element `key` (an int) of an object not
    known here (a parameter): looked up again once the object is known."""

    receiver: object
    key: object


@dataclass(frozen=True)
class Dispatch:
    """`self.name(...)` at `site` in a method: which method runs depends on
    the class of the object `self` holds (an override in a subclass wins).
    Its static answer is what `method` (found from the method's own class,
    in `fmodel`) returns; once `param` (the `self`) is bound to a known
    object, the call is looked up again on that object's class."""

    model: ScriptModel
    site: CallSite
    name: str
    param: Param
    fmodel: ScriptModel
    method: FunctionInfo

    @property
    def static(self) -> "Value":
        return _static_result(self.model, self.site, self.fmodel, self.method, self.param)


@dataclass(frozen=True, eq=False)
class Seq:
    """A tuple or list made at `node`; `items` None when its length or
    elements are not known (a starred element)."""

    model: ScriptModel
    node: cst.CSTNode
    items: tuple["Value", ...] | None


@dataclass(frozen=True, eq=False)
class Mapping:
    """A dict made at `node` (a literal, `dict(...)`, the `**kwargs` of a
    call); `entries` its literal entries; `open` when some entries are not
    known (`{**other}`)."""

    model: ScriptModel
    node: cst.CSTNode | None
    entries: tuple[tuple[object, "Value"], ...]
    open: bool = False


@dataclass(frozen=True)
class Super:
    """`super()` in a method of `cls`, for the object `receiver`."""

    model: ScriptModel
    cls: ClassInfo
    receiver: object


_KNOWN = (Made, Const, Func, Class, Lib, Imported, Module, Bound, Seq, Mapping, Super)


class Value:
    """What an expression can hold: a frozenset of atoms."""

    __slots__ = ("atoms",)

    def __init__(self, atoms: frozenset = frozenset()) -> None:
        self.atoms = atoms

    def __repr__(self) -> str:
        return f"Value({set(self.atoms) or '{}'})"

    def __eq__(self, other: object) -> bool:
        return type(other) is Value and self.atoms == other.atoms

    def __hash__(self) -> int:
        return hash(self.atoms)

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
        """Every atom is an object the engine knows: nothing unknown can hide in this value."""
        return bool(self.atoms) and all(isinstance(a, _KNOWN) for a in self.atoms)

    @property
    def constant(self) -> object:
        """The literal this value certainly is, else UNKNOWN_CONSTANT."""
        if len(self.atoms) == 1:
            (atom,) = self.atoms
            if type(atom) is Const:
                return atom.value
        return UNKNOWN_CONSTANT

    @property
    def made(self) -> tuple[Made, ...]:
        """The objects made by calls, in the order of their calls in the source
        (the atoms are a set ordered by identity: a rule naming the first of two
        loaders names the same one on every run)."""
        return tuple(sorted((a for a in self.atoms if type(a) is Made), key=_site_order))

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(a for a in self.atoms if type(a) is Param)

    def made_by(self, *names: str) -> tuple[Made, ...]:
        """The atoms made by torch's `names` (`"DataLoader"`, `"DistributedSampler"`)."""
        return tuple(a for a in self.made if a.is_api(*names))

    def holds(self, model: ScriptModel, site: CallSite) -> bool:
        return Made(model, site) in self.atoms


EMPTY = Value()
UNKNOWN_CONSTANT = object()


def union(values: Iterable[Value]) -> Value:
    first = None
    atoms: set | None = None
    for v in values:
        if not v.atoms:
            continue
        if first is None:
            first = v
        elif atoms is None:
            if v.atoms <= first.atoms:
                continue
            atoms = set(first.atoms)
            atoms |= v.atoms
        else:
            atoms |= v.atoms
    if atoms is not None:
        return Value(frozenset(atoms))
    return first if first is not None else EMPTY


def just(atom) -> Value:
    return Value(frozenset((atom,)))


def opaque(why: str) -> Value:
    return just(Opaque(why))


_NAMED_CONSTANTS = {"True": True, "False": False, "None": None}


def _literal(expr: cst.BaseExpression) -> object:
    if isinstance(expr, cst.Name) and expr.value in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[expr.value]
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        try:
            return expr.evaluated_value
        except Exception:   # pragma: no cover - odd string prefixes
            return UNKNOWN_CONSTANT
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and \
            isinstance(expr.expression, (cst.Integer, cst.Float)):
        return -expr.expression.evaluated_value
    return UNKNOWN_CONSTANT


# -- indexes of a model's facts ----------------------------------------------------

@query(on_cycle={})
def _functions_by_node(model: ScriptModel) -> dict[int, FunctionInfo]:
    return {id(f.node): f for f in model.functions}


@query(on_cycle={})
def _sites_by_func(model: ScriptModel) -> dict[int, CallSite]:
    return {id(c.node.func): c for c in model.calls}


@query(on_cycle={})
def _local_bindings(model: ScriptModel) -> dict[tuple[FunctionInfo, str], tuple]:
    """(function, name) -> the bindings of a plain name that make it local to
    the function (comprehension and lambda variables, class-body names and
    names declared global are not the function's locals)."""
    found: dict = {}
    for b in model.bindings:
        fn = b.ctx.function
        if fn is None or b.kind in ("comp", "lambda") or b.ctx.class_name is not None:
            continue
        if "." in b.key or "[" in b.key or b.key in fn.declared_global:
            continue
        found.setdefault((fn, b.key), []).append(b)
    return {k: tuple(v) for k, v in found.items()}


@query(on_cycle={})
def _global_bindings(model: ScriptModel) -> dict[str, tuple]:
    """Bindings of module names made in functions that declare them `global`."""
    found: dict = {}
    for b in model.bindings:
        fn = b.ctx.function
        if fn is not None and b.key in fn.declared_global:
            found.setdefault(b.key, []).append(b)
    return {k: tuple(v) for k, v in found.items()}


@query(on_cycle={})
def _bindings_by_key(model: ScriptModel) -> dict[str, tuple]:
    found: dict = {}
    for b in model.bindings:
        found.setdefault(b.key, []).append(b)
    return {k: tuple(v) for k, v in found.items()}


def bindings_of(model: ScriptModel, key: str) -> tuple:
    """Every binding of `key` in the file, in whatever function."""
    return _bindings_by_key(model).get(key, ())


@query(on_cycle={})
def _stores_by_member(model: ScriptModel) -> dict[str, tuple]:
    """`.name` / `['name']` -> the assignments `obj.name = v` / `obj['name'] = v`
    of the file whose target is an attribute or key of a plain name."""
    found: dict = {}
    for a in model.assigns:
        target = a.target
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
            found.setdefault("." + target.attr.value, []).append(a)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and "[" in a.key:
            found.setdefault(a.key[a.key.index("["):], []).append(a)
    return {k: tuple(v) for k, v in found.items()}


# -- value_of ---------------------------------------------------------------------

def value_of(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None = None,
             stmt: cst.CSTNode | None = None) -> Value:
    """What `expr` may hold where it is read (parameters stay symbolic).
    `scope` and `stmt` are not needed: a read knows its place."""
    if expr is None:
        return opaque("nothing")
    return settled(_value(model, expr))


def settled(value: Value, _settling: frozenset = frozenset()) -> Value:
    """`value` with the calls whose method depends on a still unknown `self`
    (Dispatch) replaced by the method of the class they are written in.
    A call met again while its own answer is being settled
    (`self.opt = self.build(self.opt)` with `build` returning its argument)
    adds nothing beyond the other answers (as a cycle does for the memo)."""
    if not any(isinstance(a, Dispatch) for a in value.atoms):
        return value
    return union((EMPTY if a in _settling else settled(a.static, _settling | {a})) if isinstance(a, Dispatch)
                 else just(a) for a in value.atoms)


@query(on_cycle=EMPTY)
def _value(model: ScriptModel, expr: cst.BaseExpression) -> Value:
    kind = type(expr)
    if kind is cst.Name:
        name = expr.value
        if name in _NAMED_CONSTANTS:
            return just(Const(_NAMED_CONSTANTS[name]))
        return _read(model, expr, name)
    if kind is cst.Attribute:
        return _read(model, expr, None)
    if kind is cst.Call:
        return _call_value(model, expr)
    if kind is cst.Subscript:
        return _subscript_value(model, expr)
    if kind is cst.IfExp:
        return _value(model, expr.body) | _value(model, expr.orelse)
    if kind is cst.BooleanOperation:   # `sampler or None`, `a and b`
        return _value(model, expr.left) | _value(model, expr.right)
    if kind in (cst.Tuple, cst.List):
        return just(Seq(model, expr, _items(model, expr.elements)))
    if kind is cst.Dict:
        return just(_dict_literal(model, expr))
    if kind is cst.DictComp:   # a dict made here, its keys not known one by one
        return just(Mapping(model, expr, (), True))
    if kind is cst.NamedExpr:
        return _value(model, expr.value)
    if kind is cst.Await:
        return _value(model, expr.expression)
    literal = _literal(expr)
    if literal is not UNKNOWN_CONSTANT:
        return just(Const(literal))
    return opaque(kind.__name__)


def _items(model: ScriptModel, elements) -> tuple[Value, ...] | None:
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    return tuple(_value(model, e.value) for e in elements)


def _dict_literal(model: ScriptModel, expr: cst.Dict) -> Mapping:
    entries: list = []
    open_ = False
    for el in expr.elements:
        if isinstance(el, cst.DictElement):
            key = _literal(el.key)
            if key is UNKNOWN_CONSTANT:
                open_ = True
                continue
            entries.append((key, _value(model, el.value)))
        else:   # `**other`: its entries when it is a known dict
            inner = _value(model, el.value)
            maps = [a for a in inner.atoms if isinstance(a, Mapping)]
            if len(maps) != len(inner.atoms) or not maps:
                open_ = True
            for m in maps:
                entries.extend(_mapping_entries(m))
                open_ = open_ or m.open
    return Mapping(model, expr, tuple(entries), open_)


def _read(model: ScriptModel, node: cst.BaseExpression, name: str | None) -> Value:
    """A name (`name`) or a dotted name read at `node`: the bindings reaching
    it, and where a path reaches it unbound, what it holds where it lives."""
    reach = model.reach.get(id(node))
    if reach is None:
        if name is None and isinstance(node, cst.Attribute):
            return _attribute(model, _value(model, node.value), node.attr.value)
        return opaque("not walked")
    out = []
    for b in reach:
        if isinstance(b, Entry):
            if name is not None:
                out.append(_outer_value(model, name, b))
            else:
                out.append(_member_read(model, node, b))
        else:
            out.append(binding_value(model, b))
    return union(out)


def _member_read(model: ScriptModel, node: cst.BaseExpression, entry: Entry) -> Value:
    """`a.b` / `a['k']` with no binding of it reaching the read: the object's attribute or entry."""
    if isinstance(node, cst.Attribute):
        found = _attribute(model, _value(model, node.value), node.attr.value)
        member = "." + node.attr.value
    else:
        found = _entry(model, _value(model, node.value), _subscript_key(node))
        member = _subscript_member(node)
    if not found.known and member is not None:
        # an object the engine does not model (a parameter, a library namespace): every store
        # of the same name in the file, as `config.x = ...` in setup() read in train()
        key = dotted_name(node) if isinstance(node, cst.Attribute) else None
        if key is None:
            base = dotted_name(node.value)
            key = f"{base}{member}" if base else None
        if key is not None and namespace_key(key):
            same = [b for b in bindings_of(model, key) if b.ctx.function is not entry.scope
                    and getattr(b, "augmented", None) is None]
            found = found | union(binding_value(model, b) for b in same)
    return found


def _subscript_key(node: cst.Subscript) -> object:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return UNKNOWN_CONSTANT
    return _literal(node.slice[0].slice.value)


def _subscript_member(node: cst.Subscript) -> str | None:
    key = _subscript_key(node)
    return f"[{key!r}]" if isinstance(key, str) else None


def _subscript_value(model: ScriptModel, expr: cst.Subscript) -> Value:
    key = _subscript_key(expr)
    if isinstance(key, str) and id(expr) in model.reach:
        return _read(model, expr, None)
    base = _value(model, expr.value)
    if key is UNKNOWN_CONSTANT:
        return opaque("subscript")
    if isinstance(key, int) and not isinstance(key, bool):
        return element(model, base, key)
    return _entry(model, base, key)


@query(on_cycle=EMPTY)
def binding_value(model: ScriptModel, b) -> Value:
    """What a binding binds (model/script.py's Assign and Binding)."""
    kind = b.kind
    if kind == "assign":
        if b.augmented is not None:
            return opaque(f"{b.key} {b.augmented}")
        if b.path is None:
            return opaque("starred target")
        node = b.node
        value_expr = node.value if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)) else None
        if value_expr is None:
            return opaque("no value")
        return element_path(model, _value(model, value_expr), b.path)
    if kind == "param":
        return just(Param(model, b.ctx.function, b.key))
    if kind == "for":
        return _target_value(model, iteration_element(model, _value(model, b.node.iter)), b.path)
    if kind == "comp":
        return _target_value(model, iteration_element(model, _value(model, b.node.iter)), b.path)
    if kind == "import":
        return just(_import_atom(model, b.node))
    if kind == "def":
        fn = _functions_by_node(model).get(id(b.node))
        return just(Func(model, fn)) if fn is not None else opaque("def")
    if kind == "class":
        cls = model.class_of_node.get(id(b.node))
        return just(Class(model, cls)) if cls is not None else opaque("class")
    if kind == "walrus":
        return _value(model, b.node.value)
    if kind == "with":
        return _target_value(model, _entered(model, _value(model, b.node.item)), b.path)
    return opaque(kind)


def _target_value(model: ScriptModel, value: Value, path) -> Value:
    if path is None:
        return opaque("starred target")
    return element_path(model, value, path)


def _import_atom(model: ScriptModel, alias: cst.ImportAlias) -> Imported:
    """The value an import binds: `import a.b` binds `a`, `import a.b as c`
    binds `a.b`, `from .m import n` binds `n` of `.m`."""
    full = dotted_name(alias.name) or ""
    statement = model.import_of_alias.get(id(alias))
    if isinstance(statement, cst.ImportFrom):
        module = dotted_name(statement.module) if statement.module is not None else ""
        return Imported(model, module or "", len(statement.relative), (full,))
    if alias.asname is not None:
        return Imported(model, full, 0, ())
    return Imported(model, full.split(".")[0], 0, ())


def _outer_value(model: ScriptModel, name: str, entry: Entry) -> Value:
    """A plain name reaching the start of its scope unbound: an unbound local
    (nothing), or the name of an enclosing function, the module or the builtins."""
    fn = entry.scope
    locals_ = _local_bindings(model)
    if not entry.closure:
        if fn is None:
            return _builtin(model, name)
        if (fn, name) in locals_:
            return EMPTY   # UnboundLocalError on this path
        if name in fn.declared_global:
            return module_name_value(model, name)
        fn = fn.ctx.function
    while fn is not None:
        found = locals_.get((fn, name))
        if found:
            return union(binding_value(model, b) for b in found)   # a closure reads it when it runs
        fn = fn.ctx.function
    return module_name_value(model, name)


@query(on_cycle=EMPTY)
def module_name_value(model: ScriptModel, name: str) -> Value:
    """What a module-level name holds once the module has run (for a function
    reading it, and for another module importing it)."""
    found = model.module_end.get(name)
    extra = _global_bindings(model).get(name, ())
    if found is None and not extra:
        return _builtin(model, name)
    out = [binding_value(model, b) for b in extra]
    for b in found or ():
        out.append(_builtin(model, name) if isinstance(b, Entry) else binding_value(model, b))
    return union(out)


def _builtin(model: ScriptModel, name: str) -> Value:
    """A name no binding of the file gives: a name a star import brings from
    a module of the tree, a builtin, or one from a library's star import."""
    for star in model.imports.star_modules:
        module = star.lstrip(".")
        level = len(star) - len(module)
        path = model.project.find_module(model.path, module, level)
        scanned = model.project.scan_of(path) if path is not None else None
        if scanned is not None and name in scanned.bound:
            return just(Imported(model, module, level, (name,)))
    if name in BUILTINS:
        return just(Lib(name))
    if model.imports.star_modules:
        return just(Lib(name))   # from a library's star import: named, provenance unknown
    return opaque(f"unassigned {name}")


# -- imports -----------------------------------------------------------------------

@query(on_cycle=EMPTY)
def resolve_import(model: ScriptModel, imported: Imported, needs: Need = (), assigned: bool = False) -> Value:
    """What an Imported reference is: a Module, a Func, a Class, a value of
    a module of the tree, or a Lib for a library (`model`: the file the
    import is in). With `needs`: a module of the tree that cannot reach what
    the asker looks for is not parsed (the answer is then Opaque).
    `assigned`: also a name a module-level assignment binds (a constant of a
    config module), which callers that look for functions and classes skip
    without parsing the module. Re-exports are followed."""
    return resolved_atoms(_resolve_import(imported, needs, assigned), needs, assigned)


def _resolve_import(imported: Imported, needs: Need, assigned: bool) -> Value:
    model = imported.model
    project = model.project
    module, level, names = imported.module, imported.level, imported.names
    path = project.find_module(model.path, module, level)
    qual = ".".join(p for p in (module, *names) if p)
    # the longest prefix of `names` that is a submodule: `from pkg import sub` then `sub.f`;
    # also of a namespace package, a folder with no __init__.py (`from torch_utils import
    # distributed` with torch_utils/distributed.py), which Python 3 imports as well
    consumed = 0
    for i in range(len(names), 0, -1):
        sub = ".".join(p for p in (module, *names[:i]) if p)
        found = project.find_module(model.path, sub, level)
        if found is not None and not _package_binds(project, model, module, names[:i], level):
            path, consumed = found, i
            break
    if path is None:
        if level == 0:
            return just(Lib(qual))
        return opaque(f"module {'.' * level}{module} not found")
    rest = names[consumed:]
    if rest:
        # a scan of its text first: a module that neither defines nor imports the name (a
        # constant unless the asker wants any value, a typo), or cannot reach what the asker
        # looks for, is never parsed
        scanned = project.scan_of(path)
        if scanned is None or rest[0] not in scanned.bound and not (assigned and rest[0] in scanned.assigned):
            return opaque(f"{rest[0]} is not a function or class of {qual}")
        if needs and not project.reaches(str(path), scanned, needs):
            return opaque("module cannot reach what is asked")
    target = project.model_for(path)
    if target is None:
        return opaque(f"module {qual} not read")
    if not rest:
        return just(Module(target))
    value = module_name_value(target, rest[0])
    for name in rest[1:]:
        value = _attribute(target, value, name)
    return value


def _package_binds(project, model: ScriptModel, module: str, names: tuple[str, ...], level: int) -> bool:
    """The package holding submodule `module.names` binds the submodule's
    name itself in its `__init__.py` (`from .launch import launch`): as in
    Python, `from pkg import launch` then gets that binding, the function,
    not the submodule its import shadowed."""
    parent = project.find_module(model.path, ".".join(p for p in (module, *names[:-1]) if p), level)
    if parent is None or parent.name != "__init__.py":
        return False
    scanned = project.scan_of(parent)
    # `from .launch import launch` (a name from inside the submodule) shadows it; `from . import
    # utils` binds the submodule itself
    return scanned is not None and names[-1] in scanned.bound and any(
        name == names[-1] and mod.rpartition(".")[2] == names[-1] for mod, _level, name in scanned.sources)


def resolved_atoms(value: Value, needs: Need = (), assigned: bool = False) -> Value:
    """`value` with its Imported atoms looked up."""
    if not any(isinstance(a, Imported) for a in value.atoms):
        return value
    return union(resolve_import(a.model, a, needs, assigned) if isinstance(a, Imported) else just(a)
                 for a in value.atoms)


# -- attributes --------------------------------------------------------------------

def _attribute(model: ScriptModel, value: Value, name: str) -> Value:
    return union(attribute_of(model, atom, name) for atom in value.atoms)


@query(on_cycle=EMPTY)
def attribute_of(model: ScriptModel, atom, name: str) -> Value:
    """What `<atom>.name` holds."""
    if isinstance(atom, Dispatch):
        return _attribute(model, settled(just(atom)), name)
    if isinstance(atom, Imported):
        return just(Imported(atom.model, atom.module, atom.level, atom.names + (name,)))
    if isinstance(atom, Lib):
        return just(Lib(f"{atom.qual}.{name}"))
    if isinstance(atom, Module):
        if name in atom.model.module_end or name in _global_bindings(atom.model):
            return module_name_value(atom.model, name)
        sub = Imported(atom.model, "", 1, (name,))
        return resolve_import(atom.model, sub)   # a submodule of the package
    if isinstance(atom, Class):
        return _class_attribute(atom.model, atom.cls, name, None)
    if isinstance(atom, Super):
        classes = mro(atom.model, atom.cls)[1:]
        return _lookup(classes, name, atom.receiver)
    cls = instance_class(model, atom)
    if cls is not None:
        return _instance_attribute(model, atom, cls, name)
    if isinstance(atom, Made):
        field = _made_record_field(atom, name)
        if field is not None:
            return field
    return just(Member(atom, name))


def _made_record_field(atom: Made, name: str) -> Value | None:
    """`env.rank` of a record made by a `namedtuple` / functional
    `NamedTuple` class: what the constructor was given for the field (a
    record's fields cannot be set afterwards)."""
    fields = made_record_fields(atom.model, atom.site)
    if fields is None or name not in fields:
        return None
    _, written = _field_argument(atom.site.node, fields, name)
    return value_of(atom.model, written) if written is not None else None


def _field_argument(call: cst.Call, fields: dict, name: str) -> tuple[bool, cst.BaseExpression | None]:
    """What a record's constructor call gives field `name`: (True, the
    argument), by keyword or by the order the fields are declared in;
    (False, the field's default) when the call does not pass it (None: no
    default); (True, None) when `*args` / `**kw` may pass it unseen."""
    written = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    if written is not None:
        return True, written
    if any(a.star for a in call.args):
        return True, None
    positional = [a.value for a in call.args if a.keyword is None]
    index = list(fields).index(name)
    if index < len(positional):
        return True, positional[index]
    return False, fields[name]


def _instance_attribute(model: ScriptModel, atom, cls: tuple[ScriptModel, ClassInfo], name: str) -> Value:
    """`obj.name` for an object of a class of the tree: bound methods and
    class attributes (through the bases), and what the methods store in
    `self.name` and other code in `obj.name`."""
    cmodel, info = cls
    classes = mro(cmodel, info)
    found = _lookup(classes, name, atom)
    stored = union(_self_stores(m, c, name) for m, c in classes)
    if isinstance(atom, Made):
        stored = _bind_constructor(atom, stored)
        stored = stored | _external_stores(atom.model, atom, name)
        if model is not atom.model:
            stored = stored | _external_stores(model, atom, name)
    out = found | stored
    method = any(isinstance(a, (Bound, Func)) for a in found.atoms)
    if not out or (_has_library_base(cmodel, info) and not method):
        # set by a library base class, or dynamically (a method the tree defines
        # comes before the library's in the lookup order: it is that method)
        out = out | just(Member(atom, name))
    return out


def _lookup(classes: tuple[tuple[ScriptModel, ClassInfo], ...], name: str, receiver) -> Value:
    """A method or class attribute `name`, first found along `classes`."""
    for m, c in classes:
        fn = c.methods.get(name)
        if fn is not None:
            decorators = {d.rpartition(".")[2] for d in fn.decorators}
            if receiver is None or decorators & STATIC:
                return just(Func(m, fn))
            if decorators & PROPERTY:
                return _returned(m, fn, receiver=receiver if isinstance(receiver, Value) else just(receiver))
            if decorators & CLASS_METHOD:
                return just(Bound(just(Class(m, c)), m, fn))
            return just(Bound(receiver if isinstance(receiver, Value) else just(receiver), m, fn))
        attrs = _class_body_bindings(m, c).get(name)
        if attrs:
            return union(binding_value(m, b) for b in attrs)
    return EMPTY


def _class_attribute(model: ScriptModel, cls: ClassInfo, name: str, receiver) -> Value:
    found = _lookup(mro(model, cls), name, receiver)
    return found if found else just(Member(Class(model, cls), name))


@query(on_cycle={})
def _class_body_bindings(model: ScriptModel, cls: ClassInfo) -> dict[str, tuple]:
    found: dict = {}
    for b in model.bindings:
        if b.ctx.class_name == cls.name and b.ctx.function is cls.ctx.function and b.kind not in ("def",):
            found.setdefault(b.key, []).append(b)
    return {k: tuple(v) for k, v in found.items()}


@query(on_cycle=EMPTY)
def _self_stores(model: ScriptModel, cls: ClassInfo, name: str) -> Value:
    """What the methods of `cls` store in `self.name` (wherever they run)."""
    out = []
    for fn in cls.all_methods:
        params = list(fn.params)
        if not params or {d.rpartition(".")[2] for d in fn.decorators} & (STATIC | CLASS_METHOD):
            continue
        for b in bindings_of(model, f"{params[0]}.{name}"):
            if b.ctx.function is fn and getattr(b, "augmented", None) is None:
                out.append(binding_value(model, b))
    return union(out)


def _external_stores(model: ScriptModel, atom, name: str) -> Value:
    """`trainer.model = ...` in `model` where `trainer` holds `atom`."""
    out = []
    for a in _stores_by_member(model).get("." + name, ()):
        if a.augmented is None and atom in _value(model, a.target.value).atoms:
            out.append(binding_value(model, a))
    return union(out)


@query(on_cycle=False)
def _has_library_base(model: ScriptModel, cls: ClassInfo) -> bool:
    """Some base of the class is not a class of the tree (`nn.Module`, a
    library's Dataset): its objects have attributes the engine does not see."""
    for base in cls.bases:
        for a in resolved_atoms(_value(model, base)).atoms:
            if a == Lib("object"):
                continue   # `class Logger(object):` is a class with no base
            if not isinstance(a, Class) or _has_library_base(a.model, a.cls):
                return True
    return False


@query(on_cycle=())
def mro(model: ScriptModel, cls: ClassInfo) -> tuple[tuple[ScriptModel, ClassInfo], ...]:
    """The class and its bases of the tree (across modules), in lookup order."""
    order: list = [(model, cls)]
    for base in cls.bases:
        for atom in resolved_atoms(_value(model, base)).atoms:
            if isinstance(atom, Class):
                for entry in mro(atom.model, atom.cls):
                    if all(entry[1] is not c for _, c in order):
                        order.append(entry)
    return tuple(order)


@query(on_cycle=None)
def instance_class(model: ScriptModel, atom) -> tuple[ScriptModel, ClassInfo] | None:
    """The class of the tree an object is an instance of: a `Made` by a call
    of the class, or a method's `self`."""
    if isinstance(atom, Made):
        classes = {(a.model, a.cls) for a in resolved_atoms(_value(atom.model, atom.site.node.func)).atoms
                   if isinstance(a, Class)}
        return classes.pop() if len(classes) == 1 else None
    if isinstance(atom, Param):
        fn = atom.fn
        if fn.cls is not None and fn.params and fn.params[0] == atom.name and \
                not {d.rpartition(".")[2] for d in fn.decorators} & (STATIC | CLASS_METHOD):
            return atom.model, fn.cls
    return None


def _bind_constructor(atom: Made, value: Value) -> Value:
    """Attributes stored by `__init__` from its parameters, seen from the object made at `atom`."""
    if not value.params:
        return value
    targets = call_targets(atom.model, atom.site)
    if len(targets) != 1:
        return value
    tmodel, fn = targets[0]
    return _bind(atom.model, atom.site, value, tmodel, fn, just(atom))


# -- containers ----------------------------------------------------------------------

def element(model: ScriptModel, value: Value, index: int) -> Value:
    """The `index`-th element of what `value` holds (a tuple, a list)."""
    out = []
    for atom in value.atoms:
        if isinstance(atom, Seq):
            if atom.items is not None and -len(atom.items) <= index < len(atom.items):
                out.append(atom.items[index])
            else:
                out.append(opaque("element"))
        elif isinstance(atom, (Param, Member, Item, Made)):
            # looked up again once the object is known; of a library object: its
            # element, by where it came from (`deepspeed.initialize(...)[0]`)
            out.append(just(Item(atom, index)))
        elif isinstance(atom, Dispatch):
            out.append(element(model, settled(just(atom)), index))
        else:
            out.append(opaque("element"))
    return union(out)


def element_path(model: ScriptModel, value: Value, path: tuple[int, ...]) -> Value:
    for index in path:
        value = element(model, value, index)
    return value


def _entry(model: ScriptModel, value: Value, key: object) -> Value:
    out = []
    for atom in value.atoms:
        if isinstance(atom, Mapping):
            out.append(mapping_entry(model, atom, key))
        elif isinstance(atom, (Param, Member, Item, Made)):
            # looked up again once the object is known; of a library object: its
            # entry, by where it came from (`torch.load(path)["model"]`), as `element`
            out.append(just(Item(atom, key)))
        elif isinstance(atom, Dispatch):
            out.append(_entry(model, settled(just(atom)), key))
        else:
            out.append(opaque("entry"))
    return union(out)


def literal_entry(m: Mapping, key: object) -> cst.BaseExpression | None:
    """The expression a dict literal writes for `key` (`{"lr": args.lr}`)."""
    if isinstance(m.node, cst.Dict):
        for el in m.node.elements:
            if isinstance(el, cst.DictElement) and _literal(el.key) == key:
                return el.value
    return None


def entry_expressions(model: ScriptModel, expr: cst.Subscript) -> tuple[tuple[ScriptModel, cst.BaseExpression, Ctx | None], ...] | None:
    """The expressions written for the entry `expr` reads (`env["master_process"]`
    with `env = setup()` returning `{"master_process": rank == 0, ...}` or
    `dict(master_process=...)`, and the stores `env["master_process"] = ...`
    into that dict), each with its file and, for a store, its place (None for
    the dict's own entry); None when the dict may be another object, has
    entries not known, or some path gives the entry another way."""
    key = _subscript_key(expr)
    if not isinstance(key, str):
        return None
    reach = model.reach.get(id(expr), ())
    found: list = []
    for b in reach:   # stored on the way to the read (`env["ddp"] = ...` in the same function)
        if not isinstance(b, Entry):
            if getattr(b, "kind", None) != "assign" or b.value is None or b.augmented is not None:
                return None
            found.append((model, b.value, b.ctx))
    if reach and all(not isinstance(b, Entry) for b in reach):
        return tuple(found)
    base = value_at(model, expr.value)
    if not base.atoms or not all(isinstance(a, Mapping) and not a.open for a in base.atoms):
        return None
    for m in base.atoms:
        written = literal_entry(m, key)
        if written is None and isinstance(m.node, cst.Call):
            written = next((a.value for a in m.node.args if a.keyword is not None and a.keyword.value == key), None)
        if written is not None:
            found.append((m.model, written, None))
        for where in {m.model, model}:
            for a in _stores_by_member(where).get(f"[{key!r}]", ()):
                if any(isinstance(x, Mapping) and x.node is m.node for x in _value(where, a.target.value).atoms):
                    if a.augmented is not None or a.value is None:
                        return None
                    found.append((where, a.value, a.ctx))
    return tuple(found) or None


def field_expressions(model: ScriptModel, expr: cst.Attribute) -> tuple[tuple[ScriptModel, cst.BaseExpression, FunctionInfo | None], ...] | None:
    """The expressions a record's field was made from (`env.leader` with `env =
    setup()` returning `DistEnv(rank=rank, leader=rank == 0)`, DistEnv a
    `@dataclass` or a `typing.NamedTuple` of the tree with no `__init__` of
    its own): the constructor's argument for that field, by keyword or by the
    order the fields are declared in, else the field's default; each with its
    file and the function it is read in. None when the object may be
    anything else or the field is not passed visibly (`*args`, `**kw`)."""
    name = expr.attr.value
    base = value_at(model, expr.value)
    if not base.atoms:
        return None
    found: list = []
    for atom in base.atoms:
        if not isinstance(atom, Made):
            return None
        owner = instance_class(atom.model, atom)
        if owner is not None:
            fields = record_fields(*owner)
            where = owner[0]
        else:
            fields = made_record_fields(atom.model, atom.site)
            where = atom.model
        if fields is None or name not in fields:
            return None
        passed, written = _field_argument(atom.site.node, fields, name)
        if written is None:
            return None
        found.append((atom.model, written, atom.site.ctx.function) if passed else (where, written, None))
    return tuple(found)


@query(on_cycle=None)
def record_fields(model: ScriptModel, cls: ClassInfo) -> dict[str, cst.BaseExpression | None] | None:
    """The fields of a `@dataclass` or `typing.NamedTuple` class of the tree,
    in declaration order, with their defaults as written (None: no default,
    or one that is not a plain value); None for any other class (one with
    an `__init__` of its own or other bases)."""
    decorators = {(dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "")
                  .rpartition(".")[2] for d in cls.node.decorators}
    bases = {(dotted_name(b) or "").rpartition(".")[2] for b in cls.bases}
    if not (("dataclass" in decorators and not bases) or bases == {"NamedTuple"}) or "__init__" in cls.methods:
        return None
    fields: dict[str, cst.BaseExpression | None] = {}
    body = cls.node.body.body if isinstance(cls.node.body, cst.IndentedBlock) else ()
    for stmt in body:
        for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()):
            if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                if "ClassVar" in model.module.code_for_node(small.annotation.annotation):
                    continue
                value = small.value
                fields[small.target.value] = None if isinstance(value, cst.Call) else value
    return fields


RECORD_FACTORIES = ("collections.namedtuple", "typing.NamedTuple", "typing_extensions.NamedTuple")


@query(on_cycle=None)
def made_record_fields(model: ScriptModel, site: CallSite) -> dict[str, cst.BaseExpression | None] | None:
    """The fields of the record a call makes when what it calls is a class
    made by `collections.namedtuple("Env", ["rank", "leader"])` (or
    `"rank leader"`, `"rank, leader"`, `defaults=[...]` for the last ones) or
    `typing.NamedTuple("Env", [("rank", int), ...])`; None for anything
    else or a field list the engine cannot read."""
    callee = callee_value(model, site)
    if len(callee.atoms) != 1:
        return None
    (factory,) = callee.atoms
    if not isinstance(factory, Made) or called_qual(factory.model, factory.site) not in RECORD_FACTORIES:
        return None
    call = factory.site
    spec = call.arg("field_names", 1) if called_qual(factory.model, call) == "collections.namedtuple" \
        else call.arg("fields", 1)
    names: list[str] = []
    if isinstance(spec, cst.SimpleString) and isinstance(spec.evaluated_value, str):
        names = spec.evaluated_value.replace(",", " ").split()
    elif isinstance(spec, (cst.List, cst.Tuple)):
        for element in spec.elements:
            item = element.value
            if isinstance(item, (cst.Tuple, cst.List)) and item.elements:
                item = item.elements[0].value   # typing.NamedTuple: (name, type)
            if not isinstance(item, cst.SimpleString) or not isinstance(item.evaluated_value, str):
                return None
            names.append(item.evaluated_value)
    else:
        return None
    fields: dict[str, cst.BaseExpression | None] = {n: None for n in names}
    defaults = call.arg("defaults", None)
    if defaults is not None:
        if not isinstance(defaults, (cst.List, cst.Tuple)) or len(defaults.elements) > len(names):
            return None
        for n, element in zip(names[len(names) - len(defaults.elements):], defaults.elements):
            fields[n] = None if isinstance(element.value, cst.Call) else element.value
    return fields


def _mapping_entries(m: Mapping) -> tuple:
    return m.entries


@query(on_cycle=EMPTY)
def mapping_entry(model: ScriptModel, m: Mapping, key: object) -> Value:
    """The entry `key` of a dict: its literal's, and the stores `d[key] = v`
    into it (in the file that made it and the file asking)."""
    found = mapping_lookup(model, m, key)
    if found is None:
        return opaque("no such entry")
    return found


@query(on_cycle=None)
def mapping_lookup(model: ScriptModel, m: Mapping, key: object) -> Value | None:
    """The entry `key` of a dict, None when it certainly has none (nothing
    stores it and no unknown entries could)."""
    out = [v for k, v in m.entries if k == key]
    if isinstance(key, str) and m.node is not None:
        for where in {m.model, model}:
            for a in _stores_by_member(where).get(f"[{key!r}]", ()):
                # the same dict: made at the same place (its entries may be bound differently per call)
                if a.augmented is None and any(isinstance(x, Mapping) and x.node is m.node
                                               for x in _value(where, a.target.value).atoms):
                    out.append(binding_value(where, a))
    if out:
        return union(out) | (opaque("entry of an open dict") if m.open else EMPTY)
    return opaque("entry of an open dict") if m.open else None


def iteration_element(model: ScriptModel, value: Value) -> Value:
    """What a `for` over `value` binds each time: a tuple's or list's
    elements, `(index, element)` for `enumerate`, a tuple per `zip`, a
    dict's `items()`."""
    return union(_element_of_atom(model, atom) for atom in value.atoms)


@query(on_cycle=EMPTY)
def _element_of_atom(model: ScriptModel, atom) -> Value:
    if isinstance(atom, Seq):
        return union(atom.items) if atom.items is not None else opaque("element")
    if isinstance(atom, Mapping):
        return union(just(Const(k)) for k, _ in atom.entries) or opaque("key")
    if not isinstance(atom, Made):
        return opaque("element")
    site = atom.site
    name = called_name(atom.model, site)
    args = [a for a in site.node.args if not a.star]
    if name == "enumerate" and args:
        inner = iteration_element(atom.model, _value(atom.model, args[0].value))
        return just(Seq(atom.model, site.node, (opaque("index"), inner)))
    if name == "zip" and args:
        items = tuple(iteration_element(atom.model, _value(atom.model, a.value)) for a in args)
        return just(Seq(atom.model, site.node, items))
    if name in ("items", "values", "keys") and isinstance(site.node.func, cst.Attribute):
        receiver = _value(atom.model, site.node.func.value)
        out = []
        for r in receiver.atoms:
            if isinstance(r, Mapping):
                for k, v in r.entries:
                    if name == "items":
                        out.append(just(Seq(atom.model, site.node, (just(Const(k)), v))))
                    else:
                        out.append(v if name == "values" else just(Const(k)))
            else:
                out.append(opaque("element"))
        return union(out)
    if name == "chain" and args:
        return union(iteration_element(atom.model, _value(atom.model, a.value)) for a in args)
    if name in ELEMENTS_OF_FIRST and args:
        return iteration_element(atom.model, _value(atom.model, args[0].value))
    return opaque("element")


def _entered(model: ScriptModel, value: Value) -> Value:
    """What `with x as y` binds: `__enter__` of an object of the tree (most return
    self), or the object itself for a library object whose `__enter__` returns it
    (a file `open(...)` made)."""
    out = []
    for atom in value.atoms:
        if type(atom) is Made and called_qual(atom.model, atom.site) in ENTER_RETURNS_SELF:
            out.append(just(atom))
            continue
        cls = instance_class(model, atom)
        enter = _lookup(mro(*cls), "__enter__", atom) if cls is not None else EMPTY
        bound = [a for a in enter.atoms if isinstance(a, Bound)]
        out.append(union(_returned(b.model, b.fn, receiver=b.receiver) for b in bound) if bound
                   else opaque("with"))
    return union(out)


# -- calls ---------------------------------------------------------------------------

def _call_value(model: ScriptModel, expr: cst.Call) -> Value:
    site = model.site_of.get(id(expr))
    if site is None:
        return opaque("call")
    callee = resolved_atoms(_value(model, expr.func))
    if not callee:
        return just(Made(model, site))
    return union(call_result(model, site, atom) for atom in callee.atoms)


@query(on_cycle=EMPTY)
def call_result(model: ScriptModel, site: CallSite, callee) -> Value:
    """What `site` returns when its function is `callee`."""
    if isinstance(callee, Func):
        fn = callee.fn
        if fn.yields:
            return just(Made(model, site))   # a generator object, iterated later
        receiver = None
        if fn.cls is not None and fn.params and {d.rpartition(".")[2] for d in fn.decorators} & CLASS_METHOD:
            receiver = just(Class(callee.model, fn.cls))
        return _returned(callee.model, fn, model, site, receiver)
    if isinstance(callee, Bound):
        if callee.fn.yields:
            return just(Made(model, site))
        receiver = callee.receiver
        if isinstance(receiver, Value) and len(receiver.atoms) == 1:
            (self_atom,) = receiver.atoms
            if type(self_atom) is Param and instance_class(self_atom.model, self_atom):
                # `self.make()` in a method: the object's own class decides which `make` runs
                return just(Dispatch(model, site, callee.fn.name, self_atom, callee.model, callee.fn))
        return _returned(callee.model, callee.fn, model, site, receiver)
    if isinstance(callee, Class):
        return just(Made(model, site))   # a new object of the class, made here
    if isinstance(callee, Member):
        return _member_call(model, site, callee)
    if isinstance(callee, Lib):
        return _library_call(model, site, callee.qual)
    if isinstance(callee, Made):
        cls = instance_class(model, callee)
        if cls is not None:
            call = _lookup(mro(*cls), "__call__", callee)
            bound = [a for a in call.atoms if isinstance(a, Bound)]
            if bound:
                return union(_returned(b.model, b.fn, model, site, b.receiver) for b in bound)
    return just(Made(model, site))


def _member_call(model: ScriptModel, site: CallSite, callee: Member) -> Value:
    name = callee.name
    receiver = callee.receiver
    if name in RETURNS_RECEIVER:
        return receiver if isinstance(receiver, Value) else just(receiver)
    if isinstance(receiver, Mapping) and name in ("get", "pop", "setdefault"):
        args = [a for a in site.node.args if not a.star and a.keyword is None]
        key = _literal(args[0].value) if args else UNKNOWN_CONSTANT
        if key is not UNKNOWN_CONSTANT:
            found = mapping_entry(model, receiver, key)
            default = _value(model, args[1].value) if len(args) > 1 else just(Const(None))
            return found | default
    if isinstance(receiver, (Mapping, Seq)) and name == "copy":
        return just(receiver)
    return just(Made(model, site))


def _library_call(model: ScriptModel, site: CallSite, qual: str) -> Value:
    node = site.node
    if (qual.rpartition(".")[2] in RETURNS_FIRST_ARGUMENT or qual in RETURNS_COPY_OF_FIRST_ARGUMENT) and \
            node.args and not node.args[0].star:
        return _value(model, node.args[0].value)
    if qual == "dict":
        entries = []
        open_ = False
        for a in node.args:
            if a.keyword is not None:
                entries.append((a.keyword.value, _value(model, a.value)))
            else:
                inner = _value(model, a.value)
                maps = [x for x in inner.atoms if isinstance(x, Mapping)]
                open_ = open_ or len(maps) != len(inner.atoms) or not maps
                for m in maps:
                    entries.extend(m.entries)
                    open_ = open_ or m.open
        return just(Mapping(model, node, tuple(entries), open_))
    if qual in ("list", "tuple") and len(node.args) == 1 and not node.args[0].star:
        inner = _value(model, node.args[0].value)
        if inner.atoms and all(isinstance(a, Seq) for a in inner.atoms) and len(inner.atoms) == 1:
            (seq,) = inner.atoms
            return just(Seq(model, node, seq.items))
    if qual == "super":
        fn = site.ctx.function
        if fn is not None and fn.cls is not None and fn.params:
            return just(Super(model, fn.cls, _value_of_param(model, fn, fn.params[0])))
    if qual == "getattr" and len(node.args) >= 2:
        names = attribute_names(model, node.args[1].value)
        if names:
            base = _value(model, node.args[0].value)
            found = union(_attribute(model, base, name) for name in names)
            if len(node.args) > 2:
                found = found | _value(model, node.args[2].value)
            return found
    return just(Made(model, site))


def attribute_names(model: ScriptModel, expr: cst.BaseExpression) -> tuple[str, ...]:
    """The attribute names a `getattr` name argument can be: a literal, a name
    whose every value is a known string (a loop variable over a literal list:
    `for split in ["train", "val"]`), and `split + "_loader"` /
    `f"{split}_loader"` built from them; () when any value is unknown."""
    name = _literal(expr)
    if isinstance(name, str):
        return (name,)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left, right = attribute_names(model, expr.left), attribute_names(model, expr.right)
        return tuple(a + b for a in left for b in right) if left and right else ()
    if isinstance(expr, cst.FormattedString):
        out = [""]
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                out = [o + part.value for o in out]
            elif isinstance(part, cst.FormattedStringExpression) and part.format_spec is None \
                    and part.conversion is None:
                inner = attribute_names(model, part.expression)
                if not inner:
                    return ()
                out = [o + i for o in out for i in inner]
            else:
                return ()
        return tuple(out)
    if isinstance(expr, cst.Name):
        value = _value(model, expr)
        if value.known and value.atoms and all(isinstance(a, Const) and isinstance(a.value, str) for a in value.atoms):
            return tuple(sorted(a.value for a in value.atoms))
    return ()


@query(on_cycle=EMPTY)
def _static_result(model: ScriptModel, site: CallSite, fmodel: ScriptModel, fn: FunctionInfo, param: Param) -> Value:
    """What `self.name(...)` returns with the method found from the class it is written in."""
    return _returned(fmodel, fn, model, site, just(param))


def _value_of_param(model: ScriptModel, fn: FunctionInfo, name: str) -> Value:
    return just(Param(model, fn, name))


def _returned(fmodel: ScriptModel, fn: FunctionInfo, model: ScriptModel | None = None,
              site: CallSite | None = None, receiver: Value | None = None) -> Value:
    """What `fn` returns, its parameters bound to the call `site` (in `model`)
    when given, its first parameter to `receiver`."""
    value = returns_of(fmodel, fn)
    if not fn.returns:
        return opaque(f"{fn.name}() returns nothing")
    if site is None:
        if receiver is not None and fn.params:
            return _substitute(value, lambda p: receiver if p.fn is fn and p.name == fn.params[0] else None)
        return value
    return _bind(model, site, value, fmodel, fn, receiver)


@query(on_cycle=EMPTY)
def returns_of(model: ScriptModel, fn: FunctionInfo) -> Value:
    """What `fn` returns, its parameters symbolic."""
    return union(_value(model, ret) for ret, _ctx in fn.returns)


# -- binding parameters to arguments ---------------------------------------------------

def _bind(model: ScriptModel, site: CallSite, value: Value, fmodel: ScriptModel, fn: FunctionInfo,
          receiver: Value | None) -> Value:
    """`value`, computed in `fn`, seen from the call `site` (in `model`)."""
    if not _mentions_params(value, fn):
        return value
    return _substitute(value, lambda p: argument_value(model, site, fmodel, fn, p.name, receiver)
                       if p.fn is fn and p.model is fmodel else None)


def _mentions_params(value: Value, fn: FunctionInfo) -> bool:
    return any(_atom_mentions(atom, fn) for atom in value.atoms if _symbolic(atom))


def _atom_mentions(atom, fn: FunctionInfo) -> bool:
    if isinstance(atom, Param):
        return atom.fn is fn
    if isinstance(atom, (Member, Item)):
        return _atom_mentions(atom.receiver, fn)
    if isinstance(atom, Dispatch):
        return atom.param.fn is fn or _mentions_params(atom.static, fn)   # its arguments may read fn's
    if isinstance(atom, Seq):
        return atom.items is not None and any(_mentions_params(v, fn) for v in atom.items)
    if isinstance(atom, Mapping):
        return any(_mentions_params(v, fn) for _, v in atom.entries)
    return False


def _substitute(value: Value, replace) -> Value:
    """`value` with each Param that `replace(param)` knows replaced by it,
    and what was read from those parameters (`kw["sampler"]`, `cfg.lr`,
    `self.make()`) looked up again on what replaces them."""
    out: set | None = None
    for atom in value.atoms:
        if not _symbolic(atom):
            if out is not None:
                out.add(atom)
            continue
        new = _substitute_atom(atom, replace)
        if out is None:
            if len(new.atoms) == 1 and atom in new.atoms:
                continue
            out = {a for a in value.atoms if not _symbolic(a)}
        out |= new.atoms
    if out is None:
        return value
    # symbolic atoms left unchanged before `out` was started
    for atom in value.atoms:
        if _symbolic(atom) and atom not in out:
            new = _substitute_atom(atom, replace)
            out |= new.atoms
    return Value(frozenset(out)) if out else EMPTY


def _symbolic(atom) -> bool:
    """The atom reads a parameter somewhere (itself, its receiver, its items)."""
    kind = type(atom)
    if kind is Param or kind is Dispatch:
        return True
    if kind is Member or kind is Item:
        return _symbolic(atom.receiver)
    if kind is Seq or kind is Mapping:
        found = atom.__dict__.get("_symbolic")
        if found is None:
            values = atom.items or () if kind is Seq else tuple(v for _, v in atom.entries)
            found = any(_symbolic(a) for v in values for a in v.atoms)
            object.__setattr__(atom, "_symbolic", found)
        return found
    return False


# The dispatches whose static answer is being bound (a method whose answer
# reaches the same call again, `self.opt = self.build(self.opt)`): one
# process lints one file at a time, so a plain set is enough.
_BINDING: set = set()


def _substitute_atom(atom, replace) -> Value:
    # each step is work the budget counts: a value rebuilt through a cycle of
    # calls can grow (one level deeper, twice the atoms) every round
    _model_of(atom).project.memo.charge()
    if isinstance(atom, Param):
        found = replace(atom)
        return found if found is not None else just(atom)
    if isinstance(atom, Member):
        receiver = _substitute_atom(atom.receiver, replace)
        if receiver == just(atom.receiver):
            return just(atom)
        model = _model_of(atom)
        return union(attribute_of(model, r, atom.name) for r in receiver.atoms)
    if isinstance(atom, Item):
        receiver = _substitute_atom(atom.receiver, replace)
        if receiver == just(atom.receiver):
            return just(atom)
        model = _model_of(atom)
        if isinstance(atom.key, int) and not isinstance(atom.key, bool):
            return element(model, receiver, atom.key)
        return _entry(model, receiver, atom.key)
    if isinstance(atom, Dispatch):
        receiver = replace(atom.param)
        if receiver is None or receiver == just(atom.param):
            # `self` stays unknown here: keep the dispatch if nothing else changes,
            # else settle it to the method of its own class
            if atom in _BINDING:
                return just(atom)   # met again inside its own answer: binding it again adds nothing
            _BINDING.add(atom)
            try:
                static = atom.static
                bound = _substitute(static, replace)
            finally:
                _BINDING.discard(atom)
            return just(atom) if bound is static else bound
        return union(_dispatch(atom, r, replace) for r in receiver.atoms)
    if isinstance(atom, Seq) and atom.items is not None:
        items = tuple(_substitute(v, replace) for v in atom.items)
        return just(atom) if items == atom.items else just(Seq(atom.model, atom.node, items))
    if isinstance(atom, Mapping) and atom.entries:
        entries = tuple((k, _substitute(v, replace)) for k, v in atom.entries)
        return just(atom) if entries == atom.entries else just(Mapping(atom.model, atom.node, entries, atom.open))
    return just(atom)


def _model_of(atom) -> ScriptModel:
    """The file a symbolic atom was read in: a projection's (`Member`, `Item`)
    is its parameter's."""
    while isinstance(atom, (Member, Item)):
        atom = atom.receiver
    return atom.model   # a projection is only substituted when it reads from a Param, which has one


def _dispatch(atom: Dispatch, receiver, replace) -> Value:
    """`self.name(...)` once `self` is known to hold `receiver`: the method
    its class (or the nearest base) defines."""
    cls = instance_class(atom.model, receiver)
    if cls is None:
        return _substitute(atom.static, replace)
    found = _lookup(mro(*cls), atom.name, receiver)
    bound = [b for b in found.atoms if isinstance(b, Bound)]
    if not bound:
        return _substitute(atom.static, replace)
    return _substitute(union(call_result(atom.model, atom.site, b) for b in bound), replace)


def _positional_params(fn: FunctionInfo) -> list[str]:
    return [p.name.value for p in (*fn.node.params.posonly_params, *fn.node.params.params)]


def _receives_self(fn: FunctionInfo, site: CallSite, receiver: Value | None) -> bool:
    """The first parameter is bound before the call's own arguments: a
    method called on an object or a class, a constructor."""
    return receiver is not None and fn.cls is not None and bool(fn.params) and \
        not {d.rpartition(".")[2] for d in fn.decorators} & STATIC


def argument_value(model: ScriptModel, site: CallSite, fmodel: ScriptModel, fn: FunctionInfo, name: str,
                   receiver: Value | None) -> Value:
    """What parameter `name` of `fn` holds when `site` calls it (with the
    object it was called on as `receiver`, for methods and constructors):
    its argument by keyword or position, through `*args` / `**kwargs`
    unpacked at the call when their contents are known, the parameter's
    default, or for `*args` / `**kwargs` parameters what the call passes
    beyond the named ones."""
    node = site.node
    positional = _positional_params(fn)
    if _receives_self(fn, site, receiver) and positional:
        if name == positional[0]:
            return receiver
        positional = positional[1:]
    keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    splat_kw = [a.value for a in node.args if a.star == "**"]
    plain: list = []
    splat_pos = None
    for a in node.args:
        if a.keyword is not None or a.star == "**":
            continue
        if a.star == "*":
            splat_pos = a.value
            break
        plain.append(a.value)
    if name in keywords:
        return _value(model, keywords[name])
    if name in positional:
        index = positional.index(name)
        if index < len(plain):
            return _value(model, plain[index])
        if splat_pos is not None:
            found = _splat_element(model, splat_pos, index - len(plain))
            if found is not None:
                return found
            return opaque(f"*args for {name}")
    if name == fn.star_param:
        extra = plain[len(positional):]
        if splat_pos is not None:
            return opaque("*args")
        return just(Seq(model, node, tuple(_value(model, e) for e in extra)))
    if name == fn.kwargs_param:
        named = set(positional) | {p.name.value for p in fn.node.params.kwonly_params}
        entries = [(k, _value(model, v)) for k, v in keywords.items() if k not in named]
        open_ = False
        for s in splat_kw:
            inner = _value(model, s)
            maps = [x for x in inner.atoms if isinstance(x, Mapping)]
            open_ = open_ or not maps or len(maps) != len(inner.atoms)
            for m in maps:
                entries.extend((k, v) for k, v in m.entries if k not in named)
                open_ = open_ or m.open
        return just(Mapping(model, node, tuple(entries), open_))
    for s in splat_kw:   # `f(**kw)` with `kw = {"loader": ...}`
        found = _splat_entry(model, s, name)
        if found is not None:
            return found
    default = _default(fn, name)
    if default is not None:
        return _value(fmodel, default)
    return opaque(f"{name} not passed")


def _splat_entry(model: ScriptModel, expr: cst.BaseExpression, name: str) -> Value | None:
    """What `**expr` passes as `name`: None when it certainly passes nothing
    by that name (a dict of known entries without it), Opaque when unknown."""
    inner = _value(model, expr)
    maps = [x for x in inner.atoms if isinstance(x, Mapping)]
    if not maps or len(maps) != len(inner.atoms):
        return opaque(f"**kwargs for {name}")
    found = [mapping_lookup(model, m, name) for m in maps]
    hits = [f for f in found if f is not None]
    return union(hits) if hits else None


def _splat_element(model: ScriptModel, expr: cst.BaseExpression, index: int) -> Value | None:
    inner = _value(model, expr)
    seqs = [a for a in inner.atoms if isinstance(a, Seq)]
    if not seqs or len(seqs) != len(inner.atoms) or any(s.items is None or index >= len(s.items) for s in seqs):
        return None
    return union(s.items[index] for s in seqs)


def _default(fn: FunctionInfo, name: str) -> cst.BaseExpression | None:
    for p in (*fn.node.params.posonly_params, *fn.node.params.params, *fn.node.params.kwonly_params):
        if p.name.value == name:
            return p.default
    return None


def argument_places(model: ScriptModel, site: CallSite, keyword: str, position: int | None = None) -> tuple:
    """Where what a call passes as `keyword=` is set: the call itself when
    written there, else the stores `kw["keyword"] = ...` into the dict it
    unpacks (their Ctx, for "can these two be set together?": stores in the
    two arms of one `if` never are); () for a dict literal's own entry."""
    if site.arg(keyword, position) is not None:
        return (site.ctx,)
    places: list = []
    for a in site.node.args:
        if a.star != "**":
            continue
        for m in _value(model, a.value).atoms:
            if not isinstance(m, Mapping) or m.node is None:
                continue
            if any(k == keyword for k, _ in m.entries):
                places.append(None)
            for where in {m.model, model}:
                for store in _stores_by_member(where).get(f"[{keyword!r}]", ()):
                    if any(isinstance(x, Mapping) and x.node is m.node
                           for x in _value(where, store.target.value).atoms):
                        places.append(store.ctx)
    return tuple(places)


def call_argument(model: ScriptModel, site: CallSite, keyword: str, position: int | None = None) -> Value | None:
    """What a call passes as `keyword=` or at `position` (a library call:
    `DataLoader(ds, sampler=...)`), through `*args` / `**kwargs` whose
    contents are known: None when it certainly passes nothing there, Opaque
    when it may, unseen."""
    expr = site.arg(keyword, position)
    if expr is not None:
        return settled(_value(model, expr))
    node = site.node
    for a in node.args:
        if a.star == "**":
            found = _splat_entry(model, a.value, keyword)
            if found is not None:
                return settled(found)
    if position is not None:
        plain = 0
        for a in node.args:
            if a.keyword is not None or a.star == "**":
                continue
            if a.star == "*":
                found = _splat_element(model, a.value, position - plain)
                return found if found is not None else opaque(f"*args for {keyword}")
            plain += 1
    return None


# -- the call graph -----------------------------------------------------------------------

def callee_value(model: ScriptModel, site: CallSite, needs: Need = ()) -> Value:
    """What a call's function expression holds, imports looked up."""
    return resolved_atoms(_value(model, site.node.func), needs)


@query(on_cycle=())
def call_targets(model: ScriptModel, site: CallSite, needs: Need = ()) -> tuple[tuple[ScriptModel, FunctionInfo], ...]:
    """The functions of the tree `site` runs: a function, a method bound to
    its object (through the class hierarchy), `__init__` of a class being
    instantiated (inherited too), `__call__` of an object. With `needs`: a
    module that cannot reach what the asker looks for is not parsed."""
    found: list[tuple[ScriptModel, FunctionInfo]] = []
    for atom in callee_value(model, site, needs).atoms:
        if isinstance(atom, Func):
            found.append((atom.model, atom.fn))
        elif isinstance(atom, Bound):
            found.append((atom.model, atom.fn))
        elif isinstance(atom, Class):
            init = _lookup(mro(atom.model, atom.cls), "__init__", Made(model, site))
            found += [(b.model, b.fn) for b in init.atoms if isinstance(b, Bound)]
        elif isinstance(atom, Made):
            cls = instance_class(model, atom)
            if cls is not None:
                call = _lookup(mro(*cls), "__call__", atom)
                found += [(b.model, b.fn) for b in call.atoms if isinstance(b, Bound)]
    unique: list = []
    for t in found:
        if all(t[1] is not u[1] for u in unique):
            unique.append(t)
    return tuple(unique)


def resolve_call(model: ScriptModel, site: CallSite, needs: Need = ()) -> tuple[ScriptModel, FunctionInfo] | None:
    """The one function of the tree a call runs, or None (a library call, a
    dynamic call, several possible functions, or one function of the tree
    beside something the engine does not know: `self.io.save(...)` where
    `self.io` is a plugin's object or a default object of the tree)."""
    targets = call_targets(model, site, needs)
    if len(targets) != 1 or not _callee_known(model, site, needs):
        return None
    return targets[0]


@query(on_cycle=False)
def _callee_known(model: ScriptModel, site: CallSite, needs: Need = ()) -> bool:
    """Everything a call's function expression may hold is a function, a
    method or a class of the tree (or an object of the tree with `__call__`):
    no library object's method and nothing unknown beside them. None (and
    a method read from None) is left out: a call that runs does not hold it."""
    for atom in callee_value(model, site, needs).atoms:
        if isinstance(atom, (Func, Bound, Class)):
            continue
        if type(atom) is Const and atom.value is None or \
                isinstance(atom, Member) and atom.receiver == Const(None):
            continue   # `self.io = None` elsewhere: `self.io.save(...)` never runs with it
        if isinstance(atom, Made) and instance_class(model, atom) is not None:
            continue
        if _library_base_attribute(model, atom):
            continue
        return False
    return True


def _library_base_attribute(model: ScriptModel, atom) -> bool:
    """`Member` standing for "a library base class might set this too" on an
    object of a class of the tree (`self._client.save(...)` in a recipe class
    with a `Protocol` base, `self._client` stored by its own `__init__`): the
    object is known, and what its own class stores is what the engine follows."""
    root = atom
    while isinstance(root, Member):
        root = root.receiver
    return root is not atom and not isinstance(root, Value) and instance_class(model, root) is not None


def calls_plain_function(model: ScriptModel, site: CallSite) -> bool:
    """The call runs a function of the tree defined with `def` outside any
    class (`load_resume(net, args)`, `ckpt.restore(...)` through a module):
    not a method, a constructor or an object's `__call__`."""
    atoms = callee_value(model, site).atoms
    return bool(atoms) and all(isinstance(a, Func) and a.fn.class_name is None for a in atoms)


def constructs(model: ScriptModel, site: CallSite) -> bool:
    """The call makes a new object of a class of the tree (and runs its `__init__`)."""
    return any(isinstance(a, Class) for a in callee_value(model, site).atoms)


@query(on_cycle=None)
def called_qual(model: ScriptModel, site: CallSite) -> str | None:
    """The qualified name of the library function or class a call runs,
    followed through imports and aliases (`DL = DataLoader; DL(ds)`,
    `import torch.utils.data as tud; tud.DataLoader(ds)`); None when the
    call runs something of the tree or something not known by name."""
    func = site.node.func
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name):
        return None
    if func is not root and not (model.imports.is_imported(root.value) or model.imports.star_modules):
        return None   # a method of an object: not a library name
    quals = set()
    for atom in _value(model, func).atoms:
        if isinstance(atom, Lib):
            quals.add(atom.qual)
        elif isinstance(atom, Imported):
            if model.project.find_module(model.path, atom.module, atom.level) is not None:
                return None   # a module of the tree
            quals.add(".".join(p for p in (atom.module, *atom.names) if p))
        else:
            return None
    return quals.pop() if len(quals) == 1 else None


def called_qual_from(model: ScriptModel, site: CallSite, caller: tuple[ScriptModel, CallSite] | None) -> str | None:
    """`called_qual`, for a call of a parameter of its function with that
    function entered from `caller` (the call that runs it, in its own module):
    what the caller passes is what runs. `context_manager(*args)` inside
    `def optional(flag, context_manager, *args)`, entered from
    `optional(cfg.log, wandb.init, project=p)`, runs `wandb.init`."""
    qual = called_qual(model, site)
    if qual is not None or caller is None:
        return qual
    func, fn = site.node.func, site.ctx.function
    if fn is None or not isinstance(func, cst.Name) or func.value not in fn.params:
        return None
    b = sole_binding(model, func)
    if b is None or b.kind != "param" or b.ctx.function is not fn:
        return None   # rebound in the function: not (only) what the caller passed
    cmodel, call = caller
    bound, expr = argument_expr(call, fn, func.value)
    if not bound or expr is None:
        return None
    atoms = resolved_atoms(value_of(cmodel, expr)).atoms
    quals = {a.qual for a in atoms if isinstance(a, Lib)}
    return quals.pop() if len(quals) == 1 and len(atoms) == 1 else None


@query(on_cycle=None)
def called_name(model: ScriptModel, site: CallSite) -> str | None:
    """The name of what a call runs, followed through aliases: `add_argument`
    for `arg("--lr")` with `arg = parser.add_argument`; the last part of the
    call as written otherwise."""
    qual = called_qual(model, site)
    if qual is not None:
        return qual.rpartition(".")[2]
    if isinstance(site.node.func, cst.Name):
        names = set()
        for atom in _value(model, site.node.func).atoms:
            if isinstance(atom, Member):
                names.add(atom.name)
            elif isinstance(atom, (Func, Bound)):
                names.add(atom.fn.name)
            elif isinstance(atom, Class):
                names.add(atom.cls.name)
            else:
                names.add(None)
        if len(names) == 1 and None not in names:
            return names.pop()
    return site.attr


@query(on_cycle=frozenset())
def library_bases(model: ScriptModel, cls: ClassInfo) -> frozenset[str]:
    """The qualified names of the library classes a class of the tree derives
    from, through its bases of the tree (`class DistSampler(DistributedSampler)`)."""
    found: set[str] = set()
    for base in cls.bases:
        for a in resolved_atoms(_value(model, base)).atoms:
            if isinstance(a, Lib):
                found.add(a.qual)
            elif isinstance(a, Class):
                found |= library_bases(a.model, a.cls)
    return frozenset(found)


def instance_of(atom, *names: str) -> bool:
    """An object of torch's `names`: made by a call of one of them, or an
    object of a class of the tree that derives from one."""
    if not isinstance(atom, Made):
        return False
    if atom.is_api(*names):
        return True
    cls = instance_class(atom.model, atom)
    return cls is not None and any(is_torch_api(q, *names) for q in library_bases(*cls))


def is_api_call(model: ScriptModel, site: CallSite, *names: str) -> bool:
    """A call of torch's `names` (and not of a same-named class of the user's),
    however it was reached (an alias, an import as another name, a star import)."""
    qual = called_qual(model, site)
    if qual is None:
        return False
    return is_torch_api(qual, *names)


# -- parameters: what the file's calls pass --------------------------------------------------

@dataclass(frozen=True)
class Argument:
    """What one call site passes for a parameter."""

    model: ScriptModel
    call: CallSite
    expr: cst.BaseExpression | None   # None: the parameter's default applies
    scope: FunctionInfo | None         # where `expr` is read
    stmt: cst.CSTNode | None = None    # the statement it is read in


def binds_receiver(call: CallSite, fn: FunctionInfo) -> bool:
    """The call binds the method's first parameter (`self` / `cls`) itself,
    before its own arguments: a method called on an object or a class
    (`saver.write(x)`), a constructor (`Saver(x)` runs `__init__`), an object
    called (`saver(x)` runs `__call__`), a bound method held in a name
    (`write = saver.write; write(x)`). A static method binds nothing."""
    params = fn.params
    if not fn.class_name or not params or params[0] not in ("self", "cls"):
        return False
    if {d.rpartition(".")[2] for d in fn.decorators} & STATIC:
        return False   # its first parameter is an argument like the others
    return call.receiver is not None or isinstance(call.node.func, cst.Name)


def argument_expr(call: CallSite, fn: FunctionInfo, name: str) -> tuple[bool, cst.BaseExpression | None]:
    """(bound, expr) for parameter `name` of `fn` at `call`, as written at the
    call: bound False when a `*args` / `**kwargs` at the call makes it
    unknowable from the call's text; expr None when the default applies."""
    params = list(fn.params)
    node = call.node
    if binds_receiver(call, fn):
        if name == params[0]:
            return False, None
        params = params[1:]
    for a in node.args:
        if a.keyword is not None and a.keyword.value == name:
            return True, a.value
    positional = _positional_params(fn)
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


@query(on_cycle={})
def _call_by_func_node(model: ScriptModel) -> dict:
    return {id(c.node.func): c for c in model.calls}


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
        if not any(t[1] is fn for t in call_targets(model, call)):
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


@query(on_cycle=None)
def _callers(model: ScriptModel, fn: FunctionInfo) -> tuple[tuple[CallSite, Value | None], ...] | None:
    """The file's calls of `fn` (with the object a method is called on);
    None when some use of `fn` is not a call (handed on: its callers are unknown)."""
    calls = _call_by_func_node(model)
    found = []
    for ref in model.refs_to(fn):
        call = calls.get(id(ref.node))
        if call is None:
            return None
        if not any(t[1] is fn for t in call_targets(model, call)):
            continue
        receiver = None
        for atom in callee_value(model, call).atoms:
            if isinstance(atom, Bound) and atom.fn is fn:
                receiver = atom.receiver
            elif isinstance(atom, Class):
                receiver = just(Made(model, call))
        found.append((call, receiver))
    return tuple(found) if found else None


def call_sites_of(model: ScriptModel, fn: FunctionInfo) -> tuple[CallSite, ...] | None:
    """Every call of `fn` in its file; None when some use of `fn` is not a
    call (stored in a dict, handed to a call, assigned: its callers are
    unknown) or nothing in the file calls it."""
    callers = _callers(model, fn)
    return None if callers is None else tuple(call for call, _ in callers)


def result_dropped(site: CallSite) -> bool:
    """The call is a statement of its own: what it returns is thrown away."""
    stmt = site.stmt
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Expr) and s.value is site.node for s in stmt.body)


@query(on_cycle=EMPTY)
def param_value(model: ScriptModel, fn: FunctionInfo, name: str) -> Value:
    """What parameter `name` of `fn` holds, through the file's call sites."""
    callers = _callers(model, fn)
    if callers is None:
        return just(Param(model, fn, name))
    out = []
    for call, receiver in callers:
        out.append(resolved(model, argument_value(model, call, model, fn, name, receiver)))
    return settled(union(out)) if out else just(Param(model, fn, name))


def resolved(model: ScriptModel, value: Value) -> Value:
    """`value` with the Params of `model`'s functions replaced by what the
    file's call sites pass (and what was read from them looked up again)."""
    if not any(_symbolic(a) for a in value.atoms):
        return value
    return _substitute(value, lambda p: param_value(model, p.fn, p.name) if p.model is model else None)


def value_at(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None = None,
             stmt: cst.CSTNode | None = None) -> Value:
    if expr is None:
        return opaque("nothing")
    return settled(resolved(model, _value(model, expr)))


def constant_of(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None = None) -> object:
    """The literal `expr` certainly holds (through names, parameters and
    defaults), else UNKNOWN_CONSTANT."""
    return value_at(model, expr).constant


def bind(model: ScriptModel, call: CallSite, value: Value) -> Value:
    """`value`, computed in the function `call` lands in (in this file or a
    helper module), seen from `call`."""
    if not any(_symbolic(a) for a in value.atoms):
        return value
    targets = call_targets(model, call)
    if len(targets) != 1:
        return value
    tmodel, fn = targets[0]
    receiver = None
    for atom in callee_value(model, call).atoms:
        if isinstance(atom, Bound) and atom.fn is fn:
            receiver = atom.receiver
        elif isinstance(atom, Class):
            receiver = just(Made(model, call))
    return settled(_bind(model, call, value, tmodel, fn, receiver))


def element_of(model: ScriptModel, expr: cst.BaseExpression, index: int, scope: FunctionInfo | None = None) -> Value:
    """The `index`-th element of the tuple `expr` holds."""
    return settled(element(model, _value(model, expr), index))


def entry_of(model: ScriptModel, expr: cst.BaseExpression, name: object, scope: FunctionInfo | None = None) -> Value:
    """The entry `name` of the dict `expr` holds."""
    return settled(_entry(model, _value(model, expr), name))


def is_param(scope: FunctionInfo | None, name: str) -> FunctionInfo | None:
    """The function (scope or one it is nested in) that has `name` as a parameter."""
    fn = scope
    while fn is not None:
        if name in fn.params:
            return fn
        fn = fn.ctx.function
    return None


def namespace_key(key: str) -> bool:
    """`args.x`, `config.x`, `cfg['x']`: an attribute or key of an object
    other than `self`, shared by every function that holds the object."""
    return ("." in key or "[" in key) and not key.startswith("self.")


# -- iteration -------------------------------------------------------------------------------

def loops_in(model: ScriptModel, fn: FunctionInfo | None) -> tuple[Loop, ...]:
    """The loops whose statement is directly in `fn` (None: module level)."""
    return _loops_by_function(model).get(fn, ())


@query(on_cycle={})
def _loops_by_function(model: ScriptModel) -> dict:
    by_fn: dict = {}
    for loop in model.loops:
        by_fn.setdefault(loop.ctx.function, []).append(loop)
    return {k: tuple(v) for k, v in by_fn.items()}


# -- what a value says to a test ---------------------------------------------------
# `if x:` and `if x is None:` on a value: True or False when every object the
# value can hold answers the same, else None (unknown stays unknown).

def _tree_instance(atom: Made) -> tuple[ScriptModel, ClassInfo] | None:
    """The class of the tree a `Made` is a fresh instance of (its constructor ran)."""
    if not constructs(atom.model, atom.site):
        return None
    return instance_class(atom.model, atom)


def _atom_is_none(atom) -> bool | None:
    if type(atom) is Const:
        return atom.value is None
    if isinstance(atom, (Func, Class, Module, Bound, Seq, Mapping, Super)):
        return False
    if isinstance(atom, Made) and _tree_instance(atom) is not None:
        return False   # a class of the tree called: a new object (a library call may return None)
    return None


def _atom_truth(atom) -> bool | None:
    if type(atom) is Const:
        return bool(atom.value)
    if isinstance(atom, (Func, Class, Module, Bound)):
        return True
    if isinstance(atom, Seq):
        return None if atom.items is None else bool(atom.items)
    if isinstance(atom, Mapping):
        return True if atom.entries else None
    if isinstance(atom, Made):
        cls = _tree_instance(atom)
        if cls is None or _has_library_base(*cls):
            return None
        # an object is true unless its class says otherwise
        if any("__bool__" in c.methods or "__len__" in c.methods for _, c in mro(*cls)):
            return None
        return True
    return None


def _agreed(value: Value, answer) -> bool | None:
    if not value.known:
        return None
    answers = {answer(a) for a in value.atoms}
    return answers.pop() if len(answers) == 1 else None


def truth_of(value: Value) -> bool | None:
    """What `if <value>:` takes: True / False for every object it may hold, else None."""
    return _agreed(value, _atom_truth)


def is_none_of(value: Value) -> bool | None:
    """What `<value> is None` gives for every object it may hold, else None."""
    return _agreed(value, _atom_is_none)


def is_generator(fn: FunctionInfo) -> bool:
    return bool(fn.yields)


def iterated(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None = None) -> Value:
    """What a `for` over `expr` consumes: through `enumerate`, `tqdm`, `zip`,
    `iter`, `itertools.cycle`/`chain`/`islice`, `metric_logger.log_every(...)`
    and other wrappers of the loader, and through local generators."""
    return consumed(model, value_of(model, expr))


def consumed(model: ScriptModel, value: Value) -> Value:
    return union(_consumed_atom(model, atom) for atom in settled(value).atoms)


@query(on_cycle=EMPTY)
def _consumed_atom(model: ScriptModel, atom) -> Value:
    if not isinstance(atom, Made):
        return just(atom)
    m, site = atom.model, atom.site
    if atom.is_api("DataLoader"):
        return just(atom)
    targets = call_targets(m, site)
    if len(targets) == 1 and is_generator(targets[0][1]):
        return bind(m, site, generator_consumes(*targets[0]))
    if targets:
        return just(atom)
    name = called_name(m, site)
    if name in MANAGED_LOADERS:
        return opaque(f"{name}() manages the loader")
    applied = builtin_call(site)
    if applied is not None and applied[0] == "iter":
        return just(atom) | consumed(m, _value(m, applied[1]))   # `loader.__iter__()` as `iter(loader)`
    if name in NOT_ITERATING:
        return just(atom)
    # enumerate(loader), tqdm(loader), zip(a, b), metric_logger.log_every(loader, 10), a
    # prefetcher around the loader: iterating it iterates its arguments
    args = [a.value for a in site.node.args
            if not a.star and (a.keyword is None or a.keyword.value in ITERABLE_KEYWORDS)]
    if name in ITERATION_WRAPPERS or args:
        return just(atom) | union(consumed(m, _value(m, a)) for a in args)
    return just(atom)


@query(on_cycle=EMPTY)
def generator_consumes(model: ScriptModel, fn: FunctionInfo) -> Value:
    """What iterating the generator `fn` consumes: the `for` loops that feed
    its `yield`s, and what it `yield from`s (parameters stay symbolic)."""
    out = []
    for y in fn.yields:
        if y.delegates:
            out.append(iterated(model, y.value))
            continue
        for loop in y.ctx.loops:
            if loop.is_for:
                out.append(iterated(model, loop.iter))
    return union(out)


# -- passes ------------------------------------------------------------------------------------

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
        applied = builtin_call(self.iter_call) if self.iter_call is not None else None
        return applied[1] if applied is not None else None


# A module whose functions can make or iterate a data loader names one:
# `DataLoader`, a `*loader*` / `*sampler*` / `*batches*` variable, a
# generator that `yield`s. Calls into other modules are not followed for passes.
LOADER_NEED: Need = (("DataLoader", "yield", "*loader", "*Loader", "*sampler", "*batches", "*dataset"),)


def _loaders_only(value: Value) -> Value:
    """What of a consumed value a pass is kept for: DataLoaders (and objects
    of classes deriving from it), and what may still become one once the
    function's parameters are bound. `for i in range(n)` is no pass of interest."""
    kept = [a for a in value.atoms if _symbolic(a) or (type(a) is Made and instance_of(a, "DataLoader"))]
    if len(kept) == len(value.atoms):
        return value
    return Value(frozenset(kept)) if kept else EMPTY


@query(on_cycle=())
def passes(model: ScriptModel, fn: FunctionInfo | None) -> tuple[Pass, ...]:
    """Every complete `for` pass over a data loader (model/values.py's
    DataLoaders, or a parameter that may hold one) that running `fn`
    performs, directly or in the functions it calls."""
    found: list[Pass] = []
    for loop in loops_in(model, fn):
        if not loop.is_for:
            continue
        consumed_value = _loaders_only(iterated(model, loop.iter))
        if not consumed_value:
            continue
        epoch = loop.ctx.loops[-1] if loop.ctx.loops else None
        found.append(Pass(consumed_value, loop, model, epoch, model if epoch else None))
    found += _iter_passes(model, fn)
    memo = model.project.memo
    for call in model.calls_in(fn):
        target = resolve_call(model, call, LOADER_NEED)
        if target is None or target[1] is fn or is_generator(target[1]):
            continue
        tmodel, callee = target
        callee_passes = passes(tmodel, callee)
        # each pass carried up through this call is work that grows with the
        # callee's answer (a call graph whose functions call each other along
        # many paths): it is charged to the file's budget
        memo.charge(len(callee_passes))
        # the passes reached along different paths often consume the same
        # value: it is bound to this call once
        bound: dict[Value, Value] = {}
        for p in callee_passes:
            consumed_value = bound.get(p.consumed)
            if consumed_value is None:
                consumed_value = bound[p.consumed] = _loaders_only(bind(model, call, p.consumed))
            if not consumed_value:
                continue
            if p.epoch is None and call.ctx.loops:
                found.append(Pass(consumed_value, p.loop, p.loop_model, call.ctx.loops[-1], model,
                                  (call,) + p.via, p.iter_call))
            else:
                found.append(Pass(consumed_value, p.loop, p.loop_model, p.epoch, p.epoch_model, (call,) + p.via,
                                  p.iter_call))
    # generators created here: `loader = sample_data(loader)` runs its loops when it is iterated,
    # its epoch loop (the `while True`) is its own
    for call in model.calls_in(fn):
        target = resolve_call(model, call, LOADER_NEED)
        if target is None or not is_generator(target[1]):
            continue
        tmodel, gen = target
        for p in passes(tmodel, gen):
            if p.epoch is not None:
                consumed_value = _loaders_only(bind(model, call, p.consumed))
                if consumed_value:
                    found.append(Pass(consumed_value, p.loop, p.loop_model, p.epoch, p.epoch_model,
                                      (call,) + p.via, p.iter_call))
    return _first_of_each(found)


def _first_of_each(found: list[Pass]) -> tuple[Pass, ...]:
    """The passes, in order, without those that repeat an earlier one in all
    that their askers read: the pass, what it consumes, its epoch loop, the
    first call of `via` and how many calls it goes through
    (model/evaluation.py picks a loop by the fewest calls and names the first
    one). The same loop reached along many paths of the call graph is one
    entry per first call and length, not one per path: a call graph whose
    functions call each other several times made them multiply at every
    level (ddpcheck's own lint/engine.py: 372,205 passes of one function, 39
    distinct, 39 s of CPU)."""
    seen: set = set()
    kept: list[Pass] = []
    for p in found:
        key = (p.consumed, id(p.loop), id(p.loop_model), id(p.epoch), id(p.epoch_model), id(p.iter_call),
               id(p.via[0]) if p.via else None, len(p.via))
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return tuple(kept)


def builtin_call(site: CallSite) -> tuple[str, cst.BaseExpression] | None:
    """(`iter`, `next` or `len`, the object it is applied to) for a call of
    that builtin with its object as first argument (`next(it)`, `next(it,
    None)`) or of the dunder method it calls, written out (`it.__next__()`,
    `loader.__iter__()`); None otherwise."""
    if site.func in ("iter", "next", "len"):
        first = site.node.args[0] if site.node.args else None
        if first is None or first.star or first.keyword is not None or \
                (site.func != "next" and len(site.node.args) != 1):
            return None
        return site.func, first.value
    if site.attr in DUNDER_BUILTINS and site.receiver is not None and not site.node.args:
        return DUNDER_BUILTINS[site.attr], site.receiver
    return None


def _iter_passes(model: ScriptModel, fn: FunctionInfo | None) -> list[Pass]:
    """`it = iter(loader)` (re)made inside a loop and drained with `next(it)`
    (FixMatch's `except StopIteration: it = iter(loader)`; the same written
    `it = loader.__iter__()` ... `it.__next__()`): a full pass per remake. An
    `iter()` whose result is never `next()`-ed by name is a peek, not a pass."""
    found = []
    applied = [b for b in map(builtin_call, model.calls_in(fn)) if b is not None]
    nexted = {dotted_name(obj) for name, obj in applied if name == "next"}
    if not nexted:
        return found
    for a in model.assigns_in(fn):
        if a.key not in nexted or not isinstance(a.value, cst.Call) or a.augmented is not None:
            continue
        site = model.site_of.get(id(a.value))
        made = builtin_call(site) if site is not None else None
        if made is None or made[0] != "iter":
            continue
        consumed_value = _loaders_only(iterated(model, made[1]))
        if consumed_value:
            epoch = site.ctx.loops[-1] if site.ctx.loops else None
            found.append(Pass(consumed_value, None, model, epoch, model if epoch else None, iter_call=site))
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


def expression_at_call(model: ScriptModel, call: CallSite, fmodel: ScriptModel,
                       expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`expr`, written in the function `call` runs (in `fmodel`), as the
    caller writes it: a parameter read there is the argument the call passes
    (`make_loader(ds, args.global_batch_size)` for `batch_size` in
    `DataLoader(ds, batch_size=batch_size)`); None when it is anything else
    or the call passes it unseen (`*args`)."""
    target = resolve_call(model, call)
    if target is None or target[0] is not fmodel or not isinstance(expr, cst.Name):
        return None
    fn = target[1]
    reach = fmodel.reach.get(id(expr), ())
    if len(reach) != 1 or not all(getattr(b, "kind", None) == "param" and b.ctx.function is fn for b in reach):
        return None
    bound, arg = argument_expr(call, fn, expr.value)
    return arg if bound else None


def visible_bindings(model: ScriptModel, read: cst.BaseExpression) -> tuple | None:
    """The bindings a read can see: those reaching it and, where a path
    reaches it unbound, the name's bindings where it lives (the enclosing
    function, the module); None when some path leads to something no
    binding of the file gives (a builtin, an attribute set elsewhere)."""
    reach = model.reach.get(id(read))
    if reach is None:
        return None
    found: list = []
    for b in reach:
        if not isinstance(b, Entry):
            found.append(b)
            continue
        if not isinstance(read, cst.Name):
            return None
        outer = _outer_bindings(model, read.value, b)
        if outer is None:
            return None
        found += outer
    return tuple(found)


def _outer_bindings(model: ScriptModel, name: str, entry: Entry) -> list | None:
    fn = entry.scope
    locals_ = _local_bindings(model)
    if not entry.closure:
        if fn is None:
            return None
        if (fn, name) in locals_:
            return []   # unbound on this path
        fn = fn.ctx.function if name not in fn.declared_global else None
    while fn is not None:
        found = locals_.get((fn, name))
        if found:
            return list(found)
        fn = fn.ctx.function
    module = model.module_end.get(name)
    if module is None or any(isinstance(b, Entry) for b in module):
        return None
    return [*module, *_global_bindings(model).get(name, ())]


@query(on_cycle=())
def bindings_seen(model: ScriptModel, read: cst.BaseExpression) -> tuple:
    """Every binding whose value a read of a name, dotted name or string key
    can see, in this file: the ones reaching it (reaching definitions), and
    where a path reaches it unbound, the name's bindings where it lives (an
    enclosing function, the module), `self.<x>` stored by the methods of the
    class and its bases, or an attribute or key of another object set
    anywhere in the file (`config.x = ...` in `setup()`, read in `train()`).
    What no binding of the file gives (a builtin, a library's attribute)
    adds nothing: callers wanting certainty ask `value_of(...).known`."""
    reach = model.reach.get(id(read))
    if reach is None:
        return ()
    found: list = []
    for b in reach:
        if not isinstance(b, Entry):
            found.append(b)
        elif isinstance(read, cst.Name):
            found += _outer_bindings(model, read.value, b) or ()
        else:
            found += _member_bindings(model, read, b)
    return tuple(dict.fromkeys(found))


def _member_bindings(model: ScriptModel, read: cst.BaseExpression, entry: Entry) -> list:
    key = dotted_name(read) if isinstance(read, cst.Attribute) else None
    if key is None and isinstance(read, cst.Subscript):
        base, member = dotted_name(read.value), _subscript_member(read)
        key = f"{base}{member}" if base and member else None
    if key is None:
        return []
    fn = entry.scope
    root, _, rest = key.partition(".")
    if fn is not None and fn.cls is not None and fn.params and root == fn.params[0] and rest and "." not in rest:
        found = []
        for m, cls in mro(model, fn.cls):
            for method in cls.all_methods:
                if method.params:
                    found += [b for b in bindings_of(m, f"{method.params[0]}.{rest}") if b.ctx.function is method]
        return found
    if namespace_key(key):
        return [b for b in bindings_of(model, key) if b.ctx.function is not fn]
    return []


def sole_binding(model: ScriptModel, read: cst.BaseExpression):
    """The one binding that reaches a read on every path to it (its value is
    certainly what that binding bound), else None."""
    reach = model.reach.get(id(read))
    if reach is None or len(reach) != 1:
        return None
    (b,) = reach
    return None if isinstance(b, Entry) else b


# -- what a value is computed from ------------------------------------------------------------

@query(on_cycle=frozenset())
def names_behind(model: ScriptModel, expr: cst.CSTNode) -> frozenset[str]:
    """The names `expr` mentions (reads, and the keywords of the calls in
    it) and, behind each name it reads, those the value bound to it mentions,
    through names (not into the functions it calls): what a value is
    computed from (`ds = Shard(data, rank=r)` ... `DataLoader(ds)`: `rank`)."""
    found: set[str] = set(reads(model, expr))
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, cst.Call):
            found.update(a.keyword.value for a in node.args if a.keyword is not None)
        reach = model.reach.get(id(node))
        if reach:
            for b in reach:
                source = getattr(b, "source", None) if not isinstance(b, Entry) else None
                if source is not None and getattr(b, "augmented", None) is None:
                    found |= names_behind(model, source)
        stack.extend(c for c in node.children if isinstance(c, cst.CSTNode))
    return frozenset(found)


# -- walking the call graph -----------------------------------------------------------------

@query(on_cycle=None)   # recursion reads as "no"
def first_call_reaching(model: ScriptModel, fn: FunctionInfo | None, test) -> CallSite | None:
    """The first call in `fn` for which `test(model, call)` holds, or that
    leads to one through the functions of the tree it calls (`test`: a
    module-level function, part of the memo key)."""
    for c in model.calls_in(fn):
        if test(model, c):
            return c
        target = resolve_call(model, c)
        if target is not None and target[1] is not fn and first_call_reaching(target[0], target[1], test) is not None:
            return c
    return None


@query(on_cycle=())
def params_handed_on(model: ScriptModel, fn: FunctionInfo) -> tuple[tuple[str, CallSite, ScriptModel, FunctionInfo, str], ...]:
    """Where `fn` hands one of its parameters, unchanged, to a function of
    the tree it calls (in this module or another): (its parameter, the call,
    the callee's model, the callee, the callee's parameter it binds). A
    parameter rebound before the call is not handed on (the read must see the
    parameter alone); a call with `*args` / `**kwargs` that hides which
    parameter gets it binds nothing."""
    found = []
    for c in model.calls_in(fn):
        target = resolve_call(model, c)
        if target is None or target[1] is fn:
            continue
        tmodel, callee = target
        for name in callee.params:
            bound, expr = argument_expr(c, callee, name)
            if not bound or not isinstance(expr, cst.Name) or expr.value not in fn.params:
                continue
            b = sole_binding(model, expr)
            if b is not None and b.kind == "param" and b.ctx.function is fn:
                found.append((expr.value, c, tmodel, callee, name))
    return tuple(found)


def runs_into(model: ScriptModel, site: CallSite, needs: Need = ()) -> list[tuple[ScriptModel, FunctionInfo]]:
    """`resolve_call` as the list of functions a walk of the call graph
    enters from a call (`callees`' and `may_reach_call`'s `runs`): the one
    function of the tree it runs, or none."""
    target = resolve_call(model, site, needs)
    return [target] if target is not None else []


def callees(model: ScriptModel, calls: Iterable[CallSite], runs=None, exclude: Iterable[FunctionInfo] = ()
            ) -> Iterator[tuple[ScriptModel, FunctionInfo, CallSite]]:
    """The functions reached from `calls` (resolved, transitively: every
    function they lead to, each once), with the call in *this* file that leads there,
    nearest first (breadth first: every function one call away, then two, ...).
    Iterative, so a chain of any length is followed without growing Python's
    stack, and a cycle ends where it comes back to a function already reached.
    `runs(model, call)`: the functions of the tree a call runs, when more than
    the one it calls count (a worker spawn's target), or fewer (only into
    modules that can reach some words); default `runs_into`.
    `exclude`: functions not to enter (the one the calls are in)."""
    seen: set[int] = {id(fn.node) for fn in exclude}
    frontier = [(model, c, c) for c in calls]
    while frontier:
        nxt = []
        for m, call, origin in frontier:
            targets = runs_into(m, call) if runs is None else runs(m, call)
            for tmodel, fn in targets:
                if id(fn.node) in seen:
                    continue
                seen.add(id(fn.node))
                yield tmodel, fn, origin
                nxt.extend((tmodel, c, origin) for c in tmodel.calls_in(fn))
        frontier = nxt



@query(on_cycle=False)
def may_reach_call(model: ScriptModel, fn: FunctionInfo, runs, candidate) -> bool:
    """Running `fn` may make a call `candidate(model, call)` accepts, in `fn`
    or in any function of the tree its calls lead to (`runs(model, call)`:
    the functions a call runs, as `callees` takes it), whatever the guards
    and whatever rank: the cheap, context-free question a walk that judges
    each call's guards under its callers' arguments asks first, so that it
    judges only calls that can lead somewhere. `runs` and `candidate` are
    module-level functions (the memo keys on them). One walk answers for
    every function it visits: when it finds no such call, none of them
    reaches one; a function already answered ends the walk there."""
    def answered(m: ScriptModel, f: FunctionInfo):
        return known(may_reach_call, m, f, runs, candidate) if f is not fn else None

    def runs_unless_answered(m: ScriptModel, call: CallSite):
        # the calls of a function answered "no" lead to functions answered "no": not walked again
        return [] if answered(m, call.ctx.function) is False else runs(m, call)

    visited = []
    for m, reached in functions_reached(model, fn, runs_unless_answered):
        found = answered(m, reached)
        if found is True:
            return True
        if found is False:
            continue
        m.project.memo.charge()
        visited.append((m, reached))
        if any(candidate(m, c) for c in m.calls_in(reached)):
            return True
    for m, reached in visited:
        keep(may_reach_call, m, reached, runs, candidate, answer=False)
    return False


def derived_from(value: Value, site: CallSite) -> bool:
    """`value` may hold what the call `site` returned or a part of it: the
    object itself, an entry or attribute of it (`ck["model"]`, `ck.state`,
    any number of levels down), or what a method of it returns
    (`ck.get("model", ck)`, `ck["model"].copy()`)."""
    seen: set[int] = set()
    todo = list(value.atoms)
    while todo:
        atom = todo.pop()
        if id(atom) in seen:
            continue
        seen.add(id(atom))
        if isinstance(atom, (Item, Member)):
            todo.append(atom.receiver)
        elif isinstance(atom, Made):
            if atom.site is site:
                return True
            func = atom.site.node.func
            if isinstance(func, cst.Attribute):   # a method of an object: what it returns comes from it
                todo.extend(value_of(atom.model, func.value).atoms)
    return False


def store_before_call(model: ScriptModel, call: CallSite, key: str):
    """The store of `key` (`args.rank`, or of what it is read from: `args`)
    that the call sees: the last one made before it in its function on every
    path to it (in no branch or loop the call is not in). (True, the
    assignment); (True, None) when nothing of the function stores it or the
    object it is read from was made anew since; (False, None) when it cannot
    be told (stored on some paths only, or after the call in a loop around it)."""
    last = None
    for a in model.assigns_in(call.ctx.function):
        if a.key != key and not key.startswith(a.key + "."):
            continue
        if a.ctx.order > call.ctx.order:
            if set(a.ctx.loops) & set(call.ctx.loops):
                return False, None
            continue
        if not set(a.ctx.branches) <= set(call.ctx.branches) or not set(a.ctx.loops) <= set(call.ctx.loops):
            return False, None
        if last is None or a.ctx.order > last.ctx.order:
            last = a
    return True, (last if last is not None and last.key == key else None)


def functions_reached(model: ScriptModel, fn: FunctionInfo, runs=None) -> Iterator[tuple[ScriptModel, FunctionInfo]]:
    """`fn` itself, then every function of the tree that running it leads
    to (`callees` of its calls, with `runs`), nearest first, each once."""
    yield model, fn
    for m, reached, _ in callees(model, model.calls_in(fn), runs, exclude=(fn,)):
        yield m, reached

__all__ = [
    "Value", "Made", "Param", "Const", "Opaque", "Func", "Class", "Lib", "Imported", "Module", "Bound", "Member",
    "Seq", "Mapping", "Super", "UNKNOWN_CONSTANT", "EMPTY", "Argument", "Pass",
    "value_of", "value_at", "resolved", "bind", "element_of", "entry_of", "constant_of", "binding_value",
    "attribute_of", "instance_class", "mro", "iteration_element", "call_argument", "argument_value",
    "call_targets", "resolve_call", "calls_plain_function", "constructs", "called_qual", "called_qual_from", "called_name", "is_api_call", "callee_value",
    "iterated", "consumed", "generator_consumes", "passes", "every_pass", "loops_in", "epoch_passes",
    "consumed_per_epoch", "is_param", "arguments_for", "namespace_key", "param_value",
    "argument_expr", "binds_receiver", "builtin_call", "union", "is_generator", "first_call_reaching", "runs_into", "callees", "functions_reached", "store_before_call", "may_reach_call", "derived_from", "bindings_of",
    "module_name_value", "resolve_import", "library_bases", "instance_of", "settled", "element", "names_behind",
    "argument_places", "literal_entry", "entry_expressions", "field_expressions", "record_fields", "expression_at_call", "LOADER_NEED", "sole_binding", "visible_bindings",
    "bindings_seen", "truth_of", "is_none_of", "call_sites_of", "result_dropped", "params_handed_on",
]
