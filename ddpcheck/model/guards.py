"""RankGuard recognition: what an `if` test says about which processes run.

Recognised (aliases resolved, helpers followed into the file or local modules):
  rank tests       `rank == 0`, `args.local_rank in [-1, 0]`, `dist.get_rank() == 0`,
                   `int(os.environ["RANK"]) == 0`, `args.rank % ngpus_per_node == 0`
  main predicates  `is_main_process()`, `utils.is_main_process()`, `accelerator.is_main_process`,
                   `trainer.is_global_zero`, `master_process`, names from config
  distribution     `args.distributed`, `dist.is_initialized()`, `world_size > 1`
  combinations     `not`, `and`, `or` (`not args.distributed or args.rank == 0`)
  variables        `is_master = args.rank == 0` ... `if is_master:`
  helper functions whose `return` is one of the above (`def is_main_process(): return get_rank() == 0`)
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpcheck.model.flow import (
    Made, argument_expr, arguments_for, bindings_seen, entry_expressions, field_expressions, instance_class,
    is_none_of, library_bases, mro, resolve_call, sole_binding, truth_of, value_at, value_of,
)
from ddpcheck.model.distributed import init_calls
from ddpcheck.model.launchers import is_spawn_index
from ddpcheck.model.names import dotted_name, environ_key, is_environ, string_value
from ddpcheck.model.memo import query
from ddpcheck.model.children import children
from ddpcheck.model.reads import code_nodes, every_node, reads
from ddpcheck.model.worlds import (
    ALL, D0, DISTRIBUTED, DN, FALSE, MAIN, NONE, S, SINGLE, TRUE, UNKNOWN, Condition,
)

from ddpcheck.model.vocabulary import (  # noqa: E402  (the names guards recognise)
    DIST_FLAGS, DIST_PREDICATES, MAIN_DECORATORS, MAIN_PREDICATES, RANK_ENV, RANK_FUNCTIONS, RANK_NAMES,
    WORLD_SIZE_NAMES,
)

# Values a rank variable takes in each world: rank 0, the other ranks, and a
# single process (where scripts use 0 or the sentinel -1).
_REPRESENTATIVES = {D0: (0,), DN: (1, 2, 3, 7), S: (-1, 0)}


def worlds(model, ctx) -> frozenset[str]:
    """The worlds (rank 0, other ranks, single process) that reach `ctx`,
    from the branches inside its own function."""
    result = ALL
    for b in ctx.branches:
        cond = condition_of(model, b.test, b.function)
        result &= cond.true_branch if b.positive else cond.false_branch
    return result


@query(on_cycle=UNKNOWN)   # recursive definitions (`a = b; b = a`) read as unknown
def condition_of(model, expr: cst.BaseExpression, scope) -> Condition:
    return _condition(model, expr, scope)


def _last(model, expr: cst.BaseExpression) -> str | None:
    d = dotted_name(expr)
    if d is None:
        return None
    return model.imports.qualify(d).rpartition(".")[2]


def _extra_guards(model) -> set[str]:
    return set(model.settings.main_process_guards)


def _fold_chain(expr: cst.BooleanOperation, judge) -> Condition:
    """The condition of `a and b and c ...` (or an `or` chain), each operand
    judged by `judge`. The chain nests to the left: it is folded in a loop, so
    a long chain never reaches the recursion limit."""
    op = type(expr.operator)
    rights = []
    while isinstance(expr, cst.BooleanOperation) and type(expr.operator) is op:
        rights.append(expr.right)
        expr = expr.left
    result = judge(expr)
    for right in reversed(rights):
        cond = judge(right)
        result = result.and_(cond) if op is cst.And else result.or_(cond)
    return result


def _condition(model, expr: cst.BaseExpression, scope) -> Condition:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        negations = 0
        while isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            negations += 1
            expr = expr.expression
        inner = condition_of(model, expr, scope)
        return inner.negate() if negations % 2 else inner
    if isinstance(expr, cst.BooleanOperation):
        return _fold_chain(expr, lambda part: condition_of(model, part, scope))
    if isinstance(expr, cst.Comparison):
        return _comparison(model, expr, scope)
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return TRUE if expr.value == "True" else FALSE
    if isinstance(expr, cst.Call):
        cond = _call_condition(model, expr, scope)
    elif isinstance(expr, cst.Subscript):
        cond = _entry_condition(model, expr)
    elif isinstance(expr, (cst.Name, cst.Attribute)):
        cond = _name_condition(model, expr, scope)
    else:
        return UNKNOWN
    if cond == UNKNOWN and is_rank_expr(model, expr, scope):
        return _rank_truth()   # `if not params.rank:`: rank 0 (and a single process with rank 0)
    return cond


def _entry_condition(model, expr: cst.Subscript) -> Condition:
    """A dict's entry (`env["master_process"]` with `env = setup()` returning
    `{"master_process": rank == 0, ...}`): what every expression written for
    that entry says, where it was written; else, like an attribute, its name
    (`cfg["is_master"]`). Unknown when neither tells."""
    written = entry_expressions(model, expr)
    key = _string_key(expr)
    by_name = Condition.exactly(MAIN) if key in MAIN_PREDICATES or key in _extra_guards(model) else UNKNOWN
    if not written:
        return by_name   # named like a main-process flag, as an attribute of that name would be
    must, may = NONE, NONE
    for wmodel, value, ctx in written:
        c = condition_of(wmodel, value, ctx.function if ctx is not None else None)
        if c == UNKNOWN:
            return by_name
        # a store holds where it is made (`env["master"] = True` in the single-process arm)
        where = worlds(wmodel, ctx) if ctx is not None else ALL
        must |= c.must & where
        may |= c.may & where
    cond = Condition(must, may)
    return by_name if cond in (TRUE, FALSE) else cond   # a constant entry says nothing of ranks here


def _rank_truth() -> Condition:
    """Where a rank, tested for truth, is true: every rank but 0 (a single
    process holds 0 or -1, either)."""
    must, may = set(), set()
    for world, reps in _REPRESENTATIVES.items():
        results = [bool(r) for r in reps]
        if all(results):
            must.add(world)
        if any(results):
            may.add(world)
    return Condition(frozenset(must), frozenset(may))


def _is_wandb_run(model, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Attribute) and model.qualify(expr) == "wandb.run"


def _wandb_run_condition(model) -> Condition:
    """`wandb.run` is set only in the processes that called `wandb.init()`:
    when every such call in the file is reached by the main process only,
    `if wandb.run:` is a main-process guard."""
    inits = [c for c in model.calls if c.qual == "wandb.init"]
    if not inits:
        return UNKNOWN
    where = frozenset().union(*(worlds(model, c.ctx) for c in inits))
    return Condition(NONE, where) if DN not in where else UNKNOWN


def after_wandb_init(model, ctx) -> bool:
    """Some test around `ctx` reads `wandb.run` (`if wandb.run is not None:`,
    `if cfg.wandb is None or wandb.run is None: return`): the code runs only in
    the processes that called `wandb.init()`, wherever that is; what it logs
    goes to the run that init started."""
    from_reads = (reads(model, b.test) for b in ctx.branches)
    return any(model.imports.qualify(n) == "wandb.run" for names in from_reads for n in names)


def _name_condition(model, expr: cst.BaseExpression, scope) -> Condition:
    if _is_wandb_run(model, expr):
        return _wandb_run_condition(model)
    last = _last(model, expr)
    if last is None:
        return UNKNOWN
    if isinstance(expr, cst.Attribute):
        state = object_state_condition(model, expr, scope)
        if state is not None:
            return state
    # A variable assigned in this file: judge what was assigned, where. A
    # namespace attribute (`config.master_process = rank == 0` in setup())
    # is judged wherever it is read.
    seen = bindings_seen(model, expr)
    assigns = [b for b in seen if b.kind == "assign"]
    params = [b for b in seen if b.kind == "param"]
    if params and not assigns:
        param = _param_condition(model, params[0].ctx.function, params[0].key)
        if param is not None:
            return param
    if assigns and all(a.value is not None and a.augmented is None for a in assigns):
        conds = []
        for a in assigns:
            value = condition_of(model, a.value, a.ctx.function)
            where = worlds(model, a.ctx)
            conds.append(Condition(value.must & where, value.may & where))
        if any(c != UNKNOWN for c in conds):
            must = NONE
            may = NONE
            for c in conds:
                must |= c.must
                may |= c.may
            return Condition(must, may)
    if isinstance(expr, cst.Attribute) and not assigns:
        # a field of a record made by a set-up function (`DistEnv(rank=r, leader=r == 0)`)
        made = field_expressions(model, expr)
        if made:
            conds = [condition_of(fmodel, value, fscope) for fmodel, value, fscope in made]
            if all(c != UNKNOWN for c in conds):
                cond = Condition(frozenset.intersection(*(c.must for c in conds)),
                                 frozenset.union(*(c.may for c in conds)))
                if cond not in (TRUE, FALSE):
                    return cond   # a constant field (a config's default) says nothing of ranks here
    if last in MAIN_PREDICATES or last in _extra_guards(model):
        return Condition.exactly(MAIN)
    key = dotted_name(expr)
    if last in DIST_FLAGS or (key is not None and key in group_start_flags(model)):
        return Condition.exactly(DISTRIBUTED)
    return UNKNOWN


def object_state_condition(model, expr: cst.Attribute, scope) -> Condition | None:
    """`stopper.early_stop` (or `self.stopper.early_stop`), read from an
    object of a class of the tree that is kept to itself (only its own
    methods are called on it, `stopper(...)` runs its `__call__`): the
    attribute holds what the methods that ran in this process stored.
    `__init__` stores on every process that made the object; another method
    stores only where it is called (`if rank == 0: stopper(val_loss)`), or
    where a method calling it on `self` runs. The object is a local of
    `scope` (made there), or an attribute of `self` stored once, in
    `__init__`, and used only by the methods of that class. None (not judged
    here) when the object is handed on, aliased or stored from outside, or a
    library base class could call its methods."""
    receiver = expr.value
    if isinstance(receiver, cst.Name):
        found = _local_object(model, receiver, scope)
    elif isinstance(receiver, cst.Attribute) and dotted_name(receiver.value) == "self" and scope is not None:
        found = _self_object(model, receiver.attr.value, scope)
    else:
        found = None
    if found is None:
        return None
    made, runs = found
    cond = _stored_condition(model, made, runs, "self." + expr.attr.value)
    if cond is None or ((D0 in cond.may) == (DN in cond.may) and (D0 in cond.must) == (DN in cond.must)):
        return None   # says nothing that tells rank 0 from the others: judged as before (by its name, say)
    return cond


def _local_object(model, receiver: cst.Name, scope):
    """(the object, where each of its methods is called) for a local name."""
    if scope is not None and (receiver.value in scope.params or receiver.value in scope.declared_global):
        return None
    value = value_of(model, receiver)
    made = next(iter(value.atoms)) if value.known and len(value.atoms) == 1 else None
    if not isinstance(made, Made) or made.model is not model or made.site.ctx.function is not scope:
        return None
    name = receiver.value
    if not _kept_to_itself(model, model.module if scope is None else scope.node.body, name):
        return None
    if any(a.key.startswith(name + ".") for a in model.assigns_in(scope)):
        return None   # stored from outside its methods
    runs = {"__init__": worlds(model, made.site.ctx)}
    for c in model.calls_in(scope):
        method = _method_called(c.node.func, lambda e: isinstance(e, cst.Name) and e.value == name)
        if method is not None:
            runs[method] = runs.get(method, NONE) | worlds(model, c.ctx)
    return made, runs


def _self_object(model, attr: str, scope):
    """(the object, where each of its methods is called) for `self.<attr>`
    of the class `scope` is a method of."""
    cls = scope.cls
    if cls is None:
        return None
    stores = [a for fn in cls.all_methods for a in model.assigns_in(fn) if a.key == "self." + attr]
    if len(stores) != 1 or stores[0].ctx.function.name != "__init__" or stores[0].value is None:
        return None
    (store,) = stores
    value = value_of(model, store.value)
    made = next(iter(value.atoms)) if value.known and len(value.atoms) == 1 else None
    if not isinstance(made, Made) or made.model is not model or made.site.node is not store.value:
        return None
    if not _attribute_kept_to_class(model, cls.node, attr) or any(
            a.key.startswith(f"self.{attr}.") for fn in cls.all_methods for a in model.assigns_in(fn)):
        return None
    init = stores[0].ctx.function
    runs = {"__init__": worlds(model, store.ctx) & function_worlds(model, init)}
    is_it = lambda e: isinstance(e, cst.Attribute) and e.attr.value == attr and dotted_name(e.value) == "self"
    for fn in cls.all_methods:
        for c in model.calls_in(fn):
            method = _method_called(c.node.func, is_it)
            if method is not None:
                runs[method] = runs.get(method, NONE) | (worlds(model, c.ctx) & function_worlds(model, fn))
    return made, runs


def _method_called(func: cst.BaseExpression, is_object) -> str | None:
    """`obj(...)` runs `__call__`, `obj.m(...)` runs `m`."""
    if is_object(func):
        return "__call__"
    if isinstance(func, cst.Attribute) and is_object(func.value):
        return func.attr.value
    return None


def _stored_condition(model, made, runs: dict, key: str) -> Condition | None:
    cls = instance_class(model, made)
    if cls is None:
        return None
    classes = mro(*cls)
    if any(library_bases(cmodel, info) for cmodel, info in classes):
        return None   # a library base may call its methods from anywhere
    methods = [(cmodel, fn) for cmodel, info in classes for fn in info.all_methods]
    grown = True
    while grown:   # a method calling another on `self` runs it where it runs itself
        grown = False
        for cmodel, fn in methods:
            if fn.name not in runs:
                continue
            for c in cmodel.calls_in(fn):
                func = c.node.func
                if isinstance(func, cst.Attribute) and dotted_name(func.value) == "self":
                    where = runs[fn.name] & worlds(cmodel, c.ctx)
                    if not where <= runs.get(func.attr.value, NONE):
                        runs[func.attr.value] = runs.get(func.attr.value, NONE) | where
                        grown = True
    conds = []
    initialised = False
    for cmodel, fn in methods:
        for a in cmodel.assigns_in(fn):
            if a.key != key:
                continue
            if fn.name not in runs:
                continue   # never called on this object (it is kept to itself, and no library base calls it)
            written = a.written   # `self.a, self.b = x, False` gives `self.b` the `False`
            if written is None or a.augmented is not None:
                return None
            value_cond = condition_of(cmodel, written, fn)   # unknown: true or false, where the store runs
            where = worlds(cmodel, a.ctx) & runs[fn.name]
            initialised |= fn.name == "__init__"
            conds.append(Condition(value_cond.must & where, value_cond.may & where))
    if not initialised:
        return None
    return Condition(frozenset().union(*(c.must for c in conds)), frozenset().union(*(c.may for c in conds)))


def _attribute_kept_to_class(model, cls_node: cst.ClassDef, attr: str) -> bool:
    """Every use of the attribute name in the module is `self.<attr>` in the
    class's own body, called, read from or stored (no subclass or other code
    of the file touches it, and it is not handed on)."""
    return _attribute_names(model, model.module).get(attr, 0) == _own_attribute_uses(model, cls_node).get(attr, 0)


@query(on_cycle=None)
def _attribute_names(model, root: cst.CSTNode) -> dict[str, int]:
    """How many times each attribute name is written after a dot under `root`."""
    counts: dict[str, int] = {}
    for node in code_nodes(root):
        if isinstance(node, cst.Attribute):
            counts[node.attr.value] = counts.get(node.attr.value, 0) + 1
    return counts


@query(on_cycle=None)
def _own_attribute_uses(model, root: cst.CSTNode) -> dict[str, int]:
    """Per attribute name, the uses of `self.<name>` under `root` that keep
    the object to itself: `self.<name>.x` (read from or a method called),
    `self.<name>(...)`, and the store `self.<name> = ...`."""
    counts: dict[str, int] = {}

    def own(node) -> str | None:
        return node.attr.value if isinstance(node, cst.Attribute) and dotted_name(node.value) == "self" else None

    for node in code_nodes(root):
        if isinstance(node, cst.Attribute):
            name = own(node.value)
        elif isinstance(node, cst.Call):
            name = own(node.func)
        elif isinstance(node, cst.AssignTarget):
            name = own(node.target)
        else:
            continue
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _kept_to_itself(model, body: cst.CSTNode, name: str) -> bool:
    """Every use of `name` in the function's body (or the module) is its
    binding, an attribute of it or a call of it or of its methods, none of
    them in a nested function: the object is not handed on, and every call
    on it is in the scope's own code."""
    return _name_counts(model, body).get(name, 0) == _own_name_uses(model, body).get(name, 0)


