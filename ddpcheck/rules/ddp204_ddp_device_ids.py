"""DDP204 ddp-device-ids."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.devices import (
    FIXED, PER_RANK, all_ranks_on_one_gpu, backends, init_sites, module_device, only_cpu_backends,
    script_sets_device,
)
from ddpcheck.model.distributed import init_calls
from ddpcheck.model.env import env_writes
from ddpcheck.model.script import ScriptModel, owner_class
from ddpcheck.model.values import wraps
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _cpu_only(model: ScriptModel) -> bool:
    """Every process group the script starts uses gloo/mpi: CPU DDP."""
    sites = [s for c in init_calls(model) for s in init_sites(model, c)]
    return bool(sites) and all(only_cpu_backends(backends(m, s)) for m, s in sites)


@register
class DDPDeviceIds(Rule):
    code = "DDP204"
    triggers = (USES_DISTRIBUTED,)
    name = "ddp-device-ids"
    short = "DDP without `device_ids` and no `set_device`: every rank uses GPU 0"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    message = ("a CUDA model is wrapped in DistributedDataParallel without `device_ids` in a script that never "
               "calls `torch.cuda.set_device`: the current device stays GPU 0 in every process")
    fix = ("call `torch.cuda.set_device(local_rank)` before `init_process_group` and wrap with "
           "`DDP(model, device_ids=[local_rank], output_device=local_rank)`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for w in wraps(model):
            site = w.site
            if w.kind != "DistributedDataParallel" or not (site.qual or "").startswith("torch."):
                continue
            if site.has_star_args or any(a.star == "**" for a in site.node.args):
                continue
            if site.arg("device_ids", 1) is not None:
                continue
            inner = site.arg("module", 0)
            kinds = module_device(model, inner, site.ctx.function, site.ctx.order, owner_class(site.ctx))
            if not kinds or _cpu_only(model):
                continue
            if script_sets_device(model) is not False or env_writes(model, "CUDA_VISIBLE_DEVICES"):
                continue
            if not init_calls(model):
                continue   # the group (and the device next to it) is set up by whoever imports this module
            if PER_RANK not in kinds and FIXED in kinds and all_ranks_on_one_gpu(model) is not None:
                continue   # everything is on GPU 0: DDP503 reports the root cause once
            name = f"`{w.inner}`" if w.inner else "the model"
            yield Hit(site.node, message=(
                f"{name} is on a GPU but `{site.func}(...)` gets no `device_ids` and the script never calls "
                "`torch.cuda.set_device`: the current device stays GPU 0 in every process, so DDP does not move "
                "the inputs to this rank's GPU, and whatever uses the current device (`*_object` collectives, "
                "a bare `.cuda()`, `barrier()`'s best-guess GPU) opens a CUDA context on GPU 0 from every "
                "rank: wasted memory there, and hangs when the guessed GPU is wrong"
            ))
