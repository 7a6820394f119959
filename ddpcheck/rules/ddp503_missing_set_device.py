"""DDP503 missing-set-device."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.devices import all_ranks_on_one_gpu
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.positions import where
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


@register
class MissingSetDevice(Rule):
    code = "DDP503"
    triggers = (USES_DISTRIBUTED,)
    name = "missing-set-device"
    short = "NCCL without `torch.cuda.set_device`: every rank uses GPU 0"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    message = ("an NCCL process group is started without `torch.cuda.set_device(local_rank)` while tensors "
               "go to a bare \"cuda\": every rank uses GPU 0")
    fix = ("pick each process's GPU before anything touches CUDA: "
           "`local_rank = int(os.environ[\"LOCAL_RANK\"]); torch.cuda.set_device(local_rank)` right before "
           "`init_process_group` (or pass `device_id=torch.device(\"cuda\", local_rank)`), and wrap with "
           "`DDP(model, device_ids=[local_rank])`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        found = all_ranks_on_one_gpu(model)
        if found is None:
            return
        init, placed = found
        what = f"`{placed.func}(...)`" if placed.func else "`.cuda()`/`.to(\"cuda\")`"
        yield Hit(init.node, message=(
            f"`{init.func}(...)` starts an NCCL process group, but no process selects its own GPU "
            f"(no `torch.cuda.set_device`, no `device_id=`) and {what} ({where(model, placed.node)}) puts "
            "tensors on the current device, which is GPU 0 in every process: all ranks pile onto GPU 0 "
            "(out of memory, or NCCL's \"Duplicate GPU detected\") while the other GPUs idle"
        ))
