"""No function in ddpcheck/ is longer than 80 lines: a longer one is split into named
steps (read with ast: decorators excluded, docstring and comments included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ddpcheck"
MAX_LINES = 80
# (path relative to ddpcheck/, qualified name) of a function allowed to be longer, with why
EXCEPTIONS: dict = {}


def long_functions(root: Path = PACKAGE, limit: int = MAX_LINES) -> list:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(str(path.relative_to(root)), name, lines)
                  for name, lines in _functions(tree, "") if lines > limit]
    return found


def _functions(node, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def test_no_function_is_longer_than_80_lines():
    too_long = [(path, name, lines) for path, name, lines in long_functions()
                if (path, name) not in EXCEPTIONS]
    assert too_long == [], "split into named steps: " + ", ".join(
        f"{path}:{name} ({lines} lines)" for path, name, lines in too_long)


def test_the_measure_counts_a_long_function_and_nested_ones(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(
        f"def long():\n{body}\n\n\nclass C:\n    def short(self):\n        def inner():\n"
        f"            pass\n        return inner\n", encoding="utf-8")
    assert long_functions(tmp_path) == [("m.py", "long", MAX_LINES + 1)]
    assert long_functions(tmp_path, limit=1) == [("m.py", "long", MAX_LINES + 1),
                                                 ("m.py", "C.short", 4),
                                                 ("m.py", "C.short.inner", 2)]
