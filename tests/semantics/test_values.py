"""What an expression holds (model/flow.py): objects by allocation site,
attributes per object, containers, calls with their arguments bound, and
unknown kept unknown.

Each case builds a few lines, asks `value_at` (or `value_of`) about the
expression passed to `use(...)`, and names the objects found by the call
that made them (`DataLoader`, `DDP`)."""

from __future__ import annotations

from ddpcheck.model.flow import Item, Made, Param, call_targets, resolve_call, value_at, value_of
from tests.semantics.helpers import build, marked


def made(code: str, marker: str = "use", resolve: bool = True, nth: int = 0) -> set[str]:
    """The calls that made what the marked expression can hold (`?` for
    anything the engine does not know)."""
    model = build(code)
    expr, _ = marked(model, marker, nth)
    value = value_at(model, expr) if resolve else value_of(model, expr)
    names = {(a.site.func or "?") for a in value.made}
    if not value.known:
        names.add("?")
    return names


# -- names and flow ---------------------------------------------------------------

def test_a_read_holds_what_reaches_it():
    code = """
        loader = DataLoader(a)
        use(loader)
        loader = DataLoader(b)
        """
    m = build(code)
    expr, _ = marked(m)
    (atom,) = value_of(m, expr).made
    assert atom.site.node.args[0].value.value == "a"


def test_rebinding_replaces_and_branches_keep_both():
    assert made("a = DataLoader(x)\na = 5\nuse(a)\n") == set()   # only the 5: no object
    assert made("a = DataLoader(x) if c else RandomSampler(x)\nuse(a)\n") == {"DataLoader", "RandomSampler"}


def test_methods_that_return_their_object():
    for method in ("eval()", "train()", "to(device)", "cuda()", "float()", "half()", "requires_grad_(False)"):
        code = f"model = DDP(net)\nmodel = model.{method}\nuse(model)\n"
        assert made(code) == {"DDP"}, method


def test_a_copy_holds_the_objects_of_what_it_copies():
    for copy_call in ("copy.deepcopy(model)", "copy.copy(model)"):
        code = f"import copy\nmodel = DDP(net)\nbest = {copy_call}\nuse(best)\n"
        assert made(code) == {"DDP"}, copy_call
    assert made("from copy import deepcopy\nmodel = DDP(net)\nuse(deepcopy(model))\n") == {"DDP"}
    # a `.copy()` method of an unknown object is not a copy the engine knows
    assert made("model = DDP(net)\nuse(model.module.copy())\n") == {"model.module.copy"}


def test_an_element_of_a_written_tuple_is_what_the_assignment_writes():
    from ddpcheck.model.script import Assign

    m = build("best, best_ep, best_model = acc, ep, copy.deepcopy(net)\na, b = pair\n")
    written = {a.key: a.written for a in m.assigns if isinstance(a, Assign)}
    assert m.module.code_for_node(written["best_model"]) == "copy.deepcopy(net)"
    assert written["a"] is None   # unpacked from something not written out


# -- calls ------------------------------------------------------------------------

def test_a_call_holds_what_the_function_returns_its_parameters_bound():
    code = """
        def build(ds, shuffle):
            if shuffle:
                return DistributedSampler(ds)
            return None
        sampler = build(data, True)
        use(sampler)
        """
    assert made(code) == {"DistributedSampler"}


def test_kwargs_built_by_a_helper_and_splatted():
    code = """
        def loader_kwargs(args):
            kw = {"num_workers": 4}
            kw["sampler"] = DistributedSampler(ds)
            return kw
        def main(args):
            kw = loader_kwargs(args)
            loader = DataLoader(ds, **kw)
            use(loader)
        """
    from ddpcheck.model.flow import call_argument

    m = build(code)
    site = next(c for c in m.calls if c.func == "DataLoader")
    sampler = call_argument(m, site, "sampler", 3)
    assert {a.site.func for a in sampler.made} == {"DistributedSampler"}
    assert call_argument(m, site, "batch_sampler", 4) is None   # certainly not passed


def test_args_and_kwargs_in_a_definition():
    code = """
        def make(*args, **kwargs):
            return DataLoader(*args, **kwargs)
        def wrapper(**kw):
            use(kw["sampler"])
        wrapper(sampler=DistributedSampler(ds))
        """
    assert made(code) == {"DistributedSampler"}


def test_a_constructor_holds_a_new_object_and_its_init_sees_the_arguments():
    code = """
        class Trainer:
            def __init__(self, model, loader):
                self.model = model
                self.loader = loader
            def fit(self):
                use(self.loader)
        trainer = Trainer(net, DataLoader(ds))
        """
    assert made(code) == {"DataLoader"}


