"""The one memo mechanism (model/memo.py): keyed on the query function and its
arguments, owned by one Memo per run, cycles answered with on_cycle,
nothing cached from a cut-short recursion, a budget past which the answer
is "unknown"."""

from ddpcheck.model.memo import Memo, query


class FakeProject:
    def __init__(self, budget: int = 1000):
        self.memo = Memo(budget)


class FakeModel:
    def __init__(self, edges, project=None):
        self.project = project or FakeProject()
        self.answers = {}
        self.edges = edges
        self.calls = []


@query(on_cycle=False)
def reaches_sink(model, node):
    model.calls.append(node)
    if node == "sink":
        return True
    return any(reaches_sink(model, nxt) for nxt in model.edges.get(node, ()))


@query
def other_query(model, node):
    return ("other", node)


def test_answers_are_memoised_per_query_function_and_arguments():
    m = FakeModel({"a": ["sink"]})
    assert reaches_sink(m, "a") is True
    assert reaches_sink(m, "a") is True
    assert m.calls == ["a", "sink"]           # second ask: no recomputation
    assert other_query(m, "a") == ("other", "a")   # same argument, other query: no collision


def test_cycle_reads_as_on_cycle_and_inner_frames_are_not_cached():
    # a -> b -> a (cycle), b -> sink: b's answer computed inside the cycle
    # is provisional; asking b first or a first gives the same answers.
    edges = {"a": ["b"], "b": ["a", "sink"], "c": ["c"]}
    first = FakeModel(edges)
    assert reaches_sink(first, "a") is True
    assert reaches_sink(first, "b") is True
    second = FakeModel(edges)
    assert reaches_sink(second, "b") is True
    assert reaches_sink(second, "a") is True
    assert reaches_sink(FakeModel(edges), "c") is False   # a pure self-cycle reads as on_cycle


def test_value_computed_under_a_cut_is_recomputed_from_outside_the_cycle():
    # x -> y -> x: y is evaluated while x is in progress (cut short), so y's
    # answer is not cached; asked on its own later, it is recomputed.
    edges = {"x": ["y"], "y": ["x"]}
    m = FakeModel(edges)
    assert reaches_sink(m, "x") is False
    m.calls.clear()
    assert reaches_sink(m, "y") is False
    assert m.calls[0] == "y"                  # recomputed, not served from a provisional cache
    m.calls.clear()
    assert reaches_sink(m, "x") is False
    assert m.calls == []                      # the cycle's entry frame was cached


def test_cycles_across_models_of_one_run_are_caught():
    project = FakeProject()
    a, b = FakeModel({}, project), FakeModel({}, project)

    @query(on_cycle="cut")
    def ping(model, n):
        other = b if model is a else a
        return ping(other, n)

    assert ping(a, 1) == "cut"


def test_a_question_past_its_budget_is_unknown_and_nothing_of_it_is_kept():
    # a chain 0 -> 1 -> ... -> 50 -> sink: 52 evaluations, over a budget of 20
    chain = {i: [i + 1] for i in range(50)}
    chain[50] = ["sink"]
    m = FakeModel(chain, FakeProject(budget=20))
    assert reaches_sink(m, 0) is False        # on_cycle: unknown, not a guess
    assert (reaches_sink.__wrapped__, (0,), ()) not in m.answers
    roomy = FakeModel(chain, FakeProject(budget=1000))
    assert reaches_sink(roomy, 0) is True


def test_two_runs_never_share_answers_or_questions_in_progress():
    one, two = FakeProject(), FakeProject()
    a, b = FakeModel({"a": ["sink"]}, one), FakeModel({"a": []}, two)
    assert reaches_sink(a, "a") is True
    assert reaches_sink(b, "a") is False
    assert one.memo.stack == [] and two.memo.stack == []
    assert one.memo.evaluations == 2 and two.memo.evaluations == 1
