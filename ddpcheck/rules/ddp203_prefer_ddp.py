"""DDP203 prefer-ddp."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.filekind import SCRIPTS_ONLY, has_main_guard
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.values import wraps
from ddpcheck.model.wrappers import prefix_adapter
from ddpcheck.findings import Severity
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _never_trains(model: ScriptModel) -> bool:
    """A script run on its own (`if __name__ == "__main__":`) that never
    runs a backward pass, a trainer's fit or anything named for training
    (`train(model, args)`): it validates, predicts or extracts features. (A
    helper module is judged as part of the scripts that call it.)"""
    return has_main_guard(model) and not any(
        c.attr in ("backward", "fit") or "train" in (c.attr or "").lower() for c in model.calls)


@register
class PreferDDP(Rule):
    code = "DDP203"
    triggers = (USES_DISTRIBUTED,)
    name = "prefer-ddp"
    short = "nn.DataParallel: prefer DistributedDataParallel (one process per GPU)"
    severity = Severity.INFO
    kinds = SCRIPTS_ONLY
    message = (
        "nn.DataParallel runs one process with one thread per GPU: the Python side is bound by the GIL, "
        "the model is replicated to every GPU on every forward, and inputs are scattered from and outputs "
        "gathered on GPU 0 every step, so GPU 0 runs out of memory first and the others wait; PyTorch "
        "recommends DistributedDataParallel instead, even on a single machine"
    )
    fix = ("use DistributedDataParallel: one process per GPU started by `torchrun --nproc_per_node=N train.py`, "
           "`dist.init_process_group(\"nccl\")`, `DDP(model.to(local_rank), device_ids=[local_rank])` and a "
           "DistributedSampler for the training data")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        all_wraps = wraps(model)
        if any(w.kind == "DistributedDataParallel" for w in all_wraps):
            return   # DataParallel is the script's fallback next to a DDP path: the author already chose
        if _never_trains(model):
            return   # inference or feature extraction: nothing to all-reduce, DDP is not the alternative
        for w in all_wraps:
            if w.kind != "DataParallel" or prefix_adapter(model, w):
                continue   # a wrapper only used to load `module.`-prefixed weights runs nothing
            name = w.site.func or "nn.DataParallel"
            yield Hit(w.site.node, message=(
                f"`{name}(...)` trains with DataParallel: one process drives all GPUs with one thread each, "
                "bound by the GIL; every forward replicates the model to each GPU, scatters the batch from "
                "GPU 0 and gathers the outputs back on GPU 0, so GPU 0 holds more memory than the others and "
                "the step is slower than with DistributedDataParallel, which PyTorch recommends even on one machine"
            ))
