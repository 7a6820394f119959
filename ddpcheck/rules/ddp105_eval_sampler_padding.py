"""DDP105 eval-sampler-padding."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ddpcheck.model.evaluation import sharded_when_distributed, is_eval_loader, loader_loops
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.reads import reads
from ddpcheck.model.values import LoaderInfo, loaders
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register

# Loop variables that carry a sample's identity: predictions keyed by them can be de-duplicated.
INDEX_TARGET = re.compile(r"^(idx|idxs|index|indices|indexes|ids|sample_ids?|img_ids?|image_ids?|uids?|keys|names|paths)$")
# Evaluators keyed by image/sample id (pycocotools-style) merge ranks and drop repeats.
KEYED_EVALUATOR = re.compile(r"evaluator|Evaluator")
# `len(data_loader.dataset) != num_processed_samples`: the script checks the count itself (torchvision).
_DATASET_NAME = re.compile(r"dataset|data|ds|set", re.I)


def _counts_samples(model: ScriptModel, test: cst.BaseExpression) -> bool:
    """A test that compares the size of a data set (`len(loader.dataset) != seen`)."""
    stack = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Comparison):
            sides = [node.left, *(c.comparator for c in node.comparisons)]
            while sides:
                side = sides.pop()
                if isinstance(side, cst.BinaryOperation):   # `len(ds) % world_size != 0`
                    sides += [side.left, side.right]
                elif isinstance(side, cst.Call) and dotted_name(side.func) == "len" and side.args and \
                        any(_DATASET_NAME.search(n) for n in reads(model, side.args[0].value)):
                    return True
        elif isinstance(node, cst.BooleanOperation):
            stack += [node.left, node.right]
        elif isinstance(node, cst.UnaryOperation):
            stack.append(node.expression)
    return False


def _aware(model: ScriptModel, loader: LoaderInfo) -> bool:
    """The script de-duplicates or checks the count: loop variables carrying
    sample ids, an id-keyed evaluator, or a test comparing `len(dataset)`
    (next to the loader or in the evaluation function)."""
    scopes = [(model, loader.site.ctx.function)]
    for ll in loader_loops(model, loader):
        m, fn = ll.model, ll.function
        targets = list(ll.loop.targets)
        it = ll.loop.iter
        if isinstance(it, cst.Call) and (dotted_name(it.func) or "") == "enumerate" and targets:
            targets = targets[1:]   # `for i, batch in enumerate(loader)`: i counts batches
        if any(INDEX_TARGET.match(t.rpartition(".")[2].split("[")[0]) for t in targets):
            return True
        scopes.append((m, fn))
    for m, fn in scopes:
        for c in m.calls_in(fn):
            if KEYED_EVALUATOR.search(c.func or "") or KEYED_EVALUATOR.search(c.qual or ""):
                return True
            for b in c.ctx.branches:
                if _counts_samples(m, b.test):
                    return True
    return False


@register
class EvalSamplerPadding(Rule):
    code = "DDP105"
    triggers = (USES_DISTRIBUTED,)
    name = "eval-sampler-padding"
    short = "eval DistributedSampler pads with repeated samples: metrics count them twice"
    severity = Severity.INFO
    kinds = NOT_TESTS
    needs_ranks = True
    message = ("the evaluation loader uses a DistributedSampler without drop_last: it pads the data set with "
               "repeated samples so every rank gets the same count, and metrics count those samples twice")
    fix = ("accept it only when len(dataset) is a multiple of the world size; otherwise gather predictions with "
           "their sample indices and drop repeats, or evaluate the full set on rank 0 with a SequentialSampler")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        reported: set[int] = set()
        for loader in loaders(model) + sharded_when_distributed(model):
            padded = [s for s in loader.samplers if s.drop_last is False]
            if not padded or not is_eval_loader(model, loader):
                continue
            if not loader_loops(model, loader) or _aware(model, loader):
                continue   # consumed only by code we cannot see, or the script handles the repeats
            for s in padded:
                if s.model is model:
                    node = s.site.node
                elif loader.model is model:
                    node = loader.site.node
                elif loader.via is not None:
                    node = loader.via.node   # made by a builder of another module: the call that builds it here
                else:
                    continue
                if id(node) in reported:
                    continue
                reported.add(id(node))
                name = f"`{s.key}`" if s.key else f"The sampler of `{loader.key or 'this loader'}`"
                yield Hit(node, message=(
                    f"{name} is a DistributedSampler over evaluation data without drop_last: when len(dataset) "
                    "is not a multiple of the world size it pads each rank's shard by repeating samples from the "
                    "start (PyTorch's docs: extra indices are added \"to make the data evenly divisible\"), so "
                    "accuracy, loss and counts reduced over the ranks include up to W-1 samples twice"
                ), fix=(
                    "if len(dataset) % world_size == 0 there is nothing to do; otherwise gather the predictions "
                    "with their sample indices and drop the repeats, or evaluate on rank 0 over the full set with "
                    "a SequentialSampler (drop_last=True on the sampler instead leaves samples out)"
                ))
