"""What a scan of a module's text tells without parsing it.

A rule that follows calls into helper modules can first ask whether the
module a call lands in, or one it imports, even names what the rule looks
for (`init_process_group`, a collective): when none does, no fact the rule
needs can hold there and the module is never parsed. The identifiers of a
module come from a scan of its text, about a hundred times cheaper than
parsing it; on torch's own source this skipped most helper parses. A leaf
module: text in, sets of names out."""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n;#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n;#]+)", re.M)
_DEF = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+(\w+)", re.M)
# a module-level assignment (`CKPT_NAME = "last.pt"`, `cfg: Config = load()`), at column 0
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.M)

# What an asker looks for, as groups of names: a module matches when it names
# one of every group (`((distributed modules), (collective names))`: a
# `reduce` alone is functools', not a collective). A name starting with `*`
# matches any identifier containing the rest (`*loader`: `train_loader`).
Need = tuple[tuple[str, ...], ...]


def names_match(identifiers: frozenset[str], need: Need) -> bool:
    return all(_group_matches(identifiers, group) for group in need)


def _group_matches(identifiers: frozenset[str], group: tuple[str, ...]) -> bool:
    if not identifiers.isdisjoint(group):
        return True
    parts = [g[1:] for g in group if g.startswith("*")]
    return bool(parts) and any(p in ident for ident in identifiers for p in parts)


@dataclass(frozen=True)
class ModuleScan:
    """Supersets (a string that looks like an import counts too): they only
    decide what *not* to parse, so too much is safe, and too little never
    happens for code Python accepts."""

    identifiers: frozenset[str]                          # every word that could be a name
    sources: frozenset[tuple[str, int, str | None]]      # (module, level, name) of its imports
    bound: frozenset[str]                                # names it defines (def, class) or binds by import
    assigned: frozenset[str] = frozenset()               # names a module-level assignment binds


def scan_text(text: str) -> ModuleScan:
    text = text.replace("\\\n", " ")
    sources: set[tuple[str, int, str | None]] = set()
    bound: set[str] = set(_DEF.findall(text))
    for m in _FROM_IMPORT.finditer(text):
        level, module = len(m.group(1)), m.group(2)
        sources.add((module, level, None))
        for part in m.group(3).strip().strip("()").split(","):
            name, _, alias = (x.strip() for x in part.partition(" as "))
            if name and name.isidentifier():
                sources.add((module, level, name))
                bound.add(alias or name)
    for m in _IMPORT.finditer(text):
        for part in m.group(1).split(","):
            full, _, alias = (x.strip() for x in part.partition(" as "))
            if full:
                sources.add((full, 0, None))
                sources.add((full.split(".")[0], 0, None))
                bound.add(alias or full.split(".")[0])
    return ModuleScan(frozenset(_IDENTIFIER.findall(text)), frozenset(sources), frozenset(bound),
                      frozenset(_ASSIGN.findall(text)))


__all__ = ["Need", "ModuleScan", "names_match", "scan_text"]
