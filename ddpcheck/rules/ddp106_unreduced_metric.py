"""DDP106 unreduced-metric."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import libcst as cst

from ddpcheck.model.evaluation import sharded_when_distributed, LoaderLoop, is_eval_loader, loader_loops
from ddpcheck.model.metrics import (
    ACCUMULATING_METHODS, Accumulator, accumulating_object, call_result_reduced, callers_reduce_the_return, containers_updated_by, class_reduces, function_reduces, is_report,
)
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import mro
from ddpcheck.model.values import loaders
from ddpcheck.model.worlds import D0, DN
from ddpcheck.model.reads import reads, reads_name
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.guards import worlds

_LIST_METHODS = {"append", "extend"}


def _entry_key(expr: cst.BaseExpression) -> str | None:
    """`avg_meters["val_loss"]`, `metric_dict["op"][0]` (meters in a dict or a
    list): its key as written, read as the container."""
    keys = []
    while isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        entry = expr.slice[0].slice.value
        if not isinstance(entry, (cst.SimpleString, cst.Integer)):
            return None
        keys.append(entry.value)
        expr = expr.value
    container = dotted_name(expr)
    if container is None or not keys:
        return None
    return container + "".join(f"[{k}]" for k in reversed(keys))


_JOINS = ("cat", "concatenate", "vstack", "hstack", "stack")


def running_update(a) -> bool:
    """`total = total + loss.item()`, `preds = torch.cat([preds, out])`: a
    plain assignment that adds to the value the name already holds, the same
    running total as `total += ...`."""
    value = a.value
    if value is None or a.augmented is not None or "[" in a.key:
        return False
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
        return a.key in (dotted_name(value.left), dotted_name(value.right))
    if isinstance(value, cst.Call) and isinstance(value.func, (cst.Attribute, cst.Name)) and value.args:
        name = value.func.attr.value if isinstance(value.func, cst.Attribute) else value.func.value
        first = value.args[0].value
        if name in _JOINS and isinstance(first, (cst.List, cst.Tuple)):
            return any(dotted_name(e.value) == a.key for e in first.elements)
    return False


def accumulators(m: ScriptModel, ll: LoaderLoop) -> list[Accumulator]:
    """What the loop adds up: `correct += ...`, `preds.append(...)`,
    `top1.update(...)` or `metric(pred, y)` on a metric object of the tree
    that keeps a running value and never reduces it (model/metrics.py)."""
    loop = ll.loop
    fn = ll.function
    found: dict[str, Accumulator] = {}
    for a in m.assigns_in(fn):
        if a.ctx.inside(loop) and (a.augmented is not None or running_update(a)):
            found.setdefault(a.key, Accumulator(a.key, a.node))
    for c in m.calls_in(fn):
        if not c.ctx.inside(loop):
            continue
        uses = []
        if c.receiver is not None:
            uses.append((c.receiver, c.attr))
        if isinstance(c.node.func, (cst.Name, cst.Attribute, cst.Subscript)):
            uses.append((c.node.func, "__call__"))   # `self.metric(pred, y)`: the object's __call__
        for obj, method in uses:
            key = dotted_name(obj) or _entry_key(obj)
            if key is None or key in found:
                continue
            if method in _LIST_METHODS and obj is c.receiver:
                found[key] = Accumulator(key, c.node)
            elif method in ACCUMULATING_METHODS and accumulating_object(m, obj, method):
                found[key] = Accumulator(key, c.node)
        for container in containers_updated_by(m, c):   # `update_metrics(metric_dict, results)`
            key = dotted_name(container)
            if key is not None:
                found.setdefault(key, Accumulator(key, c.node))
    # loop variables are not results
    return [acc for k, acc in found.items() if k not in loop.targets]


def derived(m: ScriptModel, ll: LoaderLoop, accs: list[Accumulator]) -> set[str]:
    """Accumulated names and names computed from them (`acc = correct / total`
    after the loop; `top1 = meters["op"][0].get()` inside it, whose last value
    is the running total of the whole shard)."""
    tokens = {a.token for a in accs}
    fn = ll.function
    for _ in range(3):
        grown = False
        for a in m.assigns_in(fn):
            if a.value is None or a.key in tokens:
                continue
            if a.ctx.inside(ll.loop) and (a.augmented is not None or a.ctx.loops[-1] is not ll.loop):
                continue   # only a plain assignment in the loop's own body holds the running value at the end
            names = reads(m, a.value)
            if any(reads_name(names, t) for t in tokens):
                tokens.add(a.key.split("[")[0])
                grown = True
        if not grown:
            break
    return tokens


def first_report(m: ScriptModel, ll: LoaderLoop, tokens: set[str]) -> tuple[cst.CSTNode, str, str] | None:
    """The first print/log/return after the loop that shows an accumulated value:
    (node, what it is, which name)."""
    fn = ll.function
    after = ll.loop.ctx.order
    candidates = []
    for c in m.calls_in(fn):
        if c.ctx.order <= after or c.ctx.inside(ll.loop) or not is_report(c):
            continue
        if not (worlds(m, c.ctx) & {D0, DN}):
            continue
        names = frozenset().union(*(reads(m, a.value) for a in c.node.args))
        hit = next((t for t in sorted(tokens) if reads_name(names, t)), None)
        if hit:
            candidates.append((c.ctx.order, c.node, f"`{c.func or c.attr}(...)`", hit))
    if fn is not None:
        for value, ctx in fn.returns:
            if ctx.order <= after or ctx.inside(ll.loop) or not (worlds(m, ctx) & {D0, DN}):
                continue
            names = reads(m, value)
            hit = next((t for t in sorted(tokens) if reads_name(names, t)), None)
            if hit:
                candidates.append((ctx.order, value, "the `return`", hit))
    if not candidates:
        return _reported_by_another_method(m, fn, tokens)
    _, node, what, name = min(candidates, key=lambda c: c[0])
    return node, what, name


def _reported_by_another_method(m: ScriptModel, fn, tokens: set[str]) -> tuple[cst.CSTNode, str, str] | None:
    """A value the evaluation stores on its object (`self.val_acc =
    self.metric.get()`) and another method of the class or of a base class in
    the same file prints or logs (`log_epoch()`), with no reduction there."""
    stored = sorted(t for t in tokens if t.startswith("self."))
    cls = next((k for k in m.classes if fn is not None and fn in k.all_methods), None)
    if not stored or cls is None:
        return None
    for cmodel, info in mro(m, cls):
        if cmodel is not m:
            continue
        for method in info.all_methods:
            if method is fn or function_reduces(m, method):
                continue
            for c in m.calls_in(method):
                if not is_report(c) or not (worlds(m, c.ctx) & {D0, DN}):
                    continue
                names = frozenset().union(*(reads(m, a.value) for a in c.node.args))
                hit = next((t for t in stored if reads_name(names, t)), None)
                if hit:
                    return c.node, f"`{c.func or c.attr}(...)` in `{method.name}()`", hit
    return None


def _called_through_a_value(m: ScriptModel, fn) -> bool:
    """The function is used as a value, not only called by name: stored in a
    dict of metrics (`name2metric = {"bleu": bleu}; name2metric[k](...)`),
    handed to another call, assigned: its callers cannot all be seen."""
    called = {id(c.node.func) for c in m.calls}
    return any(id(ref.node) not in called for ref in m.refs_to(fn))


@register
class UnreducedMetric(Rule):
    code = "DDP106"
    triggers = (USES_DISTRIBUTED,)
    name = "unreduced-metric"
    short = "metric from one rank's shard reported without an all_reduce"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    message = ("an evaluation metric accumulated over a DistributedSampler shard is reported without "
               "a reduction across ranks: it describes one rank's share of the data")
    fix = ("sum the counts across ranks before dividing: `t = torch.tensor([correct, total], device=device)`, "
           "`dist.all_reduce(t)`, or use a torchmetrics metric (its compute() syncs)")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        reported: set[int] = set()
        for loader in loaders(model) + sharded_when_distributed(model):
            if not loader.samplers or not is_eval_loader(model, loader):
                continue
            for ll in loader_loops(model, loader):
                m, fn = ll.model, ll.function
                if function_reduces(m, fn):
                    continue
                accs = accumulators(m, ll)
                if not accs:
                    continue
                report = first_report(m, ll, derived(m, ll, accs))
                if report is None:
                    continue
                node, what, name = report
                if ll.via is not None and (call_result_reduced(model, ll.via) if what == "the `return`"
                                           else function_reduces(model, ll.via.ctx.function)):
                    continue   # the caller reduces what the evaluation function returns
                if what == "the `return`" and fn is not None and (
                        _called_through_a_value(m, fn) or callers_reduce_the_return(m, fn)):
                    continue   # unknown callers, or every caller reduces (or drops) what it returns
                names = ", ".join(f"`{a.key}`" for a in accs[:3])
                where = ""
                if m is not model:
                    where = f" in `{fn.name if fn else 'module'}` ({Path(m.path).name})"
                    node = ll.via.node
                if id(node) in reported:
                    continue
                reported.add(id(node))
                yield Hit(node, message=(
                    f"{what}{where} reports `{name}`, accumulated ({names}) over `{loader.key}`, whose "
                    "DistributedSampler gives each rank 1/W of the evaluation data, and nothing reduces it across "
                    "ranks: the number printed, logged or returned describes one rank's shard (rank 0's on the "
                    "main process), not the data set"
                ), fix=(
                    "reduce before reporting: put the sums in a tensor on the GPU, `dist.all_reduce(t, "
                    "op=dist.ReduceOp.SUM)`, then divide (sums and counts, not per-rank averages); or use a "
                    "torchmetrics metric, whose compute() syncs across ranks"
                ))
