"""What an attribute of an object holds, by the methods that ran in this
process (model/guards.py: object_state_condition), and which
checkpoint loads a call runs in another module (model/loads.py:
unmapped_load_in).

An object of a class of the tree, made in a function and kept to itself
there (only its own methods are called on it): `__init__` stores on every
process that made it; another method (`__call__` included) stores only
where it is called, or where a method that calls it on `self` runs. An
object handed on, aliased or stored from outside is not judged."""

from __future__ import annotations

from ddpcheck.model.flow import resolve_call
from ddpcheck.model.guards import condition_of, object_state_condition
from ddpcheck.model.loads import unmapped_load_in
from ddpcheck.model.worlds import D0, DN
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

STOPPER = """
    class Stopper:
        def __init__(self):
            self.stop = False
        def __call__(self, loss):
            if loss > 1:
                self.stop = True
        def update(self, loss):
            self.check(loss)
        def check(self, loss):
            if loss > 2:
                self.stop = True
"""


def _state(code: str):
    model = build(STOPPER + code)
    expr, site = marked(model)
    return object_state_condition(model, expr, site.ctx.function)


def test_a_flag_set_by_a_call_made_on_rank_0_only_can_be_true_on_rank_0_only():
    cond = _state("""
    def main(rank):
        s = Stopper()
        if rank == 0:
            s(0.5)
        use(s.stop)
    """)
    assert cond is not None and DN not in cond.may and D0 in cond.may


def test_a_method_that_calls_the_storing_method_on_self_carries_its_worlds():
    cond = _state("""
    def main(rank):
        s = Stopper()
        if rank == 0:
            s.update(0.5)
        use(s.stop)
    """)
    assert cond is not None and DN not in cond.may


def test_a_call_made_on_every_rank_tells_no_rank_apart_and_is_left_to_the_usual_judgement():
    cond = _state("""
    def main(rank):
        s = Stopper()
        s(0.5)
        use(s.stop)
    """)
    assert cond is None


def test_an_object_handed_on_or_stored_from_outside_is_not_judged():
    handed = _state("""
    def main(rank):
        s = Stopper()
        if rank == 0:
            s(0.5)
        callbacks = [s]
        use(s.stop)
    """)
    stored = _state("""
    def main(rank):
        s = Stopper()
        if rank == 0:
            s(0.5)
        s.stop = shared_flag()
        use(s.stop)
    """)
    nested = _state("""
    def main(rank):
        s = Stopper()
        def later():
            s(0.5)
        use(s.stop)
    """)
    assert handed is None and stored is None and nested is None


def test_a_test_of_the_flag_is_a_rank_test_for_the_branch_it_guards():
    model = build(STOPPER + """
    def main(rank):
        s = Stopper()
        if rank == 0:
            s(0.5)
        use(s.stop)
    """)
    expr, site = marked(model)
    assert DN not in condition_of(model, expr, site.ctx.function).true_branch


def test_a_constructor_of_another_module_that_loads_weights(tmp_path):
    write(tmp_path / "nets.py", "import torch\nclass Net:\n"
                                "    def __init__(self, path=None):\n"
                                "        if path is not None:\n"
                                "            self.restore(path)\n"
                                "    def restore(self, path):\n"
                                "        self.load_state_dict(torch.load(path))\n")
    train = write(tmp_path / "train.py", "from nets import Net\nNet('w.pth')\nNet()\n")
    model = build_file(train)
    with_path, without = [c for c in model.calls if c.func == "Net"]
    found = unmapped_load_in(*resolve_call(model, with_path, (("load",),)), ((model, with_path),))
    assert found is not None and found[0].file_name == "nets.py"
    assert unmapped_load_in(*resolve_call(model, without, (("load",),)), ((model, without),)) is None


def test_a_flag_stored_from_a_comparison_and_set_up_by_unpacking():
    model = build("""
    class Patience:
        def __init__(self, n):
            self.n, self.bad, self.done = n, 0, False
        def __call__(self, worse):
            self.bad = self.bad + 1 if worse else 0
            self.done = self.bad >= self.n
    def main(rank):
        p = Patience(3)
        if rank == 0:
            p(True)
        use(p.done)
    """)
    expr, site = marked(model)
    cond = object_state_condition(model, expr, site.ctx.function)
    assert cond is not None and D0 in cond.may and DN not in cond.may


def test_an_object_kept_on_self_is_judged_by_where_the_class_calls_it():
    trainer = STOPPER + """
    class Trainer:
        def __init__(self, rank):
            self.rank = rank
            self.stopper = Stopper()
        def fit(self, loss):
            if self.rank == 0:
                self.stopper(loss)
            use(self.stopper.stop)
    """
    model = build(trainer)
    expr, site = marked(model)
    cond = object_state_condition(model, expr, site.ctx.function)
    assert cond is not None and DN not in cond.may
    handed = build(trainer + """
    def callbacks(t):
        return [t.stopper]
    """)
    expr, site = marked(handed)
    assert object_state_condition(handed, expr, site.ctx.function) is None
