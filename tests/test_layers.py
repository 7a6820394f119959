"""The layers stay visible: parse -> model -> rules -> lint for the linter,
leaf modules at the bottom, the preflight beside them; nothing imports upward
and no module-level import circles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ddpcheck"
# a layer may import its own and the ones listed (the leaves are open to all)
LEAVES = {"ddpcheck.findings", "ddpcheck.settings", "ddpcheck.errors", "ddpcheck.pages", "ddpcheck.triggers", "ddpcheck"}
ALLOWED = {
    "ddpcheck.parse": {"ddpcheck.parse"},
    "ddpcheck.model": {"ddpcheck.parse", "ddpcheck.model"},
    "ddpcheck.rules": {"ddpcheck.parse", "ddpcheck.model", "ddpcheck.rules"},
    "ddpcheck.lint": {"ddpcheck.parse", "ddpcheck.model", "ddpcheck.rules", "ddpcheck.lint"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.split(".")[0] == "ddpcheck"}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> str | None:
    return next((layer for layer in ALLOWED if name == layer or name.startswith(layer + ".")), None)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer_of(n)))
def test_nothing_imports_upward(name):
    allowed = ALLOWED[layer_of(name)]
    bad = sorted(i for i in imports(MODULES[name], top_level_only=False)
                 if i in MODULES and i not in LEAVES and layer_of(i) not in allowed)
    assert not bad, f"{name} imports {bad} from a layer above it"


@pytest.mark.parametrize("leaf", sorted(LEAVES - {"ddpcheck"}))
def test_leaf_modules_import_no_layer(leaf):
    used = {i for i in imports(MODULES[leaf], top_level_only=False) if i in MODULES}
    assert used <= LEAVES, f"{leaf} imports {sorted(used - LEAVES)}"


def test_no_import_circles_even_through_imports_inside_functions():
    # every import counts: at module level, inside a function (a deferred import
    # cannot hide a circle) and under `if TYPE_CHECKING:`
    graph = {name: {i for i in imports(path, top_level_only=False) if i in MODULES and i != name}
             for name, path in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            assert cycle is None, " -> ".join(cycle)


def function_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddpcheck"):
                    found.append(f"{fn.name}: {node.module}")
                elif isinstance(node, ast.Import):
                    found += [f"{fn.name}: {a.name}" for a in node.names if a.name.startswith("ddpcheck")]
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer_of(n) in ("ddpcheck.model", "ddpcheck.rules")))
def test_the_engine_and_the_rules_import_at_module_level(name):
    """The model and the rules import what they use at the top: their layers
    are read from their first lines. (The lint driver defers importing the
    rules and libcst on purpose, so that files the prefilter skips never pay
    for them.)"""
    assert function_level_imports(MODULES[name]) == []
