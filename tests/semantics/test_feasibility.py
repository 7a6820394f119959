"""Which arm of a function a call reaches (model/guards.py: worlds_from_call,
condition_in_call; model/flow.py: truth_of, is_none_of).

A test of a parameter (`if sync:`, `if scaler is None:`) is judged by what
the call passes: a literal, an object of a class of the tree, the default
when the call leaves it out, a rank test, `x if rank == 0 else None` arm by
arm, and a parameter of the caller followed to the call further out. An
answer that is not certain leaves both arms open.

Each case marks the statement in question with `use(...)` inside the
function `helper`, and the calls of `helper` (or of the function that hands
its parameter on) by source order."""

from __future__ import annotations

from ddpcheck.model.flow import truth_of, is_none_of, value_at
from ddpcheck.model.guards import reached_from_call, worlds, worlds_from_call
from ddpcheck.model.worlds import ALL, D0, DN
from tests.semantics.helpers import build, marked


def _calls(model, name):
    return [c for c in model.calls if c.func == name]


def _fn(model, name):
    return next(f for f in model.functions if f.name == name)


def reached(code: str, nth_call: int = 0, callee: str = "helper") -> bool:
    """Does the `nth_call`-th call of `callee` reach the marked statement?"""
    model = build(code)
    _, site = marked(model)
    fn = _fn(model, callee)
    call = _calls(model, callee)[nth_call]
    return reached_from_call(model, site.ctx, fn, ((model, call),))


def test_a_literal_argument_decides_a_truth_test():
    code = """
        def helper(path, sync=True):
            if sync:
                use(path)
        helper("a", sync=False)
        helper("b", True)
        helper("c")
        """
    assert [reached(code, i) for i in range(3)] == [False, True, True]


def test_negation_and_combinations():
    code = """
        def helper(path, quiet=False, dry=False):
            if not quiet and not dry:
                use(path)
        helper("a", quiet=True)
        helper("b")
        helper("c", dry=flag)
        """
    assert [reached(code, i) for i in range(3)] == [False, True, True]   # `flag` unknown: both arms


def test_an_object_of_a_class_of_the_tree_is_not_none_and_true():
    code = """
        class Scaler:
            def state_dict(self):
                return {}
        def helper(net, scaler):
            if scaler is None:
                use(net)
        def other(net, scaler):
            if not scaler:
                use(net)
        s = Scaler()
        helper(net, s)
        helper(net, None)
        other(net, s)
        """
    assert reached(code, 0) is False
    assert reached(code, 1) is True
    model = build(code)
    _, site = marked(model, nth=1)
    assert not reached_from_call(model, site.ctx, _fn(model, "other"), ((model, _calls(model, "other")[0]),))


def test_a_class_that_defines_its_truth_or_a_library_object_stays_unknown():
    code = """
        class Bag:
            def __len__(self):
                return 0
        def helper(x):
            if x:
                use(x)
        helper(Bag())
        helper(torch.zeros(1))
        helper(make_thing())
        """
    assert [reached(code, i) for i in range(3)] == [True, True, True]


def test_a_library_call_may_return_none():
    code = """
        def helper(x):
            if x is None:
                use(x)
        helper(os.environ.get("OUT"))
        """
    assert reached(code) is True


def test_a_conditional_expression_is_judged_arm_by_arm():
    code = """
        def helper(log_dir):
            if log_dir is not None:
                use(log_dir)
        rank = dist.get_rank()
        helper(out if rank == 0 else None)
        helper(out)
        """
    model = build(code)
    _, site = marked(model)
    fn = _fn(model, "helper")
    first, second = _calls(model, "helper")
    assert DN not in worlds_from_call(model, site.ctx, fn, ((model, first),))
    assert D0 in worlds_from_call(model, site.ctx, fn, ((model, first),))
    assert worlds_from_call(model, site.ctx, fn, ((model, second),)) == ALL


def test_in_its_own_file_a_parameter_test_is_what_the_files_calls_pass():
    code = """
        def save(net, scaler=None):
            if scaler is None:
                use(net)
        class Scaler:
            pass
        save(a, Scaler())
        save(b, scaler=Scaler())
        """
    model = build(code)
    _, site = marked(model)
    assert worlds(model, site.ctx) == frozenset()   # no call takes that arm
    model = build(code + "save(c)\n")
    _, site = marked(model)
    assert worlds(model, site.ctx) == ALL


def test_a_variable_holding_a_conditional_expression_is_judged_arm_by_arm():
    code = """
        def helper(log_dir):
            if log_dir:
                use(log_dir)
        def main(rank, out):
            log_dir = out if rank == 0 else None
            helper(log_dir)
            other = None
            if flag:
                other = out
            helper(other)
        """
    model = build(code)
    _, site = marked(model)
    fn = _fn(model, "helper")
    first, second = _calls(model, "helper")
    assert worlds_from_call(model, site.ctx, fn, ((model, first),)) & {D0, DN} == {D0}
    assert worlds_from_call(model, site.ctx, fn, ((model, second),)) == ALL   # two assignments reach: unknown


