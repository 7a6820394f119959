"""DDP104 missing-distributed-sampler."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.epochs import epoch_loops
from ddpcheck.model.evaluation import TRAIN_NAME, is_eval_loader
from ddpcheck.model.flow import consumed_per_epoch
from ddpcheck.model.script import Ctx, FunctionInfo, ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import LoaderInfo, exclusive, is_api_call, loaders, wraps, iterated_keys
from ddpcheck.model.worlds import D0, DN
from ddpcheck.model.reaching import always_runs_before
from ddpcheck.model.wrappers import opposite_arms
from ddpcheck.findings import Severity
from ddpcheck.model.reach import other_ranks_reach
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call

LOCAL_SAMPLERS = ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler")
# Data sets that shard themselves by rank (webdataset, HF `split_dataset_by_node`, `rank=`/`world_size=`
# arguments, `indices[rank::world_size]`).
SHARDING = re.compile(
    r"\b(rank|local_rank|global_rank|world_size|num_replicas|num_shards|shard_id|get_rank|get_world_size"
    r"|split_dataset_by_node|shard|shards|nodesplitter|split_by_node)\b"
)
# Loaders handed to a library that shards them (`accelerator.prepare(...)`, ignite's auto_dataloader).
SHARDING_CALLS = {"prepare", "prepare_data_loader", "auto_dataloader", "setup_dataloaders", "distribute_dataloader"}

UNKNOWN, NONE, LOCAL, DISTRIBUTED = "unknown", "none", "local", "distributed"


def _kind(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None, at: Ctx,
          depth: int = 0) -> str:
    """What a sampler/batch_sampler argument holds at `at`: nothing, a torch
    sampler that does not shard, a DistributedSampler, or something we cannot
    judge (a parameter, a helper we cannot see, a custom sampler class)."""
    if expr is None or (isinstance(expr, cst.Name) and expr.value == "None"):
        return NONE
    if depth > 4:
        return UNKNOWN
    if isinstance(expr, cst.IfExp):
        kinds = {_kind(model, expr.body, scope, at, depth + 1), _kind(model, expr.orelse, scope, at, depth + 1)}
        return _join(kinds)
    if isinstance(expr, cst.Call):
        site = model.site_of.get(id(expr))
        if site is None:
            return UNKNOWN
        if is_api_call(model, site, "DistributedSampler"):
            return DISTRIBUTED
        if is_api_call(model, site, *LOCAL_SAMPLERS):
            return LOCAL
        if is_api_call(model, site, "BatchSampler"):
            inner = _kind(model, site.arg("sampler", 0), scope, site.ctx, depth + 1)
            return LOCAL if inner == NONE else inner
        target = resolve_call(model, site)
        if target is not None and target[1].returns:
            tmodel, fn = target
            return _join({_kind(tmodel, v, fn, ctx, depth + 1) for v, ctx in fn.returns})
        return UNKNOWN
    key = dotted_name(expr)
    if key is None:
        return UNKNOWN
    assigns = [a for a in model.assignments(key, scope)
               if not exclusive(a.ctx, at) and not (a.ctx.function is at.function and a.ctx.order > at.order)]
    if not assigns or any(a.value is None or a.augmented is not None for a in assigns):
        return UNKNOWN
    return _join({_kind(model, a.value, a.ctx.function, at, depth + 1) for a in assigns})


def _join(kinds: set[str]) -> str:
    for k in (UNKNOWN, DISTRIBUTED, LOCAL):
        if k in kinds:
            return k
    return NONE


def _self_sharded(model: ScriptModel, loader: LoaderInfo) -> bool:
    """The data set shards itself, or a library shards the loader."""
    if {"IterableDataset", "wds", "webdataset", "split_dataset_by_node"} & set(model.references):
        return True
    if loader.site.has_keyword("batch_size") and dotted_name(loader.batch_size or cst.Name("x")) == "None":
        return True
    ds = loader.site.arg("dataset", 0)
    scope = loader.site.ctx.function
    seen = 0
    frontier = [ds] if ds is not None else []
    while frontier and seen < 6:
        expr = frontier.pop()
        seen += 1
        if SHARDING.search(model.module.code_for_node(expr)):
            return True
        key = dotted_name(expr)
        if key:
            frontier += [a.value for a in model.assignments(key, scope) if a.value is not None]
    if loader.key:
        for c in model.calls:
            if c.attr in SHARDING_CALLS and any(dotted_name(a.value) == loader.key for a in c.node.args):
                return True
    return False


def _rebound_before_every_pass(model: ScriptModel, key: str, site) -> bool:
    """`data_loader = DataLoader(raw)` for a one-off pass, then `data_loader =
    DataLoader(ds, sampler=DistributedSampler(ds))` before the epoch loop:
    every loop over the name reads the later loader, not this one."""
    scope = site.ctx.function
    reads = [loop for loop in model.loops if loop.ctx.function is scope and loop.is_for
             and loop.ctx.order > site.ctx.order and key in set(iterated_keys(loop.iter))]
    later = [a for a in model.assigns_in(scope) if a.key == key and a.augmented is None
             and a.ctx.order > site.ctx.order]
    return bool(reads) and all(any(a.ctx.order < loop.ctx.order and always_runs_before(a.ctx, loop.ctx) for a in later)
                               for loop in reads)


@register
class MissingDistributedSampler(Rule):
    code = "DDP104"
    name = "missing-distributed-sampler"
    short = "training DataLoader has no DistributedSampler: every rank sees all the data"
    severity = Severity.WARNING
    kinds = NOT_TESTS
    needs_ranks = True
    message = ("the model is wrapped in DistributedDataParallel but the training DataLoader has no "
               "DistributedSampler: every rank iterates the whole data set")
    fix = ("`sampler = DistributedSampler(dataset) if args.distributed else None`; "
           "`DataLoader(dataset, sampler=sampler, shuffle=(sampler is None), ...)`; "
           "`sampler.set_epoch(epoch)` each epoch")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        ddp = [w for w in wraps(model) if w.kind == "DistributedDataParallel"]
        if not ddp:
            return
        for loader in loaders(model):
            site = loader.site
            if loader.samplers or loader.key is None or site.has_star_args:
                continue
            if not (model.worlds(site.ctx) & {D0, DN}):
                continue   # the `else` of `if args.distributed:`: a single process reads everything, rightly
            if all(exclusive(w.site.ctx, site.ctx) or opposite_arms(model, w.site.ctx, site.ctx) for w in ddp):
                continue   # `if opts.dist_mode == "ddp": ... else: <here>`: the loader of the DataParallel/1-GPU arm
            if is_eval_loader(model, loader):
                continue
            if any(other.samplers and other.site.ctx.function is site.ctx.function
                   and exclusive(other.site.ctx, site.ctx) for other in loaders(model)):
                continue   # a builder's other arm shards (`if tag == "train": ... sampler=...`): which runs is the caller's
            scope = site.ctx.function
            if not other_ranks_reach(model, site.ctx) and not any(w.site.ctx.function is scope for w in ddp):
                continue   # a function the script never runs (`inference()`), apart from the training code
            trains = bool(TRAIN_NAME.search(loader.key)) or any(epoch_loops(model, loader.key, scope)) or \
                consumed_per_epoch(model, site)
            if not trains or _rebound_before_every_pass(model, loader.key, site):
                continue
            kinds = {_kind(model, site.arg("sampler", 3), scope, site.ctx),
                     _kind(model, site.arg("batch_sampler", 4), scope, site.ctx)}
            if UNKNOWN in kinds or DISTRIBUTED in kinds:
                continue
            if _self_sharded(model, loader):
                continue
            yield Hit(site.node, message=(
                f"`{loader.key}` feeds a model wrapped in DistributedDataParallel but has no DistributedSampler: "
                "every rank iterates the whole data set, so each epoch does W times the work (and W times the "
                "steps an epoch-based schedule expects) while DDP averages gradients of near-identical batches; "
                "a single GPU would train just as far"
            ), fix=(
                f"shard it: `sampler = DistributedSampler(dataset) if args.distributed else None`, "
                f"`{loader.key} = DataLoader(dataset, sampler=sampler, shuffle=(sampler is None), ...)`, and call "
                "`sampler.set_epoch(epoch)` at the start of each epoch"
            ))
