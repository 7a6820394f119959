"""Reaching definitions: which bindings of a name a read can see.

The builder's one walk over a file drives a `Dataflow` (see builder.py): it
reports every binding (`x = ...`, `self.model = ...`, `cfg['lr'] = ...`, a
parameter, a `for` target, a `with ... as`, an import, a `def`) and every read
of a name or a dotted name, in the order Python runs them, and the shape of
the code around them (branches, loops, `try`, early exits). For each read
this records the set of bindings that can reach it:

- straight-line code: the latest binding of the key on the path (a binding of
  `a` also replaces what `a.b` and `a['k']` held);
- `if` / `else`, `match`, `try` / `except`: each arm starts from the state
  before it, and the arms merge where they meet; an arm that leaves
  (`return`, `raise`, `break`, `continue`, `sys.exit()`) does not flow on;
- loops: a read in a loop sees the bindings before the loop and those made
  later in the loop body on an earlier iteration. The walk passes the body
  once with a marker standing for "the value at the top of the loop", then
  replaces the marker by what reaches the top (before the loop, the end of
  the body, every `continue`): for reaching definitions one pass and this
  substitution are the fixed point, so no loop is iterated by hand.

An `Entry` in a read's set means "a path from the start of the scope with no
binding here": a name of an enclosing function, a module global read in a
function, an attribute set elsewhere (`self.x` assigned in `__init__`, read in
`train()`): the value layer (model/flow.py) looks those up where they live.
Each scope has its own Entry, which says which scope it is.

A leaf of the model: it knows keys, bindings (any object) and nodes only.
"""

from __future__ import annotations

from typing import Iterable


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Entry(_Marker):
    """The start of a scope: `scope` is the function (None: the module);
    `closure` for a lambda, whose free names are its enclosing function's
    (read whenever the lambda runs)."""

    __slots__ = ("scope", "closure")

    def __init__(self, scope, closure: bool = False) -> None:
        super().__init__("ENTRY")
        self.scope = scope
        self.closure = closure


NOTHING: frozenset = frozenset()


class _LoopHead(_Marker):
    """Stands for "what the key holds at the top of this loop" while the
    loop's body is walked."""

    __slots__ = ("pending", "before", "continues", "breaks", "default_out")

    def __init__(self, before: dict | None, default_out: frozenset) -> None:
        super().__init__("LOOP")
        self.pending: list[tuple[int, str]] = []     # reads whose set holds this marker
        self.before = before                         # the state entering the loop
        self.default_out = default_out               # the default outside the loop
        self.continues: list[dict] = []
        self.breaks: list[dict] = []


class _TryFrame:
    __slots__ = ("before", "defined", "ends")

    def __init__(self, before: dict | None) -> None:
        self.before = before
        self.defined: dict[str, set] = {}      # bindings made anywhere in the try body
        self.ends: list[dict | None] = []      # states at the end of the body / else / each handler


class _Scope:
    __slots__ = ("env", "default", "entry", "loops", "tries", "prefixes")

    def __init__(self, env: dict | None, default: frozenset) -> None:
        self.entry = default          # the set "from the start of this scope"
        self.env = env                # key -> frozenset of bindings (and markers); None: unreachable
        self.default = default        # the set a key not in `env` holds
        self.loops: list[_LoopHead] = []
        self.tries: list[_TryFrame] = []
        self.prefixes: set[str] = set()   # `a`, `a.b` for every `a.b.c` bound: rebinding them kills it


