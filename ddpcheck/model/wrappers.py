"""Does a name hold the DDP / DataParallel wrapper at a given line?

`model = DDP(model)` ... `model.state_dict()`: yes. After
`model = model.module` or a fresh `model = build()`: no. A wrap in the other
arm of an `if`, or in a world that never reaches the line (the DDP wrap under
`if args.distributed:` and the line in its `else`), does not count.
`self.model` wrapped in one method is the wrapper in the other methods of the
class (set-up runs first), unless the class unwraps it somewhere."""

from __future__ import annotations

import os
import re

import libcst as cst

from ddpcheck.model.flow import (
    Item, Made, Mapping, Member, Param, Value, argument_expr, arguments_for, bindings_seen, called_qual, constant_of, epoch_passes, loops_in,
    resolve_call, value_of,
)
from ddpcheck.model.launch import launch_commands
from ddpcheck.model.names import dotted_name, wrapper_classes_named
from ddpcheck.model.memo import query
from ddpcheck.model.children import children
from ddpcheck.model.paths import constant_path, path_spelling
from ddpcheck.model.reads import literal_text, reads
from ddpcheck.model.saves import TORCH_SAVE, saved_state_dicts
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.values import LoaderInfo, WrapInfo, loaders, wraps
from ddpcheck.model.script import exclusive
from ddpcheck.model.guards import worlds
from ddpcheck.model.feasibility import Literal, ctx_literals, feasible, never_together, param_arms

# Names whose reading in a test tells the wrapper apart from the model it wraps:
# `model.module if hasattr(model, "module") else model`, `isinstance(model, DDP)`.
_UNWRAP_NAMES = frozenset({"module", "isinstance", "hasattr", "DataParallel", "DistributedDataParallel", "DDP", "DP"})


def tells_wrapper_apart(model: ScriptModel, test: cst.BaseExpression) -> bool:
    """A test that tells the wrapper apart: `hasattr(model, "module")`,
    `isinstance(model, DDP)`, `model.module is not None`, or a call of a
    function of the tree that returns such a test (`is_parallel(model)`
    returning `type(model) in (nn.DataParallel, nn.parallel.DistributedDataParallel)`)."""
    if any(n.rpartition(".")[2] in _UNWRAP_NAMES for n in reads(model, test)):
        return True
    node = _without_not(test)
    site = model.site_of.get(id(node)) if isinstance(node, cst.Call) else None
    target = resolve_call(model, site) if site is not None else None
    return target is not None and _returns_wrapper_test(*target)


@query(on_cycle=False)
def _returns_wrapper_test(model: ScriptModel, fn: FunctionInfo) -> bool:
    """Every value `fn` returns is a test that tells the wrapper apart."""
    return bool(fn.returns) and all(expr is not None and tells_wrapper_apart(model, expr) for expr, _ctx in fn.returns)


def kinds_told_apart(model: ScriptModel, test: cst.BaseExpression) -> frozenset[str] | None:
    """The wrapper kinds `test` tells apart from the model they wrap: None
    (every kind) for `hasattr(model, "module")`, `model.module is not None`,
    or an `isinstance` of a class the engine cannot name; only the kinds it
    names for `isinstance(model, nn.DataParallel)` (DistributedDataParallel
    is no subclass of DataParallel, nor the other way round, so that test
    lets a DDP wrapper through to the other arm); the empty set for a test
    that tells nothing."""
    if not tells_wrapper_apart(model, test):
        return frozenset()
    node = _without_not(test)
    if not (isinstance(node, cst.Call) and dotted_name(node.func) == "isinstance" and len(node.args) == 2):
        return None
    return wrapper_classes_named(model.imports, node.args[1].value)


def _without_not(test: cst.BaseExpression) -> cst.BaseExpression:
    """`x` for `not x`: both tell the same things apart."""
    return test.expression if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) else test


def tells_kinds_apart(model: ScriptModel, test: cst.BaseExpression, kinds: frozenset[str]) -> bool:
    """`test` tells every one of the wrapper `kinds` apart from its model."""
    told = kinds_told_apart(model, test)
    return told is None or (bool(told) and kinds <= told)


_FALLBACK_ERRORS = frozenset({"AttributeError", "Exception", "BaseException"})


