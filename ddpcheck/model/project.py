"""Local helper modules a script imports (`from utils import save_on_master`).

When the helper is in the tree being linted, rules use what it really does
(starts the process group, guards by rank, saves) instead of guessing from its
name. Each module is parsed once per process and cached."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


from ddpcheck.settings import LintSettings

_CACHE: dict[str, object] = {}
# A training repo's helper modules (utils.py, misc.py, comm.py, dist_utils.py)
# are a few hundred lines. A module far larger than that is a library of its
# own: reading it would make every file that imports it pay a big parse, so it
# counts as unseen (rules stay silent about what it does).
MAX_HELPER_BYTES = 120_000
_FOUND: dict[tuple[str, str, int], "Path | None"] = {}
_BASES: dict[tuple[str, int, "Path | None"], list[Path]] = {}
# Which local module each file's analysis found through its imports (absolute
# paths), kept for the life of the process: a helper's memoised queries do not
# look their imports up again for the next script, but the edge stays here.
# The result cache keys a script's findings on everything reachable from it.
_IMPORT_EDGES: dict[str, set[str]] = {}

# Libraries are not "helpers in the tree": when ddpcheck lints a checkout that
# vendors or sits next to them (or torch's own source), their modules are
# never parsed as local helpers.
_LIBRARY_ROOTS = {"torch", "torchvision", "torchaudio", "numpy", "accelerate", "transformers", "lightning",
                  "pytorch_lightning", "deepspeed", "apex", "timm", "mmcv", "detectron2", "fairseq"}


_INSTALL_DIRS = {"site-packages", "dist-packages"}

# A rule that follows calls into helper modules can first ask whether the
# module a call lands in, or one it imports, even names what the rule looks
# for (`init_process_group`, a collective): when none does, no fact the rule
# needs can hold there and the module is never parsed. The identifiers of a
# module come from a scan of its text, about a hundred times cheaper than
# parsing it; on torch's own source this skipped most helper parses.
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n;#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n;#]+)", re.M)
_DEF = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+(\w+)", re.M)
# abs path -> (stamp, its scan); None for a module too large to be a helper
# (or unreadable): it is never parsed either, so nothing is reached through it.
_SCANNED: dict[str, tuple[int, "ModuleScan | None"]] = {}
_REACHES: dict[tuple[str, "Need"], bool] = {}
_TARGETS: dict[tuple[str, "ModuleScan"], tuple[str, ...]] = {}
# A training repo's helpers import a handful of local modules; past this many
# the question is answered "maybe" (so the modules are parsed when a call
# lands there) instead of scanning a library-sized web of imports.
MAX_REACH_MODULES = 48

# What an asker looks for, as groups of names: a module matches when it names
# one of every group (`((distributed modules), (collective names))`: a
# `reduce` alone is functools', not a collective).
Need = tuple[tuple[str, ...], ...]


def names_match(identifiers: frozenset[str], need: Need) -> bool:
    return all(not identifiers.isdisjoint(group) for group in need)


@dataclass(frozen=True)
class ModuleScan:
    """What a scan of a module's text tells without parsing it. Supersets
    (a string that looks like an import counts too): they only decide what
    *not* to parse, so too much is safe, and too little never happens for
    code Python accepts."""

    identifiers: frozenset[str]                          # every word that could be a name
    sources: frozenset[tuple[str, int, str | None]]      # (module, level, name) of its imports
    bound: frozenset[str]                                # names it defines (def, class) or binds by import


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
    return ModuleScan(frozenset(_IDENTIFIER.findall(text)), frozenset(sources), frozenset(bound))


def _stamped(cache: dict, key: str, compute):
    """`compute(key)` for the file at `key`, cached until its mtime changes;
    None for a file that cannot be stat'ed."""
    try:
        stamp = os.stat(key).st_mtime_ns
    except OSError:
        return None
    cached = cache.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    value = compute(key)
    cache[key] = (stamp, value)
    return value