class Dataflow:
    """The reaching-definitions pass of one file; `reach` is its result:
    id(read node) -> frozenset of bindings (and ENTRY)."""

    def __init__(self) -> None:
        self.reach: dict[int, frozenset] = {}
        self._scope = _Scope({}, frozenset({Entry(None)}))
        self._saved: list[_Scope] = []
        self.module_end: dict[str, frozenset] = {}

    # -- scopes ---------------------------------------------------------------------
    def enter_scope(self, bindings: Iterable = (), inherit: bool = False, entry: Entry | None = None) -> None:
        """A function or lambda body (fresh state starting at `entry`,
        `bindings` made at its entry: the parameters), or a class body or a
        comprehension (`inherit`: it reads the enclosing state as it is when
        it runs; its own bindings do not leak out)."""
        outer = self._scope
        self._saved.append(outer)
        if inherit:
            scope = _Scope(dict(outer.env) if outer.env is not None else None, outer.default)
            scope.entry = outer.entry
            scope.prefixes = set(outer.prefixes)
            scope.loops = outer.loops   # its reads see the enclosing loops' tops: resolved with them
        else:
            scope = _Scope({}, frozenset({entry if entry is not None else Entry(None)}))
        self._scope = scope
        for b in bindings:
            self.define(b.key, b)

    def exit_scope(self) -> None:
        self._scope = self._saved.pop()

    def finish(self) -> None:
        """The end of the module: what its names hold once it has run."""
        env = self._scope.env
        self.module_end = dict(env) if env is not None else {}

    @property
    def reachable(self) -> bool:
        return self._scope.env is not None

    # -- reads and bindings ------------------------------------------------------------
    def read(self, node, key: str) -> None:
        scope = self._scope
        env = scope.env
        if env is None:
            self.reach[id(node)] = NOTHING   # dead code
            return
        found = env.get(key)
        if found is None:
            found = scope.default
        self.reach[id(node)] = found
        if scope.loops:
            for loop in scope.loops:
                if loop in found:
                    loop.pending.append((id(node), key))

    def define(self, key: str, binding) -> None:
        scope = self._scope
        env = scope.env
        if env is None:
            return
        self._kill_below(scope, env, key)
        value = frozenset((binding,))
        env[key] = value
        for frame in scope.tries:
            frame.defined.setdefault(key, set()).add(binding)
        # `a.b.c` bound: rebinding `a` or `a.b` later replaces it
        cut = len(key)
        while True:
            dot = max(key.rfind(".", 0, cut), key.rfind("[", 0, cut))
            if dot <= 0:
                break
            scope.prefixes.add(key[:dot])
            cut = dot

    def unbind(self, key: str) -> None:
        """`del x`: nothing reaches a later read."""
        scope = self._scope
        if scope.env is not None:
            self._kill_below(scope, scope.env, key)
            scope.env[key] = NOTHING

    @staticmethod
    def _kill_below(scope: _Scope, env: dict, key: str) -> None:
        if key in scope.prefixes:
            dot, bracket = key + ".", key + "["
            for k in [k for k in env if k.startswith(dot) or k.startswith(bracket)]:
                env[k] = scope.entry   # the attribute of the new object: looked up where it lives

    def end_path(self) -> None:
        """`return`, `raise`, `sys.exit()`: nothing after it on this path runs."""
        self._scope.env = None

    # -- branches ----------------------------------------------------------------------
    def fork(self) -> dict | None:
        """The state at a branch point (an `if` test, a `match` subject)."""
        env = self._scope.env
        return dict(env) if env is not None else None

    def start_arm(self, at: dict | None) -> None:
        self._scope.env = dict(at) if at is not None else None

    def arm_state(self) -> dict | None:
        return self._scope.env

    def join(self, states: list[dict | None]) -> None:
        self._scope.env = self._merge(states, self._scope.default)

    @staticmethod
    def _merge(states: list[dict | None], default: frozenset) -> dict | None:
        live = [s for s in states if s is not None]
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        first = live[0]
        out = dict(first)
        for other in live[1:]:
            for k in set(out) | set(other):
                a = out.get(k, default)
                b = other.get(k, default)
                if a is not b:
                    out[k] = a | b
        return out

    # -- loops ---------------------------------------------------------------------------
    def enter_loop(self) -> None:
        """Before the loop's first test (`while`) or target binding (`for`)."""
        scope = self._scope
        head = _LoopHead(scope.env, scope.default)
        scope.loops.append(head)
        scope.env = {} if scope.env is not None else None
        scope.default = frozenset({head})

    def loop_break(self) -> None:
        scope = self._scope
        if scope.env is not None and scope.loops:
            scope.loops[-1].breaks.append(scope.env)
        scope.env = None

    def loop_continue(self) -> None:
        scope = self._scope
        if scope.env is not None and scope.loops:
            scope.loops[-1].continues.append(scope.env)
        scope.env = None

    def exit_loop(self, runs_forever: bool = False) -> list[dict]:
        """After the body: resolve the loop's marker, then go on with the
        state where the loop ends normally (its `else`, if any, is walked
        next by the caller). Returns the states of its `break`s, for
        `after_loop_else`."""
        scope = self._scope
        head = scope.loops.pop()
        inside_default = scope.default
        scope.default = head.default_out
        back = self._merge([scope.env, *head.continues], inside_default)
        before = head.before
        if before is None:
            # the loop itself is never reached
            scope.env = None
            return []
        # what each key holds at the top of the loop, at the fixed point
        keys = set(before) | (set(back) if back is not None else set())
        top: dict[str, frozenset] = {}
        for k in keys:
            value = before.get(k, head.default_out)
            if back is not None:
                extra = back.get(k, inside_default) - {head}
                if extra:
                    value = value | extra
            top[k] = value

        def resolve(value: frozenset, key: str) -> frozenset:
            if head not in value:
                return value
            return (value - {head}) | top.get(key, before.get(key, head.default_out))

        reach = self.reach
        outer_loops = scope.loops
        for node_id, key in head.pending:
            resolved = resolve(reach[node_id], key)
            reach[node_id] = resolved
            for loop in outer_loops:
                if loop in resolved:
                    loop.pending.append((node_id, key))
        breaks = []
        for b in head.breaks:
            state = dict(top)   # a key the body did not bind holds what it held at the top
            state.update((k, resolve(v, k)) for k, v in b.items())
            breaks.append(state)
        scope.env = None if runs_forever else dict(top)
        return breaks

    def after_loop_else(self, breaks: list[dict]) -> None:
        """After the loop's `else` (or right after `exit_loop` without one):
        the paths that left by `break` join."""
        self.join([self._scope.env, *breaks])

    # -- try ----------------------------------------------------------------------------
    def enter_try(self) -> None:
        scope = self._scope
        scope.tries.append(_TryFrame(dict(scope.env) if scope.env is not None else None))

    def end_try_body(self) -> None:
        """After the body (and its `else`): keep that state for the join."""
        frame = self._scope.tries[-1]
        frame.ends.append(self._scope.env)

    def start_handler(self) -> None:
        """An `except` arm: the exception may have come from any point of the
        body, so the arm sees the state before it and every binding made in it."""
        scope = self._scope
        frame = scope.tries[-1]
        if frame.before is None:
            scope.env = None
            return
        env = dict(frame.before)
        for k, found in frame.defined.items():
            env[k] = env.get(k, scope.default) | frozenset(found)
        scope.env = env

    def end_handler(self) -> None:
        self._scope.tries[-1].ends.append(self._scope.env)

    def exit_try(self) -> None:
        """After the last handler; the `finally` body (if any) runs next, on the joined state."""
        scope = self._scope
        frame = scope.tries.pop()
        if scope.tries:   # an enclosing try's handlers can see these bindings too
            outer = scope.tries[-1].defined
            for k, found in frame.defined.items():
                outer.setdefault(k, set()).update(found)
        self.join(frame.ends)


__all__ = ["Dataflow", "Entry", "NOTHING"]