def test_calling_an_object_runs_its_call_method():
    code = """
        class EarlyStopping:
            def __call__(self, model):
                return model
        stopper = EarlyStopping()
        use(stopper(DDP(net)))
        """
    assert made(code) == {"DDP"}


def test_bound_method_aliases():
    code = """
        class Runner:
            def build(self):
                return DataLoader(ds)
        runner = Runner()
        make = runner.build
        use(make())
        """
    assert made(code) == {"DataLoader"}


def test_a_factory_returns_an_object_whose_methods_are_followed():
    code = """
        class Wrapper:
            def loader(self):
                return DataLoader(ds)
        def create(opt):
            w = Wrapper()
            return w
        use(create(None).loader())
        """
    assert made(code) == {"DataLoader"}


# -- objects and attributes ---------------------------------------------------------

def test_attributes_per_object():
    code = """
        class Holder:
            pass
        a = Holder()
        b = Holder()
        a.loader = DataLoader(x)
        b.loader = RandomSampler(x)
        use(a.loader)
        """
    assert made(code) == {"DataLoader"}


def test_self_attributes_across_methods_and_base_classes():
    code = """
        class Base:
            def setup(self):
                self.model = DDP(self.net)
        class Child(Base):
            def save(self):
                use(self.model)
        """
    assert made(code, resolve=False) == {"DDP"}


def test_a_method_runs_through_the_class_hierarchy_and_overrides_win():
    code = """
        class Base:
            def fit(self):
                return self.make()
            def make(self):
                return RandomSampler(ds)
        class Child(Base):
            def make(self):
                return DistributedSampler(ds)
        use(Child().fit())
        """
    assert made(code) == {"DistributedSampler"}


def test_one_function_of_the_tree_beside_an_unknown_object_is_not_the_call():
    # `self.io` is a plugin's object (unknown) or the default object of the tree:
    # the call may run either, so it runs no one known function
    code = """
        class DefaultIO:
            def save(self, sd, path):
                torch.save(sd, path)
        class Engine:
            def __init__(self, plugin=None):
                if plugin is not None:
                    self.io = plugin.get_io()
                else:
                    self.io = DefaultIO()
            def save(self, sd, path):
                self.io.save(sd, path)
        class Plain:
            def __init__(self):
                self.io = DefaultIO() if fast else None
            def save(self, sd, path):
                self.io.save(sd, path)
        """
    model = build(code)
    engine, plain = [c for c in model.calls if c.func == "self.io.save"]
    assert [fn.qualname for _, fn in call_targets(model, engine)] == ["DefaultIO.save"]   # a may-callee
    assert resolve_call(model, engine) is None
    # None beside it cannot be what a call that runs holds
    assert resolve_call(model, plain)[1].qualname == "DefaultIO.save"


def test_an_attribute_the_class_stores_is_followed_whatever_its_library_base():
    # a library base might set `self.client` too; what the class's own
    # `__init__` stores is what the call runs
    code = """
        class Client:
            def save(self, sd):
                torch.save(sd, "x.pt")
        class Recipe(Protocol):
            def __init__(self):
                self.client = Client()
            def save(self, sd):
                self.client.save(sd)
        """
    model = build(code)
    site = next(c for c in model.calls if c.func == "self.client.save")
    assert resolve_call(model, site)[1].qualname == "Client.save"


def test_a_method_of_the_tree_is_the_method_whatever_the_library_base():
    code = """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.reset()
            def reset(self):
                self.head = nn.Linear(4, 4)
        class Log(object):
            def __init__(self):
                self.writer = SummaryWriter("runs")
            def add(self):
                use(self.writer)
        """
    model = build(code)
    reset = next(c for c in model.calls if c.func == "self.reset")
    assert resolve_call(model, reset)[1].qualname == "Net.reset"
    assert made(code, resolve=False) == {"SummaryWriter"}   # `object` is no library base
    # an attribute a library base may set stays unknown
    assert made("class A(nn.Module):\n    def f(self):\n        use(self.weight)\n", resolve=False) == {"?"}


def test_namespace_attributes_set_in_another_function():
    code = """
        def setup(config):
            config.loader = DataLoader(ds)
        def train(config):
            use(config.loader)
        """
    assert "DataLoader" in made(code)


# -- containers --------------------------------------------------------------------

def test_tuples_lists_and_dicts():
    code = """
        def build():
            return DataLoader(a), DistributedSampler(a)
        loader, sampler = build()
        loaders = {"train": loader, "val": DataLoader(b)}
        use(sampler)
        use(loaders["train"])
        """
    assert made(code) == {"DistributedSampler"}
    m = build(code)
    expr, _ = marked(m, nth=1)
    (atom,) = value_at(m, expr).made
    assert atom.site.node.args[0].value.value == "a"


