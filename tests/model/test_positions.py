"""Positions of reported nodes: computed for those nodes only, and equal to
libcst's PositionProvider (which the whole-file pass used to give)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpcheck.model.positions import positions_of

REPO = Path(__file__).resolve().parents[2]


def _all_nodes(module: cst.Module) -> list[cst.CSTNode]:
    found, stack = [], [module]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children)
    return found


def test_every_node_of_real_scripts_matches_position_provider():
    files = sorted(REPO.glob("fixtures/scripts/*.py"))[:6] + sorted(REPO.glob("fixtures/rules/DDP3*/*.py"))[:6]
    assert files
    for path in files:
        module = cst.parse_module(path.read_text())
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        nodes = _all_nodes(module)
        got = positions_of(module, nodes)
        for node in nodes:
            pos = expected[node].start
            assert got[id(node)] == (pos.line, pos.column), (path.name, type(node).__name__)


def test_only_wanted_nodes_and_stops_early():
    module = cst.parse_module("a = 1\n\n\nif x:\n    b = f(\n        2)\nc = 3\n")
    call = module.body[1].body.body[0].body[0].value
    arg = call.args[0].value
    got = positions_of(module, [call, arg])
    assert got == {id(call): (5, 8), id(arg): (6, 8)}
    assert positions_of(module, []) == {}
