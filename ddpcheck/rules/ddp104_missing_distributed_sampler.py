"""DDP104 missing-distributed-sampler."""

from __future__ import annotations

import re
from typing import Iterator


from ddpcheck.model.evaluation import TRAIN_NAME, is_eval_loader, loader_loops
from ddpcheck.model.flow import (
    Const, Made, Value, call_argument, called_name, consumed_per_epoch, instance_of, names_behind, resolved, value_of,
)
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.values import LoaderInfo, exclusive, loaders, wraps
from ddpcheck.model.wrappers import loaders_trained_through_calls
from ddpcheck.model.positions import line_of
from ddpcheck.model.worlds import D0, DN
from ddpcheck.findings import Severity
from ddpcheck.model.reach import other_ranks_reach
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.guards import worlds

LOCAL_SAMPLERS = ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler")
# Data sets that shard themselves by rank (webdataset, HF `split_dataset_by_node`, `rank=`/`world_size=`
# arguments, `indices[rank::world_size]`).
SHARDING = re.compile(
    r"rank|local_rank|global_rank|world_size|num_replicas|num_shards|shard_id|get_rank|get_world_size"
    r"|split_dataset_by_node|shard|shards|nodesplitter|split_by_node"
)
# Loaders handed to a library that shards them (`accelerator.prepare(...)`, ignite's auto_dataloader).
SHARDING_CALLS = {"prepare", "prepare_data_loader", "auto_dataloader", "setup_dataloaders", "distribute_dataloader"}

KIND_UNKNOWN, KIND_NONE, KIND_LOCAL, KIND_DISTRIBUTED = "unknown", "none", "local", "distributed"


def _kind(model: ScriptModel, value: Value | None) -> str:
    """What a sampler/batch_sampler argument holds: nothing, a torch sampler
    that does not shard, a DistributedSampler, or something the engine cannot
    judge (a parameter, a helper it cannot see, a custom sampler class)."""
    if value is None:
        return KIND_NONE
    kinds = set()
    for atom in resolved(model, value).atoms:
        if isinstance(atom, Const) and atom.value is None:
            kinds.add(KIND_NONE)
        elif isinstance(atom, Made) and instance_of(atom, "DistributedSampler"):
            kinds.add(KIND_DISTRIBUTED)
        elif isinstance(atom, Made) and atom.is_api(*LOCAL_SAMPLERS):
            kinds.add(KIND_LOCAL)
        elif isinstance(atom, Made) and atom.is_api("BatchSampler"):
            inner = _kind(atom.model, call_argument(atom.model, atom.site, "sampler", 0))
            kinds.add(KIND_LOCAL if inner == KIND_NONE else inner)
        else:
            kinds.add(KIND_UNKNOWN)
    return _join(kinds)


def _join(kinds: set[str]) -> str:
    for k in (KIND_UNKNOWN, KIND_DISTRIBUTED, KIND_LOCAL):
        if k in kinds:
            return k
    return KIND_NONE


def _self_sharded(model: ScriptModel, loader: LoaderInfo) -> bool:
    """The data set shards itself, or a library shards the loader."""
    if {"IterableDataset", "wds", "webdataset", "split_dataset_by_node"} & set(model.references):
        return True
    batch = call_argument(model, loader.site, "batch_size", 1)
    if batch is not None and batch.constant is None:
        return True   # `batch_size=None`: the data set yields whole batches (sharded upstream)
    ds = loader.site.arg("dataset", 0)
    if ds is not None and any(SHARDING.fullmatch(n.rpartition(".")[2].split("[")[-1].strip("'\"]"))
                              for n in names_behind(model, ds)):
        return True
    atom = Made(model, loader.site)
    for c in model.calls:
        if called_name(model, c) in SHARDING_CALLS and any(
                not a.star and atom in value_of(model, a.value).atoms for a in c.node.args):
            return True
    return False


def _rebound_before_every_pass(model: ScriptModel, loader: LoaderInfo) -> bool:
    """`data_loader = DataLoader(raw)` for a one-off look, then `data_loader =
    DataLoader(ds, sampler=DistributedSampler(ds))` before the epoch loop:
    the loops iterate the later loader, never this one."""
    later = [other for other in loaders(model) if other is not loader and other.key == loader.key
             and other.site.ctx.function is loader.site.ctx.function and other.site.ctx.order > loader.site.ctx.order]
    return bool(later) and not loader_loops(model, loader) and any(loader_loops(model, o) for o in later)


@register
class MissingDistributedSampler(Rule):
    code = "DDP104"
    triggers = (USES_DISTRIBUTED,)
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
            if not _unsharded_training_loader(model, loader, ddp):
                continue
            scope = site.ctx.function
            if not other_ranks_reach(model, site.ctx) and not any(w.site.ctx.function is scope for w in ddp):
                continue   # a function the script never runs (`inference()`), apart from the training code
            trains = bool(TRAIN_NAME.search(loader.key)) or consumed_per_epoch(model, site)
            if not trains or _rebound_before_every_pass(model, loader):
                continue
            yield Hit(site.node, message=(
                f"`{loader.key}` feeds a model wrapped in DistributedDataParallel but has no DistributedSampler: "
                f"{_WHY}"), fix=_fix(loader.key))
        for call, loader in loaders_trained_through_calls(model):
            if not other_ranks_reach(model, call.ctx) or all(exclusive(w.site.ctx, call.ctx) for w in ddp) or \
                    not _unsharded_training_loader(loader.model, loader, ()):
                continue
            yield Hit(call.node, message=(
                f"`{call.func}(...)` ({loader.model.file_name}) trains the DistributedDataParallel model passed here "
                f"on `{loader.key}`, a DataLoader it makes (line {line_of(loader.model, loader.site.node)}) "
                f"with no DistributedSampler: {_WHY}"), fix=_fix(loader.key))


_WHY = ("every rank iterates the whole data set, so each epoch does W times the work (and W times the "
        "steps an epoch-based schedule expects) while DDP averages gradients of near-identical batches; "
        "a single GPU would train just as far")


def _fix(key: str) -> str:
    return (f"shard it: `sampler = DistributedSampler(dataset) if args.distributed else None`, "
            f"`{key} = DataLoader(dataset, sampler=sampler, shuffle=(sampler is None), ...)`, and call "
            "`sampler.set_epoch(epoch)` at the start of each epoch")


def _unsharded_training_loader(model: ScriptModel, loader: LoaderInfo, ddp) -> bool:
    """A loader of `model` with no sampler that shards, not an evaluation
    loader, in the arm that runs distributed (`ddp`: the wraps of its file,
    whose other arm it must not be in)."""
    site = loader.site
    if loader.samplers or loader.key is None:
        return False
    if not (worlds(model, site.ctx) & {D0, DN}):
        return False   # the `else` of `if args.distributed:`: a single process reads everything, rightly
    if ddp and all(exclusive(w.site.ctx, site.ctx) for w in ddp):
        return False   # `if opts.dist_mode == "ddp": ... else: <here>`: the loader of the DataParallel/1-GPU arm
    if is_eval_loader(model, loader):
        return False
    if any(other.samplers and other.site.ctx.function is site.ctx.function
           and exclusive(other.site.ctx, site.ctx) for other in loaders(model)):
        return False   # a builder's other arm shards (`if tag == "train": ... sampler=...`): which runs is the caller's
    kinds = {_kind(model, call_argument(model, site, "sampler", 3)),
             _kind(model, call_argument(model, site, "batch_sampler", 4))}
    if KIND_UNKNOWN in kinds or KIND_DISTRIBUTED in kinds:
        return False
    return not _self_sharded(model, loader)
