"""Parsing source text into a libcst Module; syntax errors become SourceError."""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.findings import SourceError


def parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        message = str(exc.message or "invalid syntax").strip()
        # The native parser's own "error at L:C" (0-based column) is more exact
        # than the exception's coordinates, which can point at the next token.
        where = re.search(r"error at (\d+):(\d+)", message)
        line, col = (int(where.group(1)), int(where.group(2)) + 1) if where else (exc.raw_line, exc.raw_column + 1)
        reason = re.sub(r"^parser error: error at \d+:\d+: ", "", message.splitlines()[0])
        raise SourceError(f"{line}:{col}: syntax error: {reason}") from None
    except RecursionError:
        raise SourceError("too deeply nested to parse") from None
