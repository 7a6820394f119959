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

import dataclasses
import re

import libcst as cst

from ddpcheck.model.script import (
    Assign, Branch, CallSite, Ctx, FunctionInfo, Loop, Reference, ScriptModel, YieldInfo,
)
from ddpcheck.model.names import dotted_name, environ_key, is_environ, string_value

_EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit"}
_ENV_READ_CALLS = {"os.environ.get", "os.getenv", "os.environ.setdefault", "os.environ.pop"}




def target_keys(node: cst.BaseExpression) -> list[str]:
    """Keys for an assignment target: `x`, `self.model`, `os.environ['X']`."""
    if isinstance(node, (cst.Tuple, cst.List)):
        keys: list[str] = []
        for el in node.elements:
            keys.extend(target_keys(el.value))
        return keys
    if isinstance(node, cst.StarredElement):
        return target_keys(node.value)
    d = dotted_name(node)
    if d:
        return [d]
    if isinstance(node, cst.Subscript):
        base = dotted_name(node.value)
        if base and len(node.slice) == 1:
            idx = node.slice[0].slice
            if isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString):
                return [f"{base}[{idx.value.evaluated_value!r}]"]
    return []


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


# Fields that never hold code that matters: formatting tokens, and the names
# that are bindings rather than uses (a def's name, a parameter, a keyword
# argument, an attribute after the dot, an `as` alias).
_SKIP_FIELD = re.compile(
    r"whitespace|^(lpar|rpar|lbracket|rbracket|lbrace|rbrace|comma|semicolon|colon|dot|equal|arrow|star"
    r"|leading_lines|lines_after_decorators|header|footer|newline|operator|asynchronous|walrus"
    r"|keyword|name|attr|asname|default_indicator|prefix|quote|indent|encoding|default_newline"
    r"|default_indent|has_trailing_newline|first_line|last_line|semicolon)$"
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(node_type: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(node_type)
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(node_type) if not _SKIP_FIELD.search(f.name))
        _CHILD_FIELDS[node_type] = fields
    return fields


class ScriptBuilder:
    def __init__(self, model: ScriptModel) -> None:
        self.m = model
        self.order = 0
        self.fn_stack: list[FunctionInfo | None] = [None]
        self.class_stack: list[str | None] = [None]
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
        self.class_stack.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.pop()

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
        self.m.functions.append(info)
        self.fn_stack.append(info)
        self.class_stack.append(None)   # a nested class would push its own name
        self.loop_stack.append([])
        self.saved_branches.append((self.branches, self.block_exits))
        self.branches, self.block_exits = [], []

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.fn_stack.pop()
        self.class_stack.pop()
        self.loop_stack.pop()
        self.branches, self.block_exits = self.saved_branches.pop()

    def visit_Return(self, node: cst.Return) -> None:
        fn = self.fn_stack[-1]
        if fn is not None and node.value is not None:
            fn.returns.append((node.value, self.ctx()))

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
        if site.qual in _ENV_READ_CALLS and node.args:
            self._env_read(string_value(node.args[0].value))

    def _env_read(self, name: str | None) -> None:
        if name:
            self.m.env_reads.setdefault(name, []).append(self.fn_stack[-1])

    def visit_Assign(self, node: cst.Assign) -> None:
        ctx = self.ctx()
        for t in node.targets:
            keys = target_keys(t.target)
            if len(keys) == 1 and not isinstance(t.target, (cst.Tuple, cst.List)):
                self.m.assigns.append(Assign(keys[0], node.value, ctx, node))
                continue
            flat = isinstance(t.target, (cst.Tuple, cst.List)) and all(
                not isinstance(el, cst.StarredElement) and len(target_keys(el.value)) == 1
                for el in t.target.elements)
            for i, k in enumerate(keys):
                self.m.assigns.append(Assign(k, None, ctx, node, unpacked=(node.value, i) if flat else None))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            for k in target_keys(node.target):
                self.m.assigns.append(Assign(k, node.value, self.ctx(), node))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        op = type(node.operator).__name__
        for k in target_keys(node.target):
            self.m.assigns.append(Assign(k, node.value, self.ctx(), node, augmented=op))

    def visit_Name(self, node: cst.Name) -> None:
        self.m.references.setdefault(node.value, []).append(
            Reference(node.value, node, self._ref_ctx(), via_attribute=False))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = node.attr.value
        self.m.references.setdefault(name, []).append(
            Reference(name, node, self._ref_ctx(), via_attribute=True))

    # -- the walk -------------------------------------------------------------------
    def walk(self, node: cst.CSTNode) -> None:
        special = _SPECIAL.get(type(node))
        if special is not None:
            special(self, node)
            return
        name = type(node).__name__
        visit = getattr(self, "visit_" + name, None)
        if visit is not None:
            visit(node)
        self.walk_children(node)
        leave = getattr(self, "leave_" + name, None)
        if leave is not None:
            leave(node)

    def walk_children(self, node: cst.CSTNode) -> None:
        for field in _child_fields(type(node)):
            value = getattr(node, field)
            if isinstance(value, cst.CSTNode):
                self.walk(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, cst.CSTNode):
                        self.walk(item)

    def walk_all(self, nodes) -> None:
        for n in nodes:
            self.walk(n)

    def _walk_block(self, node) -> None:
        self.block_exits.append(0)
        for stmt in node.body:
            self.walk(stmt)
        self._pop_block()

    def _walk_simple_line(self, node) -> None:
        self.stmt = node
        for small in node.body:
            self.walk(small)

    def _walk_simple_suite(self, node: cst.SimpleStatementSuite) -> None:
        self.stmt = node   # `if not main: return` on one line
        for small in node.body:
            self.walk(small)

    def _walk_if(self, node: cst.If) -> None:
        self.stmt = node
        self.walk(node.test)
        self.visit_If_body(node)
        self.walk(node.body)
        self.leave_If_body(node)
        if node.orelse is not None:
            self.visit_If_orelse(node)
            self.walk(node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse)
            self.leave_If_orelse(node)
        self.leave_If(node)

    def _walk_for(self, node: cst.For) -> None:
        self.visit_For(node)
        self.walk(node.target)
        self.walk(node.iter)
        self.visit_For_body(node)
        self.walk(node.body)
        self.leave_For_body(node)
        if node.orelse is not None:
            self.walk(node.orelse.body)

    def _walk_while(self, node: cst.While) -> None:
        self.visit_While(node)
        self.walk(node.test)
        self.visit_While_body(node)
        self.walk(node.body)
        self.leave_While_body(node)
        if node.orelse is not None:
            self.walk(node.orelse.body)

    def _walk_function(self, node: cst.FunctionDef) -> None:
        # decorators and defaults run in the enclosing scope
        self.walk_all(node.decorators)
        for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params):
            if p.default is not None:
                self.walk(p.default)
        self.visit_FunctionDef(node)
        self.walk(node.body)
        self.leave_FunctionDef(node)

    def _walk_class(self, node: cst.ClassDef) -> None:
        self.walk_all(node.decorators)
        for arg in (*node.bases, *node.keywords):
            self.walk(arg.value)
        self.visit_ClassDef(node)
        self.walk(node.body)
        self.leave_ClassDef(node)

    def _walk_with(self, node: cst.With) -> None:
        self.visit_With(node)
        for item in node.items:
            self.walk(item.item)
            if item.asname is not None:
                self.walk(item.asname.name)
        self.walk(node.body)
        self.leave_With(node)

    def _walk_call(self, node: cst.Call) -> None:
        self.visit_Call(node)
        self.walk(node.func)
        for arg in node.args:
            self.walk(arg.value)

    def _walk_attribute(self, node: cst.Attribute) -> None:
        self.visit_Attribute(node)
        self.walk(node.value)

    def _walk_import(self, node) -> None:
        if isinstance(node, cst.Import):
            self.visit_Import(node)
        else:
            self.visit_ImportFrom(node)

    def _walk_lambda(self, node: cst.Lambda) -> None:
        self.opaque += 1
        self.walk(node.body)
        self.opaque -= 1

    def _walk_try(self, node) -> None:
        self.opaque += 1
        self.walk(node.body)
        self.opaque -= 1
        for part in (*node.handlers, node.orelse, node.finalbody):
            if part is not None:
                self.walk(part)

    def _walk_if_exp(self, node: cst.IfExp) -> None:
        # `dist.get_rank() if dist.is_initialized() else 0`: each arm runs under its test
        self.walk(node.test)
        self.branches.append(Branch(node.test, True, self.fn_stack[-1]))
        self.walk(node.body)
        self.branches[-1] = Branch(node.test, False, self.fn_stack[-1])
        self.walk(node.orelse)
        self.branches.pop()

    def _walk_bool_op(self, node: cst.BooleanOperation) -> None:
        # `is_main_process() and torch.save(...)`: the right side runs only when
        # the left one is true (`and`) or false (`or`)
        self.walk(node.left)
        self.branches.append(Branch(node.left, isinstance(node.operator, cst.And), self.fn_stack[-1]))
        self.walk(node.right)
        self.branches.pop()

    def _walk_assign(self, node: cst.Assign) -> None:
        self.visit_Assign(node)
        self.in_target = True
        for t in node.targets:
            self.walk(t.target)
        self.in_target = False
        self.walk(node.value)

    def _walk_subscript(self, node: cst.Subscript) -> None:
        if not self.in_target:
            self._env_read(environ_key(self.m.imports, node))
        in_target, self.in_target = self.in_target, False
        self.walk(node.value)
        for el in node.slice:
            self.walk(el.slice)
        self.in_target = in_target

    def _walk_comparison(self, node: cst.Comparison) -> None:
        for target in node.comparisons:
            if isinstance(target.operator, (cst.In, cst.NotIn)) and is_environ(self.m.imports, target.comparator):
                self._env_read(string_value(node.left))
        self.walk_children(node)

    def _walk_del(self, node: cst.Del) -> None:
        self.in_target = True
        self.walk(node.target)
        self.in_target = False

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
    cst.Subscript: ScriptBuilder._walk_subscript,
    cst.Comparison: ScriptBuilder._walk_comparison,
    cst.Del: ScriptBuilder._walk_del,
}


def build_model(path: str, module: cst.Module, settings) -> ScriptModel:
    model = ScriptModel(path, module, settings)
    ScriptBuilder(model).walk(module)
    return model
