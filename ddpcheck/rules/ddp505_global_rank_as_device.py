"""DDP505 global-rank-as-device."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.devices import gpu_choices
from ddpcheck.model.names import dotted_name
from ddpcheck.model.positions import where
from ddpcheck.model.ranks import RankKind, rank_origin, ranks_handed_to_helpers
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.worlds import DISTRIBUTED
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.guards import worlds


@register
class GlobalRankAsDevice(Rule):
    code = "DDP505"
    triggers = (USES_DISTRIBUTED,)
    name = "global-rank-as-device"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    short = "global rank used as the GPU index: fails on a second node"
    message = ("the global rank picks the GPU: on one node it equals the local rank, on a second node rank 8 "
               "asks for GPU 8 of a machine that has 8 (\"invalid device ordinal\")")
    fix = ("pick the GPU with the rank local to the node: `local_rank = int(os.environ[\"LOCAL_RANK\"])` "
           "(torchrun sets it), or `rank % torch.cuda.device_count()`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        # one finding per global-rank value and function: `set_device(rank)`, `torch.device("cuda", rank)`
        # and `device_ids=[rank]` are one mistake, fixed once where `rank` is chosen
        groups: dict[tuple, list] = {}
        seen: set[int] = set()
        for choice in sorted(gpu_choices(model), key=lambda c: c.ctx.order):
            if id(choice.node) in seen or not worlds(model, choice.ctx) & DISTRIBUTED:
                continue
            origin = rank_origin(model, choice.index, choice.ctx.function)
            if origin.kind is not RankKind.GLOBAL:
                continue
            seen.add(id(choice.node))
            index = model.module.code_for_node(choice.index)
            groups.setdefault((id(choice.ctx.function), index), []).append((choice, origin))
        yield from self._handed_to_helpers(model)
        for (_, index), found in groups.items():
            choice, origin = found[0]
            text = " ".join(model.module.code_for_node(choice.node).split())
            where = f"`{text}`" if len(text) <= 60 else f"`{choice.how}`"
            if origin.source == f"`{index}`":
                held = ""
            elif dotted_name(choice.index) is not None:
                held = f" (`{index}` comes from {origin.source})"
            else:
                held = f" ({origin.source})"
            also = ""
            if len(found) > 1:
                others = ", ".join(f"`{c.how}`" for c, _ in found[1:4]) + (", ..." if len(found) > 4 else "")
                also = f"; `{index}` picks the GPU again below ({others})"
            yield Hit(choice.node, message=(
                f"{where} picks the GPU with the global rank{held}{also}: that works on one node, where global "
                "and local rank are equal, but on the second node rank 8 asks for GPU 8 of an 8-GPU machine "
                "(\"CUDA error: invalid device ordinal\")"
            ), fix=(f"use the rank local to the node instead of `{index}`: "
                    "`local_rank = int(os.environ[\"LOCAL_RANK\"])` (torchrun and torch.distributed.launch set "
                    "it), or `rank % torch.cuda.device_count()` (SLURM: `SLURM_LOCALID`)"))

    def _handed_to_helpers(self, model: ScriptModel) -> Iterator[Hit]:
        """A call handing the global rank to a helper of another module that picks the GPU with it
        (`run_training(model, args)`, `args.rank = node * gpus + gpu` here, `.cuda(args.rank)` there):
        reported at the call, where the number is chosen."""
        for site in model.calls:
            if not worlds(model, site.ctx) & DISTRIBUTED:
                continue
            handed = [h for h in ranks_handed_to_helpers(model, site) if h.origin.kind is RankKind.GLOBAL]
            if not handed:
                continue
            first = handed[0]
            index = first.model.module.code_for_node(first.choice.index)
            line = first.model.module.code_for_node(first.choice.node)
            at = where(first.model, first.choice.node, model)
            yield Hit(site.node, message=(
                f"`{site.func}(...)` hands the global rank ({first.origin.source}) to {first.model.file_name}, "
                f"where `{' '.join(line.split())[:60]}` ({at}) picks the GPU with `{index}`: that works on one "
                "node, but on the second node rank 8 asks for GPU 8 of an 8-GPU machine (\"CUDA error: invalid "
                "device ordinal\")"
            ), fix=("hand the helper the rank local to the node (`args.gpu`, "
                    "`int(os.environ[\"LOCAL_RANK\"])`) for picking the GPU, and keep the global rank for "
                    "`init_process_group` and samplers"))

