"""DDP502 late-cuda-visible-devices."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.devices import cuda_initialised_before
from ddpcheck.model.env import env_writes
from ddpcheck.model.launchers import launches_processes_after
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.positions import where
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


@register
class LateCudaVisibleDevices(Rule):
    code = "DDP502"
    triggers = (USES_DISTRIBUTED,)
    name = "late-cuda-visible-devices"
    short = "CUDA_VISIBLE_DEVICES set after CUDA initialised: it has no effect"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    message = ("CUDA_VISIBLE_DEVICES is set after CUDA was initialised: the driver reads it once, at "
               "initialisation, so this assignment changes nothing")
    fix = ("set it before anything touches CUDA (first lines of the script, before `import torch` to be safe), "
           "or on the command line: `CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 train.py`; "
           "inside the script, pick the GPU with `torch.cuda.set_device(local_rank)` instead")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for w in env_writes(model, "CUDA_VISIBLE_DEVICES"):
            init = cuda_initialised_before(model, w.ctx)
            if init is None or launches_processes_after(model, w.ctx) is not None:
                continue
            what = f"`{init.func}(...)`" if init.func else "a `.cuda()`/`.to(device)` call"
            yield Hit(w.node, message=(
                f"CUDA_VISIBLE_DEVICES is set here, but CUDA was already initialised by {what} "
                f"({where(model, init.node)}): the CUDA driver reads the variable once, when it initialises, so "
                "this process keeps the GPUs it saw then: `device_count()`, the device numbering and the GPU "
                "each rank lands on ignore this line"
            ))
