"""DDP303 load-without-map-location."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.memo import query
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.reach import other_ranks_reach
from ddpcheck.model.flow import calls_plain_function, constructs, resolve_call
from ddpcheck.model.loads import LOAD_NEED, TORCH_LOAD, feeds_load_state_dict, judged_load, unmapped_load_in, unmapped_loads
from ddpcheck.model.positions import where as where_in
from ddpcheck.model.reads import strings_in
from ddpcheck.findings import Severity
from ddpcheck.model.launchers import runs_in_launcher_only
from ddpcheck.rules.autofix import map_location_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

@query
def uses_cuda(model: ScriptModel) -> bool:
    """The script puts anything on a GPU (`.cuda()`, `torch.cuda.*`, a
    "cuda"/"nccl" string, `device_ids=`). A CPU-only (gloo) job saves and
    loads CPU tensors: map_location changes nothing there."""
    result = False
    for c in model.calls:
        if c.attr == "cuda" or (c.qual or "").startswith("torch.cuda.") or c.has_keyword("device_ids"):
            result = True
            break
        for a in c.node.args:
            if isinstance(a.value, (cst.SimpleString, cst.FormattedString)) and \
                    any("cuda" in t or "nccl" in t for t in strings_in(a.value)):
                result = True
                break
        if result:
            break
    return result


@register
class LoadWithoutMapLocation(Rule):
    code = "DDP303"
    triggers = (USES_DISTRIBUTED,)
    name = "load-without-map-location"
    short = "torch.load without map_location on every rank: all load onto GPU 0"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    fixable = True
    message = ("torch.load without map_location on every rank: tensors come back on the GPU they were saved "
               "from (usually cuda:0), so every process allocates the checkpoint on GPU 0")
    fix = ('pass `map_location="cpu"` (then `load_state_dict` copies to each rank\'s GPU), or '
           '`map_location=f"cuda:{local_rank}"`')

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        loads = unmapped_loads(model)
        if not runs_distributed(model) or not uses_cuda(model):
            return
        for site in loads:
            if not other_ranks_reach(model, site.ctx):
                continue   # only rank 0 (whose GPU is cuda:0) or only a single process loads
            if runs_in_launcher_only(model, site.ctx):
                continue   # after `mp.spawn(...)` returns (or before it): the launching process, once
            if not judged_load(model, site):
                continue
            what = model.module.code_for_node(site.arg("f", 0)) if site.arg("f", 0) is not None else "..."
            yield Hit(site.node, message=(
                f"`{site.func}({what})` has no map_location and runs on every rank: torch.load puts each tensor "
                "back on the device it was saved from, usually cuda:0 (rank 0's GPU), so every rank allocates a "
                "full copy of the checkpoint on GPU 0 before `load_state_dict` copies it over: GPU 0 runs out of "
                "memory or is slowed down by the other ranks' copies"
            ), fix=(f'load to CPU, as torchvision\'s references do: `{site.func}({what}, map_location="cpu")` '
                    '(or `map_location=f"cuda:{local_rank}"`)'), edit=map_location_edit(model, site))
        yield from self._through_helper_modules(model)

    def _through_helper_modules(self, model: ScriptModel) -> Iterator[Hit]:
        """A call every rank makes into another module of the tree that loads
        weights without a map_location, itself or through the calls it makes:
        an object made of a class whose constructor loads (a model class whose
        `__init__` loads its pretrained weights), or a plain function that
        restores a checkpoint (`load_resume(net, args)` doing `ck =
        torch.load(args.load)` then `net.load_state_dict(ck[...])`). Reported
        at the call, once per load. Method calls on other objects
        (`trainer.load(path)`) are left to that module's own lint."""
        seen: set[int] = set()
        for site in model.calls:
            made = constructs(model, site)
            if not made and not calls_plain_function(model, site):
                continue
            if not other_ranks_reach(model, site.ctx) or runs_in_launcher_only(model, site.ctx):
                continue
            target = resolve_call(model, site, LOAD_NEED)
            if target is None or target[0] is model:
                continue
            found = unmapped_load_in(target[0], target[1], ((model, site),))
            if found is None or id(found[1].node) in seen:
                continue
            if not made and not feeds_load_state_dict(*found):
                continue   # a helper's load of a file that need not hold weights saved from a GPU
            seen.add(id(found[1].node))
            lmodel, load = found
            if runs_distributed(lmodel) and uses_cuda(lmodel) and other_ranks_reach(lmodel, load.ctx):
                continue   # that module's own lint reports the load where it is
            first = load.arg("f", 0)
            what = lmodel.module.code_for_node(first) if first is not None else "..."
            where = where_in(lmodel, load.node, model)
            called = model.module.code_for_node(site.node.func)
            yield Hit(site.node, message=(
                f"`{called}(...)` runs on every rank, and it loads `torch.load({what})` ({where}) with no "
                "map_location: torch.load puts each tensor back on the device it was saved from, usually cuda:0, so "
                "every rank allocates a full copy of the checkpoint on GPU 0 before it is copied over: GPU 0 runs "
                "out of memory or is slowed down by the other ranks' copies"
            ), fix=(f'in {lmodel.file_name}, load to CPU: `torch.load({what}, map_location="cpu")` '
                    '(or `map_location=f"cuda:{local_rank}"`)'))
