"""Metrics accumulated over a loader and whether they are ever reduced
across ranks (DDP106).

A reduction is a collective (`dist.all_reduce`, `all_gather`, `reduce`,
`gather`), a helper named like one (`reduce_tensor`, `all_reduce_mean`,
`reduce_dict`, `gather_predictions`, `metric_logger.synchronize_between_processes()`,
`accelerator.gather_for_metrics`), or a torchmetrics-style `.compute()`.
Helpers of the file or of a local module are followed, so a reduction hidden
one call deeper counts too."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.flow import call_sites_of, callees, result_dropped

REDUCTION_NAME = re.compile(r"reduce|gather|synchroni[sz]e|(^|_)sync(_|$)|sync_between|average_across|across_processes",
                            re.I)
REDUCTION_ATTRS = {"compute", "compute_metrics"}   # torchmetrics Metric.compute() syncs the states
METER_CLASS = re.compile(r"(Meter|Average|Averager|Logger|Tracker|Counter|Accumulator)$")
REPORT_ATTRS = {
    "print", "info", "warning", "warn", "debug", "log", "log_metrics", "log_metric", "log_dict",
    "add_scalar", "add_scalars", "write", "pprint",
}


def is_reduction(site: CallSite) -> bool:
    attr = site.attr or ""
    return bool(REDUCTION_NAME.search(attr)) or attr in REDUCTION_ATTRS


@query
def function_reduces(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    """`fn` (None: module-level code) or a function it calls, 3 deep, reduces."""
    calls = model.calls_in(fn)
    result = any(is_reduction(c) for c in calls)
    if not result:
        for m, callee, _ in callees(model, calls):
            if any(is_reduction(c) for c in m.calls_in(callee)):
                result = True
                break
    return result


def callers_reduce_the_return(model: ScriptModel, fn: FunctionInfo) -> bool:
    """Every call of `fn` (all in its file, none unknown) reduces what it
    returns or throws it away: `loss, acc = evaluate(...)` then
    `dist.all_reduce(loss)` in the caller; `evaluate()` as a statement."""
    calls = call_sites_of(model, fn)
    return bool(calls) and all(result_dropped(c) or function_reduces(model, c.ctx.function) for c in calls)


def is_report(site: CallSite) -> bool:
    """print / logger.info / wandb.log / writer.add_scalar ..."""
    if site.func == "print":
        return True
    q = site.qual or ""
    if q.startswith(("math.", "numpy.", "torch.", "np.")):
        return False
    if q.startswith(("logging.", "wandb.", "mlflow.")):
        return True
    return (site.attr or "") in REPORT_ATTRS and site.receiver is not None


def class_reduces(model: ScriptModel, class_name: str) -> bool:
    return any(is_reduction(c) for c in model.calls if c.ctx.class_name == class_name)


@dataclass(frozen=True)
class Accumulator:
    key: str          # `correct`, `self.total_loss`, `top1`
    node: cst.CSTNode

    @property
    def token(self) -> str:
        return self.key.split("[")[0]


__all__ = [
    "is_reduction", "function_reduces", "is_report", "class_reduces",
    "Accumulator", "METER_CLASS",
]
