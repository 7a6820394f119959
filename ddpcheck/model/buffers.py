"""Which modules hold buffers: BatchNorm running statistics, `register_buffer`.

DDP's forward is a collective even without autograd: with
`broadcast_buffers=True` (the default) it broadcasts the module's buffers
from rank 0 before computing. A rank-0-only evaluation under `no_grad` of a
wrapped model with buffers therefore hangs; of a buffer-free one (nanoGPT)
it works. Whether a model has buffers is a fact of the classes it is built
from, so it is answered here from the classes of the tree:

- a class holds buffers when the constructor that runs for it (its own
  `__init__` or the first one up its bases, across modules) builds one
  on every path: `self.register_buffer(...)`, a torch BatchNorm layer
  (`nn.BatchNorm2d`, `nn.SyncBatchNorm`, ...), a torchvision model made of
  them (`resnet50()`), an object of a class of the tree that holds
  buffers itself, or a call of a function of the tree (`super().__init__()`,
  `self._make_layers()`, `conv_bn(c)`) that does, any number of calls down;
- "every path": nothing under a test of the function that makes it (`if
  use_bn:`, `nn.BatchNorm2d(c) if bn else nn.Identity()`) and nothing in a
  `try` body counts; a loop body counts (`for _ in range(depth)`);
- an expression holds a module with buffers when every object it can hold
  is such a class's instance or such a library layer or model; an object
  the engine cannot follow is not known to hold any.
"""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.flow import Class, Made, callee_value, called_qual, instance_class, mro, resolve_call, value_of
from ddpcheck.model.memo import query
from ddpcheck.model.script import ClassInfo, FunctionInfo, ScriptModel

# torch.nn layers that keep running statistics as buffers (track_running_stats defaults to True)
_BUFFER_LAYERS = frozenset({
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
    "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d",
})
# torchvision.models builders whose networks contain BatchNorm layers
_TORCHVISION_WITH_BATCHNORM = (
    "resnet", "resnext", "wide_resnet", "densenet", "mobilenet", "efficientnet", "regnet", "inception_v3",
    "googlenet", "shufflenet", "mnasnet",
)


def _library_with_buffers(qual: str) -> bool:
    if qual.startswith("torch.nn.") and qual.rpartition(".")[2] in _BUFFER_LAYERS:
        return True
    if qual.startswith("torchvision.models."):
        name = qual.rpartition(".")[2].lower()
        return name.startswith(_TORCHVISION_WITH_BATCHNORM) or (name.startswith("vgg") and name.endswith("_bn"))
    return False


def holds_buffers(model: ScriptModel, expr: cst.BaseExpression | None) -> bool:
    """Every object `expr` can hold where it is read is a module with
    buffers (see the module's docstring); False when unknown."""
    if expr is None:
        return False
    atoms = value_of(model, expr).atoms
    return bool(atoms) and all(_object_holds_buffers(a) for a in atoms)


def _object_holds_buffers(atom) -> bool:
    if not isinstance(atom, Made):
        return False
    if _library_with_buffers(called_qual(atom.model, atom.site) or ""):
        return True
    made_of = instance_class(atom.model, atom)
    return made_of is not None and class_holds_buffers(*made_of)


@query(on_cycle=False)   # a class built of itself adds nothing: the least fixed point
def class_holds_buffers(model: ScriptModel, cls: ClassInfo) -> bool:
    """The constructor that runs for `cls` builds a buffer on every path."""
    for owner_model, owner in mro(model, cls):
        init = owner.methods.get("__init__")
        if init is not None:
            return function_builds_buffers(owner_model, init)
    return False


@query(on_cycle=False)
def function_builds_buffers(model: ScriptModel, fn: FunctionInfo) -> bool:
    """Every run of `fn` builds a buffer (see the module's docstring)."""
    for site in model.calls_in(fn):
        if site.ctx.opaque or any(b.function is fn for b in site.ctx.branches):
            continue   # under a test or in a `try`: not on every path
        if site.attr == "register_buffer" and isinstance(site.receiver, cst.Name) and fn.params[:1] == (
                site.receiver.value,):
            return True
        if _library_with_buffers(called_qual(model, site) or ""):
            return True
        if any(isinstance(a, Class) and class_holds_buffers(a.model, a.cls) for a in callee_value(model, site).atoms):
            return True
        target = resolve_call(model, site)
        if target is not None and target[1] is not fn and function_builds_buffers(*target):
            return True
    return False


__all__ = ["holds_buffers", "class_holds_buffers", "function_builds_buffers"]
