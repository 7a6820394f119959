"""How many processes does the script start? (pure Python, no torch.)

A script that starts a process group (``init_process_group``, ``mp.spawn``, a
launcher library) runs as N ranks, the way torchrun starts it. A script that
never does is one process: with ``nn.DataParallel`` it drives the N devices
itself, without either it is a plain single-process script. The question is
answered from the source of the script and the local modules it imports
(followed transitively, the folder of the script first, as Python does); a
module that cannot be read or found counts as unknown, and unknown runs as
ranks. The one-process run checks the answer: if the script starts a process
group after all, the preflight starts it again as ranks.
"""

from __future__ import annotations

import ast
import enum
import os
from dataclasses import dataclass, field
from typing import Optional

# calls and imports that mean "this script runs as several processes"
_GROUP_CALLS = {"init_process_group", "spawn", "start_processes", "DistributedDataParallel",
                "FullyShardedDataParallel", "fully_shard", "init_device_mesh", "launch"}
_LAUNCH_LIBRARIES = {"accelerate", "lightning", "pytorch_lightning", "deepspeed", "horovod",
                     "colossalai", "fairscale", "mmengine", "mmcv", "detectron2", "ignite",
                     "torchrun", "composer", "transformers"}
MAX_MODULES = 200


class ProcessShape(str, enum.Enum):
    RANKS = "ranks"  # N processes with a process group (torchrun, mp.spawn)
    DATA_PARALLEL = "data-parallel"  # one process, nn.DataParallel over N devices
    SINGLE = "single-process"  # one process, one device


@dataclass
class ProcessPlan:
    shape: ProcessShape
    why: str  # "init_process_group at train.py:14", "nn.DataParallel at train.py:48"
    files: list = field(default_factory=list)  # the sources read


def _local_module(name: str, roots: list) -> Optional[str]:
    parts = name.split(".")
    for root in roots:
        base = os.path.join(root, *parts)
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
    return None


def _imports(tree: ast.AST) -> list:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def _called_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _signals(tree: ast.AST, where: str) -> tuple[Optional[str], Optional[str]]:
    """(why it needs ranks, why it is DataParallel) for one module."""
    ranks = dp = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node.func)
            if name in _GROUP_CALLS and ranks is None:
                if name == "launch" and "distributed" not in ast.unparse(node.func):
                    continue
                ranks = f"{name} at {where}:{node.lineno}"
            elif name == "DataParallel" and dp is None:
                dp = f"nn.DataParallel at {where}:{node.lineno}"
    for name in _imports(tree):
        top = name.split(".")[0]
        if top in _LAUNCH_LIBRARIES and ranks is None:
            ranks = f"imports {top} ({where})"
    return ranks, dp


def plan_processes(path: Optional[str]) -> ProcessPlan:
    """Read the script and the local modules it imports; decide the process shape."""
    if not path or not os.path.isfile(path):
        return ProcessPlan(ProcessShape.RANKS, "no source to read")
    roots = [os.path.dirname(os.path.abspath(path)), os.getcwd()]
    todo, seen, dp_why = [os.path.abspath(path)], set(), None
    while todo and len(seen) < MAX_MODULES:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(current, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), filename=current)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            return ProcessPlan(ProcessShape.RANKS, f"{os.path.basename(current)} unreadable",
                               sorted(seen))
        where = os.path.relpath(current, roots[0])
        ranks, dp = _signals(tree, where)
        if ranks:
            return ProcessPlan(ProcessShape.RANKS, ranks, sorted(seen))
        dp_why = dp_why or dp
        for name in _imports(tree):
            found = _local_module(name, [os.path.dirname(current)] + roots)
            if found and found not in seen:
                todo.append(os.path.abspath(found))
    if dp_why:
        return ProcessPlan(ProcessShape.DATA_PARALLEL, dp_why, sorted(seen))
    return ProcessPlan(ProcessShape.SINGLE, "no process group, no DataParallel", sorted(seen))
