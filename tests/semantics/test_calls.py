"""What a call binds and what it runs, as Python does it: calling an object
runs its class's `__call__` with the object as `self`; a bound method held in
a name binds its object too; a static method binds nothing. Dunder calls
written out (`it.__iter__()`, `it.__next__()`) are the builtins they stand
for."""

from __future__ import annotations

import textwrap

from ddpcheck.model.flow import argument_expr, builtin_call, calls_plain_function, epoch_passes, resolve_call
from ddpcheck.model.loads import feeds_load_state_dict
from ddpcheck.model.writes import writes_on_every_rank
from tests.conftest import write
from tests.semantics.helpers import build, build_file


def _argument(model, func: str, param: str) -> str | None:
    site = next(c for c in model.calls if c.func == func)
    _, fn = resolve_call(model, site)
    bound, expr = argument_expr(site, fn, param)
    assert bound
    return None if expr is None else model.module.code_for_node(expr)


HOOK = textwrap.dedent("""
    class Hook:
        def __init__(self, rank):
            self.rank = rank
        def __call__(self, step, net, head=None):
            pass
        def write(self, net, head=None):
            pass
        @staticmethod
        def plain(net, head=None):
            pass
""")


def test_calling_an_object_binds_self_before_its_arguments():
    model = build(HOOK + "hook = Hook(0)\nhook(7, a, b)\n")
    assert _argument(model, "hook", "step") == "7"
    assert _argument(model, "hook", "head") == "b"


def test_a_bound_method_held_in_a_name_binds_its_object():
    model = build(HOOK + "hook = Hook(0)\nw = hook.write\nw(a, b)\n")
    assert _argument(model, "w", "net") == "a"
    assert _argument(model, "w", "head") == "b"


def test_a_static_method_binds_nothing():
    model = build(HOOK + "Hook.plain(a, b)\n")
    assert _argument(model, "Hook.plain", "net") == "a"
    assert _argument(model, "Hook.plain", "head") == "b"


def test_a_write_in_call_is_judged_with_the_calls_own_arguments(tmp_path):
    write(tmp_path / "hooks.py", "import torch\n"
                                 "class Snap:\n"
                                 "    def __init__(self, rank):\n        self.rank = rank\n"
                                 "    def __call__(self, step, net, head=None):\n"
                                 "        if self.rank == 0:\n            torch.save(net, 'n.pt')\n"
                                 "        if head is not None:\n            torch.save(head, 'h.pt')\n")
    train = write(tmp_path / "train.py", "from hooks import Snap\n"
                                         "snap = Snap(rank)\n"
                                         "snap(1, net, head)\n"
                                         "snap(2, net)\n")
    model = build_file(train)
    with_head, without_head = [c for c in model.calls if c.func == "snap"]
    found = writes_on_every_rank(*resolve_call(model, with_head), frames=((model, with_head),))
    assert found is not None and found[1] == "save"   # `head` is passed: every rank writes h.pt
    # `head` left to its default None: only the rank-0 write is left
    assert writes_on_every_rank(*resolve_call(model, without_head), frames=((model, without_head),)) is None


def test_a_call_of_a_plain_function_is_told_from_methods_and_constructors():
    model = build(HOOK + "def restore(net):\n    pass\n"
                         "hook = Hook(0)\nrestore(a)\nhook(1, a)\nhook.write(a)\nHook(1)\n")
    plain = {c.func: calls_plain_function(model, c) for c in model.calls}
    assert plain == {"Hook": False, "restore": True, "hook": False, "hook.write": False}


