"""DDP201 syncbn-after-ddp."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import Made, Member, value_of
from ddpcheck.model.values import is_ddp_wrap
from ddpcheck.model.wrappers import wrapped_by_another_method
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import convert_first_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def is_syncbn_conversion(site) -> bool:
    q = site.qual or ""
    if q.endswith("SyncBatchNorm.convert_sync_batchnorm"):
        return True
    return q.rpartition(".")[2] == "convert_syncbn_model" and q.startswith("apex.")


def _wrap_converted(model: ScriptModel, arg, ctx) -> Made | None:
    """The DDP wrap the converted module is, or wraps (`model.module` of it),
    where the conversion reads it."""
    found, plain_too = [], False
    for atom in value_of(model, arg).atoms:
        inner = atom.receiver if isinstance(atom, Member) and atom.name == "module" else atom
        if isinstance(inner, Made) and is_ddp_wrap(inner.model, inner.site):
            found.append(inner)
        else:
            plain_too = True
    if plain_too:   # a wrap another method stores, where the order of the calls decides, is not known
        found = [a for a in found if not wrapped_by_another_method(model, a.site, ctx)]
    return min(found, key=lambda a: (a.model is not model, a.site.ctx.order), default=None)


@register
class SyncBNAfterDDP(Rule):
    code = "DDP201"
    triggers = (USES_DISTRIBUTED,)
    name = "syncbn-after-ddp"
    short = "SyncBatchNorm conversion after the DDP wrap"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    fixable = True
    message = "SyncBatchNorm conversion runs after the model was wrapped in DistributedDataParallel"
    fix = "convert first, then wrap: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before `DDP(model, ...)`"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for site in model.calls:
            if not is_syncbn_conversion(site):
                continue
            arg = site.arg("module", 0)
            if arg is None:
                continue
            wrap = _wrap_converted(model, arg, site.ctx)
            if wrap is None:
                continue
            key = dotted_name(arg)
            key = key.removesuffix(".module") if key else None
            same_file = wrap if wrap.model is model else None
            yield Hit(site.node, message=self._message(key or "the model"),
                      edit=convert_first_edit(model, site, key, same_file.site if same_file else None))

    def _message(self, name: str) -> str:
        return (f"`{name}` is converted to SyncBatchNorm after it was wrapped in DistributedDataParallel: "
                "DDP inspects the module once, when it wraps it (parameter and buffer lists, SyncBatchNorm "
                "checks), so layers swapped in afterwards bypass that set-up; PyTorch only supports converting "
                "before the wrap, and a conversion that returns a new module never reaches the wrapper")
