"""DDP405 collective-state-dict-in-rank-branch."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.collectives import site_worlds
from ddpcheck.model.guards import rank_branch_text
from ddpcheck.model.script import CallSite, ScriptModel
from ddpcheck.model.sharding import Need, Sharded, call_need, decided_by_callers
from ddpcheck.model.worlds import describe, only_some_ranks
from ddpcheck.triggers import COLLECTIVE_UNDER_RANK, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

_WHY = {
    Sharded.FSDP: "on an FSDP model it all-gathers the sharded parameters (or optimizer state) from every rank",
    Sharded.FSDP2: "with `full_state_dict=True` it all-gathers the sharded parameters from every rank",
    Sharded.DEEPSPEED: "DeepSpeed's `save_checkpoint` writes every rank's shard and synchronises the ranks inside",
    None: "distributed checkpointing plans the save with a gather and a scatter over every rank",
}
_FIX = {
    Sharded.DEEPSPEED: "call `save_checkpoint(...)` on every rank (it decides itself which rank writes what)",
    None: "call it on every rank: it writes each rank's shard itself",
}
_DEFAULT_FIX = ("call it on every rank and guard only the write: `sd = model.state_dict()` (inside `with "
                "FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True, "
                "offload_to_cpu=True)):`), then `if rank == 0: torch.save(sd, path)`")


@register
class CollectiveStateDictInRankBranch(Rule):
    code = "DDP405"
    triggers = (USES_DISTRIBUTED, COLLECTIVE_UNDER_RANK)
    name = "collective-state-dict-in-rank-branch"
    severity = Severity.ERROR
    needs_ranks = True
    short = "sharded checkpoint collective called on rank 0 only: hang"
    message = ("a sharded model's state_dict / checkpoint call is a collective but only rank 0 makes it: "
               "the job hangs")
    fix = _DEFAULT_FIX

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for site in model.calls:
            worlds = site_worlds(model, site)
            if not only_some_ranks(worlds):
                continue
            need = call_need(model, site)
            if need is None:
                continue
            if not need.known:
                fn = site.ctx.function
                need = decided_by_callers(model, fn, need) if fn is not None else None
                if need is None:
                    continue
            yield self._hit(site, need, f"{describe(worlds)} ({rank_branch_text(model, site.ctx)})")

    def _hit(self, site: CallSite, need: Need, who: str) -> Hit:
        kind = need.kind
        call = f"`{site.func}(...)`" if site.func else "this call"
        if need.via:
            inner = need.api + (" (through " + " -> ".join(need.via[1:]) + ")" if len(need.via) > 1 else "")
            what = f"{call} runs on {who}, but it calls {inner}"
        else:
            what = f"{need.api} runs on {who}"
        sharded = f" ({kind.value})" if kind is not None else ""
        return Hit(site.node, message=(
            f"{what}{sharded}, a collective: {_WHY[kind]}, so the ranks that skip it never join and the job "
            "hangs until the NCCL timeout"
        ), fix=(f"call {call} on every rank, outside the rank test, and guard only the file write inside it"
                if need.via else _FIX.get(kind, _DEFAULT_FIX)))
