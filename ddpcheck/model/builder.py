"""The single walk over a libcst tree that fills a ScriptModel.

No metadata providers: the builder keeps its own stacks (function, class,
loops, branches), which is all the context the rules need, and positions are
computed only for the few nodes that end up in findings (see run.py).

The walk is our own rather than `module.visit(visitor)`: libcst's visitor
rebuilds every node it leaves and calls attribute hooks for every field, which
costs more than the parse itself. Walking only the fields that can hold code
(no whitespace, brackets, commas) is several times cheaper and lets compound
statements say exactly which child runs under which branch or loop.
"""

from __future__ import annotations


import libcst as cst

from ddpcheck.model.children import IS_NODE
from ddpcheck.model.dataflow import Dataflow, Entry
from ddpcheck.model.script import (
    Assign, Binding, Branch, CallSite, ClassInfo, Ctx, Exit, FunctionInfo, Loop, ProjectView, Reference, ScriptModel,
    YieldInfo,
)
from ddpcheck.model.names import dotted_name, environ_key, is_environ, string_value
from ddpcheck.model.reads import ENV_READ_CALLS, Division, _child_fields, env_name, subscript_name


_EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit"}




def target_keys(node: cst.BaseExpression) -> list[str]:
    """Keys for an assignment target: `x`, `self.model`, `os.environ['X']`."""
    node_type = type(node)   # libcst's concrete classes have no subclasses: isinstance without the ABC hook
    if node_type is cst.Tuple or node_type is cst.List:
        keys: list[str] = []
        for el in node.elements:
            keys.extend(target_keys(el.value))
        return keys
    if node_type is cst.StarredElement:
        return target_keys(node.value)
    d = dotted_name(node)
    if d:
        return [d]
    if node_type is cst.Subscript:
        base = dotted_name(node.value)
        if base and len(node.slice) == 1:
            idx = node.slice[0].slice
            if isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString):
                return [f"{base}[{idx.value.evaluated_value!r}]"]
    return []


_UNKNOWN_NAME = object()


def target_paths(node: cst.BaseExpression, path: tuple[int, ...] = ()) -> list[tuple[str, tuple[int, ...] | None]]:
    """(key, path) for each name an unpacking target binds: `a, (b, c)` ->
    [("a", (0,)), ("b", (1, 0)), ("c", (1, 1))]; a starred name gets None
    (it holds a list of what is left)."""
    if isinstance(node, (cst.Tuple, cst.List)):
        found: list[tuple[str, tuple[int, ...] | None]] = []
        starred = False
        for i, el in enumerate(node.elements):
            if isinstance(el, cst.StarredElement):
                starred = True
                found += [(k, None) for k, _ in target_paths(el.value, path + (i,))]
            else:
                # after a starred element, positions count from the end: not followed
                found += [(k, p if not starred else None) for k, p in target_paths(el.value, path + (i,))]
        return found
    if isinstance(node, cst.StarredElement):
        return [(k, None) for k, _ in target_paths(node.value, path)]
    return [(k, path) for k in target_keys(node)]


def _literally_true(test: cst.BaseExpression) -> bool:
    """`while True:` / `while 1:` (the loop only ends by `break`), `if True:`."""
    return (isinstance(test, cst.Name) and test.value == "True") or (
        isinstance(test, cst.Integer) and test.value not in ("0", "0x0", "0o0", "0b0"))


def _literally_false(test: cst.BaseExpression) -> bool:
    """`if False:` / `if 0:` / `if None:`."""
    return (isinstance(test, cst.Name) and test.value in ("False", "None")) or (
        isinstance(test, cst.Integer) and test.value in ("0", "0x0", "0o0", "0b0"))


def _params_of(node: cst.Parameters) -> list[tuple[cst.Param, str]]:
    found = [(p, "") for p in (*node.posonly_params, *node.params)]
    if isinstance(node.star_arg, cst.Param):
        found.append((node.star_arg, "*"))
    found += [(p, "") for p in node.kwonly_params]
    if node.star_kwarg is not None:
        found.append((node.star_kwarg, "**"))
    return found


