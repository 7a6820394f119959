"""The ScriptModel: one description of a training script that every rule queries.

The builder fills it in a single libcst visit. It records facts (calls with their
resolved names, assignments, loops, functions, the branches around each of
them); the interpretations rules share (which processes reach a line, what a
name holds, which function a call lands in) are answered here, lazily and
memoised, so no rule re-walks the tree its own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import libcst as cst

from ddpcheck.model.names import ImportTable, dotted_name
from ddpcheck.model.memo import Memo, query
from ddpcheck.model.scan import ModuleScan, Need, names_match, scan_text
from ddpcheck.model.children import children
from ddpcheck.settings import LintSettings



class ProjectView(Protocol):
    """What a model asks of the run it belongs to (model/project.py's
    Project): its settings, the memo of its questions, and the other
    modules of the tree."""

    settings: LintSettings
    memo: Memo

    def find_module(self, from_path: str, module: str, level: int): ...

    def model_for(self, path) -> "ScriptModel | None": ...

    def scan_of(self, path) -> ModuleScan | None: ...

    def reaches(self, path: str, scan: ModuleScan, need: Need) -> bool: ...


@dataclass(eq=False)
class Branch:
    """One arm of an `if` around some code (or the code after an early exit,
    which is the negative arm of that `if`)."""

    test: cst.BaseExpression = field(repr=False)
    positive: bool
    function: "FunctionInfo | None"


@dataclass(eq=False)
class Ctx:
    """Where a fact sits: source order, enclosing function, loops and branches."""

    order: int
    function: "FunctionInfo | None"
    loops: tuple["Loop", ...]
    branches: tuple[Branch, ...]
    no_grad: bool = False
    class_name: str | None = None
    # inside a `try:` body or a lambda: when (or whether) it runs is not
    # something source order tells
    opaque: bool = False

    def inside(self, loop: "Loop") -> bool:
        return loop in self.loops


@dataclass(eq=False)
class CallSite:
    node: cst.Call = field(repr=False)
    func: str | None      # the callee as written, `dist.all_reduce`, `self.model.load_state_dict`
    qual: str | None      # with import aliases resolved, `torch.distributed.all_reduce`
    ctx: Ctx
    stmt: cst.CSTNode | None = None   # the statement holding the call (for `# noqa` and positions)

    @property
    def attr(self) -> str | None:
        """Last component of the callee: `set_epoch` for `x.sampler.set_epoch(e)`."""
        if self.func is None:
            if isinstance(self.node.func, cst.Attribute):
                return self.node.func.attr.value
            return None
        return self.func.rpartition(".")[2]

    @property
    def receiver(self) -> cst.BaseExpression | None:
        return self.node.func.value if isinstance(self.node.func, cst.Attribute) else None

    def arg(self, keyword: str, position: int | None = None) -> cst.BaseExpression | None:
        return call_arg(self.node, keyword, position)

    def has_keyword(self, keyword: str) -> bool:
        return any(a.keyword is not None and a.keyword.value == keyword for a in self.node.args)

    @property
    def has_star_args(self) -> bool:
        return any(a.star for a in self.node.args)


def exclusive(a: Ctx, b: Ctx) -> bool:
    """Two places never run in the same pass: the two arms of one `if`, or of
    two `if`s with the same test (`if args.distributed: model = DDP(model)`
    ... later `if args.distributed: ... else: <b>`). The one answer to "is
    this the other arm"."""
    if not a.branches or not b.branches:
        return False
    arms = {id(br.test): br.positive for br in a.branches}
    if any(arms.get(id(br.test), br.positive) != br.positive for br in b.branches):
        return True
    for x in a.branches:
        for y in b.branches:
            if x.test is not y.test and x.positive != y.positive and x.function is y.function \
                    and type(x.test) is type(y.test) and x.test.deep_equals(y.test):
                return True
    return False


def owner_class(ctx: Ctx) -> str | None:
    """The class whose code `ctx` is in: a method's class, or the class body."""
    return ctx.function.class_name if ctx.function is not None else ctx.class_name


def call_arg(node: cst.Call, keyword: str, position: int | None = None) -> cst.BaseExpression | None:
    """The argument passed as `keyword=` or at `position`, if any."""
    for a in node.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a.value
    if position is not None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if position < len(positional) and not any(a.star for a in node.args[: position + 1]):
            return positional[position].value
    return None