@query(on_cycle=None)
def _name_counts(model, body: cst.CSTNode) -> dict[str, int]:
    """How many times each name is written under `body`, nested functions and
    classes included, wherever a name stands (a def's name, a keyword, an
    attribute after the dot too)."""
    counts: dict[str, int] = {}
    for node in every_node(body):
        if isinstance(node, cst.Name):
            counts[node.value] = counts.get(node.value, 0) + 1
    return counts


@query(on_cycle=None)
def _own_name_uses(model, body: cst.CSTNode) -> dict[str, int]:
    """Per name, its uses under `body` outside nested functions and classes
    that keep the object to itself: `name.x`, `name(...)`, `name = ...`."""
    counts: dict[str, int] = {}
    for node in every_node(body, lambda n: not isinstance(n, (cst.FunctionDef, cst.ClassDef))):
        if isinstance(node, cst.Attribute):
            target = node.value
        elif isinstance(node, cst.Call):
            target = node.func
        elif isinstance(node, cst.AssignTarget):
            target = node.target
        else:
            continue
        if isinstance(target, cst.Name):
            counts[target.value] = counts.get(target.value, 0) + 1
    return counts


@query(on_cycle=frozenset())
def group_start_flags(model) -> frozenset[str]:
    """The flags whose truth starts this script's process group: the tests of
    the `if`s around its group starts (`if train_config.enable_fsdp: setup()`
    with `setup()` calling init_process_group). Where such a flag is false no
    group exists and one process runs, so `not cfg.enable_fsdp or rank == 0`
    is a main-process guard."""
    found = set()
    for call in init_calls(model):
        for b in call.ctx.branches:
            if b.positive and isinstance(b.test, (cst.Name, cst.Attribute)):
                key = dotted_name(b.test)
                if key:
                    found.add(key)
    return frozenset(found)


