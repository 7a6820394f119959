"""DDP303 load-without-map-location."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.distributed import runs_distributed
from ddpcheck.model.memo import query
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.reach import other_ranks_reach
from ddpcheck.model.values import exclusive
from ddpcheck.model.flow import names_behind
from ddpcheck.model.reads import reads, reads_name, strings_in
from ddpcheck.findings import Severity
from ddpcheck.model.launchers import runs_in_launcher_only
from ddpcheck.rules.autofix import map_location_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

TORCH_LOAD = ("torch.load", "torch.serialization.load")


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


WEIGHTS = re.compile(
    r"ckpt|checkpoint|resume|pretrain|weight|snapshot|state|model|best|last|latest|teacher|student|ema"
    r"|backbone|encoder|decoder|generator|discriminator|net\b|\.pth|\.tar|\.bin|\.safetensors", re.I)


def _looks_like_weights(model: ScriptModel, site) -> bool:
    """The load is a checkpoint or weights (what a GPU run saves from cuda:0),
    not a data file (`features = torch.load(cached_features_file)`): it feeds
    `load_state_dict`, or the path, the name it is stored in or the function it
    is in says so."""
    stmt = site.stmt
    if any(c.attr == "load_state_dict" and c.stmt is stmt for c in model.calls_in(site.ctx.function)):
        return True
    first = site.arg("f", 0)
    texts = [*names_behind(model, first), *strings_in(first)] if first is not None else []
    keys = [a.key for a in model.assigns_in(site.ctx.function) if a.value is not None and any(v is site.node for v in _values(a.value))]
    texts += keys
    if site.ctx.function is not None:
        texts.append(site.ctx.function.name)
    if any(WEIGHTS.search(t) for t in texts):
        return True
    for key in keys:   # `sd = torch.load(p)` ... `model.load_state_dict(sd)`
        for c in model.calls_in(site.ctx.function):
            if c.attr == "load_state_dict" and any(
                    reads_name(reads(model, a.value), key) for a in c.node.args):
                return True
    return False


def _values(expr) -> list:
    """The expression and the calls it is made of (`torch.load(p)["model"]`)."""
    out = [expr]
    while isinstance(expr, (cst.Subscript, cst.Attribute)) or (
            isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        expr = expr.value if not isinstance(expr, cst.Call) else expr.func.value
        out.append(expr)
    return out


def _mapped_in_other_arm(model: ScriptModel, site, mapped) -> bool:
    """`if args.gpu is None: ckpt = torch.load(p) else: ckpt = torch.load(p, map_location=loc)`
    (the ImageNet example): the author maps where the process owns one GPU and
    chose not to in the other arm."""
    first = site.arg("f", 0)
    for m in mapped:
        other = m.arg("f", 0)
        if exclusive(site.ctx, m.ctx) and other is not None and first is not None and other.deep_equals(first):
            return True
    return False


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
        loads = [s for s in model.calls if s.qual in TORCH_LOAD
                 and not s.has_star_args and s.arg("map_location", 1) is None]
        if not loads or not runs_distributed(model) or not uses_cuda(model):
            return
        mapped = [s for s in model.calls if s.qual in TORCH_LOAD and s.arg("map_location", 1) is not None]
        for site in loads:
            if not other_ranks_reach(model, site.ctx):
                continue   # only rank 0 (whose GPU is cuda:0) or only a single process loads
            if runs_in_launcher_only(model, site.ctx):
                continue   # after `mp.spawn(...)` returns (or before it): the launching process, once
            if _mapped_in_other_arm(model, site, mapped) or not _looks_like_weights(model, site):
                continue
            what = model.module.code_for_node(site.arg("f", 0)) if site.arg("f", 0) is not None else "..."
            yield Hit(site.node, message=(
                f"`{site.func}({what})` has no map_location and runs on every rank: torch.load puts each tensor "
                "back on the device it was saved from, usually cuda:0 (rank 0's GPU), so every rank allocates a "
                "full copy of the checkpoint on GPU 0 before `load_state_dict` copies it over: GPU 0 runs out of "
                "memory or is slowed down by the other ranks' copies"
            ), fix=(f'load to CPU, as torchvision\'s references do: `{site.func}({what}, map_location="cpu")` '
                    '(or `map_location=f"cuda:{local_rank}"`)'), edit=map_location_edit(model, site))
