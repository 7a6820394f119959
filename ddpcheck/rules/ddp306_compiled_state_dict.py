"""DDP306 compiled-state-dict."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.findings import Severity
from ddpcheck.model.compiled import compile_calls, compiled_held
from ddpcheck.model.names import dotted_name
from ddpcheck.model.positions import where
from ddpcheck.model.reads import reads
from ddpcheck.model.saves import STRIPS_COMPILE_PREFIX, is_save_sink, saved_state_dicts
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

# The script deals with the prefix itself (strips it on load, unwraps before saving).
_HANDLES_PREFIX = re.compile(r"_orig_mod|OptimizedModule")


def _told_apart(model: ScriptModel, node: cst.IfExp) -> bool:
    """`m._orig_mod.state_dict() if args.compile else m.state_dict()`."""
    return any(_HANDLES_PREFIX.search(n) or n.rpartition(".")[2] == "compile" for n in reads(model, node))


@register
class CompiledStateDict(Rule):
    code = "DDP306"
    triggers = (USES_DISTRIBUTED,)
    name = "compiled-state-dict"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    short = "state_dict of a torch.compile result saved: keys get `_orig_mod.`"
    message = ("the state_dict of a `torch.compile(model)` result is saved: every key gets an `_orig_mod.` "
               "prefix, so the checkpoint does not load into the plain model")
    fix = ("save the original module's weights: `model._orig_mod.state_dict()` (or keep a reference to the "
           "model before compiling), or compile in place with `model.compile()`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not compile_calls(model) or {"_orig_mod", "OptimizedModule"} & model.scan().identifiers:
            return   # the script deals with the prefix itself (strips it on load, unwraps before saving)
        reported: set[int] = set()
        for sink in model.calls:
            if not is_save_sink(model, sink, STRIPS_COMPILE_PREFIX):
                continue
            for sd in saved_state_dicts(model, sink, _told_apart):
                key = dotted_name(sd.receiver)
                if key is None or id(sd.node) in reported:
                    continue
                c = compiled_held(model, sd.receiver, sd.ctx)
                if c is None:
                    continue
                reported.add(id(sd.node))
                original = dotted_name(c.node.args[0].value)
                if original and original != key and c.ctx.function is sd.ctx.function:
                    keep = (f"save `{original}.state_dict()` (the module before compiling: it shares the "
                            "compiled one's parameters)")
                else:
                    keep = f"save `{key}._orig_mod.state_dict()`"
                yield Hit(sd.node, message=(
                    f"`{key}.state_dict()` is saved while `{key}` holds the result of `torch.compile(...)` "
                    f"({where(model, c.node)}): every key gets the prefix `_orig_mod.` (`_orig_mod.fc.weight`), "
                    "so the checkpoint does not load into the plain model (evaluation, export, a run without "
                    "compile) without renaming its keys"
                ), fix=(f"{keep}, or compile in place with `{original or 'model'}.compile()`, which keeps the keys"))
