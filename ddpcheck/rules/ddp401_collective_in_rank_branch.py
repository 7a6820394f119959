"""DDP401 collective-in-rank-branch."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.collectives import Event, function_events, unbalanced
from ddpcheck.model.evaluation import no_grad
from ddpcheck.model.guards import rank_branch_text
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.worlds import describe
from ddpcheck.findings import Severity
from ddpcheck.triggers import COLLECTIVE_UNDER_RANK, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _guard(model: ScriptModel, event: Event) -> str:
    """The `if` that keeps some ranks out, as written."""
    return rank_branch_text(model, event.site.ctx)


@register
class CollectiveInRankBranch(Rule):
    code = "DDP401"
    triggers = (USES_DISTRIBUTED, COLLECTIVE_UNDER_RANK)
    name = "collective-in-rank-branch"
    short = "collective reached by only some ranks: the job hangs"
    severity = Severity.ERROR
    needs_ranks = True
    message = "a collective is reached by only some ranks: the others never join it and the job hangs"
    fix = ("call it on every rank (move it out of the rank test), or pair it: `if rank != 0: dist.barrier()` "
           "before the rank-0 work and `if rank == 0: dist.barrier()` after it")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for fn in [None, *model.functions]:
            for event in unbalanced(function_events(model, fn), model):
                yield self._hit(model, event)

    def _hit(self, model: ScriptModel, e: Event) -> Hit:
        who = describe(e.worlds)
        guard = _guard(model, e)
        if "forward" in e.kinds and e.via is None:
            when = ("the wrapped model has buffers (BatchNorm running statistics or registered buffers), and "
                    "even under no_grad the first forward after a training step broadcasts them from rank 0 "
                    "(broadcast_buffers=True, the default)" if no_grad(model, e.site.ctx) else
                    "with broadcast_buffers=True (the default) DDP broadcasts the module's buffers from rank 0 "
                    "at the start of every forward")
            return Hit(e.site.node, message=(
                f"{e.what} runs on {who} ({guard}): {when}, a collective the other ranks never join, so the "
                "job hangs (or desynchronises with their next forward)"
            ), fix=("evaluate the unwrapped model there (`model.module(x)` / `model_without_ddp`), or run the "
                    "evaluation on every rank and reduce the metrics"))
        if e.via is not None:
            forward = "forward" in e.kinds and e.via.startswith("runs the DDP forward")
            why = ("DDP broadcasts the module's buffers at the start of its forward, a collective"
                   if forward else "a collective")
            return Hit(e.site.node, message=(
                f"{e.what} runs on {who} ({guard}), but it {e.via}: {why} that every rank must join, "
                "and the ranks that skip this call never do, so the job hangs"
            ), fix=("pass the unwrapped model (`model.module` / `model_without_ddp`), or call it on every rank"
                    if forward else
                    "call it on every rank (outside the rank test) and keep only the printing/saving under it"))
        kinds = ", ".join(sorted(e.kinds))
        return Hit(e.site.node, message=(
            f"{e.what} is a collective ({kinds}) that every rank must call, but it is reached by {who} "
            f"({guard}): the ranks that skip it never join, the ones that call it wait for them "
            "forever, and the job hangs until the NCCL timeout"
        ))