def test_a_load_feeds_load_state_dict_in_the_statement_or_through_what_holds_it():
    model = build("""
        import torch
        def a(net, p):
            ck = torch.load(p)
            net.load_state_dict(ck["net"])
        def b(opt, folder):
            opt.load_state_dict(torch.load(folder / "opt.pt"))
        def c(p):
            table = torch.load(p)
            return table
        def d(net, p):
            od = torch.load(p)
            saved = od["model"]
            net.load_state_dict(saved)
        def e(net, p):
            ck = torch.load(p)
            net.load_state_dict(ck.get("state_dict", ck)["a"])
        def f(net, p, q):
            ck = torch.load(p)
            other = torch.load(q)
            net.load_state_dict(other)
            return ck
        def g(net, p):
            ck = torch.load(p)
            if "model" in ck:
                ck = ck["model"]
            net.module.load_state_dict(ck, strict=False)
    """)
    loads = {}
    for c in model.calls:
        if c.func == "torch.load":
            loads.setdefault(c.ctx.function.name, []).append(feeds_load_state_dict(model, c))
    # `f`: the first load is returned, the second one goes into the model
    assert loads == {"a": [True], "b": [True], "c": [False], "d": [True], "e": [True], "f": [False, True],
                     "g": [True]}


def test_dunder_calls_written_out_are_the_builtins():
    model = build("a = it.__next__()\nb = next(it, None)\nc = seq.__iter__()\nd = iter(seq)\n"
                  "e = x.__len__()\nf = other.__next__(1)\ng = obj.next()\n")
    found = {c.func: builtin_call(c) for c in model.calls}
    told = {f: (b[0], model.module.code_for_node(b[1])) if b else None for f, b in found.items()}
    assert told == {"it.__next__": ("next", "it"), "next": ("next", "it"), "seq.__iter__": ("iter", "seq"),
                    "iter": ("iter", "seq"), "x.__len__": ("len", "x"), "other.__next__": None, "obj.next": None}


ENDLESS = {
    "builtins": "def endless(data):\n    it = iter(data)\n    while True:\n        try:\n"
                "            yield next(it)\n        except StopIteration:\n            it = iter(data)\n",
    "dunders": "def endless(data):\n    it = data.__iter__()\n    while True:\n        try:\n"
               "            yield it.__next__()\n        except StopIteration:\n            it = data.__iter__()\n",
}


def test_an_endless_generator_written_with_dunders_passes_over_its_loader_like_one_with_builtins(tmp_path):
    seen = {}
    for form, helper in ENDLESS.items():
        folder = tmp_path / form
        write(folder / "loops.py", helper)
        train = write(folder / "train.py", "from torch.utils.data import DataLoader\nfrom loops import endless\n"
                                           "loader = DataLoader(ds, batch_size=4)\nbatches = endless(loader)\n"
                                           "for step in range(100):\n    batch = next(batches)\n")
        model = build_file(train)
        loader = next(c for c in model.calls if c.func == "DataLoader")
        seen[form] = any(p.consumed.holds(model, loader) for p in epoch_passes(model))
    assert seen == {"builtins": True, "dunders": True}


def test_whether_a_function_may_reach_a_write_is_one_walk_whose_no_answers_every_function_it_visited():
    from ddpcheck.model.flow import may_reach_call
    from ddpcheck.model.memo import known
    from ddpcheck.model.writes import _may_be_a_write, _runs_into_writers, may_write

    model = build("""
        import torch
        def leaf(x):
            return x + 1
        def middle(x):
            return leaf(x) * 2
        def top(x):
            return middle(leaf(x))
        def saver(state, p):
            torch.save(state, p)
        def deep(state, p):
            top(1)
            saver(state, p)
        def hands(fn, state):
            fn(state)
    """)
    fns = {f.name: f for f in model.functions}
    assert may_write(model, fns["deep"]) is True
    assert may_write(model, fns["top"]) is False
    # the walk from `top` visited `middle` and `leaf` and answered them too
    assert known(may_reach_call, model, fns["middle"], _runs_into_writers, _may_be_a_write) is False
    assert known(may_reach_call, model, fns["leaf"], _runs_into_writers, _may_be_a_write) is False
    # a call of a parameter runs what a caller passes: it may be a write
    assert may_write(model, fns["hands"]) is True