def _param_condition(model, fn, name: str, none_test: bool = False) -> Condition | None:
    """A parameter is the guard its callers pass (`log_fn(is_master)`): true
    where some call passes a true value, certainly true only where every call
    does (a literal, an object, a default left as is, `x if rank == 0 else
    None`: see _expr_condition). With `none_test`, where it is None. None
    when some caller cannot be seen."""
    args = arguments_for(model, fn, name)
    if not args:
        return None
    conds = [_expr_condition(model, a.expr, a.scope, (), none_test) for a in args]
    if all(c == UNKNOWN for c in conds):
        return None
    must, may = ALL, NONE
    for a, c in zip(args, conds):
        where = worlds(model, a.call.ctx)
        must &= c.must | (ALL - where)
        may |= c.may & where
    return Condition(must, may)


def _call_condition(model, call: cst.Call, scope) -> Condition:
    last = _last(model, call.func)
    if last is None:
        return UNKNOWN
    if last in MAIN_PREDICATES or last in _extra_guards(model):
        return Condition.exactly(MAIN)
    if last in DIST_PREDICATES:
        return Condition.exactly(DISTRIBUTED)
    if last == "is_available":
        return TRUE   # torch.distributed.is_available(): true on every Linux/macOS build
    if last == "getattr" and len(call.args) >= 2 and isinstance(call.args[1].value, cst.SimpleString):
        attr = call.args[1].value.evaluated_value
        if attr in DIST_FLAGS:
            return Condition.exactly(DISTRIBUTED)
        if attr in MAIN_PREDICATES:
            return Condition.exactly(MAIN)
    # A helper of the user's: judge what it returns.
    site = model.site_of.get(id(call))
    target = resolve_call(model, site) if site is not None else None
    if target is not None:
        tmodel, fn = target
        if fn.returns:
            must, may = ALL, NONE
            for value, ctx in fn.returns:
                c = condition_of(tmodel, value, fn)
                where = worlds(tmodel, ctx)
                must &= c.must | (ALL - where)
                may |= c.may & where
            return Condition(must, may)
    return UNKNOWN


# -- rank comparisons ----------------------------------------------------------

def is_rank_expr(model, expr: cst.BaseExpression, scope) -> bool:
    if isinstance(expr, cst.Call):
        last = _last(model, expr.func)
        if last in RANK_FUNCTIONS:
            return True
        if last == "int" and expr.args:
            return is_rank_expr(model, expr.args[0].value, scope)
        if last in ("get", "getenv") and expr.args:
            key = string_value(expr.args[0].value)
            # `os.environ.get("RANK")`, and a config dict's entry named like a rank
            # (`config.get("rank", 0)`), judged as an attribute of that name would be
            return key in RANK_ENV or (last == "get" and _rank_name(key))
        return False
    if isinstance(expr, cst.Subscript):
        env = environ_key(model.imports, expr)
        if env is not None:
            return env in RANK_ENV
        # `config["rank"]`: a config dict's entry, named like a rank attribute
        return _rank_name(_string_key(expr))
    if isinstance(expr, (cst.Name, cst.Attribute)):
        last = _last(model, expr)
        if _rank_name(last):
            return True
        if isinstance(expr, cst.Attribute) and last and last.isupper() and _rank_name(last.lower()):
            return True   # `cfg.LOCAL_RANK`: a config object's field in capitals (yacs, easydict)
        key = dotted_name(expr)
        seen = bindings_seen(model, expr)
        if isinstance(expr, cst.Name) and is_spawn_index(model, expr.value, scope) and \
                all(b.kind == "param" for b in seen):
            return True   # `def main_worker(gpu, args)` handed to mp.spawn: `if gpu == 0:`
        if key:
            return bool(seen) and all(b.kind == "assign" and _rank_valued(model, b, expr) for b in seen)
    return False


_QUANTITY_HEADS = {"num", "n", "max", "min", "total", "size", "count"}


# `is_built_on_rank`, `has_rank`, `use_global_rank`: a predicate or a switch about ranks, not a rank
_PREDICATE_HEADS = {"is", "has", "should", "use", "can", "do", "on", "enable", "skip"}


def _rank_name(name: str | None) -> bool:
    """A variable, attribute or config key named for a rank (`rank`, `args.local_rank`, `cfg["ddp_rank"]`)."""
    return bool(name) and (name in RANK_NAMES or (name.endswith("_rank") and name != "node_rank"
                                                  and not _per_rank_quantity(name)
                                                  and name.lower().split("_")[0] not in _PREDICATE_HEADS))


def _string_key(expr: cst.Subscript) -> str | None:
    if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return None
    return string_value(expr.slice[0].slice.value)


