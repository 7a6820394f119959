"""DDP201 syncbn-after-ddp."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import exclusive, is_ddp_wrap, origins, wraps_before
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import convert_first_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.rules.base import Hit, Rule, register


def is_syncbn_conversion(site) -> bool:
    q = site.qual or ""
    if q.endswith("SyncBatchNorm.convert_sync_batchnorm"):
        return True
    return q.rpartition(".")[2] == "convert_syncbn_model" and q.startswith("apex.")


@register
class SyncBNAfterDDP(Rule):
    code = "DDP201"
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
            if any(is_ddp_wrap(m, o) for m, o in origins(model, arg, site.ctx.function)
                   if o.node is arg or m is not model
                   or (o.ctx.order < site.ctx.order and not exclusive(o.ctx, site.ctx))):
                yield Hit(site.node, message=self._message(dotted_name(arg) or "the model"),
                          edit=convert_first_edit(model, site, dotted_name(arg)))
                continue
            key = dotted_name(arg)
            if key is None:
                continue
            key = key.removesuffix(".module")
            if wraps_before(model, key, site, kind="DistributedDataParallel"):
                yield Hit(site.node, message=self._message(key), edit=convert_first_edit(model, site, key))

    def _message(self, name: str) -> str:
        return (f"`{name}` is converted to SyncBatchNorm after it was wrapped in DistributedDataParallel: "
                "DDP inspects the module once, when it wraps it (parameter and buffer lists, SyncBatchNorm "
                "checks), so layers swapped in afterwards bypass that set-up; PyTorch only supports converting "
                "before the wrap, and a conversion that returns a new module never reaches the wrapper")