@dataclass(eq=False)
class Assign:
    key: str                       # `model`, `self.model`, `args.batch_size`, `os.environ['X']`
    value: cst.BaseExpression | None = field(repr=False)
    ctx: Ctx
    node: cst.CSTNode = field(repr=False)
    augmented: str | None = None   # the operator of `x //= n`, else None
    # `a, loader = build(cfg)`: value is None, unpacked is (the right-hand side, 1)
    unpacked: tuple[cst.BaseExpression, int] | None = None
    # where the key sits in an unpacking target, however nested: `a, (b, c) = x`
    # gives `c` the path (1, 1); None for a starred target (`a, *rest = x`); () when not unpacked
    path: tuple[int, ...] | None = ()
    target: cst.BaseExpression | None = field(default=None, repr=False)   # the target expression, when not unpacked

    kind = "assign"

    @property
    def source(self) -> cst.BaseExpression | None:
        """The expression the bound value comes from (the whole right-hand side when unpacked)."""
        return self.value if self.value is not None else (self.unpacked[0] if self.unpacked else None)

    @property
    def written(self) -> cst.BaseExpression | None:
        """The expression written for this key: the value, or, unpacked from a
        tuple or list written on the right-hand side, its element
        (`best, best_model = acc, copy.deepcopy(net)` gives `best_model` the
        `copy.deepcopy(net)`); None when the element is not written out."""
        if self.value is not None:
            return self.value
        expr = self.unpacked[0] if self.unpacked else None
        for index in self.path or ():
            if not isinstance(expr, (cst.Tuple, cst.List)) or \
                    any(isinstance(e, cst.StarredElement) for e in expr.elements) or index >= len(expr.elements):
                return None
            expr = expr.elements[index].value
        return expr if self.path else None


@dataclass(eq=False)
class Binding:
    """A name bound by something other than an assignment statement (model/dataflow.py):
    kind        key         node            the value it gets
    "param"     `loader`    cst.Param       what the callers pass
    "for"       `batch`     cst.For         an element of what the loop iterates (`path` into it)
    "comp"      `x`         cst.CompFor     an element of what the comprehension iterates
    "with"      `f`         cst.WithItem    what the context manager's `__enter__` returns
    "import"    `dist`      cst.ImportAlias the module or the name imported
    "def"       `train`     cst.FunctionDef the function
    "class"     `Trainer`   cst.ClassDef    the class
    "walrus"    `n`         cst.NamedExpr   its value
    "except"    `e`         cst.ExceptHandler an exception (never followed)
    "match"     `x`         a pattern       never followed
    "lambda"    `x`         cst.Param       a lambda's parameter (never followed)"""

    key: str
    kind: str
    node: cst.CSTNode = field(repr=False)
    ctx: Ctx
    path: tuple[int, ...] | None = ()
    star: str = ""     # "*" / "**" for `*args` / `**kwargs` parameters

    value = None
    augmented = None
    unpacked = None


@dataclass(eq=False)
class Loop:
    node: cst.For | cst.While = field(repr=False)
    iter: cst.BaseExpression | None = field(repr=False)
    ctx: Ctx                          # where the loop statement itself is
    targets: tuple[str, ...] = ()

    @property
    def is_for(self) -> bool:
        return isinstance(self.node, cst.For)


@dataclass(eq=False)
class YieldInfo:
    value: cst.BaseExpression | None = field(repr=False)
    ctx: Ctx
    delegates: bool = False   # `yield from value`


@dataclass(eq=False)
class ClassInfo:
    """A `class` statement: its bases (the expressions, looked up by the value
    layer, across modules) and the methods its body defines."""

    name: str
    node: cst.ClassDef = field(repr=False)
    ctx: Ctx                       # where the class statement is
    bases: tuple[cst.BaseExpression, ...] = field(default=(), repr=False)
    methods: dict[str, "FunctionInfo"] = field(default_factory=dict, repr=False)   # the last def of each name
    all_methods: list["FunctionInfo"] = field(default_factory=list, repr=False)


@dataclass(eq=False)
class FunctionInfo:
    name: str
    node: cst.FunctionDef = field(repr=False)
    ctx: Ctx                       # where the def statement is
    class_name: str | None
    params: tuple[str, ...]
    decorators: tuple[str, ...]    # qualified dotted names of decorators
    returns: list[tuple[cst.BaseExpression, Ctx]] = field(default_factory=list)
    # `yield x` / `yield from x` in its own body (not a nested def): a generator
    yields: list["YieldInfo"] = field(default_factory=list)
    star_param: str | None = None      # the name of `*args`
    kwargs_param: str | None = None    # the name of `**kwargs`
    declared_global: set[str] = field(default_factory=set)   # `global x` / `nonlocal x` in its body
    cls: ClassInfo | None = field(default=None, repr=False)   # the class whose body defines it (a method)

    @property
    def qualname(self) -> str:
        return f"{self.class_name}.{self.name}" if self.class_name else self.name


