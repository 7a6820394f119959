"""DDP302 wrapped-state-dict."""

from __future__ import annotations

import os
import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.query import query
from ddpcheck.model.reads import reads
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import wraps
from ddpcheck.model.flow import argument_expr
from ddpcheck.model.wrappers import strips_prefix, wrapper_in
from ddpcheck.findings import Severity
from ddpcheck.rules.base import Hit, Rule, register

TORCH_SAVE = ("torch.save", "torch.serialization.save")
# Save helpers we cannot see (`utils.save_on_master`, `save_checkpoint`): they write what they are given.
SAVE_HELPER = re.compile(r"^(save|save_on_\w+|save_(checkpoint|ckpt|model|state|weights)\w*|\w*_save)$")
# A test that tells the wrapper apart: `model.module if hasattr(model, "module") else model`.
_UNWRAP_NAMES = {"module", "isinstance", "hasattr", "DataParallel", "DistributedDataParallel", "DDP", "DP"}
# A helper that strips the prefix before writing.
STRIPS_PREFIX = re.compile(r"['\"]module\.|removeprefix|consume_prefix_in_state_dict_if_present|unwrap")


def tells_wrapper_apart(model: ScriptModel, test: cst.BaseExpression) -> bool:
    """A test that tells the wrapper apart: `hasattr(model, "module")`,
    `isinstance(model, DDP)`, `model.module is not None`."""
    return any(n.rpartition(".")[2] in _UNWRAP_NAMES for n in reads(model, test))


@query(on_cycle=False)
def _helper_saves(model: ScriptModel, fn: FunctionInfo, depth: int = 0) -> bool:
    """`fn` hands what it gets to torch.save with the keys as they are (a
    helper that renames them first, `{k[7:]: v ...}`, does not count)."""
    result = False
    for c in model.calls_in(fn):
        if c.qual in TORCH_SAVE:
            obj = c.arg("obj", 0)
            if obj is not None and strips_prefix(model, obj, fn):
                continue
            result = True
            break
        if depth < 2:
            target = model.resolve_call(c)
            if target is not None and _helper_saves(target[0], target[1], depth + 1):
                result = True
                break
    if result and STRIPS_PREFIX.search(model.module.code_for_node(fn.node)):
        result = False
    return result


def is_save_sink(model: ScriptModel, site: CallSite) -> bool:
    """torch.save, or a helper that passes what it gets to torch.save."""
    if site.qual in TORCH_SAVE:
        return True
    target = model.resolve_call(site)
    if target is not None:
        return _helper_saves(*target)
    attr = site.attr or ""
    return bool(SAVE_HELPER.match(attr)) and not (site.qual or "").startswith(("numpy.", "np.", "json.", "pickle."))


class _Collector:
    def __init__(self, model: ScriptModel, sink: CallSite) -> None:
        self.model = model
        self.sink = sink
        self.found: list[CallSite] = []
        self.seen: set[int] = set()

    def expr(self, node: cst.CSTNode, scope: FunctionInfo | None, depth: int = 0) -> None:
        if depth > 4 or id(node) in self.seen:
            return
        self.seen.add(id(node))
        if isinstance(node, (cst.DictComp, cst.Call, cst.Name, cst.Attribute)) and \
                strips_prefix(self.model, node, scope):
            return   # `{k[7:]: v for k, v in model.state_dict().items()}`: the keys are renamed
        if isinstance(node, cst.IfExp):
            # `m.module.state_dict() if args.distributed else m.state_dict()`: the author tells them apart
            arms = reads(self.model, node.body) | reads(self.model, node.orelse)
            if tells_wrapper_apart(self.model, node.test) or any(n.endswith(".module") for n in arms):
                return
        if isinstance(node, cst.Call):
            site = self.model.site_of.get(id(node))
            if site is not None and site.attr == "state_dict" and site.receiver is not None:
                self.found.append(site)
                return
        if isinstance(node, (cst.Name, cst.Attribute)) and not isinstance(node, cst.Call):
            key = dotted_name(node)
            if key is not None:
                self.name(key, scope, depth)
                if isinstance(node, cst.Name):
                    return
        for child in node.children:
            if isinstance(child, cst.BaseExpression) or isinstance(child, (cst.Arg, cst.DictElement, cst.Element,
                                                                          cst.StarredDictElement, cst.StarredElement)):
                self.expr(child, scope, depth + 1)

    def name(self, key: str, scope: FunctionInfo | None, depth: int) -> None:
        """What the checkpoint dict under `key` was filled with before the save."""
        for a in self.model.assigns:
            if a.value is None or not (a.key == key or a.key.startswith(key + "[")):
                continue
            if a.ctx.function is not scope or a.ctx.order > self.sink.ctx.order:
                continue
            self.expr(a.value, scope, depth + 1)


