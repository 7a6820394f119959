"""Folder creation that fails when the folder already exists.

`os.makedirs(d)` / `os.mkdir(d)` / `Path(d).mkdir()` without `exist_ok=True`
raise FileExistsError when `d` exists. Guarded by an existence check
(`if not os.path.exists(d): os.makedirs(d)`) they work in one process; run by
every rank at once, every rank sees "missing", all of them create it, and all
but the first raise."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import bindings_seen
from ddpcheck.model.paths import per_rank_path
from ddpcheck.model.script import CallSite, ScriptModel

MAKEDIRS = {"os.makedirs", "os.mkdir"}
EXISTS_CHECKS = {"os.path.exists", "os.path.isdir", "os.path.lexists"}
PATH_CLASSES = {"pathlib.Path", "pathlib.PurePath", "Path"}


@dataclass(frozen=True)
class FolderCreation:
    site: CallSite
    checked: bool                    # inside `if not exists(...)` (the classic race)
    path: cst.BaseExpression | None  # the folder argument, when there is one


def _is_path_object(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    """`Path(d)` / `pathlib.Path(d)` / `(out / "ckpt")` built from a Path call."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Divide):
        return _is_path_object(model, expr.left)
    if isinstance(expr, cst.Call):
        name = dotted_name(expr.func)
        return bool(name) and model.imports.qualify(name) in PATH_CLASSES and (
            name != "Path" or model.imports.qualify(name) == "pathlib.Path")
    return False


def _exists_call(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    name = dotted_name(expr.func)
    if name and model.imports.qualify(name) in EXISTS_CHECKS:
        return True
    # `Path(d).exists()` / `out_dir.exists()` / `p.is_dir()`
    return isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("exists", "is_dir") and not expr.args


def _says_missing(model: ScriptModel, test: cst.BaseExpression, positive: bool) -> bool:
    """Taking this arm of `test` means the folder was found missing."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _says_missing(model, test.expression, not positive)
    if isinstance(test, cst.BooleanOperation):
        # `A and not exists(d)` true: both hold; `A or exists(d)` false: neither holds
        if positive and isinstance(test.operator, cst.And) or not positive and isinstance(test.operator, cst.Or):
            return _says_missing(model, test.left, positive) or _says_missing(model, test.right, positive)
        return False
    return not positive and _exists_call(model, test)


def _exist_ok(site: CallSite) -> bool | None:
    """True / False, or None when it is computed at run time."""
    # os.makedirs(name, mode, exist_ok) and Path.mkdir(mode, parents, exist_ok); os.mkdir has none
    value = site.arg("exist_ok", None if site.qual == "os.mkdir" else 2)
    if value is None:
        return False
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


def folder_creation(model: ScriptModel, site: CallSite) -> FolderCreation | None:
    """A call that raises FileExistsError when the folder exists, or None."""
    q = site.qual or ""
    if q in MAKEDIRS:
        path = site.arg("name", 0) if q == "os.makedirs" else site.arg("path", 0)
    elif site.attr == "mkdir" and site.receiver is not None and (
            _is_path_object(model, site.receiver) or _path_variable(model, site)):
        path = site.receiver
    else:
        return None
    if site.has_star_args or _exist_ok(site) is not False:
        return None
    checked = any(_says_missing(model, b.test, b.positive) for b in site.ctx.branches)
    return FolderCreation(site, checked, path)


def _path_variable(model: ScriptModel, site: CallSite) -> bool:
    """`out = Path(args.output_dir)` ... `out.mkdir()`."""
    key = dotted_name(site.receiver)
    if key is None:
        return False
    assigns = bindings_seen(model, site.receiver)
    return bool(assigns) and all(a.kind == "assign" and a.value is not None and _is_path_object(model, a.value)
                                 for a in assigns)


def racy_folder_creation(model: ScriptModel, site: CallSite) -> bool:
    """A creation that fails when the folder exists, of a folder shared by the ranks."""
    found = folder_creation(model, site)
    return found is not None and not per_rank_path(model, found.path, site.ctx.function)


def same_folder_creation(model: ScriptModel, site: CallSite) -> bool:
    q = site.qual or ""
    return q in MAKEDIRS or site.attr == "mkdir"


__all__ = ["folder_creation", "racy_folder_creation", "same_folder_creation", "FolderCreation"]
