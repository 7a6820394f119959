"""DDP302 wrapped-state-dict."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import wraps
from ddpcheck.model.wrappers import wrapper_held
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import unwrap_edit
from ddpcheck.rules.base import Hit, Rule, register

TORCH_SAVE = ("torch.save", "torch.serialization.save")
# Save helpers we cannot see (`utils.save_on_master`, `save_checkpoint`): they write what they are given.
SAVE_HELPER = re.compile(r"^(save|save_on_\w+|save_(checkpoint|ckpt|model|state|weights)\w*|\w*_save)$")
# A test that tells the wrapper apart: `model.module if hasattr(model, "module") else model`.
UNWRAP_TEST = re.compile(r"\bmodule\b|isinstance|hasattr|DataParallel|DistributedDataParallel|\bDDP\b|\bDP\b")
# A helper that strips the prefix before writing.
STRIPS_PREFIX = re.compile(r"['\"]module\.|removeprefix|consume_prefix_in_state_dict_if_present|unwrap")


def _helper_saves(model: ScriptModel, fn: FunctionInfo, depth: int = 0) -> bool:
    memo = ("helper_saves", id(fn))
    if memo in model._memo:
        return model._memo[memo]
    model._memo[memo] = False
    result = False
    for c in model.calls_in(fn):
        if c.qual in TORCH_SAVE:
            result = True
            break
        if depth < 2:
            target = model.resolve_call(c)
            if target is not None and _helper_saves(target[0], target[1], depth + 1):
                result = True
                break
    if result and STRIPS_PREFIX.search(model.module.code_for_node(fn.node)):
        result = False
    model._memo[memo] = result
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
        if isinstance(node, cst.IfExp):
            # `m.module.state_dict() if args.distributed else m.state_dict()`: the author tells them apart
            arms = self.model.module.code_for_node(node.body) + self.model.module.code_for_node(node.orelse)
            if UNWRAP_TEST.search(self.model.module.code_for_node(node.test)) or ".module" in arms:
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
    short = "wrapper's state_dict saved: keys get a `module.` prefix"
    severity = Severity.WARNING
    fixable = True
    message = ("the state_dict of the DDP/DataParallel wrapper is saved: every key gets a `module.` prefix, "
               "so the checkpoint does not load into the plain model")
    fix = "save `model.module.state_dict()` (keep `model_without_ddp = model.module` after wrapping)"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        wrapped = {w.key for w in wraps(model) if w.key}
        if not any(c.attr == "state_dict" and c.receiver is not None and dotted_name(c.receiver) in wrapped
                   for c in model.calls):
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
                if key is None or any(UNWRAP_TEST.search(model.module.code_for_node(b.test)) for b in sd.ctx.branches):
                    continue
                w = wrapper_held(model, key, sd.ctx)
                if w is None:
                    continue
                reported.add(id(sd.node))
                kinds = {x.kind for x in wraps(model) if x.key == key}
                kind = "DistributedDataParallel or DataParallel" if len(kinds) > 1 else w.kind
                yield Hit(sd.node, message=(
                    f"`{key}.state_dict()` is saved while `{key}` holds the {kind} wrapper: every key is "
                    f"prefixed with `module.` (`module.conv1.weight`), so the checkpoint does not load into an "
                    "unwrapped model (single-GPU evaluation, export, fine-tuning) without renaming its keys, "
                    "and loading it back needs the same wrapper"
                ), fix=(f"save `{key}.module.state_dict()`, or keep `{key}_without_ddp = {key}.module` right after "
                        "wrapping and save (and load) through it, as torchvision's references do"),
                    edit=unwrap_edit(model, sd, key, w.site))
