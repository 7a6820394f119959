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
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import reads, reads_name
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.flow import (
    Made, Mapping, Seq, Value, argument_expr, call_sites_of, callees, instance_class, mro, resolve_call, result_dropped,
    sole_binding, value_at,
)

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
    return bool(calls) and all(result_dropped(c) or call_result_reduced(model, c) for c in calls)


def call_result_reduced(model: ScriptModel, site: CallSite) -> bool:
    """The function that makes the call reduces what it returns before
    showing it. Followed by name when the result is bound to names
    (`val_loss, val_acc = validate(...)`): a name the caller prints or logs
    with no reduction of its own (`val_acc`, beside an all-reduced
    `val_loss`) is shown unreduced. A result used any other way: any
    reduction in the calling function counts."""
    fn = site.ctx.function
    if not function_reduces(model, fn):
        return False
    names = _result_names(model, site)
    if names is None:
        return True
    return not any(_shown_unreduced(model, site, name) for name in names)


def _result_names(model: ScriptModel, site: CallSite) -> tuple[str, ...] | None:
    names = tuple(a.key for a in model.assigns_in(site.ctx.function)
                  if a.value is site.node or (a.unpacked is not None and a.unpacked[0] is site.node))
    if not names or any("[" in n for n in names):
        return None
    return names


def _is_reduction_call(site: CallSite) -> bool:
    return is_reduction(site) or bool(REDUCTION_NAME.search(site.func or ""))


def _shown_unreduced(model: ScriptModel, site: CallSite, name: str) -> bool:
    """`name`, bound from the call's result, is printed or logged after the
    call, and no reduction in the calling function reads it (itself, or a
    tensor made from it: `t = torch.tensor(val_loss)`, `dist.all_reduce(t)`)."""
    fn = site.ctx.function
    carriers = {name} | {a.key for a in model.assigns_in(fn) if a.value is not None
                         and a.ctx.order > site.ctx.order and reads_name(reads(model, a.value), name)}
    for c in model.calls_in(fn):
        if not any(reads_name(reads(model, a.value), k) for a in c.node.args for k in carriers):
            continue
        if _is_reduction_call(c):
            return False
        target = resolve_call(model, c)
        if target is not None and function_reduces(*target):
            return False   # `acc = mean_over_gpus(acc)`, a helper of the tree that reduces
    return any(c.ctx.order > site.ctx.order and is_report(c)
               and any(reads_name(reads(model, a.value), name) for a in c.node.args)
               for c in model.calls_in(fn))


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


# Methods of a metric object that add one batch to its running state.
ACCUMULATING_METHODS = ("update", "__call__", "add", "add_batch", "accumulate", "step")


@query(on_cycle=False)
def method_accumulates(model: ScriptModel, fn: FunctionInfo) -> bool:
    """The method adds to its object's own state: `self.correct += ...`,
    `self.preds.append(...)` (itself, or a method of the object it calls)."""
    for a in model.assigns_in(fn):
        if a.augmented is not None and a.key.startswith("self."):
            return True
    for c in model.calls_in(fn):
        receiver = c.receiver
        if receiver is None:
            continue
        name = dotted_name(receiver) or ""
        if c.attr in ("append", "extend") and name.startswith("self."):
            return True
        if name == "self" and fn.class_name is not None:
            cls = next((k for k in model.classes if k.name == fn.class_name and fn in k.all_methods), None)
            target = cls.methods.get(c.attr or "") if cls is not None else None
            if target is not None and target is not fn and method_accumulates(model, target):
                return True
    return False


def _accumulating_atom(atom: Made, method: str) -> bool:
    cls = instance_class(atom.model, atom)
    if cls is None:
        return False
    cmodel, info = cls
    if class_reduces(cmodel, info.name):
        return False
    if METER_CLASS.search(info.name):
        return True
    for m, c in mro(cmodel, info):
        fn = c.methods.get(method)
        if fn is not None:
            return method_accumulates(m, fn)
    return False


def accumulating_object(model: ScriptModel, expr: cst.BaseExpression, method: str) -> bool:
    """`expr` holds an object of a class of the tree that keeps a running
    metric and never reduces it: named like a meter (`AverageMeter`), or its
    `method` (`update`, `__call__`) adds to its own attributes. A parameter
    holds what the file's calls pass (`metric_dict["op"][0]` in `validate(net,
    loader, metric_dict)`, the dict built by its caller)."""
    return any(_accumulating_atom(atom, method) for atom in value_at(model, expr).made)


def _receiver_root(expr: cst.BaseExpression) -> cst.Name | None:
    """`metric_dict` of `metric_dict["op"][i]` / `meters.top1`."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return expr if isinstance(expr, cst.Name) else None


@query(on_cycle=frozenset())
def updated_params(model: ScriptModel, fn: FunctionInfo) -> frozenset[tuple[str, str]]:
    """(parameter, method): `fn` calls an accumulating method on an entry or
    attribute of its parameter (`metric_dict["op"][i].update(*pair)` in a
    helper `update_metrics(metric_dict, results)`)."""
    found = set()
    for c in model.calls_in(fn):
        if c.receiver is None or c.attr not in ACCUMULATING_METHODS:
            continue
        param = _param_behind(model, c.receiver, fn)
        if param is not None:
            found.add((param, c.attr))
    return frozenset(found)


def _param_behind(model: ScriptModel, expr: cst.BaseExpression, fn: FunctionInfo) -> str | None:
    """The parameter of `fn` an entry or attribute is read from, through
    local names bound once to such a read (`op = metric_dict["op"][i]`)."""
    seen: set[int] = set()
    root = _receiver_root(expr)
    while root is not None and id(root) not in seen:
        seen.add(id(root))
        bound = sole_binding(model, root)
        if bound is None or bound.ctx.function is not fn:
            return None
        if bound.kind == "param":
            return root.value
        if bound.kind != "assign" or bound.value is None or bound.path != () or bound.augmented is not None:
            return None
        root = _receiver_root(bound.value)
    return None


def _objects_in(value: Value) -> list[Made]:
    """The objects a value holds, in its containers too (a dict of lists of meters)."""
    out, stack, seen = [], [value], set()
    while stack:
        v = stack.pop()
        for atom in v.atoms:
            if id(atom) in seen:
                continue
            seen.add(id(atom))
            if type(atom) is Made:
                out.append(atom)
            elif isinstance(atom, Seq) and atom.items is not None:
                stack.extend(atom.items)
            elif isinstance(atom, Mapping):
                stack.extend(entry for _, entry in atom.entries)
    return out


def containers_updated_by(model: ScriptModel, site: CallSite) -> list[cst.BaseExpression]:
    """The arguments of `site` whose metric objects the function it runs
    updates (updated_params): `update_metrics(metric_dict, results)` with
    `metric_dict = {"op": [Acc(), TopK(1)]}` built by the caller."""
    target = resolve_call(model, site)
    if target is None:
        return []
    out = []
    for param, method in sorted(updated_params(*target)):
        bound, expr = argument_expr(site, target[1], param)
        if bound and expr is not None and any(_accumulating_atom(a, method)
                                              for a in _objects_in(value_at(model, expr))):
            out.append(expr)
    return out


@dataclass(frozen=True)
class Accumulator:
    key: str          # `correct`, `self.total_loss`, `top1`
    node: cst.CSTNode

    @property
    def token(self) -> str:
        return self.key.split("[")[0]


__all__ = [
    "is_reduction", "function_reduces", "is_report", "class_reduces",
    "Accumulator", "METER_CLASS", "ACCUMULATING_METHODS", "accumulating_object", "method_accumulates",
    "updated_params", "containers_updated_by",
]
