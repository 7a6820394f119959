"""DDP302 wrapped-state-dict."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.saves import is_save_sink, saved_state_dicts
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import wraps
from ddpcheck.model.wrappers import UNWRAP_TEST, wrapper_held
from ddpcheck.findings import Severity
from ddpcheck.rules.base import Hit, Rule, register


def _told_apart(model: ScriptModel, node: cst.IfExp) -> bool:
    """`m.module.state_dict() if args.distributed else m.state_dict()`: the author tells them apart."""
    arms = model.module.code_for_node(node.body) + model.module.code_for_node(node.orelse)
    return bool(UNWRAP_TEST.search(model.module.code_for_node(node.test))) or ".module" in arms


@register
class WrappedStateDict(Rule):
    code = "DDP302"
    name = "wrapped-state-dict"
    severity = Severity.WARNING
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
            found = saved_state_dicts(model, sink, lambda node: _told_apart(model, node))
            for sd in found:
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
                        "wrapping and save (and load) through it, as torchvision's references do"))
