"""Parsing source text: Python's own parser first, then libcst.

CPython's parser (`compile(..., PyCF_ONLY_AST)`) runs in C at ~10x libcst's
speed and is the authority on what is valid Python: its syntax errors carry
the line and column Python itself reports. It also refuses, in milliseconds,
what is nested too deeply for Python to compile (`x = 1+1+...+1` with
thousands of terms), which is exactly what makes libcst's native parser spin
for minutes and then overflow its stack (a segfault, not an exception)."""

from __future__ import annotations

import ast
import re
import warnings
from typing import TYPE_CHECKING

from ddpcheck.findings import ErrorKind, SourceError

if TYPE_CHECKING:
    import libcst as cst


def check_syntax(text: str, path: str = "<unknown>") -> None:
    """Raise SourceError when Python itself would refuse to compile `text`."""
    try:
        with warnings.catch_warnings():
            # SyntaxWarning / DeprecationWarning (`"\d"`, `x is 1`) are for
            # the code's author at run time, not for the linter's output.
            warnings.simplefilter("ignore")
            compile(text, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError included
        line = exc.lineno if exc.lineno else None
        col = max(1, exc.offset or 1) if line is not None else None
        raise SourceError(exc.msg or "invalid syntax", ErrorKind.SYNTAX, line, col) from None
    except (RecursionError, MemoryError):
        # CPython's parser and AST builder bound their own depth; past it
        # `python file.py` fails too ("maximum recursion depth exceeded during
        # compilation").
        raise SourceError("nested too deeply for Python to compile (a very long expression or chain)",
                          ErrorKind.TOO_COMPLEX) from None
    except ValueError as exc:  # NUL bytes; read_source refuses those first
        raise SourceError(str(exc), ErrorKind.SYNTAX) from None


def parse(text: str) -> "cst.Module":
    """libcst's parse of text that check_syntax has accepted."""
    import libcst as cst  # here, not at the top: files the prefilter skips never pay for libcst

    try:
        return _parse_unvalidated(cst, text)
    except cst.ParserSyntaxError as exc:
        # Valid Python (CPython accepted it) that libcst cannot read: say so,
        # at libcst's position. Its native parser's own "error at L:C" (0-based
        # column) is more exact than the exception's coordinates.
        message = str(exc.message or "invalid syntax").strip()
        where = re.search(r"error at (\d+):(\d+)", message)
        line, col = (int(where.group(1)), int(where.group(2)) + 1) if where else (exc.raw_line, exc.raw_column + 1)
        reason = re.sub(r"^parser error: error at \d+:\d+: ", "", message.splitlines()[0])
        raise SourceError(f"ddpcheck's parser (libcst) cannot read this: {reason}", ErrorKind.PARSER,
                          line, col) from None
    except RecursionError:
        raise SourceError("nested too deeply for ddpcheck's parser", ErrorKind.TOO_COMPLEX) from None


def _no_validation(node) -> None:
    """What a node made by the parser checks of itself: nothing (see _parse_unvalidated)."""


def _parse_unvalidated(cst, text: str) -> "cst.Module":
    """`cst.parse_module(text)` without each node's `_validate()`.

    Every libcst node checks its own fields when it is made (`CSTNode.__post_init__`
    calls `_validate()`: a Name is an identifier, parentheses balance, ...). That
    guards trees built by hand; a tree made by libcst's parser from text CPython
    accepted is valid by construction (libcst's own note there: validation could
    skip parsed trees), and the checks were about 15 % of every parse (torch's
    source: 1.7 of 11.2 s). So for the length of one parse the class hook is a
    no-op, and it is put back whatever happens; nothing else runs in between
    (the lint runs one file at a time per process, and nodes built by ddpcheck's
    autofix are made outside it, fully checked). `_validate` only raises (no
    libcst node computes state in it), so the tree is the same object for object.
    Where the hook is not where this expects it (another libcst), a plain parse."""
    node_class = cst.CSTNode
    validate = node_class.__dict__.get("__post_init__")
    if validate is None:
        return cst.parse_module(text)
    node_class.__post_init__ = _no_validation
    try:
        return cst.parse_module(text)
    finally:
        node_class.__post_init__ = validate


def parse_checked(text: str, path: str = "<unknown>") -> "cst.Module":
    """Python's check, then libcst: for any source that was not checked yet."""
    check_syntax(text, path)
    return parse(text)