def _per_rank_quantity(name: str) -> bool:
    """`num_tokens_per_microbatch_per_dp_rank`, `batch_per_rank`, `max_rank`:
    an amount per rank (or a bound), not a rank."""
    parts = name.lower().split("_")
    return "per" in parts or parts[0] in _QUANTITY_HEADS


@query(on_cycle=False)
def _rank_valued(model, binding, read: cst.BaseExpression) -> bool:
    """An assignment whose value is a rank (`rank = dist.get_rank()`), also
    unpacked: from a tuple written out (`save_dir, rank = d, opt.global_rank`),
    or from what a call returns, `read` (the name or attribute the binding
    reaches) then holding only what a rank function made (`world,
    cfg.LOCAL_RANK = init_dist()`, whose `return ws, dist.get_rank()`)."""
    if binding.value is not None:
        return is_rank_expr(model, binding.value, binding.ctx.function)
    written = binding.written
    if written is not None:
        return is_rank_expr(model, written, binding.ctx.function)
    if binding.unpacked is None:
        return False
    value = value_of(model, read)
    return bool(value.atoms) and all(isinstance(a, Made) and (a.site.qual or "").rpartition(".")[2] in RANK_FUNCTIONS
                                     for a in value.atoms)


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _literal(expr: cst.BaseExpression):
    """An int (or "0"-like string) literal, a tuple/list/set of them, else None."""
    if isinstance(expr, cst.Integer):
        return expr.evaluated_value   # 0, 0x0, 1_000 alike
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and isinstance(expr.expression, cst.Integer):
        return -expr.expression.evaluated_value
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return None
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        items = [_literal(e.value) for e in expr.elements]
        if items and all(isinstance(i, int) for i in items):
            return tuple(items)
    return None


_OPS = {
    cst.Equal: lambda a, b: a == b, cst.NotEqual: lambda a, b: a != b,
    cst.LessThan: lambda a, b: a < b, cst.LessThanEqual: lambda a, b: a <= b,
    cst.GreaterThan: lambda a, b: a > b, cst.GreaterThanEqual: lambda a, b: a >= b,
    cst.Is: lambda a, b: a == b, cst.IsNot: lambda a, b: a != b,
    cst.In: lambda a, b: a in b, cst.NotIn: lambda a, b: a not in b,
}
_FLIP = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
         cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual}


def _comparison(model, expr: cst.Comparison, scope) -> Condition:
    if len(expr.comparisons) != 1:
        return UNKNOWN
    target = expr.comparisons[0]
    op_type = type(target.operator)
    left, right = expr.left, target.comparator
    if op_type not in _OPS:
        return UNKNOWN
    compared = _param_compared(model, expr, scope)
    if compared is not None:
        cond = _compared_in_calls(model, scope, *compared)
        if cond is not None:
            return cond
    # `rank % ngpus_per_node == 0`: the first process of every node (torchvision,
    # MoCo). For logging and saving it is a rank guard.
    if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
        if is_rank_expr(model, left.left, scope) and _literal(right) == 0:
            if op_type is cst.Equal:
                return Condition.exactly(MAIN)
            if op_type is cst.NotEqual:
                return Condition.exactly(frozenset({DN}))
        return UNKNOWN
    if op_type in (cst.Is, cst.IsNot) and _is_none(right) != _is_none(left):
        side = left if _is_none(right) else right
        if _is_wandb_run(model, side):   # `wandb.run is not None`: a Run object or None
            cond = _wandb_run_condition(model)
            return cond if op_type is cst.IsNot else cond.negate()
        if isinstance(side, cst.Name) and scope is not None and _own_param(model, side, scope):
            # `if scaler is None:` in a function: what the file's calls pass
            cond = _param_condition(model, scope, side.value, none_test=True)
            if cond is not None:
                return cond if op_type is cst.Is else cond.negate()
        # `rank is None or rank == 0` (None: "not distributed"): a rank of a
        # distributed process is always an int; a single process may hold None.
        if not is_rank_expr(model, side, scope):
            return UNKNOWN
        if op_type is cst.Is:
            return Condition(frozenset(), frozenset({S}))
        return Condition(frozenset({D0, DN}), frozenset({D0, DN, S}))
    if _literal(left) is not None and _literal(right) is None:
        left, right = right, left
        if op_type in _FLIP:
            op_type = _FLIP[op_type]
        elif op_type in (cst.In, cst.NotIn):
            return UNKNOWN
    value = _literal(right)
    if value is None:
        return _size_comparison(model, left, op_type, right, scope)
    if not is_rank_expr(model, left, scope) and not (
            isinstance(left, cst.Attribute) and _made_field_is_rank(model, left.value, scope, left.attr.value)):
        return _size_comparison(model, left, op_type, right, scope)
    return _rank_compared(op_type, value)


def _rank_compared(op_type, value) -> Condition:
    """What `<a rank> <op> value` says, from the values a rank takes in each world."""
    if isinstance(value, tuple) and op_type not in (cst.In, cst.NotIn):
        return UNKNOWN
    if not isinstance(value, tuple) and op_type in (cst.In, cst.NotIn):
        return UNKNOWN
    test = _OPS[op_type]
    must, may = set(), set()
    for world, reps in _REPRESENTATIVES.items():
        results = [test(r, value) for r in reps]
        if all(results):
            must.add(world)
        if any(results):
            may.add(world)
    return Condition(frozenset(must), frozenset(may))


_NO_VALUE = object()


def literal_value(expr: cst.BaseExpression | None):
    """The Python value of a literal as written (`''`, `[]`, `"out"`, `3`,
    `None`, `(1, 2)`), else _NO_VALUE."""
    if expr is None:
        return _NO_VALUE
    try:
        return ast.literal_eval(cst.Module([]).code_for_node(expr).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NO_VALUE


def _param_compared(model, expr: cst.Comparison, scope):
    """`param != ''`, `param == "none"`, `len(param) > 0` (either side): the
    parameter of `scope` compared with a literal, and the test as a function
    of the parameter's value; None for anything else."""
    if scope is None or len(expr.comparisons) != 1:
        return None
    op_type = type(expr.comparisons[0].operator)
    if op_type not in _OPS or op_type in (cst.Is, cst.IsNot):
        return None
    left, right = expr.left, expr.comparisons[0].comparator
    if literal_value(left) is not _NO_VALUE and literal_value(right) is _NO_VALUE:
        if op_type not in (cst.Equal, cst.NotEqual, *_FLIP):
            return None
        left, right = right, left
        op_type = _FLIP.get(op_type, op_type)
    bound = literal_value(right)
    if bound is _NO_VALUE:
        return None
    measure = None
    if isinstance(left, cst.Call) and isinstance(left.func, cst.Name) and left.func.value == "len" \
            and len(left.args) == 1 and not left.args[0].star:
        left, measure = left.args[0].value, len
    if not (isinstance(left, cst.Name) and _own_param(model, left, scope)):
        return None
    test = _OPS[op_type]

    def judge(value) -> bool | None:
        try:
            return bool(test(measure(value) if measure is not None else value, bound))
        except TypeError:
            return None   # `len(None)` raises, `None < 1` too: not a branch that is taken quietly
    return left.value, judge


def _compared_in_calls(model, fn, name: str, judge) -> Condition | None:
    """Where the test `judge` of parameter `name` holds, from what the file's
    calls pass (a literal, or the default as written); None when some call
    passes something else, or no call is seen."""
    args = arguments_for(model, fn, name)
    if not args:
        return None
    must, may = ALL, NONE
    for a in args:
        answer = judge(literal_value(a.expr)) if literal_value(a.expr) is not _NO_VALUE else None
        if answer is None:
            return None
        where = worlds(model, a.call.ctx)
        cond = TRUE if answer else FALSE
        must &= cond.must | (ALL - where)
        may |= cond.may & where
    return Condition(must, may)


# -- tests true on one process of the job -------------------------------------

def _is_world_size(model, expr: cst.BaseExpression) -> bool:
    """`world_size`, `args.world_size`, `dist.get_world_size()`,
    `int(os.environ["WORLD_SIZE"])`: the number of processes, the same on
    every rank."""
    while isinstance(expr, cst.Call) and _last(model, expr.func) == "int" and len(expr.args) >= 1:
        expr = expr.args[0].value
    if isinstance(expr, cst.Call):
        last = _last(model, expr.func)
        return last == "get_world_size" or (
            last in ("get", "getenv") and bool(expr.args) and string_value(expr.args[0].value) == "WORLD_SIZE")
    if isinstance(expr, cst.Subscript):
        return environ_key(model.imports, expr) == "WORLD_SIZE"
    return _last(model, expr) in WORLD_SIZE_NAMES


_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)


