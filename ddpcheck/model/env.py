"""Environment variables a script reads and writes (`os.environ["LOCAL_RANK"]`,
`os.environ.get("LOCAL_RANK", -1)`, `os.getenv`, `"RANK" in os.environ`;
`os.environ["CUDA_VISIBLE_DEVICES"] = ...`, `os.environ.setdefault/update`,
`os.putenv`), however `os` / `environ` were imported."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.memo import query
from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.names import string_value



def env_reads(model: ScriptModel) -> dict[str, list[FunctionInfo | None]]:
    """Variable name -> the functions (None: module level) that read it,
    recorded by the builder's one walk."""
    return model.env_reads


def reads_env(model: ScriptModel, name: str, fn: FunctionInfo | None = None, anywhere: bool = False) -> bool:
    readers = env_reads(model).get(name, [])
    return bool(readers) if anywhere else any(r is fn for r in readers)


@dataclass(frozen=True)
class EnvWrite:
    name: str
    node: cst.CSTNode      # the statement or call to report
    ctx: Ctx
    how: str               # "assignment", "setdefault", "update", "putenv"


@query
def env_writes(model: ScriptModel, name: str) -> list[EnvWrite]:
    found = []
    for a in model.assigns:
        base, sep, rest = a.key.partition("[")
        if sep and rest == f"{name!r}]" and model.imports.qualify(base) == "os.environ" and a.augmented is None:
            found.append(EnvWrite(name, a.node, a.ctx, "assignment"))
    for c in model.calls:
        q = c.qual or ""
        if q in ("os.environ.setdefault", "os.putenv") and c.node.args and string_value(c.node.args[0].value) == name:
            found.append(EnvWrite(name, c.node, c.ctx, q.rpartition(".")[2]))
        elif q == "os.environ.update" and _update_sets(c.node, name):
            found.append(EnvWrite(name, c.node, c.ctx, "update"))
    found.sort(key=lambda w: w.ctx.order)
    return found


def _update_sets(node: cst.Call, name: str) -> bool:
    for a in node.args:
        if a.keyword is not None and a.keyword.value == name:
            return True
        if a.keyword is None and isinstance(a.value, cst.Dict):
            for el in a.value.elements:
                if isinstance(el, cst.DictElement) and string_value(el.key) == name:
                    return True
    return False


__all__ = ["env_reads", "reads_env", "env_writes", "EnvWrite"]