@query(on_cycle={})
def _unwrapped_fallbacks(model: ScriptModel) -> dict[int, frozenset[str]]:
    """Nodes inside the `except AttributeError:` arm of a `try` whose body
    reaches through `.module` (`try: sd = net.module.state_dict()
    except AttributeError: sd = net.state_dict()`), with the names whose
    `.module` the body tried: that arm runs only for the unwrapped object."""
    found: dict[int, frozenset[str]] = {}
    if "except" not in model.text:
        return found

    # every `try` of the module (the nodes libcst's visitor reaches, walked
    # without it: it rebuilds each node it passes); the answer is a union per
    # node, so the order of the walk does not matter
    for node in _nodes_under(model.module):
        if type(node) is not cst.Try:
            continue
        tried = frozenset(n.rpartition(".")[0] for n in reads(model, node.body)
                          if n.endswith(".module") and n.rpartition(".")[0])
        if not tried:
            continue
        for handler in node.handlers:
            caught = handler.type
            names = ([dotted_name(e.value) for e in caught.elements] if isinstance(caught, cst.Tuple)
                     else [dotted_name(caught)] if caught is not None else ["BaseException"])
            if not any((n or "").rpartition(".")[2] in _FALLBACK_ERRORS for n in names):
                continue
            for n in _nodes_under(handler.body):
                found[id(n)] = found.get(id(n), frozenset()) | tried
    return found