def _same_on_every_rank(model, expr: cst.BaseExpression, scope, seen: frozenset[int] = frozenset()) -> bool:
    """`expr` has one value in every process of the job, as far as its text
    and bindings show: integer literals and the world size combined by
    arithmetic (`world_size - 1`, `args.world_size // 2`), or a name bound
    only to such a value. Anything else (a loop index, a parameter, a
    command-line option) is not known to be."""
    if isinstance(expr, cst.Integer) or (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus)
                                         and isinstance(expr.expression, cst.Integer)):
        return True
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ARITHMETIC):
        return _same_on_every_rank(model, expr.left, scope, seen) and _same_on_every_rank(model, expr.right, scope, seen)
    if _is_world_size(model, expr):
        return True
    if _collective_result(model, expr, scope):
        return True
    if isinstance(expr, cst.Name) and id(expr) not in seen:
        seen_bindings = bindings_seen(model, expr)
        return bool(seen_bindings) and all(
            b.kind == "assign" and b.written is not None and b.augmented is None
            and _same_on_every_rank(model, b.written, b.ctx.function, seen | {id(expr)})
            for b in seen_bindings)
    return False


# Collectives after which every rank holds the same value in what they were handed.
_SAME_AFTER = frozenset({"broadcast_object_list", "broadcast", "all_reduce"})


def _collective_result(model, expr: cst.BaseExpression, scope) -> bool:
    """`choice[0]` after `dist.broadcast_object_list(choice, src=0)`, `t.item()`
    / `int(t)` after `dist.broadcast(t, 0)` or `dist.all_reduce(t)` in the same
    function: every rank holds what the collective left there. Also a call
    of a function of the tree each of whose returns is one
    (`def share(obj): ...; dist.broadcast_object_list(box); return box[0]`)."""
    if isinstance(expr, cst.Subscript):
        return _handed_to_collective(model, expr.value, scope, ("broadcast_object_list",))
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("item", "tolist") and not expr.args:
            return _handed_to_collective(model, expr.func.value, scope, ("broadcast", "all_reduce"))
        if _last(model, expr.func) in ("int", "float") and len(expr.args) == 1:
            return _handed_to_collective(model, expr.args[0].value, scope, ("broadcast", "all_reduce"))
        site = model.site_of.get(id(expr))
        target = resolve_call(model, site) if site is not None else None
        if target is not None and target[1].returns:
            tmodel, fn = target
            return all(_collective_result(tmodel, value, fn) for value, _ in fn.returns)
    return False


def _handed_to_collective(model, holder: cst.BaseExpression, scope, names: tuple[str, ...]) -> bool:
    """`holder` (a name) is the first argument of such a collective called
    earlier in the same function, on every path (not under a test of its own)."""
    if not isinstance(holder, cst.Name):
        return False
    read = _order_of(model, holder)
    for c in model.calls:
        if c.ctx.function is not scope or not c.node.args or (c.qual or c.func or "").rpartition(".")[2] not in names:
            continue
        first = c.node.args[0].value
        if isinstance(first, cst.Name) and first.value == holder.value and read is not None \
                and c.ctx.order < read and not _inside_own_test(c.ctx, scope):
            return True
    return False


def _order_of(model, node: cst.CSTNode) -> int | None:
    """The source order of the code reading `node` (a name or `x.attr`), when
    the model recorded the read."""
    key = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else None
    for r in model.references.get(key, ()) if key is not None else ():
        if r.node is node:
            return r.ctx.order
    return None


def _inside_own_test(ctx, scope) -> bool:
    return any(b.function is scope for b in ctx.branches)


def _one_rank_comparison(model, expr: cst.BaseExpression, scope) -> str | None:
    """"==" for `rank == k`, "!=" for `rank != k`, with `k` the same on every
    rank (`args.rank == args.world_size - 1`, `dist.get_rank() == 3`): the
    test is true on one process at most; else None."""
    if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
        return None
    op = expr.comparisons[0].operator
    if not isinstance(op, (cst.Equal, cst.NotEqual)):
        return None
    left, right = expr.left, expr.comparisons[0].comparator
    for rank, other in ((left, right), (right, left)):
        if is_rank_expr(model, rank, scope) and not is_rank_expr(model, other, scope) \
                and _same_on_every_rank(model, other, scope):
            return "==" if isinstance(op, cst.Equal) else "!="
    return None


def _one_rank_when(model, test: cst.BaseExpression, scope, positive: bool) -> bool:
    """The arm `positive` of `test` runs on one process at most: a rank
    compared equal to a value every rank shares, in a chain of `and`s taken
    (or of `or`s not taken, for `!=`)."""
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, positive = test.expression, not positive
    if isinstance(test, cst.BooleanOperation):
        if isinstance(test.operator, cst.And) and positive:
            return _one_rank_when(model, test.left, scope, True) or _one_rank_when(model, test.right, scope, True)
        if isinstance(test.operator, cst.Or) and not positive:
            return _one_rank_when(model, test.left, scope, False) or _one_rank_when(model, test.right, scope, False)
        return False
    kind = _one_rank_comparison(model, test, scope)
    if kind is None and positive:
        return _one_rank_value(model, test, scope)
    return kind == ("==" if positive else "!=")


@query(on_cycle=False)
def _one_rank_value(model, expr: cst.BaseExpression, scope) -> bool:
    """A flag or predicate true on one process at most: a name bound only
    to such a test (`is_last = args.rank == args.world_size - 1`), or a call
    of a function of the tree each of whose returns is one
    (`def is_last_rank(): return dist.get_rank() == dist.get_world_size() - 1`)."""
    if isinstance(expr, cst.Name):
        seen = bindings_seen(model, expr)
        return bool(seen) and all(b.kind == "assign" and b.written is not None and b.augmented is None
                                  and _one_rank_when(model, b.written, b.ctx.function, True)
                                  for b in seen)
    if isinstance(expr, cst.Call) and not expr.args:
        site = model.site_of.get(id(expr))
        target = resolve_call(model, site) if site is not None else None
        if target is None or not target[1].returns:
            return False
        tmodel, fn = target
        return all(_one_rank_when(tmodel, value, fn, True) for value, _ in fn.returns)
    return False


def one_rank_only(model, ctx) -> bool:
    """Some test around `ctx` lets one process of the job at most through
    (`if args.rank == args.world_size - 1:`, `if dist.get_rank() != 3:
    return`): whatever else the tests say, `ctx` does not run on several
    ranks. DDP301 asks it: one writer is not N writers fighting over a file."""
    return any(_one_rank_when(model, b.test, b.function, b.positive) for b in ctx.branches)


