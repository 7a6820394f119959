"""Value flow (model/flow.py): what a name, parameter, attribute or loop holds,
followed through calls, returns, generators and objects."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst

from ddpcheck.model.project import Project
from ddpcheck.model.flow import Made, Opaque, Param, every_pass, iterated, value_at, value_of
from ddpcheck.settings import LintSettings

SETTINGS = LintSettings(enabled=frozenset())


def build(code: str, path: str = "t.py"):
    model = Project(SETTINGS).build(path, cst.parse_module(textwrap.dedent(code)))
    return model


def read(model, marker: str = "marker"):
    """The first argument of the call `marker(x)`, and the function it is in."""
    site = next(c for c in model.calls if c.func == marker)
    return site.node.args[0].value, site.ctx.function


def made_names(value) -> set[str]:
    return {a.site.func for a in value.made}


def test_assignment_either_or_keeps_both_arms():
    m = build("""
        import torch.utils.data as data
        def data_sampler(dataset, shuffle, distributed):
            if distributed:
                return data.distributed.DistributedSampler(dataset, shuffle=shuffle)
            return data.RandomSampler(dataset)
        sampler = data_sampler(ds, True, args.distributed)
        marker(sampler)
    """)
    v = value_at(m, *read(m))
    assert made_names(v) == {"data.distributed.DistributedSampler", "data.RandomSampler"}
    assert len(v.made_by("DistributedSampler")) == 1
    assert v.known


def test_tuple_return_unpacked_by_the_caller():
    m = build("""
        from torch.utils.data import DataLoader, DistributedSampler
        def build_loader(args):
            sampler = DistributedSampler(ds)
            return DataLoader(ds, sampler=sampler, batch_size=args.bs), sampler
        def main(args):
            loader, sampler = build_loader(args)
            marker(loader)
            marker2(sampler)
    """)
    assert made_names(value_at(m, *read(m))) == {"DataLoader"}
    assert made_names(value_at(m, *read(m, "marker2"))) == {"DistributedSampler"}


def test_parameter_is_symbolic_then_resolved_through_callers():
    m = build("""
        from torch.utils.data import DataLoader
        def train(model, loader, opt):
            marker(loader)
        def main():
            train(net, DataLoader(ds), opt)
            train(net, loader=DataLoader(other), opt=opt)
    """)
    expr, scope = read(m)
    raw = value_of(m, expr, scope)
    assert [type(a) for a in raw.atoms] == [Param] and raw.params[0].name == "loader"
    assert len(value_at(m, expr, scope).made_by("DataLoader")) == 2


def test_parameter_of_a_function_handed_away_stays_unknown():
    m = build("""
        import torch.multiprocessing as mp
        def main_worker(gpu, loader):
            marker(loader)
        mp.spawn(main_worker, args=(loader,))
    """)
    v = value_at(m, *read(m))
    assert not v.known and v.params


def test_default_and_star_args():
    m = build("""
        from torch.utils.data import DataLoader
        def train(loader=DataLoader(ds)):
            marker(loader)
        train()
    """)
    assert made_names(value_at(m, *read(m))) == {"DataLoader"}
    m = build("""
        def train(loader):
            marker(loader)
        train(*parts)
    """)
    assert not value_at(m, *read(m)).known


def test_self_attribute_across_methods_and_constructor_arguments():
    m = build("""
        from torch.utils.data import DataLoader
        class Trainer:
            def __init__(self, model, train_data):
                self.train_data = train_data
            def _run_epoch(self):
                marker(self.train_data)
        Trainer(net, DataLoader(ds))
    """)
    assert made_names(value_at(m, *read(m))) == {"DataLoader"}


def test_namespace_attribute_set_in_another_function():
    m = build("""
        from torch.utils.data import DataLoader
        def setup(config):
            config.loader = DataLoader(ds)
        def train(config):
            marker(config.loader)
    """)
    assert made_names(value_at(m, *read(m))) == {"DataLoader"}


def test_reassignment_reads_the_earlier_value():
    m = build("""
        def sample_data(loader):
            while True:
                for batch in loader:
                    yield batch
        def train(loader):
            loader = sample_data(loader)
            marker(loader)
    """)
    v = value_of(m, *read(m))
    assert made_names(v) == {"sample_data"}
    consumed = iterated(m, *read(m))
    assert [a.name for a in consumed.params] == ["loader"]
    assert consumed.params[0].fn.name == "train"


def test_iteration_wrappers_and_non_iterating_calls():
    m = build("""
        import itertools
        from torch.utils.data import DataLoader
        loader = DataLoader(ds)
        marker(enumerate(tqdm(loader)))
        marker2(itertools.cycle(loader))
        marker3(range(len(loader)))
    """)
    for name in ("marker", "marker2"):
        assert iterated(m, *read(m, name)).made_by("DataLoader"), name
    assert not iterated(m, *read(m, "marker3")).made_by("DataLoader")


def test_yield_from_generator():
    m = build("""
        from torch.utils.data import DataLoader
        def batches(loader):
            yield from loader
        loader = DataLoader(ds)
        marker(batches(loader))
    """)
    assert iterated(m, *read(m)).made_by("DataLoader")


def test_cycle_answers_without_looping():
    m = build("""
        a = b
        b = a
        marker(a)
    """)
    v = value_at(m, *read(m))
    assert all(isinstance(x, Opaque) for x in v.atoms) or not v.atoms


def test_passes_carry_the_loader_up_to_the_epoch_loop():
    m = build("""
        from torch.utils.data import DataLoader
        def train_one_epoch(model, data_loader):
            for step, batch in enumerate(data_loader):
                model(batch)
        def main():
            loader = DataLoader(ds)
            for epoch in range(10):
                train_one_epoch(net, loader)
    """)
    found = [(fn.name if fn else None, p) for fn, p in every_pass(m) if p.consumed.made_by("DataLoader")]
    epochs = [(fn, p.via[0].func) for fn, p in found if p.epoch is not None]
    assert epochs == [("main", "train_one_epoch")]


def test_value_crosses_into_a_helper_module(tmp_path: Path):
    (tmp_path / "engine.py").write_text(textwrap.dedent("""
        def train(model, loader, opt):
            for x, y in loader:
                opt.step()
    """))
    (tmp_path / "data.py").write_text(textwrap.dedent("""
        from torch.utils.data import DataLoader, DistributedSampler
        def build_loader(args):
            sampler = DistributedSampler(ds)
            return DataLoader(ds, sampler=sampler), sampler
    """))
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent("""
        from data import build_loader
        from engine import train
        loader, sampler = build_loader(args)
        for epoch in range(3):
            train(net, loader, opt)
    """))
    m = build(main.read_text(), str(main))
    epochs = [p for _, p in every_pass(m) if p.epoch is not None and p.consumed.made_by("DataLoader")]
    assert len(epochs) == 1
    assert epochs[0].epoch_model is m and epochs[0].loop_model is not m
    loader_atom = epochs[0].consumed.made_by("DataLoader")[0]
    assert isinstance(loader_atom, Made) and loader_atom.model.path.endswith("data.py")


def test_dict_entries_and_namespace_keys():
    m = build("""
        from torch.utils.data import DataLoader
        def build(cfg):
            loaders = {"train": DataLoader(train_set), "val": DataLoader(val_set)}
            cfg["sampler"] = DistributedSampler(train_set)
            return loaders
        def fit(cfg):
            loaders = build(cfg)
            marker(loaders["train"])
            marker2(cfg["sampler"])
    """)
    expr, scope = read(m)
    v = value_at(m, expr, scope)
    assert len(v.made) == 1 and v.made[0].site.node.args[0].value.value == "train_set"
    assert made_names(value_at(m, *read(m, "marker2"))) == {"DistributedSampler"}


def test_library_managed_loader_is_not_followed():
    m = build("""
        from torch.utils.data import DataLoader
        loader = accelerator.prepare(DataLoader(ds))
        marker(loader)
    """)
    consumed = iterated(m, *read(m))
    assert not consumed.made_by("DataLoader") and not consumed.known


def test_iter_remade_and_drained_with_next_is_a_pass_but_a_peek_is_not():
    m = build("""
        from torch.utils.data import DataLoader
        loader = DataLoader(ds)
        it = iter(loader)
        for step in range(1000):
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
        for _ in range(3):
            peek = iter(DataLoader(other))
    """)
    found = [p for _, p in every_pass(m) if p.epoch is not None]
    assert len(found) == 1 and found[0].iter_call is not None
    assert found[0].consumed.made_by("DataLoader")[0].site.node.args[0].value.value == "ds"


def test_a_constructor_call_holds_the_new_object_though_it_runs_init():
    # resolve_call lands `Meter()` in `Meter.__init__` (which returns nothing);
    # the value is still the object made there, also through a dict entry
    m = build("""
        class Meter:
            def __init__(self):
                self.sum = 0
        def evaluate():
            meters = {"loss": Meter()}
            marker(meters["loss"])
            marker2(Meter())
    """)
    for fn_name in ("marker", "marker2"):
        expr, scope = read(m, fn_name)
        assert made_names(value_of(m, expr, scope)) == {"Meter"}


def test_a_loop_reached_along_many_call_paths_is_one_pass_per_first_call():
    # every level calls the next twice: 2**12 paths reach the same loop
    levels = [f"def level{i}(loader):\n    level{i + 1}(loader)\n    level{i + 1}(loader)\n" for i in range(12)]
    m = build("from torch.utils.data import DataLoader\n" + "".join(levels) + textwrap.dedent("""
        def level12(loader):
            for batch in loader:
                pass
        def main():
            loader = DataLoader(ds)
            for epoch in range(10):
                level0(loader)
    """))
    found = [(fn.name if fn else None, p) for fn, p in every_pass(m)]
    top = [p for fn, p in found if fn == "main"]
    assert top and all(p.consumed.made_by("DataLoader") and p.epoch is not None for p in top)
    assert {p.via[0].func for p in top} == {"level0"} and {len(p.via) for p in top} == {13}
    assert len(top) == 1   # one per first call and length, not one per path (4,096)