@dataclass(eq=False)
class Exit:
    """A statement that leaves the enclosing loop or function early:
    `break`, `return`, `raise`, `sys.exit()` / `exit()` / `os._exit()`."""

    kind: str                      # "break", "return", "raise" or "exit"
    node: cst.CSTNode = field(repr=False)   # the statement (or the exit call)
    ctx: Ctx


@dataclass(eq=False)
class Reference:
    """A use of a name (`main`, `self.save_checkpoint`): how functions are reached."""

    name: str
    node: cst.CSTNode = field(repr=False)
    ctx: Ctx
    via_attribute: bool


# shared read-only answer for "nothing recorded here" (callers never mutate query answers)
_EMPTY: list = []


class ScriptModel:
    def __init__(self, path: str, module: cst.Module, project: ProjectView, text: str | None = None) -> None:
        self.path = path
        self.module = module
        self._text = text   # the source as read; regenerated from `module` when not given
        self.project = project
        self.settings = project.settings
        self.imports = ImportTable()
        self.calls: list[CallSite] = []
        self.site_of: dict[int, CallSite] = {}   # id(cst.Call) -> CallSite
        self.assigns: list[Assign] = []
        # every binding in walk order: assignments and the others (Binding); model/dataflow.py
        self.bindings: list[Assign | Binding] = []
        # id(read node) -> the bindings (and dataflow.ENTRY) that can reach that read
        self.reach: dict[int, frozenset] = {}
        # key -> the module-level bindings that reach the end of the module
        self.module_end: dict[str, frozenset] = {}
        self.loops: list[Loop] = []
        self.functions: list[FunctionInfo] = []
        self.exits: list[Exit] = []
        self.references: dict[str, list[Reference]] = {}
        # environment variables read (`os.environ["LOCAL_RANK"]`, `.get`, `os.getenv`,
        # `"RANK" in os.environ`) -> the functions reading them (None: module level)
        self.env_reads: dict[str, list[FunctionInfo | None]] = {}
        self.class_names: set[str] = set()
        self.classes: list[ClassInfo] = []
        self.class_of_node: dict[int, ClassInfo] = {}     # id(cst.ClassDef) -> its ClassInfo
        self.import_of_alias: dict[int, cst.CSTNode] = {}  # id(cst.ImportAlias) -> its Import / ImportFrom
        # id(expression) -> the names it reads, for every recorded expression
        # (assignment values, calls and their arguments, branch tests, loop
        # iterables, returned values), and the divisions inside them: model/reads.py
        self.reads_of: dict[int, frozenset[str]] = {}
        self.divisions_of: dict[int, tuple] = {}   # reads.Division per recorded expression
        self.answers: dict = {}   # answers of @query functions asked of this model (model/memo.py)

    # -- names -------------------------------------------------------------
    def qualify(self, expr: cst.BaseExpression | None) -> str | None:
        if expr is None:
            return None
        d = dotted_name(expr)
        return self.imports.qualify(d) if d else None

    def defines(self, name: str) -> bool:
        """A module-level def or class of this name exists in the file."""
        return name in self.class_names or any(
            f.name == name and f.class_name is None for f in self.functions
        )

    # -- functions ----------------------------------------------------------
    def functions_named(self, name: str, class_name: str | None = None) -> list[FunctionInfo]:
        by_name = self._functions_by_name()
        found = by_name.get(name, _EMPTY)
        if class_name is None:
            return found
        return [f for f in found if f.class_name == class_name]

    @query
    def _functions_by_name(self) -> dict[str, list[FunctionInfo]]:
        by_name: dict[str, list[FunctionInfo]] = {}
        for f in self.functions:
            by_name.setdefault(f.name, []).append(f)
        return by_name

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.module.code
        return self._text

    @query
    def scan(self) -> ModuleScan:
        """The identifiers, imports and definitions of this file, as the
        project scans a helper module's text."""
        return scan_text(self.text)

    @query
    def may_reach(self, need: Need) -> bool:
        """This file, or a local module it can reach through its imports, names
        what `need` asks for (`(("init_process_group",),)`; project.Need).
        When none does, no fact that needs it can hold, and the rule asking
        need not follow calls into helper modules (parsing them is what costs)."""
        if names_match(self.scan().identifiers, need):
            return True
        return self.project is not None and self.project.reaches(self.path, self.scan(), need)

    @property
    def file_name(self) -> str:
        """The file's name without its folder, as messages name a helper module (`utils.py`)."""
        return self.path.replace("\\", "/").rpartition("/")[2]

    def calls_in(self, fn: FunctionInfo | None) -> list[CallSite]:
        return self._calls_by_function().get(fn, _EMPTY)

    @query
    def _calls_by_function(self) -> dict[FunctionInfo | None, list[CallSite]]:
        by_fn: dict[FunctionInfo | None, list[CallSite]] = {}
        for c in self.calls:
            by_fn.setdefault(c.ctx.function, []).append(c)
        return by_fn

    def calls_inside(self, loop: Loop) -> list[CallSite]:
        return [c for c in self.calls_in(loop.ctx.function) if c.ctx.inside(loop)]

    def refs_to(self, fn: FunctionInfo) -> list[Reference]:
        """Uses of a function's name in this file, other than its own def."""
        refs = [r for r in self.references.get(fn.name, []) if r.node is not fn.node.name]
        if fn.class_name is None:
            return [r for r in refs if not r.via_attribute]
        # a method is reached through `self.save(...)` / `trainer.save(...)`, not `torch.save(...)`
        refs = [r for r in refs if r.via_attribute and not self._module_attribute(r.node)]
        if fn.name == "__init__" and fn.class_name in self.class_names:
            # a constructor runs where its class is instantiated: `Trainer(...)`, and `cls(...)`
            # in a classmethod of the class (`trainer = cls(config)` in `Trainer.run`)
            names = self._class_name_nodes()
            refs += [r for r in self.references.get(fn.class_name, [])
                     if not r.via_attribute and id(r.node) not in names]
            refs += [r for r in self.references.get("cls", []) if id(r.node) in self._constructor_calls()
                     and r.ctx.function is not None and r.ctx.function.class_name == fn.class_name
                     and r.ctx.function.params[:1] == ("cls",)
                     and any(d.rpartition(".")[2] == "classmethod" for d in r.ctx.function.decorators)]
        return refs

    @query
    def _constructor_calls(self) -> set[int]:
        """The name nodes called as `cls(...)`."""
        return {id(c.node.func) for c in self.calls if isinstance(c.node.func, cst.Name) and c.node.func.value == "cls"}

    @query
    def _class_name_nodes(self) -> set[int]:
        """The name nodes of `class X:` statements, of the base classes they
        name (`class Child(X):` subclasses X, it does not construct it), and
        of the class named to `super(X, self)` (Python 2's spelling of
        `super()`: it constructs nothing)."""
        found: set[int] = {id(c.node.args[0].value) for c in self.calls
                           if c.func == "super" and len(c.node.args) == 2 and isinstance(c.node.args[0].value, cst.Name)}
        stack = list(self.module.body)
        while stack:
            node = stack.pop()
            if isinstance(node, cst.ClassDef):
                found.add(id(node.name))
                found.update(id(base.value) for base in node.bases)
            elif isinstance(node, (cst.If, cst.Try, cst.With, cst.Else, cst.ExceptHandler, cst.Finally,
                                   cst.IndentedBlock)):
                stack.extend(children(node))
        return found

    def _module_attribute(self, node: cst.CSTNode) -> bool:
        d = dotted_name(node) if isinstance(node, cst.Attribute) else None
        return bool(d) and d.split(".")[0] != "self" and self.imports.is_imported(d)

    # -- assignments --------------------------------------------------------
    def assigns_in(self, fn: FunctionInfo | None) -> list[Assign]:
        return self._assigns_by_function().get(fn, _EMPTY)

    @query
    def _assigns_by_function(self) -> dict[FunctionInfo | None, list[Assign]]:
        by_fn: dict[FunctionInfo | None, list[Assign]] = {}
        for a in self.assigns:
            by_fn.setdefault(a.ctx.function, []).append(a)
        return by_fn

    def function_called(self, name: str) -> FunctionInfo | None:
        """What a bare call `name(...)` runs when this file defines `name`: its
        module-level function, or the `__init__` of its class."""
        local = [f for f in self.functions_named(name) if f.class_name is None]
        return local[-1] if local else self.constructor(name)

    def class_named(self, name: str) -> str | None:
        return name if name in self.class_names else None

    def constructor(self, class_name: str) -> FunctionInfo | None:
        """`__init__` of a class defined in this file: what `Logger(...)`
        runs (None for a class without one, or no such class)."""
        if class_name not in self.class_names:
            return None
        inits = self.functions_named("__init__", class_name)
        return inits[-1] if inits else None