def _scan_file(key: str) -> "ModuleScan | None":
    """The scan of a helper module; None when it is too large to be one, or unreadable."""
    from ddpcheck.findings import SourceError
    from ddpcheck.parse.source import read_source

    try:
        text = read_source(key)
    except SourceError:
        return None
    return None if len(text) > MAX_HELPER_BYTES else scan_text(text)


def _function_called(model, name: str):
    return model.function_called(name)


def _class_named(model, name: str):
    return model.class_named(name)


class ProjectIndex:
    def __init__(self, settings: LintSettings) -> None:
        self.settings = settings
        self.root = Path(settings.root).resolve() if settings.root else None

    # -- finding files --------------------------------------------------------
    def _bases(self, from_path: str, level: int) -> list[Path]:
        key = (os.path.dirname(os.path.abspath(from_path)), level, self.root)
        if key not in _BASES:
            _BASES[key] = self._find_bases(from_path, level)
        return _BASES[key]

    def _find_bases(self, from_path: str, level: int) -> list[Path]:
        here = Path(from_path).resolve().parent
        if level > 0:
            for _ in range(level - 1):
                here = here.parent
            return [here]
        bases = [here]
        # walk up through packages (folders with __init__.py) to the folder above them
        cur = here
        for _ in range(6):
            if not (cur / "__init__.py").exists():
                break
            cur = cur.parent
            bases.append(cur)
        if self.root is not None and self.root not in bases:
            bases.append(self.root)
        # An install folder holds other distributions (torch's source sits
        # beside sympy and jinja2): they are libraries, not the project's
        # helpers, so a file inside an installed package resolves only its
        # own package's modules (relative imports), never its neighbours.
        return [b for b in bases if b.name not in _INSTALL_DIRS]

    def find_module(self, from_path: str, module: str, level: int) -> Path | None:
        key = (os.path.dirname(os.path.abspath(from_path)), module, level)
        if key not in _FOUND:
            _FOUND[key] = self._find_module(from_path, module, level)
        found = _FOUND[key]
        if found is not None:
            _IMPORT_EDGES.setdefault(os.path.abspath(from_path), set()).add(os.path.abspath(found))
        return found

    def _find_module(self, from_path: str, module: str, level: int) -> Path | None:
        parts = [p for p in module.split(".") if p]
        if level == 0 and parts and parts[0] in _LIBRARY_ROOTS:
            return None
        bases = list(self._bases(from_path, level))
        here = os.path.dirname(os.path.abspath(from_path))
        if level == 0 and parts and parts[0] == os.path.basename(here) and not os.path.isfile(
                os.path.join(here, "__init__.py")):
            # `from data.loader import X` inside data/ (a folder without
            # __init__.py): run from the folder above, as the entry script is
            if os.path.basename(os.path.dirname(here)) not in _INSTALL_DIRS:
                bases.append(Path(os.path.dirname(here)))
        for base in bases:
            target = os.path.join(base, *parts)
            for candidate in (target + ".py" if parts else None, os.path.join(target, "__init__.py")):
                if candidate is not None and os.path.isfile(candidate):
                    return Path(candidate)
        return None

    def model_for(self, path: Path):
        return _stamped(_CACHE, str(path), self._build)

    def _build(self, key: str):
        from ddpcheck.model.builder import build_model
        from ddpcheck.parse.source import read_source
        from ddpcheck.parse.syntax import parse_checked
        from ddpcheck.findings import SourceError

        try:
            text = read_source(key)
            if len(text) > MAX_HELPER_BYTES:
                raise SourceError("too large for a helper module")
            # Read and parsed as the linted files are (encoding cookies,
            # Python's own check first, so nothing it refuses reaches libcst).
            model = build_model(key, parse_checked(text, key), self.settings, text)
        except (SourceError, RecursionError):
            return None
        model.project = self
        return model

    # -- what a module can reach ------------------------------------------------
    def _scan(self, path: Path | str) -> ModuleScan | None:
        return _stamped(_SCANNED, os.path.abspath(path), _scan_file)

    def _targets(self, from_path: str, sources) -> list[Path]:
        """The local modules `sources` can land in, as resolve_function looks
        them up (the module, and `module.name` for a submodule imported by name)."""
        found = []
        for module, level, name in sources:
            candidates = [module] if name is None else [module, f"{module}.{name}" if module else name]
            for target in candidates:
                path = self.find_module(from_path, target, level)
                if path is not None:
                    found.append(path)
        return found

    def reaches(self, path: str, scan: ModuleScan, need: Need) -> bool:
        """The module at `path` (scanned as `scan`), or a local module
        reachable from it through imports however deep, matches `need`."""
        start = os.path.abspath(path)
        key = (start, need)
        if key not in _REACHES:
            _REACHES[key] = self._reaches(start, scan, need)
        return _REACHES[key]

    def _reaches(self, start: str, scan: ModuleScan, need: Need) -> bool:
        if names_match(scan.identifiers, need):
            return True
        closure = self._closure(start, scan)
        if closure is None:
            return True   # a library-sized web of modules: not worth proving, parse as needed
        return any(names_match(self._scan(key).identifiers, need) for key in closure)

    def _closure(self, start: str, scan: ModuleScan) -> tuple[str, ...] | None:
        """The readable local modules reachable from `start` through imports
        (absolute paths, `start` excluded), or None past MAX_REACH_MODULES."""
        seen = {start}
        found: list[str] = []
        todo = [(start, scan)]
        while todo:
            here, scanned = todo.pop()
            for key in self._targets_of(here, scanned):
                if key in seen:
                    continue
                seen.add(key)
                nxt = self._scan(key)
                if nxt is not None:
                    found.append(key)
                    if len(found) > MAX_REACH_MODULES:
                        return None
                    todo.append((key, nxt))
        return tuple(found)

    def _targets_of(self, path: str, scan: ModuleScan) -> tuple[str, ...]:
        key = (path, scan)
        if key not in _TARGETS:
            _TARGETS[key] = tuple(dict.fromkeys(os.path.abspath(p) for p in self._targets(path, scan.sources)))
        return _TARGETS[key]

    # -- what an analysis read ---------------------------------------------------
    @staticmethod
    def helpers_read(path: str) -> tuple[str, ...]:
        """The local modules the analysis of `path` found through its imports,
        directly or through other helpers (absolute paths, sorted)."""
        start = os.path.abspath(path)
        seen: set[str] = set()
        todo = [start]
        while todo:
            for found in _IMPORT_EDGES.get(todo.pop(), ()):
                if found not in seen and found != start:
                    seen.add(found)
                    todo.append(found)
        return tuple(sorted(seen))

    # -- resolving names ----------------------------------------------------------
    def resolve_function(self, from_path: str, module: str, level: int, name: str, needs: Need = ()):
        """(model, FunctionInfo) for what `name(...)` runs when `name` comes
        from local module `module`: its function, or its class's `__init__`.
        With `needs`: None unless that module or one it imports matches it
        (the asker looks for nothing else)."""
        return self._resolve_name(from_path, module, level, name, _function_called, needs)

    def resolve_class(self, from_path: str, module: str, level: int, name: str):
        """(model, name) when local module `module` defines class `name`."""
        return self._resolve_name(from_path, module, level, name, _class_named)

    def _resolve_name(self, from_path: str, module: str, level: int, name: str, find, needs: Need = (),
                      depth: int = 0):
        """(model, find(model, name)) in the local module `module`, following
        re-exports (`from .dist import is_main_process` in a package __init__)."""
        if depth > 3:
            return None
        path = self.find_module(from_path, module, level)
        if path is None:
            # `from utils import dist_utils` then `dist_utils.f()`: module is a package member
            return None
        scanned = self._scan(path)
        if scanned is None or name not in scanned.bound:
            return None   # it neither defines nor imports `name` (a constant, a typo): nothing to parse
        if needs and not self.reaches(str(path), scanned, needs):
            return None
        model = self.model_for(path)
        if model is None:
            return None
        found = find(model, name)
        if found is not None:
            return model, found
        src = model.imports.sources.get(name)
        if src and src[2] is not None:
            return self._resolve_name(str(path), src[0], src[1], src[2], find, needs, depth + 1)
        return None
