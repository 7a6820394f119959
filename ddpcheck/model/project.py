"""One lint run's view of the project: the local helper modules a script
imports (`from utils import save_on_master`), found the way Python finds
them, parsed once, and the memo every question of the run is answered
through.

When a helper is in the tree being linted, rules use what it really does
(starts the process group, guards by rank, saves) instead of guessing from its
name. A `Project` is made per lint run (a worker of the runner keeps one for
all the files it lints with the same settings): every cache lives on it, so
two runs in one process, with different roots or settings, never see each
other's answers."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst

from ddpcheck.findings import SourceError
from ddpcheck.model.builder import build_model
from ddpcheck.model.memo import Memo
from ddpcheck.model.scan import ModuleScan, Need, names_match, scan_text
from ddpcheck.model.script import ScriptModel
from ddpcheck.parse.source import read_source
from ddpcheck.parse.syntax import parse_checked
from ddpcheck.settings import LintSettings

# A training repo's helper modules (utils.py, misc.py, comm.py, dist_utils.py)
# are a few hundred lines. A module far larger than that is a library of its
# own: reading it would make every file that imports it pay a big parse, so it
# counts as unseen (rules stay silent about what it does).
MAX_HELPER_BYTES = 120_000

# Libraries are not "helpers in the tree": when ddpcheck lints a checkout that
# vendors or sits next to them (or torch's own source), their modules are
# never parsed as local helpers.
_LIBRARY_ROOTS = {"torch", "torchvision", "torchaudio", "numpy", "accelerate", "transformers", "lightning",
                  "pytorch_lightning", "deepspeed", "apex", "timm", "mmcv", "detectron2", "fairseq"}

_INSTALL_DIRS = {"site-packages", "dist-packages"}
# What marks the root of a project (where `python -m` and installs put it on the path).
_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_MISSING = object()

# Past this many local modules reachable through imports the question is
# answered "maybe" (so the modules are parsed when a call lands there)
# instead of scanning the whole web. A scan is a text search, cached per run,
# about a tenth of a parse and far less than the model built after it, so
# the bound is set for the largest framework repositories, not for a
# training repo's handful of helpers: at 48, linting torch's own source
# parsed 119 helper modules where scanning further proves 20 of them unable
# to reach what was asked.
MAX_REACH_MODULES = 10_000


def _stamp(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class Project:
    def __init__(self, settings: LintSettings) -> None:
        self.settings = settings
        self.root = Path(settings.root).resolve() if settings.root else None
        self.memo = Memo()
        # abs path -> (mtime stamp, its model or None when it cannot be a helper)
        self._models: dict[str, tuple[int, ScriptModel | None]] = {}
        # abs path -> (stamp, its scan; None for a module too large to be a
        # helper, or unreadable: it is never parsed either, so nothing is reached through it)
        self._scans: dict[str, tuple[int, ModuleScan | None]] = {}
        # (abs path, what is asked of its text) -> (stamp, the verdict): see text_verdict
        self._verdicts: dict[tuple[str, object], tuple[int, bool]] = {}
        self._found: dict[tuple[str, str, int], Path | None] = {}
        self._roots: dict[Path, Path | None] = {}
        self._bases_of: dict[tuple[str, int], list[Path]] = {}
        self._reaches: dict[tuple[str, Need], bool] = {}
        self._closures: dict[str, tuple[str, ...] | None] = {}
        self._targets: dict[tuple[str, ModuleScan], tuple[str, ...]] = {}
        # Which local module each file's analysis found through its imports
        # (absolute paths): a helper's memoised queries do not look their
        # imports up again for the next script, but the edge stays here. The
        # result cache keys a script's findings on everything reachable from it.
        self._edges: dict[str, set[str]] = {}
        # search root -> the documented launch commands of that project (model/launch.py)
        self.launch_docs: dict[str, object] = {}
        # abs path -> the modules beside it that import it (importers_beside)
        self._importers: dict[str, tuple[str, ...]] = {}
        self._absolutes: dict[Path | str, str] = {}   # _absolute

    def _absolute(self, path: Path | str) -> str:
        """`os.path.abspath(path)`, kept for a path that is already absolute
        (its answer does not depend on the working folder): the import and
        reach lookups ask it of the same few hundred paths tens of thousands
        of times a file."""
        found = self._absolutes.get(path)
        if found is None:
            found = os.path.abspath(path)
            if os.path.isabs(path):
                self._absolutes[path] = found
        return found

    # -- models -------------------------------------------------------------------
    def build(self, path: str, module: cst.Module, text: str | None = None) -> ScriptModel:
        """The model of a file being linted (its text as given: stdin, an edited
        buffer). The questions asked about it share a fresh budget (model/memo.py)."""
        self.memo.new_budget()
        return build_model(path, module, self, text)

    def _stamped(self, cache: dict, path: str, compute, key=None):
        """`compute(path)` for the file at `path`, kept in `cache` under `key`
        (the path itself when None) until the file's mtime changes; None for a
        file that cannot be stat'ed. Every per-file cache of the run goes
        through here, so a file edited during a long run is read again
        everywhere at once."""
        stamp = _stamp(path)
        if stamp is None:
            return None
        key = path if key is None else key
        cached = cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        value = compute(path)
        cache[key] = (stamp, value)
        return value

    def text_verdict(self, path: str, question: object, judge) -> bool:
        """`judge(text)` of the module at `path`, once per run for each
        `question` (a hashable name for what `judge` decides: the lint
        driver asks "does it pass the prefilter of these rules?"); False for
        a module that cannot be read."""
        def compute(key: str) -> bool:
            try:
                return bool(judge(read_source(key)))
            except SourceError:
                return False

        key = self._absolute(path)
        return bool(self._stamped(self._verdicts, key, compute, (key, question)))

    def model_for(self, path: Path | str) -> ScriptModel | None:
        return self._stamped(self._models, str(path), self._build_helper)

    def _build_helper(self, key: str) -> ScriptModel | None:
        try:
            text = read_source(key)
            if len(text) > MAX_HELPER_BYTES:
                raise SourceError("too large for a helper module")
            # Read and parsed as the linted files are (encoding cookies,
            # Python's own check first, so nothing it refuses reaches libcst).
            return build_model(key, parse_checked(text, key), self, text)
        except (SourceError, RecursionError):
            return None

    # -- finding files --------------------------------------------------------
    def _discovered_root(self, here: Path) -> Path | None:
        """Without a configured root: the nearest folder above the file that
        marks a project (pyproject.toml, setup.py, setup.cfg, .git), as pytest
        and ruff find theirs; none for a file inside an installed package."""
        found = self._roots.get(here, _MISSING)
        if found is _MISSING:
            found = None
            for folder in (here, *here.parents):
                if folder.name in _INSTALL_DIRS:
                    found = None
                    break
                if found is None and any((folder / marker).exists() for marker in _ROOT_MARKERS):
                    found = folder
            self._roots[here] = found
        return found

    def _bases(self, from_path: str, level: int) -> list[Path]:
        key = (os.path.dirname(self._absolute(from_path)), level)
        found = self._bases_of.get(key)
        if found is None:
            found = self._bases_of[key] = self._find_bases(from_path, level)
        return found

    def _find_bases(self, from_path: str, level: int) -> list[Path]:
        """The folders an import in `from_path` is looked up from, in
        Python's order: relative imports from the file's package; absolute
        ones from the script's folder, the folders above its packages, then
        the project root and its `src/` (a src layout, whose package is on
        the path once installed)."""
        here = Path(from_path).resolve().parent
        if level > 0:
            for _ in range(level - 1):
                here = here.parent
            return [here]
        bases = [here]
        # walk up through packages (folders with __init__.py) to the folder above them
        cur = here
        while (cur / "__init__.py").exists() and cur.parent != cur:
            cur = cur.parent
            bases.append(cur)
        root = self.root if self.root is not None else self._discovered_root(here)
        if root is not None:
            for folder in (root, root / "src"):
                if folder not in bases and folder.is_dir():
                    bases.append(folder)
        # An install folder holds other distributions (torch's source sits
        # beside sympy and jinja2): they are libraries, not the project's
        # helpers, so a file inside an installed package resolves only its
        # own package's modules (relative imports), never its neighbours.
        return [b for b in bases if b.name not in _INSTALL_DIRS]

    def find_module(self, from_path: str, module: str, level: int) -> Path | None:
        key = (os.path.dirname(self._absolute(from_path)), module, level)
        if key not in self._found:
            self._found[key] = self._find_module(from_path, module, level)
        found = self._found[key]
        if found is not None:
            self._edges.setdefault(self._absolute(from_path), set()).add(self._absolute(found))
        return found

    def _find_module(self, from_path: str, module: str, level: int) -> Path | None:
        parts = [p for p in module.split(".") if p]
        if level == 0 and parts and parts[0] in _LIBRARY_ROOTS:
            return None
        bases = list(self._bases(from_path, level))
        here = os.path.dirname(self._absolute(from_path))
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

    # -- what a module can reach ------------------------------------------------
    def scan_of(self, path: Path | str) -> ModuleScan | None:
        """The scan of the module at `path` (model/scan.py); None for one too large to be a helper."""
        return self._stamped(self._scans, self._absolute(path), _scan_file)

    def _target_paths(self, from_path: str, sources) -> list[Path]:
        """The local modules `sources` can land in, as the call graph (model/flow.py) looks
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
        start = self._absolute(path)
        key = (start, need)
        found = self._reaches.get(key)
        if found is None:
            found = self._reaches[key] = self._reaches_from(start, scan, need)
        return found

    def _reaches_from(self, start: str, scan: ModuleScan, need: Need) -> bool:
        if names_match(scan.identifiers, need):
            return True
        closure = self._closures.get(start, _MISSING)
        if closure is _MISSING:
            closure = self._closures[start] = self._closure(start, scan)
        if closure is None:
            return True   # a library-sized web of modules: not worth proving, parse as needed
        return any(names_match(self.scan_of(key).identifiers, need) for key in closure)

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
                nxt = self.scan_of(key)
                if nxt is not None:
                    found.append(key)
                    if len(found) > MAX_REACH_MODULES:
                        return None
                    todo.append((key, nxt))
        return tuple(found)

    def _targets_of(self, path: str, scan: ModuleScan) -> tuple[str, ...]:
        key = (path, scan)
        found = self._targets.get(key)
        if found is None:
            found = self._targets[key] = tuple(dict.fromkeys(
                self._absolute(p) for p in self._target_paths(path, scan.sources)))
        return found

    def imported_modules(self, path: str, scan: ModuleScan) -> tuple[str, ...]:
        """The local modules the module at `path` (scanned as `scan`) imports,
        however deep (absolute paths); past MAX_REACH_MODULES, only the ones
        it imports directly."""
        start = self._absolute(path)
        closure = self._closure(start, scan)
        return closure if closure is not None else self._targets_of(start, scan)

    def importers_beside(self, path: str) -> tuple[str, ...]:
        """The Python files in the same folder as the module at `path` that
        import it (a training script importing the evaluation module beside
        it: `from test import validation`), absolute paths, sorted; at most
        MAX_REACH_MODULES files of the folder are read."""
        key = self._absolute(path)
        found = self._importers.get(key)
        if found is None:
            folder = os.path.dirname(key)
            try:
                names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))[:MAX_REACH_MODULES]
            except OSError:
                names = []
            stem = os.path.splitext(os.path.basename(key))[0]
            found = []
            for name in names:
                other = os.path.join(folder, name)
                scan = self.scan_of(other) if other != key else None
                if scan is not None and stem in scan.identifiers and key in self._targets_of(other, scan):
                    found.append(other)
            found = self._importers[key] = tuple(found)
        return found

    def local_imports(self, path: str, scan: ModuleScan) -> tuple[str, ...]:
        """The local modules the module at `path` imports directly (absolute paths)."""
        return self._targets_of(self._absolute(path), scan)

    # -- what an analysis read ---------------------------------------------------
    def depends_on(self, path: str, other: str) -> None:
        """The analysis of `path` read `other` (a launch script, a document):
        its findings are stale when `other` changes."""
        self._edges.setdefault(self._absolute(path), set()).add(self._absolute(other))

    def helpers_read(self, path: str) -> tuple[str, ...]:
        """The local modules the analysis of `path` found through its imports,
        directly or through other helpers (absolute paths, sorted)."""
        start = self._absolute(path)
        seen: set[str] = set()
        todo = [start]
        while todo:
            for found in self._edges.get(todo.pop(), ()):
                if found not in seen and found != start:
                    seen.add(found)
                    todo.append(found)
        return tuple(sorted(seen))


def _scan_file(key: str) -> ModuleScan | None:
    """The scan of a helper module; None when it is too large to be one, or unreadable."""
    try:
        text = read_source(key)
    except SourceError:
        return None
    return None if len(text) > MAX_HELPER_BYTES else scan_text(text)


__all__ = ["Project", "MAX_HELPER_BYTES", "MAX_REACH_MODULES", "Need", "ModuleScan", "names_match", "scan_text"]
