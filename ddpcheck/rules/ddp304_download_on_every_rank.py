"""DDP304 download-on-every-rank."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.downloads import download_call, same_download
from ddpcheck.model.positions import where
from ddpcheck.model.rankfirst import every_rank_at_once, helper_work_at_once
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import LIBRARY_TRAINER, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

_WHY = {
    "data set": ("every rank downloads and extracts the same archive into the same folder at once: the writes "
                 "interleave (a corrupt archive, `RuntimeError: File not found or corrupted`) and a fast rank "
                 "can open files another rank is still writing"),
    "file": ("every rank writes the same file at once: the writes interleave into a corrupt file, and a rank "
             "can read it while another is still writing"),
}


@register
class DownloadOnEveryRank(Rule):
    code = "DDP304"
    triggers = (USES_DISTRIBUTED, LIBRARY_TRAINER)
    name = "download-on-every-rank"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    short = "data set download run by every rank at once"
    message = ("a download runs on every rank at once: N processes write and extract the same archive "
               "into the same folder, and a rank can read a half-written file")
    fix = ("let rank 0 download first: `if rank != 0: dist.barrier()` before it and `if rank == 0: "
           "dist.barrier()` after it (or `with accelerator.main_process_first():`), or download once before "
           "launching and pass `download=False`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not runs_distributed(model):
            return
        for site in model.calls:
            if site.ctx.opaque:
                continue
            what = download_call(model, site)
            if what is not None:
                if same_download(model, site) and every_rank_at_once(model, site, same_download):
                    call = f"`{site.func}(...)`" if site.func else "this download"
                    yield Hit(site.node, message=f"{call} downloads on every rank: {_WHY[what]}")
                continue
            found = helper_work_at_once(model, site, same_download)
            if found is not None:
                helper, inner = found
                yield Hit(site.node, message=(
                    f"`{site.func}(...)` leads to `{inner.func}(...)` ({where(helper, inner.node, model)}), which "
                    f"downloads without ordering the ranks, and this call runs on every rank: {_WHY[download_call(helper, inner) or 'data set']}"))