@register
class WrappedStateDict(Rule):
    code = "DDP302"
    name = "wrapped-state-dict"
    severity = Severity.WARNING
    message = ("the state_dict of the DDP/DataParallel wrapper is saved: every key gets a `module.` prefix, "
               "so the checkpoint does not load into the plain model")
    fix = "save `model.module.state_dict()` (keep `model_without_ddp = model.module` after wrapping)"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not wraps(model):
            return
        reported: set[int] = set()
        for sink in model.calls:
            if not is_save_sink(model, sink):
                continue
            collector = _Collector(model, sink)
            for a in sink.node.args:
                collector.expr(a.value, sink.ctx.function)
            for sd in collector.found:
                if id(sd.node) in reported:
                    continue
                key = dotted_name(sd.receiver)
                if key is None or any(tells_wrapper_apart(model, b.test) for b in sd.ctx.branches):
                    continue
                found = wrapper_in(model, sd.receiver, sd.ctx)
                if found is None:
                    continue
                w, via = found
                reported.add(id(sd.node))
                yield self._hit(model, sd.node, key, w, via)
            yield from self._through_helper(model, sink, reported)

    def _through_helper(self, model: ScriptModel, sink: CallSite, reported: set[int]) -> Iterator[Hit]:
        """`save_checkpoint(model, path)` into a helper module whose body saves
        `model.state_dict()`: the wrapper crosses the module as an argument."""
        target = model.resolve_call(sink)
        if target is None or target[0] is model:
            return
        tmodel, fn = target
        for param in saved_params(tmodel, fn):
            bound, expr = argument_expr(sink, fn, param)
            if not bound or expr is None or id(expr) in reported:
                continue
            found = wrapper_in(model, expr, sink.ctx)
            if found is None:
                continue
            reported.add(id(expr))
            yield self._hit(model, expr, dotted_name(expr) or "model", found[0], found[1],
                            helper=f"{fn.name}() ({os.path.basename(tmodel.path)})")

    def _hit(self, model: ScriptModel, node: cst.CSTNode, key: str, w, via: CallSite | None,
             helper: str | None = None) -> Hit:
        kinds = {x.kind for x in wraps(model) if x.key == w.key}
        kind = "DistributedDataParallel or DataParallel" if len(kinds) > 1 else w.kind
        shown = w.key or key
        if helper is not None:
            what = f"`{key}` is handed to {helper}, which saves `.state_dict()` of it, while it holds the {kind} wrapper"
        elif via is not None:
            caller = via.ctx.function.name + "()" if via.ctx.function is not None else "module-level code"
            what = (f"`{key}.state_dict()` is saved and `{key}` is the {kind} wrapper that "
                    f"`{via.func or 'a call'}(...)` in {caller} passes in")
        else:
            what = f"`{key}.state_dict()` is saved while `{key}` holds the {kind} wrapper"
        return Hit(node, message=(
            f"{what}: every key is prefixed with `module.` (`module.conv1.weight`), so the checkpoint does not "
            "load into an unwrapped model (single-GPU evaluation, export, fine-tuning) without renaming its keys, "
            "and loading it back needs the same wrapper"
        ), fix=(f"save `{shown}.module.state_dict()`, or keep `{shown}_without_ddp = {shown}.module` right after "
                "wrapping and save (and load) through it, as torchvision's references do"))


def saved_params(model: ScriptModel, fn: FunctionInfo) -> list[str]:
    """The parameters of `fn` whose `.state_dict()` it saves, unrenamed
    (`def save_checkpoint(model, path): torch.save({"model": model.state_dict()}, path)`)."""
    found = []
    for sink in model.calls_in(fn):
        if not is_save_sink(model, sink):
            continue
        collector = _Collector(model, sink)
        for a in sink.node.args:
            collector.expr(a.value, fn)
        for sd in collector.found:
            key = dotted_name(sd.receiver)
            if key in fn.params and key not in found and \
                    not any(tells_wrapper_apart(model, b.test) for b in sd.ctx.branches) and \
                    not [a for a in model.assignments(key, fn) if a.ctx.function is fn]:
                found.append(key)
    return found
