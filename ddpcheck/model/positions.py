"""Positions (line, column) of the few nodes that are reported.

libcst's PositionProvider records a range for every node of the file, which
costs more than the parse itself. Findings need the start of a handful of
nodes, so this generates the module's code once with a codegen state that
only counts lines up to each wanted node and stops after the last one: about
the cost of `module.code` for the part of the file before the last finding.
The positions are libcst's own (same `record_syntactic_position` hooks as
PositionProvider), so they match what PositionProvider reports.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterable, Iterator

import libcst as cst
from libcst._nodes.internal import CodegenState

from ddpcheck.model.memo import query
from ddpcheck.model.script import ScriptModel

# libcst's code generation recurses a few frames per nesting level of the
# source; Python frames are cheap in 3.11 (no C stack per Python call), so a
# deeply nested but valid file gets a higher limit for this one pass.
_CODEGEN_RECURSION_LIMIT = 100_000


class _Found(Exception):
    """Every wanted node has its position: stop generating code."""


class _StartTrackingState(CodegenState):
    def __init__(self, module: cst.Module, wanted: set[int]) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.wanted = wanted                   # ids of the nodes still without a position
        self.alias: dict[int, list[int]] = {}  # id(start_node) -> ids of nodes starting there
        self.found: dict[int, tuple[int, int]] = {}
        self._scanned = 0                      # tokens already counted into line / column
        self._line = 1
        self._column = 0

    def _here(self) -> tuple[int, int]:
        tokens = self.tokens
        line, column = self._line, self._column
        for i in range(self._scanned, len(tokens)):
            token = tokens[i]
            if "\n" in token or "\r" in token:
                segments = token.replace("\r\n", "\n").replace("\r", "\n").split("\n")
                line += len(segments) - 1
                column = len(segments[-1])
            else:
                column += len(token)
        self._scanned, self._line, self._column = len(tokens), line, column
        return line, column

    def _record(self, key: int) -> None:
        if key in self.wanted:
            self.found[key] = self._here()
            self.wanted.discard(key)
        waiting = self.alias.pop(key, None)
        while waiting:   # nodes that start where this one does (nested blocks: iterative)
            other = waiting.pop()
            self.found[other] = self._here()
            waiting.extend(self.alias.pop(other, ()))

    @contextmanager
    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> Iterator[None]:
        key = id(node)
        if start_node is not None and key in self.wanted:
            # the node starts where its first child does (an indented block's first statement)
            self.alias.setdefault(id(start_node), []).append(key)
            self.wanted.discard(key)
        else:
            self._record(key)
        if not self.wanted and not self.alias:
            raise _Found
        yield


class _StartTrackingAllState(_StartTrackingState):
    """Also nodes without a syntactic hook (an `Arg`, a `Param`): their start
    is where their code begins, as PositionProvider has it. The hooks run for
    every node, so this pass is only made for such nodes."""

    def __init__(self, module: cst.Module, wanted: set[int]) -> None:
        super().__init__(module, wanted)
        self.began: dict[int, tuple[int, int]] = {}

    def before_codegen(self, node) -> None:
        if id(node) in self.wanted:
            self.began[id(node)] = self._here()

    def after_codegen(self, node) -> None:
        key = id(node)
        if key in self.wanted:
            self.found[key] = self.began.pop(key)
            self.wanted.discard(key)
            if not self.wanted and not self.alias:
                raise _Found


def positions_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict[int, tuple[int, int]]:
    """id(node) -> (line, 0-based column) of each node's syntactic start, for
    the nodes of `nodes` that are in `module`."""
    wanted = {id(n) for n in nodes}
    if not wanted:
        return {}
    found = _generate(module, _StartTrackingState(module, set(wanted)))
    missing = wanted - found.keys()
    if missing:
        found.update(_generate(module, _StartTrackingAllState(module, missing)))
    return found


def _generate(module: cst.Module, state: _StartTrackingState) -> dict[int, tuple[int, int]]:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _CODEGEN_RECURSION_LIMIT))
    try:
        module._codegen(state)
    except _Found:
        pass
    finally:
        sys.setrecursionlimit(limit)
    return state.found


@query
def _line(model: ScriptModel, node: cst.CSTNode) -> int | None:
    pos = positions_of(model.module, [node]).get(id(node))
    return pos[0] if pos is not None else None


def line_of(model: ScriptModel, node) -> int | None:
    return _line(model, node)


def where(model: ScriptModel, node, here: ScriptModel | None = None) -> str:
    """`line 12`, or `utils.py:12` when the node is in another file than `here`."""
    line = line_of(model, node)
    if here is not None and model is not here:
        name = model.file_name
        return f"{name}:{line}" if line else name
    return f"line {line}" if line else "elsewhere"