def _size_comparison(model, left, op_type, right, scope) -> Condition:
    """`world_size > 1` / `dist.get_world_size() == 1`."""
    value = _literal(right)
    if not isinstance(value, int):
        return UNKNOWN
    while isinstance(left, cst.Call) and _last(model, left.func) == "int" and len(left.args) >= 1:
        left = left.args[0].value   # `int(os.environ.get("WORLD_SIZE", 1)) > 1`
    if isinstance(left, cst.Call):
        last = _last(model, left.func)
        is_ws = last == "get_world_size" or (
            last in ("get", "getenv") and bool(left.args) and string_value(left.args[0].value) == "WORLD_SIZE"
            and (last == "getenv" or is_environ(model.imports, left.func.value if isinstance(left.func, cst.Attribute) else left.func)))
    elif isinstance(left, cst.Subscript):
        is_ws = environ_key(model.imports, left) == "WORLD_SIZE"
    else:
        last = _last(model, left)
        is_ws = last in WORLD_SIZE_NAMES
    if not is_ws:
        return UNKNOWN
    test = _OPS[op_type]
    # distributed jobs have world size 2+ (say 2 and 8), a single process 1
    dist_true = [test(n, value) for n in (2, 8)]
    single_true = test(1, value)
    must, may = set(), set()
    if all(dist_true):
        must |= {D0, DN}
    if any(dist_true):
        may |= {D0, DN}
    if single_true:
        must.add(S)
        may.add(S)
    return Condition(frozenset(must), frozenset(may))


def worlds_from_call(model, ctx, fn, frames: tuple) -> frozenset[str]:
    """The worlds reaching `ctx` (in `fn`, in `model`) when `fn` runs from the
    call `frames[0]` = (caller's model, call), itself run from `frames[1]`, and
    so on outwards: a test of `fn`'s parameters is judged by what the calls
    pass (`def save(state, path, enabled): if enabled: ...`, a default left
    as is, `log_dir if is_main else None` handed on through two helpers),
    across modules too. An empty result: the call never reaches `ctx`."""
    result = ALL
    for b in ctx.branches:
        if b.function is fn:
            cond = condition_in_call(model, b.test, fn, frames)
        else:
            cond = condition_of(model, b.test, b.function)
        result &= cond.true_branch if b.positive else cond.false_branch
    return result


def reached_from_call(model, ctx, fn, frames: tuple) -> bool:
    """Some process can reach `ctx` when `fn` runs from those calls (False:
    the arm it sits in cannot be taken for the arguments passed)."""
    return bool(worlds_from_call(model, ctx, fn, frames))


def relevant_frames(frames: tuple) -> tuple:
    """The part of `frames` (the calls that run a function, innermost first)
    that worlds_from_call and called_qual_from can read: the innermost call,
    and each call further out only while the call inside it hands on
    something its own function was given (`save(state, path, enabled=flag)`
    with `flag` a parameter of the caller is judged at the caller's caller;
    `save(state, path, enabled=False)` is judged there and then). A question
    asked with these frames has the answer it has with all of them, so they
    are what a memoised question about a chain of calls is keyed on: every
    chain that ends in the same call shares it, and a recursion whose calls
    hand nothing on comes back to the same question (a fixed point)."""
    if not frames:
        return frames
    keep = 1
    while keep < len(frames) and passes_own_params(*frames[keep - 1]):
        keep += 1
    return frames[:keep]


@query(on_cycle=True)
def passes_own_params(model, call) -> bool:
    """Some argument of `call` reads a parameter of the function the call is
    in, as written or through the function's own assignments (`flag =
    enabled and rank == 0`, then `save(..., flag)`)."""
    scope = call.ctx.function
    if scope is None:
        return False
    if _receiver_is_own_self(model, call):
        return True   # `self.save(...)`: an attribute test in `save` is judged on the object the caller runs on
    return any(_reads_params(model, a.value, scope, set()) for a in call.node.args)


def _reads_params(model, expr: cst.CSTNode, scope, seen: set[int]) -> bool:
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, cst.Name):
            for b in bindings_seen(model, node):
                if b.ctx.function is not scope:
                    continue
                if b.kind == "param":
                    return True
                if b.kind == "assign" and id(b) not in seen:
                    seen.add(id(b))
                    todo.append(b.value if b.value is not None else b.node)
        else:
            todo.extend(children(node))
    return False


@query(on_cycle=UNKNOWN)
def condition_in_call(model, test: cst.BaseExpression, fn, frames: tuple) -> Condition:
    """What `test`, read in `fn`, says when `fn` runs from `frames` (see
    worlds_from_call): a parameter of `fn` tested for truth (`if sync:`,
    `not sync`) or for None (`x is None`, `x is not None`) is what the
    argument says (a literal, an object of a class of the tree, a rank test,
    `a if rank == 0 else None` arm by arm, a parameter of the caller passed
    on from the call further out), or the parameter's default when the call
    leaves it out. Anything else is condition_of's answer."""
    if not frames:
        return condition_of(model, test, fn)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return condition_in_call(model, test.expression, fn, frames).negate()
    if isinstance(test, cst.BooleanOperation):
        return _fold_chain(test, lambda part: condition_in_call(model, part, fn, frames))
    if isinstance(test, cst.Name) and _own_param(model, test, fn):
        return _argument_condition(model, fn, test.value, frames, none_test=False)
    # What a flag holds for this call, when it can be told: `self.enable = enable` ...
    # `if self.enable:` in the same function (the value stored: a constructor's flag is
    # what the call passes), `if self.enabled:` in a method run on an object whose
    # constructor call passed the flag, a dict entry a loop over the dict rewrote. When
    # that says nothing, the test is judged as condition_of judges it (by its name, say).
    for told in (_stored_in_function(model, test, fn), _entry_rewritten_by_loop(model, test, fn)):
        if told is not None:
            cond = condition_in_call(model, told, fn, frames)
            if cond != UNKNOWN:
                return cond
    held = _attribute_of_receiver(model, test, fn, frames)
    if held is not None and held != UNKNOWN:
        return held
    compared = _param_compared(model, test, fn) if isinstance(test, cst.Comparison) else None
    if compared is not None:
        answer = _compared_at_call(model, fn, *compared, frames)
        if answer is not None:
            return TRUE if answer else FALSE
    if isinstance(test, cst.Comparison):
        field = _param_field_compared(model, test, fn)
        if field is not None and _field_is_rank_at_call(model, fn, field[0], field[1], frames):
            return _rank_compared(field[2], field[3])
        if field is not None and fn.class_name and fn.params[:1] == (field[0],) \
                and _receiver_field_is_rank(model, test, fn, field[1], frames):
            return _rank_compared(field[2], field[3])
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
            type(test.comparisons[0].operator) in (cst.Is, cst.IsNot):
        left, right = test.left, test.comparisons[0].comparator
        side = left if _is_none(right) else right if _is_none(left) else None
        if isinstance(side, cst.Name) and _own_param(model, side, fn):
            cond = _argument_condition(model, fn, side.value, frames, none_test=True)
            return cond if isinstance(test.comparisons[0].operator, cst.Is) else cond.negate()
    return condition_of(model, test, fn)


def _stored_in_function(model, read: cst.BaseExpression, fn) -> cst.BaseExpression | None:
    """The value the one assignment reaching `read` (a name or `self.x`) on
    every path stored, when that assignment is a plain one in `fn` itself and
    its value reads one of `fn`'s parameters (`enabled = flag and HAS_TB`,
    `self.enable = enable`); None otherwise (what other functions store, or a
    value with no parameter in it, is condition_of's to judge)."""
    if not isinstance(read, (cst.Name, cst.Attribute)) or fn is None:
        return None
    bound = sole_binding(model, read)
    if bound is None or bound.kind != "assign" or bound.value is None or bound.augmented is not None \
            or bound.path != () or bound.ctx.function is not fn:
        return None
    return bound.value if _reads_params(model, bound.value, fn, set()) else None


