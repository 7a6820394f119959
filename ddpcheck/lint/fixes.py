"""Autofix: apply the edits rules attach to their hits (rules/base.py's Edit
hierarchy) with one libcst transformer, then lint the result again.

No second analysis decides what to change: a rule that knows the mechanical
fix describes it on the nodes it already holds, and this module only carries
it out. libcst keeps every comment and every byte of formatting it does not
touch. A round applies every non-conflicting edit; edits that touch a node an
earlier edit of the round changed wait for the next round (re-linted text),
up to MAX_ROUNDS. An edit whose result would not compile is dropped."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import libcst as cst

from ddpcheck.findings import FileResult, Finding, SourceError
from ddpcheck.lint.engine import lint_text, worth_analysing
from ddpcheck.rules.base import AddArg, Edit, InsertAfter, InsertAtBodyStart, MoveBefore, RemoveArg, ReplaceExpr
from ddpcheck.settings import LintSettings

MAX_ROUNDS = 10


@dataclass(frozen=True)
class FixOutcome:
    path: str
    original: str
    fixed: str
    applied: tuple[Finding, ...]   # the findings whose fix was applied (positions in the text they were found in)
    result: FileResult             # the lint of the fixed text

    @property
    def changed(self) -> bool:
        return self.fixed != self.original


def fix_text(text: str, path: str, settings: LintSettings, unsafe: bool = False) -> FixOutcome:
    """Apply the fixes of `text`'s findings; never raises for bad input (the
    result then carries the error and the text is unchanged)."""
    from ddpcheck.lint.analyze import rule_hits
    from ddpcheck.lint.noqa import apply_noqa

    current = text
    applied: list[Finding] = []
    for _ in range(MAX_ROUNDS):
        if not worth_analysing(current, settings.enabled):
            break
        try:
            run = rule_hits(current, path, settings)
        except SourceError:
            break
        candidates = [x for x in run.located if x.hit.edit is not None and (x.hit.edit.safe or unsafe)]
        if not candidates:
            break
        unsuppressed = {id(f) for f in apply_noqa([x.finding for x in candidates], current)}
        chosen, touched = [], set()
        for x in sorted((x for x in candidates if id(x.finding) in unsuppressed), key=lambda x: x.finding):
            ids = {id(n) for n in x.hit.edit.nodes}
            if ids & touched:
                continue
            touched |= ids
            chosen.append(x)
        new_text, done = apply_edits(run.module, [x.hit.edit for x in chosen])
        if new_text == current or not _compiles(new_text):
            break
        applied += [x.finding for x, ok in zip(chosen, done) if ok]
        current = new_text
    return FixOutcome(path=path, original=text, fixed=current, applied=tuple(applied),
                      result=lint_text(current, path, settings))


def _compiles(text: str) -> bool:
    try:
        compile(text, "<fixed>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


NO_NEWLINE = b"\\ No newline at end of file\n"
_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")


def _lines(data: bytes) -> list[bytes]:
    """Lines as `patch` and `git apply` see them: split at b"\\n" only (a CR
    stays part of its line; form feeds and U+2028 are not line breaks)."""
    return _LINE.findall(data)


def unified_diff(outcome: FixOutcome, encoding: str = "utf-8") -> bytes:
    """The fix as a unified diff that `git apply` and `patch -p1` accept: the
    lines are the file's own bytes (`encoding` is the one the file was read in,
    so a PEP 263 cookie's encoding and a UTF-8 BOM come back as they were;
    CRLF endings stay), and a last line without a newline is followed by the
    `\\ No newline at end of file` marker. Empty when the fix changes nothing."""
    if not outcome.changed:
        return b""
    path = outcome.path[2:] if outcome.path.startswith("./") else outcome.path
    out = []
    for line in difflib.diff_bytes(difflib.unified_diff, _lines(outcome.original.encode(encoding)),
                                   _lines(outcome.fixed.encode(encoding)),
                                   fromfile=f"a/{path}".encode(), tofile=f"b/{path}".encode()):
        out.append(line)
        if not line.endswith(b"\n"):
            out.append(b"\n" + NO_NEWLINE)
    return b"".join(out)


# --- applying edits -------------------------------------------------------------------

def apply_edits(module: cst.Module, edits: list[Edit]) -> tuple[str, list[bool]]:
    """The module's code with `edits` applied, and for each edit whether its
    nodes were found and it was carried out."""
    applier = _Applier(module, edits)
    new_module = module.visit(applier)
    return new_module.code, [id(e) in applier.done for e in edits]


def _statement(module: cst.Module, code: str) -> cst.BaseStatement:
    return cst.parse_statement(code, config=module.config_for_parsing)


class _Applier(cst.CSTTransformer):
    def __init__(self, module: cst.Module, edits: list[Edit]) -> None:
        super().__init__()
        self.module = module
        self.done: set[int] = set()
        self.on_node: dict[int, list[Edit]] = {}
        self.in_block: dict[int, list[Edit]] = {}   # statement id -> InsertAfter / MoveBefore edits
        for e in edits:
            if isinstance(e, (InsertAfter, MoveBefore)):
                for n in e.nodes:
                    self.in_block.setdefault(id(n), []).append(e)
            else:
                self.on_node.setdefault(id(e.nodes[0]), []).append(e)

    def on_leave(self, original_node, updated_node):
        for e in self.on_node.get(id(original_node), ()):
            result = self._apply(e, original_node, updated_node)
            if result is not None:
                updated_node = result
                self.done.add(id(e))
        if isinstance(original_node, (cst.Module, cst.IndentedBlock)) and self.in_block:
            updated_node = self._block(original_node, updated_node)
        return updated_node

    # -- edits on one node ------------------------------------------------------
    def _apply(self, e: Edit, original, updated):
        if isinstance(e, ReplaceExpr):
            return cst.parse_expression(e.code, config=self.module.config_for_parsing)
        if isinstance(e, RemoveArg) and isinstance(updated, cst.Call):
            return _remove_arg(updated, e.keyword)
        if isinstance(e, AddArg) and isinstance(updated, cst.Call):
            return _add_arg(self.module, updated, e)
        if isinstance(e, InsertAtBodyStart) and isinstance(getattr(updated, "body", None), cst.IndentedBlock):
            body = updated.body
            return updated.with_changes(body=body.with_changes(body=[_statement(self.module, e.code), *body.body]))
        return None

    # -- edits on a block's statements ---------------------------------------------
    def _block(self, original, updated):
        originals = list(original.body)
        ids = [id(s) for s in originals]
        if not any(i in self.in_block for i in ids):
            return updated
        statements = list(updated.body)
        moves = {}
        after: dict[int, list[cst.BaseStatement]] = {}
        for index, sid in enumerate(ids):
            for e in self.in_block.get(sid, ()):
                if id(e) in self.done:
                    continue
                if isinstance(e, InsertAfter) and e.anchor is originals[index]:
                    after.setdefault(index, []).append(_statement(self.module, e.code))
                    self.done.add(id(e))
                elif isinstance(e, MoveBefore) and e.statement is originals[index] and id(e.anchor) in ids:
                    moves[index] = (ids.index(id(e.anchor)), e)
        out = list(statements)
        for index, (anchor, e) in sorted(moves.items(), reverse=True):
            if anchor >= index:
                continue   # already before: nothing to move
            moved = statements[index] if e.code is None else _statement(self.module, e.code).with_changes(
                leading_lines=getattr(statements[index], "leading_lines", ()))
            self.done.add(id(e))
            out[index] = None
            out[anchor] = [moved, out[anchor]] if not isinstance(out[anchor], list) else [moved, *out[anchor]]
        flat: list[cst.BaseStatement] = []
        for index, item in enumerate(out):
            if item is None:
                continue
            flat.extend(item if isinstance(item, list) else [item])
            flat.extend(after.get(index, ()))
        return updated.with_changes(body=flat)


def _remove_arg(call: cst.Call, keyword: str) -> cst.Call | None:
    args = list(call.args)
    index = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == keyword), None)
    if index is None:
        return None
    removed = args.pop(index)
    if "#" in cst.Module(body=[]).code_for_node(removed.with_changes(comma=cst.MaybeSentinel.DEFAULT)):
        return None   # a comment inside the argument itself would be lost
    if index > 0:
        # the argument before takes the removed one's comma, with the comment
        # and line break that may follow it (`shuffle=True,  # why`)
        args[index - 1] = args[index - 1].with_changes(comma=removed.comma)
    elif "#" in cst.Module(body=[]).code_for_node(removed):
        return None
    return call.with_changes(args=args)


def _add_arg(module: cst.Module, call: cst.Call, e: AddArg) -> cst.Call | None:
    args = list(call.args)
    value = cst.parse_expression(e.code, config=module.config_for_parsing)
    if e.keyword is not None:
        if any(a.keyword is not None and a.keyword.value == e.keyword for a in args):
            return None
        new = cst.Arg(value=value, keyword=cst.Name(e.keyword),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
        if any(a.star == "**" for a in args):
            return None
        if not args:
            return call.with_changes(args=[new])
        last = args[-1]
        if isinstance(last.comma, cst.Comma):   # a trailing comma: keep the one-argument-a-line layout
            separator = args[-2].comma if len(args) > 1 else cst.Comma(whitespace_after=call.whitespace_before_args)
            args[-1] = last.with_changes(comma=separator)
            new = new.with_changes(comma=last.comma)
        else:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, new])
    positional = [i for i, a in enumerate(args) if a.keyword is None and not a.star]
    if e.after is None or e.after >= len(positional):
        return None
    at = positional[e.after]
    anchor = args[at]
    new = cst.Arg(value=value, comma=anchor.comma if isinstance(anchor.comma, cst.Comma)
                  else cst.MaybeSentinel.DEFAULT)
    args[at] = anchor.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.insert(at + 1, new)
    return call.with_changes(args=args)
