"""Local helper modules a script imports (`from utils import save_on_master`).

When the helper is in the tree being linted, rules use what it really does
(starts the process group, guards by rank, saves) instead of guessing from its
name. Each module is parsed once per process and cached."""

from __future__ import annotations

import os
from pathlib import Path


from ddpcheck.settings import LintSettings

_CACHE: dict[str, object] = {}
# A training repo's helper modules (utils.py, misc.py, comm.py, dist_utils.py)
# are a few hundred lines. A module far larger than that is a library of its
# own: reading it would make every file that imports it pay a big parse, so it
# counts as unseen (rules stay silent about what it does).
MAX_HELPER_BYTES = 120_000
_FOUND: dict[tuple[str, str, int], "Path | None"] = {}
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


class ProjectIndex:
    def __init__(self, settings: LintSettings) -> None:
        self.settings = settings
        self.root = Path(settings.root).resolve() if settings.root else None

    # -- finding files --------------------------------------------------------
    def _bases(self, from_path: str, level: int) -> list[Path]:
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
        return bases

    def find_module(self, from_path: str, module: str, level: int) -> Path | None:
        key = (str(Path(from_path).parent), module, level)
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
        for base in self._bases(from_path, level):
            target = base.joinpath(*parts) if parts else base
            for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
                if candidate is not None and candidate.is_file():
                    return candidate
        return None

    def model_for(self, path: Path):
        key = str(path)
        try:
            stamp = os.stat(key).st_mtime_ns
        except OSError:
            return None
        cached = _CACHE.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        from ddpcheck.model.builder import build_model
        from ddpcheck.parse.source import read_source
        from ddpcheck.parse.syntax import parse_checked
        from ddpcheck.findings import SourceError

        model = None
        try:
            text = read_source(key)
            if len(text) > MAX_HELPER_BYTES:
                raise SourceError("too large for a helper module")
            # Read and parsed as the linted files are (encoding cookies,
            # Python's own check first, so nothing it refuses reaches libcst).
            module = parse_checked(text, key)
            model = build_model(key, module, self.settings)
            model.project = self
        except (SourceError, RecursionError):
            model = None
        _CACHE[key] = (stamp, model)
        return model

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
    def resolve_function(self, from_path: str, module: str, level: int, name: str, depth: int = 0):
        """(model, FunctionInfo) for `name` in local module `module`, following
        re-exports (`from .dist import is_main_process` in a package __init__)."""
        if depth > 3:
            return None
        path = self.find_module(from_path, module, level)
        if path is None:
            # `from utils import dist_utils` then `dist_utils.f()`: module is a package member
            return None
        model = self.model_for(path)
        if model is None:
            return None
        local = [f for f in model.functions_named(name) if f.class_name is None]
        if local:
            return model, local[-1]
        src = model.imports.sources.get(name)
        if src and src[2] is not None:
            return self.resolve_function(str(path), src[0], src[1], src[2], depth + 1)
        return None