def _entry_rewritten_by_loop(model, test: cst.BaseExpression, fn) -> cst.BaseExpression | None:
    """`flags["writer"]` read after `for k, v in flags.items(): flags[k] = v
    and self.enable` in `fn`: a loop over a dict's own keys that stores every
    entry, unconditionally, leaves each entry that existed holding what it
    stored: that value (its reads of the loop's variables stay unknown).
    Only a loop that is a statement of `fn`'s own body ahead of the one
    reading the entry, with nothing else in the body storing an entry of
    that dict, is read; None otherwise."""
    if fn is None or not isinstance(test, cst.Subscript) or _string_key(test) is None:
        return None
    holder = dotted_name(test.value)
    body = getattr(fn.node.body, "body", ())
    if holder is None or not body:
        return None
    found = None
    for stmt in body:
        if _contains(stmt, test):
            return found
        stored = _loop_store(stmt, holder)
        if stored is not None:
            found = stored
        elif _stores_entry(stmt, holder):
            found = None   # another store of an entry: what it leaves is not read here
    return None


def _loop_store(stmt: cst.CSTNode, holder: str) -> cst.BaseExpression | None:
    """`for k, v in d.items(): d[k] = value` (or `for k in d` / `d.keys()`):
    the value, when the store is a statement of the loop's own body."""
    if not isinstance(stmt, cst.For) or stmt.orelse is not None:
        return None
    target = stmt.target
    key = target.elements[0].value if isinstance(target, cst.Tuple) and target.elements else target
    if not isinstance(key, cst.Name) or not _iterates_own_keys(stmt.iter, holder, target):
        return None
    value = None
    for line in getattr(stmt.body, "body", ()):
        for small in getattr(line, "body", ()) if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                t = small.targets[0].target
                if isinstance(t, cst.Subscript) and dotted_name(t.value) == holder and len(t.slice) == 1 \
                        and isinstance(t.slice[0].slice, cst.Index) and isinstance(t.slice[0].slice.value, cst.Name) \
                        and t.slice[0].slice.value.value == key.value:
                    value = small.value
    return value


def _iterates_own_keys(it: cst.BaseExpression, holder: str, target: cst.BaseExpression) -> bool:
    """`for k in d`, `for k in d.keys()`, `for k, v in d.items()`."""
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and not it.args \
            and dotted_name(it.func.value) == holder:
        if it.func.attr.value == "items":
            return isinstance(target, cst.Tuple) and len(target.elements) == 2
        return it.func.attr.value == "keys" and isinstance(target, cst.Name)
    return dotted_name(it) == holder and isinstance(target, cst.Name)


def _stores_entry(stmt: cst.CSTNode, holder: str) -> bool:
    todo = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if any(isinstance(t, cst.Subscript) and dotted_name(t.value) == holder for t in targets):
                return True
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        todo.extend(children(node))
    return False


def _contains(stmt: cst.CSTNode, node: cst.CSTNode) -> bool:
    todo = [stmt]
    while todo:
        current = todo.pop()
        if current is node:
            return True
        todo.extend(children(current))
    return False


def _attribute_of_receiver(model, test: cst.BaseExpression, fn, frames: tuple) -> Condition | None:
    """`if self.enabled:` in a method run by `logger.log(...)` (`frames[0]`):
    where the attribute is true on the object the call runs it on, from
    what its constructor call passed (`Logger(out, enabled=rank == 0)` with
    `self.enabled = enabled` in `__init__`), for every object the receiver
    may hold, each where it was made. None when the receiver is not known to
    hold only objects of classes of the tree, or the attribute is stored
    anywhere but by one plain assignment in `__init__`."""
    if not frames or not isinstance(test, cst.Attribute) or not isinstance(test.value, cst.Name) \
            or fn is None or not fn.class_name or not fn.params or test.value.value != fn.params[0]:
        return None
    stores = bindings_seen(model, test)
    if len(stores) != 1:
        return None
    store = stores[0]
    init = store.ctx.function
    if store.kind != "assign" or store.value is None or store.augmented is not None or store.path != () \
            or init is None or init.name != "__init__":
        return None
    caller_model, call = frames[0]
    if call.receiver is None:
        return None
    value = value_at(caller_model, call.receiver, call.ctx.function)
    if not value.known or not value.atoms:
        return None
    must, may = ALL, NONE
    for atom in value.atoms:
        if not isinstance(atom, Made):
            return None
        made = resolve_call(atom.model, atom.site)
        if made is None or made[1] is not init:
            return None   # made by another class's constructor, or by a library
        cond = condition_in_call(model, store.value, init, ((atom.model, atom.site),))
        where = worlds(atom.model, atom.site.ctx)
        must &= cond.must | (ALL - where)
        may |= cond.may & where
    return Condition(must, may)


def _param_field_compared(model, test: cst.Comparison, fn):
    """`conf.device == 0`, `0 != cfg.rank_id` with `conf` a parameter of `fn`:
    (parameter, field, operator, literal), the literal on the right; else None."""
    if len(test.comparisons) != 1:
        return None
    op_type = type(test.comparisons[0].operator)
    left, right = test.left, test.comparisons[0].comparator
    if _literal(left) is not None and _literal(right) is None and op_type not in (cst.In, cst.NotIn):
        left, right = right, left
        op_type = _FLIP.get(op_type, op_type)
    value = _literal(right)
    if op_type not in _OPS or op_type in (cst.Is, cst.IsNot) or value is None or \
            not isinstance(left, cst.Attribute) or not isinstance(left.value, cst.Name) or \
            not _own_param(model, left.value, fn):
        return None
    return left.value.value, left.attr.value, op_type, value


def _field_is_rank_at_call(model, fn, param: str, field: str, frames: tuple) -> bool:
    """Every object the call `frames[0]` passes as `param` had `field` set to
    a rank (`conf.device = int(os.environ["LOCAL_RANK"])` in the `get_config()`
    that made it), as far as the function that made it and the caller show;
    False when any of it is unknown or a field is set to anything else."""
    caller_model, call = frames[0]
    bound, expr = argument_expr(call, fn, param)
    if not bound or expr is None:
        return False
    return _made_field_is_rank(caller_model, expr, call.ctx.function, field)


def _made_field_is_rank(model, expr: cst.BaseExpression, scope, field: str) -> bool:
    """Every object `expr` (read in `scope`) holds had `field` set to a rank,
    by the function that made it and in `scope` (the only places looked at:
    a field set anywhere else is not seen); False when the object is not
    known, no such assignment is seen, or one sets something else."""
    value = value_at(model, expr, scope)
    if not value.known or not value.atoms:
        return False
    for atom in value.atoms:
        if not isinstance(atom, Made):
            return False
        places = {(id(atom.model), atom.site.ctx.function): (atom.model, atom.site.ctx.function),
                  (id(model), scope): (model, scope)}
        writes = [(m, a) for m, scope in places.values() for a in m.assigns_in(scope)
                  if isinstance(a.target, cst.Attribute) and a.target.attr.value == field
                  and atom in value_at(m, a.target.value, scope).atoms]
        if not writes or not all(a.value is not None and a.augmented is None and
                                 is_rank_expr(m, a.value, a.ctx.function) for m, a in writes):
            return False
    return True


def _receiver_field_is_rank(model, test: cst.Comparison, fn, field: str, frames: tuple) -> bool:
    """`if self.device_id == 0:` in a method run by `trainer.save(...)`
    (`frames[0]`): the attribute holds a rank on every object the receiver
    may hold, judged by its value, not its name: `__init__` stores
    `self.device_id = device_id` and every construction passes a rank
    (`Trainer(model, device_id=local_rank)`), through `super().__init__(...)`
    of a subclass too. False when the receiver or the stores are not known,
    the attribute is stored outside a constructor, or some construction
    passes anything else (`Trainer(model, device_id=0)`: every rank)."""
    caller_model, call = frames[0]
    while len(frames) > 1 and _receiver_is_own_self(caller_model, call):
        frames = frames[1:]   # `self.save(...)` in `run`, run by `loop.run()`: the object `loop` holds
        caller_model, call = frames[0]
    if call.receiver is None:
        return False
    read = test.left if isinstance(test.left, cst.Attribute) else test.comparisons[0].comparator
    stores = bindings_seen(model, read)
    if not stores or any(s.kind != "assign" or s.ctx.function is None or s.ctx.function.name != "__init__"
                         for s in stores):
        return False   # stored by another method (or not a plain store): what it holds here is not told
    value = value_at(caller_model, call.receiver, call.ctx.function)
    if not value.known or not value.atoms:
        return False
    for atom in value.atoms:
        if not isinstance(atom, Made):
            return False
        made = resolve_call(atom.model, atom.site)
        if made is None or not _constructor_stores_rank(made[0], made[1], field, ((atom.model, atom.site),), set()):
            return False
    return True