def test_a_parameter_handed_on_is_judged_at_the_outer_call():
    code = """
        def helper(log_dir=None):
            w = SummaryWriter(log_dir) if log_dir else None
            use(w)
        def fit(model, log_dir=None):
            helper(log_dir=log_dir)
        rank = dist.get_rank()
        fit(m, log_dir="runs" if rank == 0 else None)
        fit(m)
        """
    model = build(code)
    writer = next(c for c in model.calls if c.func == "SummaryWriter")
    helper, fit = _fn(model, "helper"), _fn(model, "fit")
    inner = _calls(model, "helper")[0]
    guarded, default = _calls(model, "fit")
    assert worlds_from_call(model, writer.ctx, helper, ((model, inner), (model, guarded))) & {D0, DN} == {D0}
    assert not reached_from_call(model, writer.ctx, helper, ((model, inner), (model, default)))
    # without the outer call, `fit`'s parameter is what the file's calls pass: a folder on rank 0 only
    assert worlds_from_call(model, writer.ctx, helper, ((model, inner),)) & {D0, DN} == {D0}
    # a call passing something unknown leaves both arms open
    model = build(code + "fit(m, log_dir=args.out)\n")
    inner = _calls(model, "helper")[0]
    writer = next(c for c in model.calls if c.func == "SummaryWriter")
    assert DN in worlds_from_call(model, writer.ctx, _fn(model, "helper"), ((model, inner),))


def test_a_rebound_parameter_is_not_the_argument():
    code = """
        def helper(sync=False):
            sync = load_flag()
            if sync:
                use(sync)
        helper()
        """
    assert reached(code) is True


def test_star_arguments_leave_both_arms_open():
    code = """
        def helper(path, sync=False):
            if sync:
                use(path)
        helper(*args)
        helper(**kw)
        """
    assert [reached(code, i) for i in range(2)] == [True, True]


def test_values_as_tests():
    model = build("""
        class Box:
            pass
        a = Box()
        b = None
        c = [1]
        d = []
        e = Box() if x else None
        use(a); use(b); use(c); use(d); use(e)
        """)
    values = [value_at(model, marked(model, nth=i)[0]) for i in range(5)]
    assert [truth_of(v) for v in values] == [True, False, True, False, None]
    assert [is_none_of(v) for v in values] == [False, True, False, False, None]


def test_callers_of_a_function_and_what_they_do_with_its_result():
    from ddpcheck.model.flow import call_sites_of, result_dropped

    model = build("""
        def evaluate():
            return 1
        def handed():
            return 2
        evaluate()
        x = evaluate()
        table = {"h": handed}
        """)
    first, second = call_sites_of(model, _fn(model, "evaluate"))
    assert result_dropped(first) and not result_dropped(second)
    assert call_sites_of(model, _fn(model, "handed")) is None   # stored as a value: callers unknown


def test_a_static_method_called_on_self_binds_its_first_parameter_to_the_first_argument():
    from ddpcheck.model.flow import argument_expr

    model = build("""
        class Builder:
            @staticmethod
            def build(cls, check, sync):
                return cls
            def run(self):
                self.build(Dataset, self.check, False)
        """)
    fn = _fn(model, "build")
    call = next(c for c in model.calls if c.func == "self.build")
    assert model.module.code_for_node(argument_expr(call, fn, "sync")[1]) == "False"
    assert model.module.code_for_node(argument_expr(call, fn, "cls")[1]) == "Dataset"


def test_a_parameter_compared_with_a_literal_is_judged_by_what_the_call_passes():
    code = """
        def helper(img, plot_dir=''):
            if plot_dir != '':
                use(img)
        helper(1)
        helper(2, plot_dir='out/fig')
        helper(3, plot_dir=name)
        """
    assert [reached(code, i) for i in range(3)] == [False, True, True]   # `name` unknown: both arms


def test_the_length_of_a_parameter_compared_with_a_literal():
    code = """
        def helper(img, keep=[]):
            if len(keep) > 0:
                use(img)
        helper(1)
        helper(2, keep=["a"])
        helper(3, keep=None)
        """
    # `len(None)` raises: not an arm the engine can call untaken
    assert [reached(code, i) for i in range(3)] == [False, True, True]


def test_a_comparison_handed_on_through_the_callers_parameter():
    code = """
        def helper(img, mode="train"):
            if mode == "val":
                use(img)
        def outer(img, mode="train"):
            helper(img, mode=mode)
        outer(1)
        """
    model = build(code)
    _, site = marked(model)
    helper, outer = _fn(model, "helper"), _fn(model, "outer")
    inner_call, outer_call = _calls(model, "helper")[0], _calls(model, "outer")[0]
    assert not reached_from_call(model, site.ctx, helper, ((model, inner_call), (model, outer_call)))