def _nodes_under(root: cst.CSTNode):
    """`root` and every node below it: what libcst's visitor passes, in no particular order."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def unwrapped_fallback(model: ScriptModel, node: cst.CSTNode, key: str) -> bool:
    """`node` sits in the `except AttributeError:` fallback of a `try` that
    first reached `key.module`: there `key` is not the wrapper."""
    return key in _unwrapped_fallbacks(model).get(id(node), ())


def wraps_held(model: ScriptModel, value: Value, ctx: Ctx) -> list[WrapInfo]:
    """The DDP / DataParallel wraps among a value's objects that can be what
    it holds at `ctx` (a wrap in a world that never reaches `ctx`, or in the
    other arm of an `if` with the same test, cannot); none when the value is
    also what some code unwraps (`self.model = self.model.module` in a method
    of the class: the author tells them apart)."""
    wrap_of = {}
    for atom in value.made:
        w = next((w for w in wraps(atom.model) if w.site is atom.site), None)
        if w is not None:
            wrap_of[atom] = w
    if not wrap_of:
        return []
    if any(isinstance(a, Member) and a.name == "module" and a.receiver in wrap_of for a in value.atoms):
        return []
    here = worlds(model, ctx)
    plain_too = any(a not in wrap_of for a in value.atoms)
    found = []
    for atom, w in wrap_of.items():
        if atom.model is model and (not worlds(model, w.site.ctx) & here or exclusive(w.site.ctx, ctx)
                                    or never_together(model, w.site.ctx, ctx) or runs_before_wrap(model, w, ctx)):
            continue
        if plain_too and wrapped_by_another_method(model, w.site, ctx):
            continue
        found.append(w)
    found.sort(key=lambda w: (w.kind != "DistributedDataParallel", w.site.ctx.order))
    return found


def runs_before_wrap(model: ScriptModel, w: WrapInfo, ctx: Ctx) -> bool:
    """`ctx` is in a method that the wrapping method calls before it wraps
    (`self._load_snapshot()` in `__init__`, ahead of `self.model =
    DDP(self.model)`): there the attribute is still the plain model."""
    fn = ctx.function
    wrapper_fn = w.site.ctx.function
    if fn is None or wrapper_fn is None or fn is wrapper_fn or fn.class_name is None:
        return False
    return any(c.ctx.order < w.site.ctx.order and c.func == f"self.{fn.name}" for c in model.calls_in(wrapper_fn))


def wrapped_by_another_method(model: ScriptModel, wrap: CallSite, ctx: Ctx) -> bool:
    """The wrap is stored by a method other than `__init__` and other than
    the code at `ctx`, which does not call that method first: whether the
    attribute holds the wrapper or the plain model there depends on the
    order the object's users call its methods in (timm's task:
    `compile()` before `prepare_distributed()`), so it is not known."""
    wrapper_fn = wrap.ctx.function
    fn = ctx.function
    if wrapper_fn is None or wrapper_fn.class_name is None or wrapper_fn.name == "__init__" or fn is wrapper_fn:
        return False
    if fn is None:
        return True
    return not any(c.ctx.order < ctx.order and (c.attr or "") == wrapper_fn.name for c in model.calls_in(fn))


def told_apart_where_bound(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    """`expr` is a name bound by a test that tells the wrapper apart:
    `m = model.module if hasattr(model, "module") else model`."""
    for b in model.reach.get(id(expr), ()):
        source = getattr(b, "source", None)
        if isinstance(source, cst.IfExp) and tells_wrapper_apart(model, source.test):
            return True
    return False


@query
def wrapper_held(model: ScriptModel, expr: cst.BaseExpression, ctx: Ctx) -> WrapInfo | None:
    """The wrap whose result `expr` holds at `ctx` (read there), or None."""
    found = wraps_held(model, value_of(model, expr), ctx)
    return found[0] if found else None


@query(on_cycle=False)
def prefix_adapter(model: ScriptModel, w: WrapInfo) -> bool:
    """The wrapper is only a key-prefix adapter: bound to a local name
    (`m = DataParallel(m)`) that is used for nothing but loading weights into
    it and reading `.module` back (`m.load_state_dict(sd); m = m.module`):
    never called, trained, saved, returned, stored or handed on. Loading into
    it is how the author matches a checkpoint whose keys carry `module.`,
    and nothing runs through it."""
    fn = w.site.ctx.function
    if fn is None or w.key is None or "." in w.key:
        return False
    binding = next((b for b in model.bindings if b.kind == "assign" and b.value is w.site.node
                    and b.key == w.key and b.path == ()), None)
    if binding is None:
        return False
    uses = _name_uses(model, fn, w.key)
    if uses is None:
        return False
    loaded = unwrapped = False
    for node, attr in uses:
        reach = model.reach.get(id(node))
        if reach is None or binding not in reach:
            continue
        if attr == "load_state_dict":
            loaded = True
        elif attr == "module":
            unwrapped = True
        else:
            return False
    return loaded and unwrapped


@query(on_cycle=None)
def _name_uses(model: ScriptModel, fn: FunctionInfo, name: str) -> tuple | None:
    """Every read of `name` in `fn`'s own body, with the attribute read on
    it (`m.load_state_dict` -> "load_state_dict", a bare use -> None); None
    when a function, lambda or class nested in `fn` mentions the name."""
    found: list = []
    nested = False

    class Uses(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            nonlocal nested
            if node is fn.node:
                return True
            nested = nested or _mentions(node, name)
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            nonlocal nested
            nested = nested or _mentions(node, name)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            nonlocal nested
            nested = nested or _mentions(node, name)
            return False

        def visit_Attribute(self, node: cst.Attribute) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == name:
                found.append((node.value, node.attr.value))

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name and not any(n is node for n, _ in found):
                found.append((node, None))

    fn.node.visit(Uses())
    return None if nested else tuple(found)


def _mentions(node: cst.CSTNode, name: str) -> bool:
    class Find(cst.CSTVisitor):
        hit = False

        def visit_Name(self, n: cst.Name) -> None:
            if n.value == name:
                Find.hit = True

    node.visit(Find())
    return Find.hit


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
    """The wrapper `expr` holds at `ctx`: an object it holds there (through
    any name, attribute, container, or call of the tree), or a parameter
    some caller passes it to. (wrap, the call that passed it)."""
    if told_apart_where_bound(model, expr):
        return None
    value = value_of(model, expr)
    held = wraps_held(model, value, ctx)
    if held:
        return held[0], None
    for p in value.params:
        if p.model is model and p.name not in ("self", "cls"):
            arms = param_arms(model, expr, ctx, p.fn, p.name)
            if arms is None:
                found = wrapper_passed(model, p.fn, p.name)
            else:
                own = [(b.test, b.positive) for b in ctx.branches if b.function is p.fn]
                found = _wrapper_passed_on_arms(model, p.fn, p.name, [own + arm for arm in arms])
            if found is not None:
                return found
    return None


def _wrapper_passed_on_arms(model: ScriptModel, fn: FunctionInfo, param: str,
                            arms: list) -> tuple[WrapInfo, CallSite] | None:
    """wrapper_passed, for a read that holds the parameter itself only
    along `arms` (the tests taken on the way, in `fn`): a call whose
    argument is the wrapper counts only where those tests, as the call
    passes their parameters, can hold together with the tests around the
    wrap and the call (`save(model, is_wrapped=env["ddp"])` with the wrap
    under `if env["ddp"]:` never reaches `raw = m.module if is_wrapped else
    m`'s plain arm with the wrapper)."""
    for arg in arguments_for(model, fn, param) or ():
        if arg.expr is None or arg.model is not model:
            continue
        found = wrapper_in(model, arg.expr, arg.call.ctx)
        if found is None:
            continue
        frame = (model, arg.call, fn)
        around = ctx_literals(model, arg.call.ctx) + ctx_literals(model, found[0].site.ctx)
        if any(feasible([Literal(model, t, pos, frame) for t, pos in arm] + around) for arm in arms):
            return found[0], arg.call
    return None


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


@query(on_cycle=False)
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
        # `name = k[7:]` ... `{name: v}`: the key was renamed on its own line (`name = name`
        # in a loop meets this question again: the memo's fixed point answers it)
        return any(a.kind == "assign" and a.value is not None and renames_key(model, a.value, a.ctx.function)
                   for a in bindings_seen(model, key))
    return False


@query(on_cycle=False)
def prefixes_key(model: ScriptModel, key: cst.BaseExpression, scope) -> bool:
    """A key expression that gives the key DDP's `module.` prefix (the inverse
    of `renames_key`): `"module." + k`, `f"module.{k}"`, `"module.{}".format(k)`,
    `"module.%s" % k`, or a conditional one of these
    (`k if k.startswith("module.") else "module." + k`)."""
    if isinstance(key, cst.IfExp):
        return prefixes_key(model, key.body, scope) or prefixes_key(model, key.orelse, scope)
    if isinstance(key, cst.BinaryOperation):
        if isinstance(key.operator, cst.Add):
            return _is_prefix(model, key.left, scope)
        if isinstance(key.operator, cst.Modulo):
            text = constant_of(model, key.left, scope)
            return isinstance(text, str) and text.startswith(PREFIX)
    if isinstance(key, (cst.FormattedString, cst.ConcatenatedString)):
        parts = key.parts if isinstance(key, cst.FormattedString) else ()
        return bool(parts) and isinstance(parts[0], cst.FormattedStringText) and parts[0].value.startswith(PREFIX)
    if isinstance(key, cst.Call) and isinstance(key.func, cst.Attribute) and key.func.attr.value == "format":
        text = constant_of(model, key.func.value, scope)
        return isinstance(text, str) and text.startswith(PREFIX)
    if isinstance(key, cst.Name):
        return any(a.kind == "assign" and a.value is not None and prefixes_key(model, a.value, a.ctx.function)
                   for a in bindings_seen(model, key))
    return False


def strips_prefix(model: ScriptModel, expr: cst.BaseExpression, scope) -> bool:
    """`expr` is a state dict whose keys lost the `module.` prefix: a dict
    comprehension renaming its keys, a helper that strips it, or a name
    holding one (or handed to torch's `consume_prefix_in_state_dict_if_present`)."""
    return _renamed_state(model, expr, scope, renames_key, strip=True)


def adds_prefix(model: ScriptModel, expr: cst.BaseExpression, scope) -> bool:
    """`expr` is a state dict whose keys were given the `module.` prefix
    (`{"module." + k: v ...}`, `new_sd["module." + k] = v` in a loop): made
    to be loaded into the wrapper."""
    return _renamed_state(model, expr, scope, prefixes_key, strip=False)


def _renamed_state(model: ScriptModel, expr: cst.BaseExpression, scope, renames, strip: bool) -> bool:
    """Every object `expr` can hold (the value engine's answer: through
    names, helpers of the project in any module, their returns) is a dict
    whose keys were renamed by `renames`; or, stripping, the name was handed
    to torch's `consume_prefix_in_state_dict_if_present` first."""
    key = dotted_name(expr)
    if strip and key is not None and key in _handed_to_strip(model, scope):
        return True
    value = value_of(model, expr)
    return bool(value.atoms) and all(_renamed_object(atom, renames, strip) for atom in value.atoms)


def _renamed_object(atom, renames, strip: bool) -> bool:
    """A dict made with renamed keys: a comprehension (`{k[7:]: v ...}`),
    `dict(...)` / `OrderedDict(...)` of a generator of renamed pairs, a dict
    filled key by key under renamed keys in a loop (`new = {}` ... `new[k[7:]] = v`),
    or (stripping) what a library prefix-stripping function returns."""
    if isinstance(atom, Mapping):
        node, model = atom.node, atom.model
        if isinstance(node, cst.DictComp):
            return renames(model, node.key, _scope_of(model, node))
        if isinstance(node, cst.Call):
            return _renamed_pairs(model, node, renames) or _filled_at(model, node, renames)
        if isinstance(node, cst.Dict) and not atom.entries and not atom.open:
            return _filled_at(model, node, renames)
        return False
    if isinstance(atom, Made):
        name = (called_qual(atom.model, atom.site) or atom.site.func or "").rpartition(".")[2]
        if strip and name in _STRIP_FUNCTIONS:
            return True
        if name in ("OrderedDict", "dict"):
            return _renamed_pairs(atom.model, atom.site.node, renames) or _filled_at(atom.model, atom.site.node, renames)
    return False


def _renamed_pairs(model: ScriptModel, node: cst.Call, renames) -> bool:
    """`dict((k[7:], v) for k, v in sd.items())`, `OrderedDict([...])`."""
    if not node.args or not isinstance(node.args[0].value, (cst.GeneratorExp, cst.ListComp)):
        return False
    elt = node.args[0].value.elt
    return isinstance(elt, cst.Tuple) and bool(elt.elements) and \
        renames(model, elt.elements[0].value, _scope_of(model, node))


def _filled_at(model: ScriptModel, made: cst.CSTNode, renames) -> bool:
    """The empty dict made at `made` is bound to a name (`new = {}`,
    `new = OrderedDict()`) that a loop of the same function fills under
    renamed keys."""
    for b in model.bindings:
        if b.kind == "assign" and b.value is made and b.path == () and b.key and "." not in b.key:
            return _filled_renamed(model, b.key, b.ctx.function, renames)
    return False


def _scope_of(model: ScriptModel, node: cst.CSTNode):
    """The function `node` (a call, a dict comprehension) is written in (None: module level)."""
    site = model.site_of.get(id(node))
    if site is not None:
        return site.ctx.function
    return next((fn for comp, fn in _dict_comps(model) if comp is node), None)


@query(on_cycle=())
def _dict_comps(model: ScriptModel) -> tuple:
    """Each dict comprehension of the module, with the function it is written
    in (None: module level). An explicit stack: the depth is the user's code's."""
    if "for" not in model.text:
        return ()
    found: list = []
    by_node = {id(f.node): f for f in model.functions}
    stack: list = [(model.module, None)]
    while stack:
        node, fn = stack.pop()
        node_type = type(node)   # neither class has subclasses: the isinstance test without the ABC's hook
        if node_type is cst.FunctionDef:
            fn = by_node.get(id(node), fn)
        elif node_type is cst.DictComp:
            found.append((node, fn))
        stack.extend((c, fn) for c in reversed(children(node)))
    return tuple(found)


@query(on_cycle=frozenset())
def _handed_to_strip(model: ScriptModel, scope) -> frozenset[str]:
    """Names handed to a prefix-stripping function in `scope`
    (`consume_prefix_in_state_dict_if_present(state_dict, "module.")`)."""
    return frozenset(dotted_name(c.node.args[0].value) for c in model.calls_in(scope)
                     if c.attr in _STRIP_FUNCTIONS and c.node.args and dotted_name(c.node.args[0].value))


def _tests_prefix(model: ScriptModel, test: cst.BaseExpression, scope) -> bool:
    """`k.startswith("module.")` or `"module" in k`: the key carries the prefix."""
    if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and \
            test.func.attr.value == "startswith" and test.args:
        return _is_prefix(model, test.args[0].value, scope)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
            isinstance(test.comparisons[0].operator, cst.In):
        return _is_prefix(model, test.left, scope)
    return False


def _filled_renamed(model: ScriptModel, key: str, scope, renames=renames_key) -> bool:
    """`for k, v in sd.items(): new_sd[k[7:]] = v`: a dict filled key by key
    under renamed keys, unconditionally or under a test that the key carries
    the prefix (`if "module" in k: new_sd[k[7:]] = v else: new_sd[k] = v`)."""
    def fills(block) -> bool:
        stmts = block.body if isinstance(block, cst.IndentedBlock) else ()
        for stmt in stmts:
            if isinstance(stmt, cst.If) and _tests_prefix(model, stmt.test, scope) and fills(stmt.body):
                return True
            smalls = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()
            for small in smalls:
                if not isinstance(small, cst.Assign):
                    continue
                for t in small.targets:
                    target = t.target
                    if isinstance(target, cst.Subscript) and dotted_name(target.value) == key and \
                            len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index) and \
                            renames(model, target.slice[0].slice.value, scope):
                        return True
        return False

    return any(loop.is_for and fills(loop.node.body) for loop in loops_in(model, scope))