def _receiver_is_own_self(model, call) -> bool:
    """`call` runs a method on the receiver of the method it sits in (`self.save(...)`)."""
    fn = call.ctx.function
    return fn is not None and bool(fn.class_name) and bool(fn.params) and isinstance(call.receiver, cst.Name) \
        and call.receiver.value == fn.params[0] and _own_param(model, call.receiver, fn)


def _constructor_stores_rank(model, init, field: str, frames: tuple, seen: set) -> bool:
    """The constructor `init`, run from `frames`, stores a rank in
    `self.<field>` (its own store, else the store of the base constructor it
    calls, `super().__init__(...)`), and no other method of its class stores
    the attribute."""
    if init is None or init.name != "__init__" or not init.params or id(init) in seen:
        return False
    seen.add(id(init))
    me = init.params[0]
    if any(a.ctx.function is not None and a.ctx.function.class_name == init.class_name and a.ctx.function is not init
           and isinstance(a.target, cst.Attribute) and a.target.attr.value == field for a in model.assigns):
        return False
    stores = [a for a in model.assigns_in(init) if isinstance(a.target, cst.Attribute) and a.target.attr.value == field
              and isinstance(a.target.value, cst.Name) and a.target.value.value == me]
    if stores:
        return all(a.value is not None and a.augmented is None and a.path == ()
                   and _holds_rank_at_call(model, init, a.value, frames) for a in stores)
    for c in model.calls_in(init):
        target = resolve_call(model, c)
        if target is not None and target[1].name == "__init__" and target[1] is not init:
            return _constructor_stores_rank(target[0], target[1], field, ((model, c), *frames), seen)
    return False


def _holds_rank_at_call(model, fn, expr: cst.BaseExpression, frames: tuple) -> bool:
    """`expr`, read in `fn`, is a rank when `fn` runs from `frames`: a rank
    as written, or a parameter of `fn` whose argument is one (a parameter of
    the caller handed on is judged at the call further out)."""
    if isinstance(expr, cst.Name) and frames and _own_param(model, expr, fn):
        caller_model, call = frames[0]
        bound, passed = argument_expr(call, fn, expr.value)
        if not bound or passed is None:
            return False   # unknown from the call's text, or the default (not judged)
        return _holds_rank_at_call(caller_model, call.ctx.function, passed, frames[1:])
    return is_rank_expr(model, expr, fn)


def _own_param(model, name: cst.Name, fn) -> bool:
    """`name` reads `fn`'s parameter as passed (not rebound before the read)."""
    bound = sole_binding(model, name)
    return bound is not None and bound.kind == "param" and bound.ctx.function is fn


def _compared_at_call(model, fn, name: str, judge, frames: tuple) -> bool | None:
    """The test `judge` of parameter `name` of `fn` for what the call
    `frames[0]` passes: a literal, or the default when it passes nothing (a
    parameter of the caller handed on is judged at the call further out)."""
    caller_model, call = frames[0]
    bound, expr = argument_expr(call, fn, name)
    if not bound:
        return None
    if expr is None:
        value = literal_value(_default_of(fn, name))
    elif isinstance(expr, cst.Name) and len(frames) > 1 and call.ctx.function is not None \
            and _own_param(caller_model, expr, call.ctx.function):
        return _compared_at_call(caller_model, call.ctx.function, expr.value, judge, frames[1:])
    else:
        value = literal_value(expr)
    return None if value is _NO_VALUE else judge(value)


def _argument_condition(model, fn, name: str, frames: tuple, none_test: bool) -> Condition:
    """Where parameter `name` of `fn` is true (or None, with `none_test`) when
    `fn` runs from `frames`."""
    caller_model, call = frames[0]
    bound, expr = argument_expr(call, fn, name)
    if not bound:
        return UNKNOWN   # `*args` / `**kw` at the call: not known from its text
    if expr is None:   # not passed: the default applies (`use_distributed_barriers: bool = False`)
        default = _default_of(fn, name)
        if default is None:
            return UNKNOWN
        return _expr_condition(model, default, fn.ctx.function, (), none_test)
    return _expr_condition(caller_model, expr, call.ctx.function, frames[1:], none_test)


def _expr_condition(model, expr: cst.BaseExpression, scope, frames: tuple, none_test: bool) -> Condition:
    """Where the value of `expr` (read in `scope`) is true (is None, with `none_test`)."""
    if isinstance(expr, cst.IfExp):
        # `a if rank == 0 else None`: each arm where its test sends it
        test = condition_in_call(model, expr.test, scope, frames)
        body = _expr_condition(model, expr.body, scope, frames, none_test)
        orelse = _expr_condition(model, expr.orelse, scope, frames, none_test)
        return test.and_(body).or_(test.negate().and_(orelse))
    if frames and isinstance(expr, cst.Name) and scope is not None and _own_param(model, expr, scope):
        return _argument_condition(model, scope, expr.value, frames, none_test)
    if isinstance(expr, cst.Name):
        # `log_dir = out if rank == 0 else None` ... `Logger(log_dir)`: what the one
        # assignment reaching the read bound, judged where it was made
        bound = sole_binding(model, expr)
        if bound is not None and bound.kind == "assign" and bound.value is not None and \
                bound.augmented is None and bound.path == () and bound.ctx.function is scope:
            return _expr_condition(model, bound.value, scope, frames, none_test)
    if not none_test:
        cond = condition_of(model, expr, scope)   # a rank test passed as a flag (`is_master=rank == 0`)
        if cond != UNKNOWN:
            return cond
    value = value_at(model, expr)
    answer = is_none_of(value) if none_test else truth_of(value)
    if answer is None:
        return UNKNOWN
    return TRUE if answer else FALSE


def _default_of(fn, name: str) -> cst.BaseExpression | None:
    """The default value of parameter `name` of `fn`, as written."""
    params = fn.node.params
    for p in (*params.posonly_params, *params.params, *params.kwonly_params):
        if p.name.value == name:
            return p.default
    return None


def function_worlds(model, fn) -> frozenset[str]:
    """Worlds a function body runs in by its decorators alone (`@rank_zero_only`)."""
    extra = _extra_guards(model)
    for dec in fn.decorators:
        last = dec.rpartition(".")[2]
        if last in MAIN_DECORATORS or last in extra:
            return MAIN
    return ALL


def rank_branch_text(model, ctx) -> str:
    """The rank test that keeps some ranks away from `ctx`, as written, for
    messages: "inside `if rank == 0:`"."""
    for b in ctx.branches:
        cond = condition_of(model, b.test, b.function)
        arm = cond.true_branch if b.positive else cond.false_branch
        if len(arm & DISTRIBUTED) == 1:
            test = model.module.code_for_node(b.test).strip()
            return f"inside `if {test}:`" if b.positive else f"past `if {test}:` (its else branch or after its early exit)"
    fn = ctx.function
    if fn is not None and function_worlds(model, fn) != ALL:
        return f"`{fn.name}` is decorated to run on rank 0 only"
    return "behind a rank test"


__all__ = ["worlds", "condition_of", "is_rank_expr", "function_worlds", "rank_branch_text", "worlds_from_call", "reached_from_call", "condition_in_call", "relevant_frames", "passes_own_params", "one_rank_only", "SINGLE", "ALL"]