def _exits(block: cst.BaseSuite) -> bool:
    """The block always leaves: return / continue / break / raise / sys.exit()."""
    if isinstance(block, cst.SimpleStatementSuite):
        smalls = block.body
    elif isinstance(block, cst.IndentedBlock) and block.body and isinstance(block.body[-1], cst.SimpleStatementLine):
        smalls = block.body[-1].body
    else:
        return False
    if not smalls:
        return False
    last = smalls[-1]
    if isinstance(last, (cst.Return, cst.Continue, cst.Break, cst.Raise)):
        return True
    return (
        isinstance(last, cst.Expr) and isinstance(last.value, cst.Call)
        and dotted_name(last.value.func) in _EXIT_CALLS
    )


class ScriptBuilder:
    def __init__(self, model: ScriptModel) -> None:
        self.m = model
        self.order = 0
        self.fn_stack: list[FunctionInfo | None] = [None]
        self.class_stack: list[str | None] = [None]
        self.class_infos: list[ClassInfo | None] = [None]
        self.loop_stack: list[list[Loop]] = [[]]
        self.branches: list[Branch] = []
        self.block_exits: list[int] = []   # early-exit branches pushed per open block
        self.no_grad = 0
        self.no_grad_withs: set[int] = set()
        self.opaque = 0          # depth of try bodies and lambdas
        self.in_target = False   # walking an assignment target (writes, not reads)
        self.stmt: cst.CSTNode | None = None
        # (branches, block_exits) of the enclosing code while inside a def
        self.saved_branches: list[tuple[list[Branch], list[int]]] = []
        self._ref_ctx_cache: Ctx | None = None
        # names read by the recorded expressions being walked (innermost last),
        # and the divisions inside them; see model/reads.py
        self.reading: list[set[str]] = []
        self.dividing: list[list[Division]] = []
        self.chained: set[int] = set()   # inner attributes of a chain already read
        self.flow = Dataflow()           # which bindings reach each read (model/dataflow.py)
        self.dotted: dict[int, str | None] = {}   # id(inner attribute) -> its dotted name, from the outer one

    # -- context --------------------------------------------------------------
    def ctx(self) -> Ctx:
        self.order += 1
        self._ref_ctx_cache = None
        return Ctx(
            order=self.order,
            function=self.fn_stack[-1],
            loops=tuple(self.loop_stack[-1]),
            branches=tuple(self.branches),
            no_grad=self.no_grad > 0,
            class_name=self.class_stack[-1],
            opaque=self.opaque > 0,
        )

    # -- bindings (model/dataflow.py) --------------------------------------------
    def _bind(self, binding) -> None:
        self.m.bindings.append(binding)
        self.flow.define(binding.key, binding)

    def _bind_target(self, target: cst.BaseExpression, kind: str, node: cst.CSTNode) -> None:
        ctx = self._ref_ctx()
        for key, path in target_paths(target):
            self._bind(Binding(key, kind, node, ctx, path))

    # -- imports --------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self.m.imports.add_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.m.imports.add_import_from(node)

    # -- blocks -----------------------------------------------------------------
    def _pop_block(self) -> None:
        for _ in range(self.block_exits.pop()):
            self.branches.pop()

    # -- functions and classes -----------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if self.fn_stack[-1] is None and self.class_stack[-1] is None:
            self.m.class_names.add(node.name.value)
        info = ClassInfo(node.name.value, node, self._ref_ctx(),
                         tuple(a.value for a in node.bases if a.keyword is None and not a.star))
        self.m.classes.append(info)
        self.m.class_of_node[id(node)] = info
        self.class_stack.append(node.name.value)
        self.class_infos.append(info)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.pop()
        self.class_infos.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stmt = node
        params = tuple(
            p.name.value
            for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params)
        )
        decorators = tuple(
            self.m.imports.qualify(d) for d in (
                dotted_name(dec.decorator.func if isinstance(dec.decorator, cst.Call) else dec.decorator)
                for dec in node.decorators
            ) if d
        )
        info = FunctionInfo(
            name=node.name.value, node=node, ctx=self.ctx(), class_name=self.class_stack[-1],
            params=params, decorators=decorators,
        )
        cls = self.class_infos[-1]
        if cls is not None and self.class_stack[-1] == cls.name:
            info.cls = cls
            cls.methods[info.name] = info
            cls.all_methods.append(info)
        self.m.functions.append(info)
        self.fn_stack.append(info)
        self.class_stack.append(None)   # a nested class would push its own name
        self.class_infos.append(None)
        self.loop_stack.append([])
        self.saved_branches.append((self.branches, self.block_exits))
        self.branches, self.block_exits = [], []

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.fn_stack.pop()
        self.class_stack.pop()
        self.class_infos.pop()
        self.loop_stack.pop()
        self.branches, self.block_exits = self.saved_branches.pop()

    def visit_Return(self, node: cst.Return) -> None:
        fn = self.fn_stack[-1]
        ctx = self.ctx()
        if fn is not None and node.value is not None:
            fn.returns.append((node.value, ctx))
        self.m.exits.append(Exit("return", node, ctx))

    def visit_Break(self, node: cst.Break) -> None:
        self.m.exits.append(Exit("break", node, self.ctx()))
        self.flow.loop_break()

    def visit_Continue(self, node: cst.Continue) -> None:
        self.flow.loop_continue()

    def visit_Global(self, node: cst.Global) -> None:
        fn = self.fn_stack[-1]
        if fn is not None:
            fn.declared_global.update(n.name.value for n in node.names)

    visit_Nonlocal = visit_Global

    def visit_Raise(self, node: cst.Raise) -> None:
        self.m.exits.append(Exit("raise", node, self.ctx()))

    def visit_Yield(self, node: cst.Yield) -> None:
        fn = self.fn_stack[-1]
        if fn is not None:
            value = node.value.item if isinstance(node.value, cst.From) else node.value
            fn.yields.append(YieldInfo(value, self.ctx(), isinstance(node.value, cst.From)))

    # -- branches --------------------------------------------------------------
    def visit_If_body(self, node: cst.If) -> None:
        self.branches.append(Branch(node.test, True, self.fn_stack[-1]))

    def leave_If_body(self, node: cst.If) -> None:
        self.branches.pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        self.branches.append(Branch(node.test, False, self.fn_stack[-1]))

    def leave_If_orelse(self, node: cst.If) -> None:
        self.branches.pop()

    def leave_If(self, original_node: cst.If) -> None:
        # `if not is_main_process(): return` guards everything after it in the block.
        if original_node.orelse is None and _exits(original_node.body) and self.block_exits:
            self.branches.append(Branch(original_node.test, False, self.fn_stack[-1]))
            self.block_exits[-1] += 1

    # -- loops ------------------------------------------------------------------
    def visit_For(self, node: cst.For) -> None:
        self.stmt = node
        self.m.loops.append(Loop(node=node, iter=node.iter, ctx=self.ctx(), targets=tuple(target_keys(node.target))))

    def visit_For_body(self, node: cst.For) -> None:
        self.loop_stack[-1].append(self._loop_for(node))

    def leave_For_body(self, node: cst.For) -> None:
        self.loop_stack[-1].pop()

    def visit_While(self, node: cst.While) -> None:
        self.stmt = node
        self.m.loops.append(Loop(node=node, iter=None, ctx=self.ctx()))

    def visit_While_body(self, node: cst.While) -> None:
        self.loop_stack[-1].append(self._loop_for(node))

    def leave_While_body(self, node: cst.While) -> None:
        self.loop_stack[-1].pop()

    def _loop_for(self, node: cst.CSTNode) -> Loop:
        for loop in reversed(self.m.loops):
            if loop.node is node:
                return loop
        raise AssertionError("loop visited before its body")

    # -- with ---------------------------------------------------------------------
    def visit_With(self, node: cst.With) -> None:
        self.stmt = node
        for item in node.items:
            it = item.item
            name = dotted_name(it.func) if isinstance(it, cst.Call) else None
            if name and self.m.imports.qualify(name).rpartition(".")[2] in ("no_grad", "inference_mode"):
                self.no_grad += 1
                self.no_grad_withs.add(id(node))
                break

    def leave_With(self, original_node: cst.With) -> None:
        if id(original_node) in self.no_grad_withs:
            self.no_grad -= 1

    # -- facts ----------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        func = dotted_name(node.func)
        site = CallSite(
            node=node, func=func, qual=self.m.imports.qualify(func) if func else None,
            ctx=self.ctx(), stmt=self.stmt,
        )
        self.m.calls.append(site)
        self.m.site_of[id(node)] = site
        if site.qual in _EXIT_CALLS:
            self.m.exits.append(Exit("exit", node, site.ctx))
        if site.qual in ENV_READ_CALLS and node.args:
            self._env_read(string_value(node.args[0].value))

    def _env_read(self, name: str | None) -> None:
        if name:
            self.m.env_reads.setdefault(name, []).append(self.fn_stack[-1])
            if self.reading:
                self.reading[-1].add(env_name(name))

    # -- names read (model/reads.py) ---------------------------------------------------
    def _begin_reads(self) -> None:
        self.reading.append(set())
        self.dividing.append([])

    def _end_reads(self, expr: cst.CSTNode | None) -> None:
        names = self.reading.pop()
        divisions = self.dividing.pop()
        if self.reading:
            self.reading[-1] |= names
            self.dividing[-1] += divisions
        if expr is not None:
            self.m.reads_of[id(expr)] = frozenset(names)
            if divisions:
                self.m.divisions_of[id(expr)] = tuple(divisions)

    def _read(self, expr):
        """Walk `expr` as a recorded expression (a generator step)."""
        self._begin_reads()
        yield expr
        self._end_reads(expr)

    def visit_Assign(self, node: cst.Assign) -> None:
        ctx = self.ctx()
        for t in node.targets:
            keys = target_keys(t.target)
            if len(keys) == 1 and not isinstance(t.target, (cst.Tuple, cst.List)):
                self.m.assigns.append(Assign(keys[0], node.value, ctx, node, target=t.target))
                continue
            flat = isinstance(t.target, (cst.Tuple, cst.List)) and all(
                not isinstance(el, cst.StarredElement) and len(target_keys(el.value)) == 1
                for el in t.target.elements)
            for i, (k, path) in enumerate(target_paths(t.target)):
                self.m.assigns.append(Assign(k, None, ctx, node, unpacked=(node.value, i) if flat else None,
                                             path=path))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            for k in target_keys(node.target):
                self.m.assigns.append(Assign(k, node.value, self.ctx(), node, target=node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        op = type(node.operator).__name__
        for k in target_keys(node.target):
            self.m.assigns.append(Assign(k, node.value, self.ctx(), node, augmented=op, target=node.target))

    def visit_Name(self, node: cst.Name) -> None:
        if not self.in_target and node.value not in ("True", "False", "None"):
            self.flow.read(node, node.value)
        if self.reading:
            self.reading[-1].add(node.value)
        self.m.references.setdefault(node.value, []).append(
            Reference(node.value, node, self._ref_ctx(), via_attribute=False))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # `a.b.c` is visited before `a.b`: its dotted name, computed once,
        # gives the inner one's by cutting the last part
        key = self.dotted.pop(id(node), _UNKNOWN_NAME)
        if key is _UNKNOWN_NAME:
            key = dotted_name(node)
        inner = node.value
        if key is not None and type(inner) is cst.Attribute:
            self.dotted[id(inner)] = key.rpartition(".")[0]
        if not self.in_target and key is not None:
            self.flow.read(node, key)
        if self.reading and id(node) not in self.chained:
            if key is not None:
                parts = key.split(".")
                self.reading[-1].update(".".join(parts[:i]) for i in range(len(parts), 1, -1))
            while type(inner) is cst.Attribute:   # its prefixes are in: skip them below
                self.chained.add(id(inner))
                inner = inner.value
        name = node.attr.value
        self.m.references.setdefault(name, []).append(
            Reference(name, node, self._ref_ctx(), via_attribute=True))

    # -- the walk -------------------------------------------------------------------
    # Iterative, so no depth of user code (`f(f(f(...)))` 150 deep, a 1,000-term
    # `a and b and ...`) reaches Python's recursion limit. Each node's walker is
    # a generator that yields the children to walk, in order, and runs its own
    # bookkeeping (push a branch, pop a loop) between them; the driver walks a
    # yielded child completely before resuming its parent.
    def walk(self, root: cst.CSTNode) -> None:
        stack = [self._steps(root)]
        steps = self._steps
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                continue
            gen = steps(child)
            if gen is not None:
                stack.append(gen)

    def _steps(self, node: cst.CSTNode):
        """The walker of `node`: a generator of its children, or None for a
        node with nothing below it (handled here)."""
        node_type = type(node)
        special = _SPECIAL.get(node_type)
        if special is not None:
            return special(self, node)
        if node_type is cst.Name:
            self.visit_Name(node)
            return None
        fields = _child_fields(node_type)
        hooks = _HOOKS.get(node_type)
        if hooks is None:
            hooks = _HOOKS[node_type] = _hooks_of(node_type)
        visit, leave = hooks
        if visit is not None:
            visit(self, node)
        if not fields:
            if leave is not None:
                leave(self, node)
            return None
        if leave is not None:
            return self._generic(node, fields, leave)
        children = []
        is_node = IS_NODE
        for field in fields:
            value = getattr(node, field)
            if is_node[type(value)]:
                children.append(value)
            elif isinstance(value, (list, tuple)):
                children.extend(item for item in value if is_node[type(item)])
        return iter(children) if children else None

    def _generic(self, node: cst.CSTNode, fields: tuple[str, ...], leave):
        yield from _nodes_in(node, fields)
        if leave is not None:
            leave(self, node)

    def _children(self, node: cst.CSTNode):
        return _nodes_in(node, _child_fields(type(node)))

    def _walk_block(self, node):
        self.block_exits.append(0)
        yield from node.body
        self._pop_block()

    def _walk_simple_line(self, node):
        self.stmt = node
        for small in node.body:
            yield small
            if self._exit_statement(small):
                self.flow.end_path()

    def _walk_simple_suite(self, node: cst.SimpleStatementSuite):
        self.stmt = node   # `if not main: return` on one line
        for small in node.body:
            yield small
            if self._exit_statement(small):
                self.flow.end_path()

    def _exit_statement(self, small: cst.BaseSmallStatement) -> bool:
        """`sys.exit(1)` as a statement: nothing after it runs."""
        if not (type(small) is cst.Expr and type(small.value) is cst.Call):
            return False
        func = dotted_name(small.value.func)
        return func is not None and self.m.imports.qualify(func) in _EXIT_CALLS

    def _walk_if(self, node: cst.If):
        self.stmt = node
        yield from self._read(node.test)
        flow = self.flow
        before = flow.fork()
        if _literally_false(node.test):
            flow.end_path()   # `if False:` / `if 0:`: the body never runs
        self.visit_If_body(node)
        yield node.body
        self.leave_If_body(node)
        body_end = flow.arm_state()
        flow.start_arm(before)
        if _literally_true(node.test):
            flow.end_path()   # `if True:` (imports grouped after a sys.path change): the body always runs
        if node.orelse is not None:
            self.visit_If_orelse(node)
            yield node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse
            self.leave_If_orelse(node)
        flow.join([body_end, flow.arm_state()])
        self.leave_If(node)

    def _walk_for(self, node: cst.For):
        self.visit_For(node)
        yield from self._read(node.iter)   # evaluated once, before the first iteration
        flow = self.flow
        flow.enter_loop()
        self.visit_For_body(node)
        self.in_target = True
        yield node.target
        self.in_target = False
        self._bind_target(node.target, "for", node)
        yield node.body
        self.leave_For_body(node)
        breaks = flow.exit_loop()
        if node.orelse is not None:
            yield node.orelse.body
        flow.after_loop_else(breaks)

    def _walk_while(self, node: cst.While):
        self.visit_While(node)
        flow = self.flow
        flow.enter_loop()
        yield from self._read(node.test)   # evaluated at the top of every iteration
        self.visit_While_body(node)
        yield node.body
        self.leave_While_body(node)
        breaks = flow.exit_loop(runs_forever=_literally_true(node.test))
        if node.orelse is not None:
            yield node.orelse.body
        flow.after_loop_else(breaks)

    def _walk_function(self, node: cst.FunctionDef):
        # decorators and defaults run in the enclosing scope
        yield from node.decorators
        for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params):
            if p.default is not None:
                yield p.default
        self.visit_FunctionDef(node)
        info = self.fn_stack[-1]
        ctx = self._ref_ctx()
        params = []
        for param, star in _params_of(node.params):
            params.append(Binding(param.name.value, "param", param, ctx, star=star))
            if star == "*":
                info.star_param = param.name.value
            elif star == "**":
                info.kwargs_param = param.name.value
        self.m.bindings.extend(params)
        self.flow.enter_scope(params, entry=Entry(info))
        yield node.body
        self.flow.exit_scope()
        self.leave_FunctionDef(node)
        self._bind(Binding(node.name.value, "def", node, info.ctx))

    def _walk_class(self, node: cst.ClassDef):
        yield from node.decorators
        for arg in (*node.bases, *node.keywords):
            yield arg.value
        self.visit_ClassDef(node)
        ctx = self._ref_ctx()
        self.flow.enter_scope(inherit=True)   # the body reads the enclosing names as they are now
        yield node.body
        self.flow.exit_scope()
        self.leave_ClassDef(node)
        self._bind(Binding(node.name.value, "class", node, ctx))

    def _walk_with(self, node: cst.With):
        self.visit_With(node)
        for item in node.items:
            yield item.item
            if item.asname is not None:
                self.in_target = True
                yield item.asname.name
                self.in_target = False
                self._bind_target(item.asname.name, "with", item)
        yield node.body
        self.leave_With(node)

    def _walk_call(self, node: cst.Call):
        self._begin_reads()
        self.order += 1   # the names read by the call come after what ran before it
        self._ref_ctx_cache = None
        yield node.func
        for arg in node.args:
            yield from self._read(arg.value)
        # recorded once its function and arguments are evaluated: the source
        # order of calls is the order Python runs them (`PartialState().wait()`
        # makes the state first, then waits)
        self.visit_Call(node)
        self._end_reads(node)

    def _walk_attribute(self, node: cst.Attribute):
        target = self.in_target
        self.visit_Attribute(node)
        self.in_target = False   # `self` in `self.model = ...` is read
        yield node.value
        self.in_target = target

    def _walk_import(self, node) -> None:
        if isinstance(node, cst.Import):
            self.visit_Import(node)
            names = node.names
        else:
            self.visit_ImportFrom(node)
            names = () if isinstance(node.names, cst.ImportStar) else node.names
        ctx = self._ref_ctx()
        for alias in names:
            self.m.import_of_alias[id(alias)] = node
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            else:
                local = (dotted_name(alias.name) or "").split(".")[0]
            if local:
                self._bind(Binding(local, "import", alias, ctx))
        return None

    def _walk_lambda(self, node: cst.Lambda):
        self.opaque += 1
        ctx = self._ref_ctx()
        params = [Binding(p.name.value, "lambda", p, ctx) for p, _ in _params_of(node.params)]
        self.m.bindings.extend(params)
        self.flow.enter_scope(params, entry=Entry(self.fn_stack[-1], closure=True))
        yield node.body
        self.flow.exit_scope()
        self.opaque -= 1

    def _walk_try(self, node):
        flow = self.flow
        flow.enter_try()
        self.opaque += 1
        yield node.body
        self.opaque -= 1
        if node.orelse is not None:
            yield node.orelse
        flow.end_try_body()
        for handler in node.handlers:
            flow.start_handler()
            if handler.type is not None:
                yield handler.type
            if handler.name is not None:
                self._bind_target(handler.name.name, "except", handler)
            yield handler.body
            flow.end_handler()
        flow.exit_try()
        if node.finalbody is not None:
            yield node.finalbody

    def _walk_comprehension(self, node):
        """`[f(x) for x in xs if x]`: the first iterable is read where the
        comprehension is; the rest runs in a scope of its own."""
        comp = node.for_in
        yield comp.iter
        flow = self.flow
        flow.enter_scope(inherit=True)
        first = True
        while comp is not None:
            if not first:
                yield comp.iter
            first = False
            self.in_target = True
            yield comp.target
            self.in_target = False
            self._bind_target(comp.target, "comp", comp)
            for cond in comp.ifs:
                yield cond.test
            comp = comp.inner_for_in
        if isinstance(node, cst.DictComp):
            yield node.key
            yield node.value
        else:
            yield node.elt
        flow.exit_scope()

    def _walk_named_expr(self, node: cst.NamedExpr):
        yield node.value
        self.in_target = True
        yield node.target
        self.in_target = False
        self._bind_target(node.target, "walrus", node)

    def _walk_raise(self, node: cst.Raise):
        self.visit_Raise(node)
        if node.exc is not None:
            yield node.exc
        if node.cause is not None:
            yield node.cause.item
        self.flow.end_path()

    def _walk_match(self, node):
        yield from self._read(node.subject)
        flow = self.flow
        before = flow.fork()
        ends = []
        for case in node.cases:
            flow.start_arm(before)
            yield case.pattern
            if case.guard is not None:
                yield case.guard
            yield case.body
            ends.append(flow.arm_state())
        ends.append(before)   # no case matched
        flow.join(ends)

    def _walk_if_exp(self, node: cst.IfExp):
        # `dist.get_rank() if dist.is_initialized() else 0`: each arm runs under its test
        yield from self._read(node.test)
        self.branches.append(Branch(node.test, True, self.fn_stack[-1]))
        yield node.body
        self.branches[-1] = Branch(node.test, False, self.fn_stack[-1])
        yield node.orelse
        self.branches.pop()

    def _walk_bool_op(self, node: cst.BooleanOperation):
        # `is_main_process() and torch.save(...)`: the right side runs only when
        # the left one is true (`and`) or false (`or`)
        yield from self._read(node.left)
        self.branches.append(Branch(node.left, isinstance(node.operator, cst.And), self.fn_stack[-1]))
        yield node.right
        self.branches.pop()

    def _walk_assign(self, node: cst.Assign):
        start = len(self.m.assigns)
        self.visit_Assign(node)
        made = self.m.assigns[start:]
        self.in_target = True
        for t in node.targets:
            yield t.target
        self.in_target = False
        yield from self._read(node.value)
        for a in made:   # bound once the value is computed
            self._bind(a)

    def _walk_ann_assign(self, node: cst.AnnAssign):
        start = len(self.m.assigns)
        self.visit_AnnAssign(node)
        made = self.m.assigns[start:]
        self.in_target = True
        yield node.target
        self.in_target = False
        yield node.annotation
        if node.value is not None:
            yield from self._read(node.value)
        for a in made:
            self._bind(a)

    def _walk_aug_assign(self, node: cst.AugAssign):
        start = len(self.m.assigns)
        self.visit_AugAssign(node)
        made = self.m.assigns[start:]
        yield node.target   # read, then bound again
        yield from self._read(node.value)
        for a in made:
            self._bind(a)

    def _walk_return(self, node: cst.Return):
        self.visit_Return(node)
        if node.value is not None:
            yield from self._read(node.value)
        self.flow.end_path()

    def _walk_binary(self, node: cst.BinaryOperation):
        if not self.reading or not isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            yield node.left
            yield node.right
            return
        self._begin_reads()
        yield node.left
        dividend = frozenset(self.reading[-1])
        self._end_reads(None)
        self._begin_reads()
        yield node.right
        divisor = frozenset(self.reading[-1])
        self._end_reads(None)
        self.dividing[-1].append(Division(node, dividend, divisor))
    def _walk_subscript(self, node: cst.Subscript):
        if not self.in_target:
            self._env_read(environ_key(self.m.imports, node))
            key = subscript_name(node)
            if key:
                self.flow.read(node, key)
                if self.reading:
                    self.reading[-1].add(key)
        in_target, self.in_target = self.in_target, False
        yield node.value
        for el in node.slice:
            yield el.slice
        self.in_target = in_target

    def _walk_comparison(self, node: cst.Comparison):
        for target in node.comparisons:
            if isinstance(target.operator, (cst.In, cst.NotIn)) and is_environ(self.m.imports, target.comparator):
                self._env_read(string_value(node.left))
        yield from self._children(node)

    def _walk_del(self, node: cst.Del):
        self.in_target = True
        yield node.target
        self.in_target = False
        for key in target_keys(node.target):
            self.flow.unbind(key)

    def _ref_ctx(self) -> Ctx:
        # Names are the most frequent nodes: references share one Ctx until the
        # next fact advances the source order (a new branch always comes with one).
        c = self._ref_ctx_cache
        if (c is None or c.function is not self.fn_stack[-1] or len(c.branches) != len(self.branches)
                or (self.branches and c.branches[-1] is not self.branches[-1])
                or len(c.loops) != len(self.loop_stack[-1])):
            self._ref_ctx_cache = Ctx(self.order, self.fn_stack[-1], tuple(self.loop_stack[-1]),
                                      tuple(self.branches), self.no_grad > 0, self.class_stack[-1],
                                      self.opaque > 0)
        return self._ref_ctx_cache


_SPECIAL = {
    cst.Module: ScriptBuilder._walk_block,
    cst.IndentedBlock: ScriptBuilder._walk_block,
    cst.SimpleStatementLine: ScriptBuilder._walk_simple_line,
    cst.SimpleStatementSuite: ScriptBuilder._walk_simple_suite,
    cst.If: ScriptBuilder._walk_if,
    cst.For: ScriptBuilder._walk_for,
    cst.While: ScriptBuilder._walk_while,
    cst.FunctionDef: ScriptBuilder._walk_function,
    cst.ClassDef: ScriptBuilder._walk_class,
    cst.With: ScriptBuilder._walk_with,
    cst.Call: ScriptBuilder._walk_call,
    cst.Attribute: ScriptBuilder._walk_attribute,
    cst.Import: ScriptBuilder._walk_import,
    cst.ImportFrom: ScriptBuilder._walk_import,
    cst.Lambda: ScriptBuilder._walk_lambda,
    cst.Try: ScriptBuilder._walk_try,
    cst.TryStar: ScriptBuilder._walk_try,
    cst.IfExp: ScriptBuilder._walk_if_exp,
    cst.BooleanOperation: ScriptBuilder._walk_bool_op,
    cst.Assign: ScriptBuilder._walk_assign,
    cst.AnnAssign: ScriptBuilder._walk_ann_assign,
    cst.AugAssign: ScriptBuilder._walk_aug_assign,
    cst.Return: ScriptBuilder._walk_return,
    cst.BinaryOperation: ScriptBuilder._walk_binary,
    cst.Subscript: ScriptBuilder._walk_subscript,
    cst.Comparison: ScriptBuilder._walk_comparison,
    cst.Del: ScriptBuilder._walk_del,
    cst.ListComp: ScriptBuilder._walk_comprehension,
    cst.SetComp: ScriptBuilder._walk_comprehension,
    cst.GeneratorExp: ScriptBuilder._walk_comprehension,
    cst.DictComp: ScriptBuilder._walk_comprehension,
    cst.NamedExpr: ScriptBuilder._walk_named_expr,
    cst.Raise: ScriptBuilder._walk_raise,
    cst.Match: ScriptBuilder._walk_match,
}


def _nodes_in(node: cst.CSTNode, fields: tuple[str, ...]):
    """The child nodes held in `fields` of `node`, in order."""
    is_node = IS_NODE
    for field in fields:
        value = getattr(node, field)
        if is_node[type(value)]:
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if is_node[type(item)]:
                    yield item


# node type -> the builder's (visit_<Type>, leave_<Type>) functions, None where
# it has none: looked up once per type instead of twice per node
_HOOKS: dict[type, tuple] = {}


def _hooks_of(node_type: type) -> tuple:
    name = node_type.__name__
    return getattr(ScriptBuilder, "visit_" + name, None), getattr(ScriptBuilder, "leave_" + name, None)


def build_model(path: str, module: cst.Module, project: ProjectView, text: str | None = None) -> ScriptModel:
    """The model of one file, part of `project` (the run it is analysed in:
    model/project.py), which answers its questions about other files."""
    model = ScriptModel(path, module, project, text)
    builder = ScriptBuilder(model)
    builder.walk(module)
    builder.flow.finish()
    model.reach = builder.flow.reach
    model.module_end = builder.flow.module_end
    return model
