"""DDP202 wrap-before-load."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import bindings_seen, value_of
from ddpcheck.model.wrappers import wraps_held
from ddpcheck.model.saves import hands_to_state_dict_taker
from ddpcheck.model.wrappers import adds_prefix, loads_own_wrapped_checkpoint, prefix_adapter, strips_prefix
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _saves_wrapper_state(model: ScriptModel, wrap, key: str, scope) -> bool:
    """The script itself takes the wrapper's `state_dict()` (to save it,
    directly or through a checkpoint dict and a helper, or in a function it
    hands the wrapper to: `train(model=model)` in `train.py`): its checkpoints
    carry the `module.` prefix, so loading them back into the wrapper is
    consistent (DDP302 reports the save instead)."""
    return any(
        c.attr == "state_dict" and c.receiver is not None
        and any(a.site is wrap.site for a in value_of(model, c.receiver).made)
        for c in model.calls
    ) or hands_to_state_dict_taker(model, key, wrap.order, scope)


def _prefix_handled(model: ScriptModel, site) -> bool:
    """The state dict loaded is renamed for the plain model on some path
    (`if not args.distributed and ...startswith("module"): sd = {k[7:]: v ...}`):
    the author knows which checkpoints carry the prefix and when; or its keys
    were given the prefix (`{"module." + k: v ...}`): made for the wrapper."""
    loaded = site.arg("state_dict", 0)
    if loaded is None:
        return False
    if adds_prefix(model, loaded, site.ctx.function):
        return True
    if dotted_name(loaded) is None:
        return False
    return any(a.kind == "assign" and a.value is not None and strips_prefix(model, a.value, a.ctx.function)
               for a in bindings_seen(model, loaded))


@register
class WrapBeforeLoad(Rule):
    code = "DDP202"
    triggers = (USES_DISTRIBUTED,)
    name = "wrap-before-load"
    short = "weights loaded into the DDP/DataParallel wrapper instead of the model"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    message = "weights are loaded into the DataParallel/DDP wrapper instead of the model it wraps"
    fix = "load the weights before wrapping, or load into `model.module` (keep a `model_without_ddp = model.module`)"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for site in model.calls:
            if site.attr != "load_state_dict" or site.receiver is None:
                continue
            key = dotted_name(site.receiver)
            if key is None or key.endswith(".module") or _prefix_handled(model, site):
                continue
            held = wraps_held(model, value_of(model, site.receiver), site.ctx)
            if not held:
                continue
            w = held[0]
            loaded = site.arg("state_dict", 0)
            if w.overrides("load_state_dict") or _saves_wrapper_state(model, w, key, site.ctx.function) or \
                    prefix_adapter(model, w) or \
                    (loaded is not None and loads_own_wrapped_checkpoint(model, loaded)):
                continue   # the wrapper only matches a checkpoint's `module.` keys and is unwrapped,
                # or the checkpoint is one the project wrote from a wrapper (keys with `module.`)
            silent = getattr(site.arg("strict", 1), "value", None) == "False"
            consequence = (
                "with strict=False nothing matches and the weights are silently NOT loaded"
                if silent else
                "a plain checkpoint's keys lack the `module.` prefix the wrapper expects, so loading "
                "fails with missing/unexpected keys"
            )
            yield Hit(site.node, message=(
                f"`{key}` is already wrapped in {w.kind} when its weights are loaded: {consequence}"
            ))
