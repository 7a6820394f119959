"""DDP307 makedirs-race."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.makedirs import folder_creation, same_folder_creation
from ddpcheck.model.paths import per_rank_path
from ddpcheck.model.rankfirst import every_rank_at_once
from ddpcheck.model.script import ScriptModel
from ddpcheck.rules.base import Hit, Rule, register


@register
class MakedirsRace(Rule):
    code = "DDP307"
    name = "makedirs-race"
    severity = Severity.WARNING
    message = ("a folder is created on every rank without `exist_ok=True`: the ranks race, and all but the "
               "first raise FileExistsError")
    fix = ("pass `exist_ok=True` (`os.makedirs(d, exist_ok=True)`, `Path(d).mkdir(parents=True, exist_ok=True)`), "
           "or create it on rank 0 only, before a barrier")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not runs_distributed(model):
            return
        for site in model.calls:
            found = folder_creation(model, site)
            if found is None or site.ctx.opaque or per_rank_path(model, found.path, site.ctx.function):
                continue
            if not every_rank_at_once(model, site, same_folder_creation):
                continue
            call = f"`{site.func}(...)`" if site.func else "this mkdir"
            if found.checked:
                why = ("the existence check and the creation are not atomic, so several ranks see the folder "
                       "missing and create it, and every rank but the first raises FileExistsError")
            else:
                why = "one rank creates the folder and every other rank raises FileExistsError"
            yield Hit(site.node, message=f"{call} runs on every rank without `exist_ok=True`: {why}")
