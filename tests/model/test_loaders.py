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


def test_a_builder_call_written_as_an_argument_is_a_loader_of_its_own():
    m = build("""
        from torch.utils.data import DataLoader, DistributedSampler
        from helpers import make_loader
        def evaluate(model, loader):
            for x in loader:
                model(x)
        def main(model, a, b):
            train_loader = make_loader(a, "train")
            for x in train_loader:
                model(x)
            evaluate(model, make_loader(b, "test"))
        """)
    from ddpcheck.model.values import sharded_held_loaders
    # the builder lives in a module this snippet cannot see: nothing is known, nothing is judged
    assert [h for h in sharded_held_loaders(m) if h.key is None] == []


def test_an_argument_loader_feeds_only_the_call_it_is_written_in(tmp_path):
    (tmp_path / "helpers.py").write_text(
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "def make_loader(ds, mode):\n"
        "    return DataLoader(ds, sampler=DistributedSampler(ds, shuffle=(mode == 'train')))\n")
    main = tmp_path / "train.py"
    main.write_text(
        "from helpers import make_loader\n"
        "def evaluate(model, loader):\n"
        "    for x in loader:\n"
        "        model(x)\n"
        "def main(model, a, b):\n"
        "    train_loader = make_loader(a, 'train')\n"
        "    for x in train_loader:\n"
        "        model(x)\n"
        "    evaluate(model, make_loader(b, 'test'))\n")
    from ddpcheck.model.values import sharded_held_loaders
    from tests.semantics.helpers import build_file
    m = build_file(main, root=tmp_path)
    inline = [h for h in sharded_held_loaders(m) if h.key is None]
    assert len(inline) == 1
    assert {ll.function.name for ll in loader_loops(m, inline[0])} == {"evaluate"}
