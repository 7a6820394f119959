"""DDP307 makedirs-race."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.makedirs import folder_creation, racy_folder_creation
from ddpcheck.model.positions import where
from ddpcheck.model.rankfirst import every_rank_at_once, helper_work_at_once
from ddpcheck.model.script import ScriptModel
from ddpcheck.rules.autofix import exist_ok_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import LIBRARY_TRAINER, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

_CHECKED = ("the existence check and the creation are not atomic, so several ranks see the folder missing and "
            "create it, and every rank but the first raises FileExistsError")
_BARE = "one rank creates the folder and every other rank raises FileExistsError"


@register
class MakedirsRace(Rule):
    code = "DDP307"
    triggers = (USES_DISTRIBUTED, LIBRARY_TRAINER)
    name = "makedirs-race"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    short = "folder created on every rank without `exist_ok=True`: FileExistsError"
    fixable = True
    message = ("a folder is created on every rank without `exist_ok=True`: the ranks race, and all but the "
               "first raise FileExistsError")
    fix = ("pass `exist_ok=True` (`os.makedirs(d, exist_ok=True)`, `Path(d).mkdir(parents=True, exist_ok=True)`), "
           "or create it on rank 0 only, before a barrier")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not runs_distributed(model):
            return
        for site in model.calls:
            if site.ctx.opaque:
                continue
            if racy_folder_creation(model, site):
                if every_rank_at_once(model, site, racy_folder_creation):
                    found = folder_creation(model, site)
                    call = f"`{site.func}(...)`" if site.func else "this mkdir"
                    yield Hit(site.node, message=(
                        f"{call} runs on every rank without `exist_ok=True`: {_CHECKED if found.checked else _BARE}"),
                        edit=exist_ok_edit(site, found.checked))
                continue
            found = helper_work_at_once(model, site, racy_folder_creation)
            if found is not None:
                helper, inner = found
                made = folder_creation(helper, inner) if racy_folder_creation(helper, inner) else None
                yield Hit(site.node, message=(
                    f"`{site.func}(...)` leads to `{inner.func}(...)` ({where(helper, inner.node, model)}), which "
                    "creates a folder without `exist_ok=True` and without a rank guard, and this call runs on every "
                    f"rank: {_BARE if made is not None and not made.checked else _CHECKED}"))