@query(on_cycle=False)
def renames_prefix_on_load(model: ScriptModel) -> bool:
    """A loading function of the module (one that calls `torch.load` or
    `load_state_dict`, with the local functions defined in it: `def
    convert(sd): ...` inside `load_model`) renames state-dict keys to drop
    `module.`: a `k.replace("module.", "")` / `removeprefix` /
    `re.sub(r"^module\\.", ...)`, torch's `consume_prefix_in_state_dict_if_present`,
    or a dict comprehension whose key drops the prefix (`{k[7:]: v for k, v in
    sd.items()}`, also one that filters which keys it keeps)."""
    for c in model.calls:
        strips = c.attr in _STRIP_FUNCTIONS or (
            c.attr in (*_STRIP_METHODS, "sub") and bool(c.node.args)
            and _is_prefix(model, c.node.args[0].value, c.ctx.function))
        if strips and _in_loading_function(model, c.ctx.function):
            return True
    for comp, fn in _dict_comps(model):
        if renames_key(model, comp.key, fn) and _in_loading_function(model, fn):
            return True
    return False


def _in_loading_function(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """`fn`, or a function it is defined in, calls `torch.load` or `load_state_dict`."""
    while fn is not None:
        if any(c.attr in ("load", "load_state_dict") for c in model.calls_in(fn)):
            return True
        fn = fn.ctx.function
    return False


_TORCH_LOAD = frozenset({"torch.load", "torch.serialization.load"})
# The wrappers whose `state_dict()` keys are the wrapped model's under `module.`.
_PREFIXING = frozenset({"DistributedDataParallel", "DataParallel"})


def loads_own_wrapped_checkpoint(model: ScriptModel, loaded: cst.BaseExpression) -> bool:
    """`loaded` certainly holds what `torch.load(P)` read (or an item of it:
    `torch.load(P)[0]`, `ckpt["model"]`), on every path, and the project writes
    P with `torch.save` from the `state_dict()` of a DDP / DataParallel wrapper:
    P spelled the same way once names are replaced by what they hold
    (`path = os.path.join(d, "model.pth")` and `open(os.path.join(d,
    "model.pth"), "rb")`, see `paths.path_spelling`), in this module or a local
    module it imports (a trainer module that saves, an entry script that
    loads). The keys carry the wrapper's `module.` prefix, so a load into
    either wrapper matches them. A load the engine cannot tie to such a save
    (an unknown source, a path from elsewhere, several possible values) is not one."""
    value = value_of(model, loaded)
    if not value.atoms:
        return False
    for atom in value.atoms:
        while isinstance(atom, Item):
            atom = atom.receiver
        if not isinstance(atom, Made) or called_qual(atom.model, atom.site) not in _TORCH_LOAD:
            return False
        path = atom.site.arg("f", 0)
        spelling = path_spelling(atom.model, path) if path is not None else None
        if spelling is not None and _names_a_file(spelling):
            if not _project_writes_wrapped(atom.model, spelling):
                return False
        elif not _documented_as_wrapped_save(atom.model, spelling):
            return False
    return True


# a path that is one attribute of an object read at run time: `{opt.saved_model}`, or of the
# namespace a known parse_args() call returned (`{parser.parse_args@train.py:36.saved_model}`)
_OPTION_READ = re.compile(r"^\{[^{}]*\.([A-Za-z_]\w*)\}$")


def _documented_as_wrapped_save(model: ScriptModel, spelling: str | None) -> bool:
    """The path is an option read at run time (`torch.load(opt.saved_model)`),
    every value the project's documented commands give it for this script
    (`python test.py --saved_model saved_models/<exp>/best_accuracy.pth`) names
    a file the project writes from a DDP / DataParallel wrapper's
    `state_dict()` (`torch.save(model.state_dict(),
    f"./saved_models/{opt.exp_name}/best_accuracy.pth")`, by file name), and
    there is at least one such value: this module, the local modules it
    imports, or the modules beside it that import it (a training script
    importing its evaluation module) write those files."""
    m = _OPTION_READ.match(spelling or "")
    if m is None:
        return False
    option = m.group(1)
    values = [value.strip("'\"") for command in launch_commands(model) for name, value in command.script_args
              if name.lstrip("-").replace("-", "_") == option]
    if not values or any(not v or "$" in v for v in values):
        return False
    written = _wrapped_file_names(model)
    return all(os.path.basename(v) in written for v in values)


@query(on_cycle=frozenset())
def _wrapped_file_names(model: ScriptModel) -> frozenset[str]:
    """The file names (a literal last part of the path) that `torch.save`
    writes a wrapper's `state_dict()` to, in this module, the local modules it
    imports and the modules beside it that import it."""
    project = model.project
    if project is None:
        return frozenset()
    modules = [model]
    for path in (*project.imported_modules(model.path, model.scan()), *project.importers_beside(model.path)):
        other = project.model_for(path)
        if other is not None and all(other is not m for m in modules):
            project.depends_on(model.path, path)
            modules.append(other)
    names = set()
    for m in modules:
        for sink in m.calls:
            path = sink.arg("f", 1) if sink.qual in TORCH_SAVE else None
            name = _file_name(m, path) if path is not None else None
            if name and _saves_prefixed_keys(m, sink):
                names.add(name)
    return frozenset(names)


def _file_name(model: ScriptModel, path: cst.BaseExpression) -> str | None:
    """The file name a path ends in when it is written out, whatever the
    folder before it holds (`f"./saved_models/{opt.exp_name}/best.pth"`,
    `os.path.join(run_dir, "best.pth")`, `out / "best.pth"`, `out +
    "/best.pth"`: `best.pth`)."""
    spelled = path_spelling(model, path)
    if spelled is not None:
        text, whole = spelled, True
    elif isinstance(path, cst.FormattedString) and path.parts and isinstance(path.parts[-1], cst.FormattedStringText):
        text, whole = path.parts[-1].value, False
    elif isinstance(path, cst.Call) and dotted_name(path.func) in ("os.path.join", "osp.join") and path.args \
            and isinstance(path.args[-1].value, cst.SimpleString) and not path.args[-1].star:
        text, whole = literal_text(path.args[-1].value), True
    elif isinstance(path, cst.BinaryOperation) and isinstance(path.right, cst.SimpleString) and \
            isinstance(path.operator, (cst.Add, cst.Divide)):
        text, whole = literal_text(path.right), isinstance(path.operator, cst.Divide)
    else:
        return None
    if text is None or not (whole or "/" in text):
        return None   # `prefix + "best.pth"` may be `run_best.pth`: the name is not all written
    name = text.rsplit("/", 1)[-1]
    return name if name and "{" not in name else None


def _names_a_file(spelling: str) -> bool:
    """The spelling has a literal part, a file name of its own (`{out}/best.pth`),
    not only names that any two functions may share (`{path}`)."""
    return bool(re.sub(r"\{[^{}]*\}", "", spelling).strip("/"))


@query(on_cycle=False)
def _project_writes_wrapped(model: ScriptModel, spelling: str) -> bool:
    """This module, or a local module it imports (however deep), writes the
    `state_dict()` of a DDP / DataParallel wrapper with `torch.save` to the
    path spelled `spelling`."""
    def writes(m: ScriptModel) -> bool:
        return _writes_wrapped(m, spelling) or _writes_wrapped_through_calls(m, spelling)

    return writes(model) or _an_imported_module(model, writes, deep=True)


def _an_imported_module(model: ScriptModel, test, deep: bool) -> bool:
    """Some local module `model` imports (however deep, or only directly)
    passes `test`; the analysis of `model` then depends on that module."""
    project = model.project
    if project is None:
        return False
    scan = model.scan()
    paths = project.imported_modules(model.path, scan) if deep else project.local_imports(model.path, scan)
    for path in paths:
        helper = project.model_for(path)
        if helper is not None and helper is not model and test(helper):
            project.depends_on(model.path, path)
            return True
    return False


@query(on_cycle=False)
def _writes_wrapped_through_calls(model: ScriptModel, spelling: str) -> bool:
    """A call of this module hands a DDP / DataParallel wrapper to a function
    of the tree (in any module) that saves that parameter's `state_dict()`
    with `torch.save` (`save_model(net, args.out)` whose body writes
    `net.state_dict()` to `os.path.join(out_dir, "model.pth")`), to the path
    spelled `spelling` once the call's arguments stand for the parameters."""
    for call in model.calls:
        if not call.node.args:
            continue
        target = resolve_call(model, call)
        if target is None:
            continue
        tmodel, fn = target
        for sink in tmodel.calls_in(fn):
            path = sink.arg("f", 1) if sink.qual in TORCH_SAVE else None
            inner = path_spelling(tmodel, path) if path is not None else None
            if inner is None or _spelled_with_arguments(model, call, fn, inner) != spelling:
                continue
            for sd in saved_state_dicts(tmodel, sink, lambda _m, _n: False):
                held = value_of(tmodel, sd.receiver) if sd.receiver is not None else None
                if held is None or len(held.atoms) != 1:
                    continue
                (param,) = held.atoms
                if type(param) is not Param or param.fn is not fn:
                    continue
                bound, arg = argument_expr(call, fn, param.name)
                if bound and arg is not None and _prefixing(wrapper_in(model, arg, call.ctx)):
                    return True
    return False


_TOKEN = re.compile(r"\{([^{}]*)\}")
_HEAD = re.compile(r"[A-Za-z_]\w*")


def _spelled_with_arguments(model: ScriptModel, call: CallSite, fn: FunctionInfo, inner: str) -> str | None:
    """A path `fn` spells from its parameters (`{out_dir}/model.pth`), spelled
    with what `call` passes for them (`{args.out}/model.pth`); None when a
    parameter it reads is not passed a spellable argument."""
    failed = False

    def replace(match: re.Match) -> str:
        nonlocal failed
        token = match.group(1)
        head = _HEAD.match(token)
        if head is None or head.group(0) not in fn.params:
            return match.group(0)   # not a parameter of `fn`: spelled the same from anywhere
        bound, arg = argument_expr(call, fn, head.group(0))
        spelled = path_spelling(model, arg) if bound and arg is not None else None
        rest = token[head.end():]
        if spelled is None or rest and not (spelled.startswith("{") and spelled.endswith("}")):
            failed = True
            return ""
        return spelled[:-1] + rest + "}" if rest else spelled

    text = _TOKEN.sub(replace, inner)
    return None if failed else re.sub(r"/+", "/", text)


@query(on_cycle=False)
def _writes_wrapped(model: ScriptModel, spelling: str) -> bool:
    """A `torch.save` of this module writes, to the path spelled `spelling`,
    the `state_dict()` of a DDP / DataParallel wrapper. The save's path is
    spelled as written, or as the one literal it holds once the calls of this
    module are followed (`self.args.ckpt_path` in a trainer method, the
    trainer built with an options object whose `ckpt_path` is a literal)."""
    for sink in model.calls:
        path = sink.arg("f", 1) if sink.qual in TORCH_SAVE else None
        if path is None or spelling not in (path_spelling(model, path), constant_path(model, path)):
            continue
        if _saves_prefixed_keys(model, sink):
            return True
    return False


def _saves_prefixed_keys(model: ScriptModel, sink: CallSite) -> bool:
    """The `torch.save` writes the `state_dict()` of a DDP / DataParallel
    wrapper (keys with `module.`)."""
    return any(sd.receiver is not None and _prefixing(wrapper_in(model, sd.receiver, sd.ctx))
               for sd in saved_state_dicts(model, sink, lambda _m, _n: False))


def _prefixing(found) -> bool:
    """A wrapper found (`wrapper_in`) whose `state_dict()` keys carry `module.`."""
    return found is not None and found[0].kind in _PREFIXING and not found[0].overrides("state_dict")


@query(on_cycle=False)
def project_strips_prefix(model: ScriptModel) -> bool:
    """The script, or a local module it imports, strips the `module.` prefix
    from checkpoint keys where it loads them: the project reads its wrapped
    checkpoints back through that renaming (DINO's `load_pretrained_weights`)."""
    return renames_prefix_on_load(model) or _an_imported_module(model, renames_prefix_on_load, deep=False)


@query(on_cycle=())
def loaders_trained_through_calls(model: ScriptModel) -> tuple[tuple[CallSite, LoaderInfo], ...]:
    """The DataLoaders made in another module that a call of this file hands
    the DDP wrapper to iterates once per epoch (`train(dataset, model, dev)`
    whose `train_epoch` builds `DataLoader(dataset, ...)` each epoch): the
    call of this file that crosses into that module, and the loader."""
    found: list[tuple[CallSite, LoaderInfo]] = []
    seen: set[tuple[int, int]] = set()
    for p in epoch_passes(model):
        for atom in p.consumed.made_by("DataLoader"):
            if atom.model is model:
                continue
            for call in p.via:
                if model.site_of.get(id(call.node)) is not call:
                    continue
                target = resolve_call(model, call)
                if target is None or target[0] is model:
                    continue
                if (id(call.node), id(atom.site)) in seen or not _hands_ddp(model, call):
                    break
                loader = next((l for l in loaders(atom.model) if l.site is atom.site), None)
                if loader is not None:
                    seen.add((id(call.node), id(atom.site)))
                    found.append((call, loader))
                break
    return tuple(found)


def _hands_ddp(model: ScriptModel, call: CallSite) -> bool:
    for a in call.node.args:
        if a.star:
            continue
        found = wrapper_in(model, a.value, call.ctx)
        if found is not None and found[0].kind == "DistributedDataParallel":
            return True
    return False


__all__ = ["prefix_adapter", "loaders_trained_through_calls", "wrapper_held", "wraps_held", "wrapped_by_another_method", "runs_before_wrap", "told_apart_where_bound", "wrapper_passed", "wrapper_in", "renames_key", "strips_prefix",
           "prefixes_key", "adds_prefix", "unwrapped_fallback",
           "tells_wrapper_apart", "kinds_told_apart", "tells_kinds_apart", "renames_prefix_on_load", "project_strips_prefix",
           "loads_own_wrapped_checkpoint"]
