"""DDP404 rank-only-exit."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.guards import rank_branch_text
from ddpcheck.model.loopexits import rank_only_exits
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.worlds import describe
from ddpcheck.triggers import COLLECTIVE_UNDER_RANK, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

_LEAVES = {
    "break": "`break` leaves the loop",
    "return": "`return` leaves the function (and its loop)",
    "raise": "`raise` ends the process",
}


@register
class RankOnlyExit(Rule):
    code = "DDP404"
    triggers = (USES_DISTRIBUTED, COLLECTIVE_UNDER_RANK)
    name = "rank-only-exit"
    severity = Severity.ERROR
    needs_ranks = True
    short = "only some ranks leave a loop that runs a collective: hang"
    message = ("only some ranks leave a loop whose iterations run a collective: the others wait in the next "
               "iteration's collective forever")
    fix = ("decide on every rank: compute the flag on rank 0, share it (`stop = torch.tensor(int(flag), "
           "device=device); dist.broadcast(stop, src=0)` or `dist.all_reduce(stop)`), then `if stop.item(): "
           "break` outside the rank test")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for found in rank_only_exits(model):
            e = found.exit
            c = found.collective
            what = c.what if c.via is None else f"{c.what}, which {c.via}"
            loop_line = "this loop" if found.loop is e.ctx.loops[-1] else "the enclosing loop"
            if e.kind in ("raise", "exit"):
                outcome = ("they block there until the launcher notices the dead rank and kills them (torchrun, "
                           "mp.spawn) or, after a clean exit (`sys.exit(0)`) or under launchers that do not, until "
                           "the NCCL timeout")
            else:
                outcome = "the job hangs until the NCCL timeout"
            leaves = _LEAVES[e.kind] if e.kind != "exit" else f"`{model.module.code_for_node(e.node)}` ends the process"
            yield Hit(e.node, message=(
                f"{leaves} on {describe(found.worlds)} ({rank_branch_text(model, e.ctx)}), but every "
                f"iteration of {loop_line} runs {what} on every rank: the ranks that stay start the next "
                f"iteration and wait in its collective for ranks that never come; {outcome}"
            ))
