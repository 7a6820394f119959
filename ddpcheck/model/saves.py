"""Where state dicts are written to disk: `torch.save(...)` and the save
helpers that pass what they get to it, and which `x.state_dict()` calls end up
in what a save writes (directly, in a dict, in a checkpoint dict filled
before the save). DDP302 (the wrapper's `module.` prefix) and DDP306 (a
compiled module's `_orig_mod.` prefix) ask the same questions."""

from __future__ import annotations

import re
from typing import Callable

import libcst as cst

from ddpcheck.model.flow import argument_expr
from ddpcheck.model.names import dotted_name
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.flow import resolve_call
from ddpcheck.model.children import children

TORCH_SAVE = ("torch.save", "torch.serialization.save")
# Save helpers we cannot see (`utils.save_on_master`, `save_checkpoint`): they write what they are given.
SAVE_HELPER = re.compile(r"^(save|save_on_\w+|save_(checkpoint|ckpt|model|state|weights)\w*|\w*_save)$")
# A helper that renames the wrapper's keys before writing.
STRIPS_MODULE_PREFIX = re.compile(r"['\"]module\.|removeprefix|consume_prefix_in_state_dict_if_present|unwrap")
# A helper that renames a compiled module's keys before writing.
STRIPS_COMPILE_PREFIX = re.compile(r"_orig_mod|removeprefix|consume_prefix_in_state_dict_if_present|unwrap")


# `renamed(model, expr, scope)`: `expr` is a state dict whose keys were renamed
# (wrappers.strips_prefix for DDP's `module.`)
Renamed = Callable[[ScriptModel, cst.BaseExpression, "FunctionInfo | None"], bool]


@query(on_cycle=False)
def helper_saves(model: ScriptModel, fn: FunctionInfo, strips: re.Pattern, renamed: Renamed | None = None) -> bool:
    """A helper of the linted tree writes what it is given with torch.save,
    itself or through a helper it calls (any number of calls down; a
    recursion is the memo's fixed point), and does not rename keys (`strips`
    in its text, or a saved object that `renamed` recognises)."""
    result = False
    for c in model.calls_in(fn):
        if c.qual in TORCH_SAVE:
            obj = c.arg("obj", 0)
            if renamed is not None and obj is not None and renamed(model, obj, fn):
                continue
            result = True
            break
        target = resolve_call(model, c)
        if target is not None and helper_saves(target[0], target[1], strips, renamed):
            result = True
            break
    if result and strips.search(model.module.code_for_node(fn.node)):
        result = False
    return result


def is_save_sink(model: ScriptModel, site: CallSite, strips: re.Pattern = STRIPS_MODULE_PREFIX,
                 renamed: Renamed | None = None) -> bool:
    """torch.save, or a helper that passes what it gets to torch.save."""
    if site.qual in TORCH_SAVE:
        return True
    target = resolve_call(model, site)
    if target is not None:
        return helper_saves(target[0], target[1], strips, renamed)
    attr = site.attr or ""
    return bool(SAVE_HELPER.match(attr)) and not (site.qual or "").startswith(("numpy.", "np.", "json.", "pickle."))


ToldApart = Callable[[ScriptModel, cst.IfExp], bool]


class _Collector:
    def __init__(self, model: ScriptModel, sink: CallSite, told_apart: ToldApart, renamed: Renamed | None) -> None:
        self.model = model
        self.sink = sink
        self.told_apart = told_apart
        self.renamed = renamed
        self.found: list[CallSite] = []
        self.seen: set[int] = set()

    def expr(self, node: cst.CSTNode, scope: FunctionInfo | None) -> None:
        # every node is visited once (`seen`): the walk ends with the expression
        # and the assignments it reads, however deeply they nest
        if id(node) in self.seen:
            return
        self.seen.add(id(node))
        if self.renamed is not None and isinstance(node, (cst.DictComp, cst.Call, cst.Name, cst.Attribute)) and \
                self.renamed(self.model, node, scope):
            return   # `{k[7:]: v for k, v in model.state_dict().items()}`: the keys are renamed
        if isinstance(node, cst.IfExp) and self.told_apart(self.model, node):
            return
        if isinstance(node, cst.Call):
            site = self.model.site_of.get(id(node))
            if site is not None and site.attr == "state_dict" and site.receiver is not None:
                self.found.append(site)
                return
        if isinstance(node, (cst.Name, cst.Attribute)):
            key = dotted_name(node)
            if key is not None:
                self.name(key, scope)
                if isinstance(node, cst.Name):
                    return
        for child in children(node):
            if isinstance(child, cst.BaseExpression) or isinstance(child, (cst.Arg, cst.DictElement, cst.Element,
                                                                          cst.StarredDictElement, cst.StarredElement)):
                self.expr(child, scope)

    def name(self, key: str, scope: FunctionInfo | None) -> None:
        """What the checkpoint dict under `key` was filled with before the save."""
        for a in self.model.assigns_in(scope):
            written = a.written
            if written is None or not (a.key == key or a.key.startswith(key + "[")):
                continue
            if a.ctx.order > self.sink.ctx.order:
                continue
            self.expr(written, scope)


def saved_state_dicts(model: ScriptModel, sink: CallSite, told_apart: ToldApart,
                      renamed: Renamed | None = None) -> list[CallSite]:
    """The `x.state_dict()` calls whose result the save `sink` writes.
    `told_apart(model, ifexp)`: a conditional expression that picks the right
    object itself (`m.module.state_dict() if ddp else m.state_dict()`) is not
    followed; `renamed`: nor is a state dict whose keys were renamed."""
    collector = _Collector(model, sink, told_apart, renamed)
    for a in sink.node.args:
        collector.expr(a.value, sink.ctx.function)
    return collector.found


__all__ = ["TORCH_SAVE", "SAVE_HELPER", "STRIPS_MODULE_PREFIX", "STRIPS_COMPILE_PREFIX", "helper_saves",
           "is_save_sink", "saved_state_dicts", "takes_state_dict_of_param", "hands_to_state_dict_taker"]


def takes_state_dict_of_param(model: ScriptModel, fn: FunctionInfo, param: str) -> bool:
    """`fn` takes `.state_dict()` of what it gets as `param` (to save it:
    `def train(..., model, ...): ... torch.save({"model_state_dict": model.state_dict()}, p)`)."""
    return any(c.attr == "state_dict" and c.receiver is not None and dotted_name(c.receiver) == param
               for c in model.calls_in(fn))


def hands_to_state_dict_taker(model: ScriptModel, key: str, after: int, scope: FunctionInfo | None) -> bool:
    """A call after `after` in `scope` hands `key` to a function (this file or
    a local helper module) that takes its `.state_dict()`."""
    for c in model.calls_in(scope):
        if c.ctx.order <= after or not any(dotted_name(a.value) == key for a in c.node.args):
            continue
        target = resolve_call(model, c)
        if target is None:
            continue
        tmodel, fn = target
        for param in fn.params:
            bound, expr = argument_expr(c, fn, param)
            if bound and expr is not None and dotted_name(expr) == key and \
                    takes_state_dict_of_param(tmodel, fn, param):
                return True
    return False
