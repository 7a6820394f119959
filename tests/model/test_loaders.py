"""Loaders a builder returns (model/values.py held_loaders), the loops that
consume each holder's loader (model/evaluation.py), and metric objects that
keep a running value (model/metrics.py)."""

from __future__ import annotations

from ddpcheck.model.evaluation import loader_loops
from ddpcheck.model.metrics import accumulating_object
from ddpcheck.model.values import held_loaders, held_sharded_for_sure
from tests.semantics.helpers import build, marked

BUILDER = """
    from torch.utils.data import DataLoader, DistributedSampler
    def make_loader(ds, mode):
        return DataLoader(ds, sampler=DistributedSampler(ds, shuffle=(mode == "train")))
    def pick_loader(ds, mode):
        if mode == "train":
            return DataLoader(ds, sampler=DistributedSampler(ds))
        return DataLoader(ds, shuffle=False)
    def evaluate(model, loader):
        for x in loader:
            model(x)
    def main(model):
        train_loader = make_loader(a, "train")
        val_loader = make_loader(b, "val")
        for x in train_loader:
            model(x)
        evaluate(model, val_loader)
        other = pick_loader(b, "val")
        evaluate(model, other)
    """


def test_one_builder_called_twice_gives_each_holder_its_loader_and_its_loops():
    m = build(BUILDER)
    held = {h.key: h for h in held_loaders(m)}
    assert {"train_loader", "val_loader", "other"} <= set(held)
    assert held["train_loader"].site is held["val_loader"].site   # one allocation site, two holders
    val_loops = {ll.function.name for ll in loader_loops(m, held["val_loader"])}
    train_loops = {ll.function.name for ll in loader_loops(m, held["train_loader"])}
    assert val_loops == {"evaluate"}
    assert train_loops == {"main"}


def test_a_holder_is_sharded_for_sure_only_when_every_path_gives_it_a_distributed_sampler():
    m = build(BUILDER)
    held = {h.key: h for h in held_loaders(m)}
    assert held_sharded_for_sure(m, held["val_loader"])
    # pick_loader chooses its loader by the argument: which one `other` gets is not known here
    assert not any(held_sharded_for_sure(m, h) for h in held_loaders(m) if h.key == "other")


def test_metric_objects_that_keep_a_running_value():
    code = """
        class TopK:
            def __call__(self, logits, labels):
                self.hits += 1
        class Scorer:
            def __call__(self, logits, labels):
                return logits.argmax(1) == labels
        class Summed:
            def update(self, v):
                self._add(v)
            def _add(self, v):
                self.values.append(v)
        scores = {"top1": [TopK(), "top-1"]}
        use(scores["top1"][0])
        use(Scorer())
        use(Summed())
        """
    m = build(code)
    assert accumulating_object(m, marked(m, nth=0)[0], "__call__")
    assert not accumulating_object(m, marked(m, nth=1)[0], "__call__")   # returns a value, keeps nothing
    assert accumulating_object(m, marked(m, nth=2)[0], "update")
