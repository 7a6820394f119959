"""Records made by a library factory, and attributes named at run time
(model/flow.py: made_record_fields, attribute_of, attribute_names).

`collections.namedtuple("Env", [...])` (or `"a b"`, `"a, b"`, with
`defaults=`) and `typing.NamedTuple("Env", [("a", int), ...])` make a class
whose objects' fields are what the constructor was given, by position or
keyword, else the default. `getattr(obj, name)` with a name that can only be
known strings (a literal, a loop variable over a literal list, `name +
"_loader"`, `f"{name}_loader"`) is the union of those attributes."""

from __future__ import annotations

from ddpcheck.model.flow import field_expressions, value_at
from ddpcheck.model.guards import condition_of
from ddpcheck.model.worlds import D0, DN
from tests.semantics.helpers import build, marked


def _made(model, nth: int = 0) -> set[str]:
    expr, _ = marked(model, nth=nth)
    value = value_at(model, expr)
    return {a.site.func for a in value.atoms if hasattr(a, "site")} if value.known else {"?"}


def test_a_namedtuple_field_holds_the_argument_given_for_it():
    model = build("""
    import collections
    from torch.utils.data import DataLoader
    Loaders = collections.namedtuple("Loaders", ["train", "val"])
    def build(a, b):
        return Loaders(DataLoader(a), val=Sampled(b))
    def main():
        loaders = build(x, y)
        use(loaders.train)
        use(loaders.val)
    """)
    assert _made(model, 0) == {"DataLoader"} and _made(model, 1) == {"Sampled"}


def test_field_lists_as_a_string_and_defaults():
    model = build("""
    from collections import namedtuple
    Pair = namedtuple("Pair", "first, second", defaults=[None])
    p = Pair(Thing())
    use(p.first)
    use(p.second)
    """)
    expr, _ = marked(model, nth=1)
    assert _made(model, 0) == {"Thing"}
    assert [model.module.code_for_node(e) for _, e, _ in field_expressions(model, expr)] == ["None"]


def test_a_functional_namedtuple_field_holding_a_rank_test_is_a_rank_test():
    model = build("""
    from typing import NamedTuple
    import torch.distributed as dist
    Env = NamedTuple("Env", [("rank", int), ("leader", bool)])
    def main():
        rank = dist.get_rank()
        env = Env(rank, rank == 0)
        use(env.leader)
    """)
    expr, site = marked(model)
    cond = condition_of(model, expr, site.ctx.function)
    assert D0 in cond.may and DN not in cond.may


def test_an_unreadable_field_list_or_a_starred_call_is_not_judged():
    model = build("""
    from collections import namedtuple
    Rec = namedtuple("Rec", FIELDS)
    r = Rec(Thing())
    use(r.anything)
    Pair = namedtuple("Pair", "a b")
    q = Pair(*parts)
    use(q.a)
    """)
    assert _made(model, 0) == {"?"} and _made(model, 1) == {"?"}


def test_getattr_with_a_loop_variable_over_literal_names():
    model = build("""
    from torch.utils.data import DataLoader
    class Runner:
        def __init__(self, a, b):
            self.train_loader = DataLoader(a)
            self.val_loader = Other(b)
        def run(self, name):
            for split in ["train", "val"]:
                use(getattr(self, f"{split}_loader"))
                use(getattr(self, split + "_loader"))
            for attr in ("train_loader",):
                use(getattr(self, attr))
            use(getattr(self, name))
    """)
    assert _made(model, 0) == _made(model, 1) == {"DataLoader", "Other"}
    assert _made(model, 2) == {"DataLoader"}
    assert _made(model, 3) != {"DataLoader", "Other"}