def test_a_for_loop_binds_the_elements():
    code = """
        for name, loader in {"train": DataLoader(a)}.items():
            use(loader)
        for i, model in enumerate([DDP(a), DDP(b)]):
            use(model)
        """
    assert made(code) == {"DataLoader"}
    assert made(code, nth=1) == {"DDP"}


# -- unknown stays unknown ---------------------------------------------------------

def test_a_parameter_of_a_function_handed_away_stays_unknown():
    code = """
        import torch.multiprocessing as mp
        def worker(rank, loader):
            use(loader)
        mp.spawn(worker, args=(DataLoader(ds),))
        """
    m = build(code)
    expr, _ = marked(m)
    value = value_at(m, expr)
    assert not value.known and isinstance(next(iter(value.atoms)), Param)


def test_library_objects_attributes_and_unresolved_names_are_unknown():
    assert made("import argparse\nargs = argparse.ArgumentParser().parse_args()\nuse(args.sampler)\n") == {"?"}
    assert made("use(something_undefined)\n") == {"?"}
    assert made("def f(x):\n    return x.loader\nuse(f(obj))\n") == {"?"}


def test_a_value_through_a_cycle_of_names_is_a_fixed_point():
    code = """
        a = DataLoader(x)
        for i in r:
            b = a
            a = b
        use(a)
        """
    assert made(code) == {"DataLoader"}


def test_results_of_library_calls_are_objects_made_there():
    code = """
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net, device_ids=[0])
        use(model)
        """
    m = build(code)
    expr, _ = marked(m)
    (atom,) = value_at(m, expr).atoms
    assert isinstance(atom, Made) and atom.is_api("DistributedDataParallel")


def test_the_objects_a_value_holds_come_in_the_order_of_their_calls():
    # a value is a set of atoms ordered by identity; what a rule names first
    # (the first of two loaders a loop draws from) must not change from run to run
    names = [f"loader{i}" for i in range(6)]
    code = "from torch.utils.data import DataLoader\n" + "".join(
        f"{n} = DataLoader(ds{i})\n" for i, n in enumerate(names)) + \
        "x = " + " if c else ".join(names) + "\nuse(x)\n"
    model = build(code)
    expr, _ = marked(model)
    made = value_at(model, expr).made
    assert [model.module.code_for_node(a.site.node) for a in made] == [f"DataLoader(ds{i})" for i in range(6)]


def test_a_file_opened_in_a_with_statement_is_the_file_open_made():
    assert made("with open(path, 'rb') as f:\n    use(f)\n") == {"open"}
    # the `__enter__` of another library object is not known: it may return anything
    assert made("with tempdir(path) as d:\n    use(d)\n") == {"?"}


def test_an_entry_or_element_of_a_library_object_is_an_item_of_that_object():
    model = build("ckpt = torch.load(path)\nuse(ckpt['model'])\nuse(ckpt[0])\n")
    for nth in (0, 1):
        expr, _ = marked(model, nth=nth)
        value = value_of(model, expr)
        (atom,) = value.atoms
        assert type(atom) is Item and atom.receiver.site.func == "torch.load"
        assert not value.known   # what the file held under that key is not known


# -- objects of classes deriving from torch's ---------------------------------------

def test_a_dataloader_subclass_carries_the_sampler_its_constructor_hands_to_dataloader():
    from ddpcheck.model.values import subclass_loaders

    model = build("""
        import torch.utils.data as data
        from torch.utils.data import DataLoader
        class ShardedLoader(data.DataLoader):
            def __init__(self, dataset, batch_size, train=True):
                sampler = data.DistributedSampler(dataset, shuffle=train) if train else None
                super().__init__(dataset, batch_size=batch_size, sampler=sampler)
        class PlainLoader(DataLoader):
            def __init__(self, dataset):
                super(PlainLoader, self).__init__(dataset, batch_size=4, shuffle=True)
        class Inner(ShardedLoader):
            def __init__(self, dataset):
                super().__init__(dataset, 8)
        class Passed(DataLoader):
            def __init__(self, dataset, sampler):
                super().__init__(dataset, sampler=sampler)
        train = ShardedLoader(ds, 32)
        plain = PlainLoader(ds)
        inner = Inner(ds)
        passed = Passed(ds, data.DistributedSampler(ds))
        none = Passed(ds, None)
    """)
    found = {l.key: [(s.site.func, s.shuffle) for s in l.samplers] for l in subclass_loaders(model)}
    # `Inner` reaches DataLoader's constructor through another class of the tree: not known here.
    # The sampler's shuffle flag is the constructor's `train`, whose default the call leaves.
    assert found == {"train": [("data.DistributedSampler", True)], "plain": [],
                     "passed": [("data.DistributedSampler", True)], "none": []}
    assert all(l.batch_size is None for l in subclass_loaders(model))
