"""What a file is, for the rules that judge a training run: a script, test
code, or a module of a library.

A rule's harm is a training run's harm (a wasted epoch order, a race on a
checkpoint, a GPU picked by the global rank on the second node). Test code
exercises a library on one machine on purpose (a model wrapped in
DataParallel to test a checkpointer, a global rank as the device of a
spawned test worker), and a library module is run by its users' scripts,
which decide how many processes there are and when the process group
starts. Each rule says which kinds it looks at (`Rule.kinds`, on its page);
the driver decides a file's kind from its path (config `test-files`,
`script-files`) and from what this module tells:

- `library_module`: the file is part of a package the project installs (a
  chain of folders with `__init__.py` under a folder holding setup.py /
  setup.cfg / pyproject.toml, `src/` layouts too) and is not run as a script
  (no `if __name__ == "__main__":`);
- `test_functions`: functions of any file that are tests by name
  (`def test_...`, `..._for_test`), for the same judgement inside a library.
"""

from __future__ import annotations

import os

import libcst as cst

from ddpcheck.model.names import dotted_name, string_value
from ddpcheck.model.script import FunctionInfo, ScriptModel

SCRIPT = "script"
TEST = "test"
LIBRARY = "library"
ALL_KINDS = frozenset({SCRIPT, TEST, LIBRARY})
NOT_TESTS = frozenset({SCRIPT, LIBRARY})
SCRIPTS_ONLY = frozenset({SCRIPT})

_PACKAGING = ("setup.py", "setup.cfg", "pyproject.toml")
_TEST_SUFFIXES = ("_for_test", "_for_tests", "_for_testing")


def has_main_guard(model: ScriptModel) -> bool:
    """The module runs as a script: `if __name__ == "__main__":` at its top level."""
    for stmt in model.module.body:
        if isinstance(stmt, cst.If) and _is_main_test(stmt.test):
            return True
    return False


def _is_main_test(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return any(dotted_name(s) == "__name__" for s in sides) and any(string_value(s) == "__main__" for s in sides)


def _package_top(folder: str) -> str | None:
    """The outermost folder of the chain of packages (`__init__.py`) that
    holds `folder`; None when `folder` is not a package."""
    top = None
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        top = folder
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return top


def installed_package_module(path: str) -> bool:
    """`path` is a module of a package the project installs: its package
    chain sits in a folder (or that folder's `src/`) with a packaging file."""
    top = _package_top(os.path.dirname(os.path.abspath(path)))
    if top is None:
        return False
    base = os.path.dirname(top)
    if os.path.basename(base) == "src":
        base = os.path.dirname(base)
    return any(os.path.isfile(os.path.join(base, name)) for name in _PACKAGING)


def library_module(model: ScriptModel) -> bool:
    return not has_main_guard(model) and installed_package_module(model.path)


def is_test_function(fn: FunctionInfo) -> bool:
    return fn.name.startswith("test_") or fn.name.endswith(_TEST_SUFFIXES)


def test_functions(model: ScriptModel) -> list[FunctionInfo]:
    """Test functions and the functions nested in them."""
    found = []
    for fn in model.functions:
        outer = fn
        while outer is not None and not is_test_function(outer):
            outer = outer.ctx.function
        if outer is not None:
            found.append(fn)
    return found


__all__ = ["SCRIPT", "TEST", "LIBRARY", "ALL_KINDS", "NOT_TESTS", "SCRIPTS_ONLY", "has_main_guard", "installed_package_module",
           "library_module", "is_test_function", "test_functions"]
