"""The one memo mechanism (model/memo.py): keyed on the query function and its
arguments, owned by one Memo per run, cycles answered with on_cycle,
nothing cached from a cut-short recursion, a budget past which the answer
is "unknown"."""

import pytest

from ddpcheck.model.memo import Memo, TooComplex, query


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


def test_a_cycle_is_solved_to_its_fixed_point_whichever_question_comes_first():
    # a -> b -> a (cycle), b -> sink: b's first answer inside the cycle reads
    # a's provisional "no"; the head goes round again until nothing changes.
    edges = {"a": ["b"], "b": ["a", "sink"], "c": ["c"]}
    first = FakeModel(edges)
    assert reaches_sink(first, "a") is True
    assert reaches_sink(first, "b") is True
    second = FakeModel(edges)
    assert reaches_sink(second, "b") is True
    assert reaches_sink(second, "a") is True
    assert reaches_sink(FakeModel(edges), "c") is False   # a pure self-cycle: nothing reaches the sink


def test_answers_inside_a_cycle_are_kept_once_it_is_solved():
    # x -> y -> x: y is answered while x is in progress; once x's answer stops
    # changing, y's is kept too: asked later, nothing is recomputed.
    edges = {"x": ["y"], "y": ["x"]}
    m = FakeModel(edges)
    assert reaches_sink(m, "x") is False
    m.calls.clear()
    assert reaches_sink(m, "y") is False
    assert reaches_sink(m, "x") is False
    assert m.calls == []


def test_a_big_cycle_is_solved_in_a_few_rounds_not_by_recomputing_it_from_every_member():
    # a ring of 60 nodes, each also pointing back to the start: every member
    # depends on a question in progress; without provisional answers the
    # members were recomputed from each other over and over
    ring = {i: [(i + 1) % 60, 0] for i in range(60)}
    ring[59].append("sink")
    m = FakeModel(ring)
    assert reaches_sink(m, 0) is True
    assert all(reaches_sink(m, i) is True for i in range(60))
    assert m.project.memo.evaluations < 60 * 8


@query(on_cycle=0)
def flip(model, node):
    """Not monotone: each round changes the answer (1 - previous)."""
    return 1 - flip(model, node)


def test_a_cycle_that_never_settles_is_unknown():
    assert flip(FakeModel({}), "n") == 0   # on_cycle after MAX_ROUNDS rounds


def test_cycles_across_models_of_one_run_are_caught():
    project = FakeProject()
    a, b = FakeModel({}, project), FakeModel({}, project)

    @query(on_cycle="cut")
    def ping(model, n):
        other = b if model is a else a
        return ping(other, n)

    assert ping(a, 1) == "cut"


def test_a_question_past_its_budget_is_unknown_and_nothing_in_progress_is_kept():
    # a chain 0 -> 1 -> ... -> 50 -> sink: 52 evaluations, over a budget of 20
    chain = {i: [i + 1] for i in range(50)}
    chain[50] = ["sink"]
    m = FakeModel(chain, FakeProject(budget=20))
    with pytest.raises(TooComplex):
        reaches_sink(m, 0)                     # unknown: its asker (a rule) reports nothing from it
    assert (reaches_sink.__wrapped__, (0,), ()) not in m.answers
    assert m.project.memo.stack == [] and not m.project.memo.provisional
    roomy = FakeModel(chain, FakeProject(budget=1000))
    assert reaches_sink(roomy, 0) is True


def test_a_chain_deeper_than_pythons_stack_is_unknown_not_a_crash():
    chain = {i: [i + 1] for i in range(5000)}
    m = FakeModel(chain, FakeProject(budget=100_000))
    with pytest.raises(TooComplex):
        reaches_sink(m, 0)


def test_two_runs_never_share_answers_or_questions_in_progress():
    one, two = FakeProject(), FakeProject()
    a, b = FakeModel({"a": ["sink"]}, one), FakeModel({"a": []}, two)
    assert reaches_sink(a, "a") is True
    assert reaches_sink(b, "a") is False
    assert one.memo.stack == [] and two.memo.stack == []
    assert one.memo.evaluations == 2 and two.memo.evaluations == 1


@query
def costly(model, node):
    """An answer whose work outside the memo (rebuilding a value) is charged."""
    model.project.memo.charge(40)
    return node


def test_work_charged_outside_the_memo_counts_against_the_budget():
    m = FakeModel({}, FakeProject(budget=100))
    assert costly(m, 1) == 1 and costly(m, 2) == 2    # 2 evaluations + 80 units charged
    with pytest.raises(TooComplex):
        costly(m, 3)                                  # 123 units > 100: unknown, not kept
    assert (costly.__wrapped__, (3,), ()) not in m.answers
    assert costly(m, 1) == 1                          # answered before: still known


def test_the_budget_is_shared_by_every_question_about_a_file_until_a_new_one_starts():
    # each question alone fits the budget; together they do not, so a file
    # with many questions cannot take more than the budget between them
    chain = {i: [i + 1] for i in range(30)}
    m = FakeModel(chain, FakeProject(budget=40))
    assert reaches_sink(m, 15) is False               # 16 evaluations
    assert reaches_sink(m, 5) is False                # 10 more (15.. answered)
    other = FakeModel({i: [i + 1] for i in range(30)}, m.project)
    with pytest.raises(TooComplex):
        reaches_sink(other, 0)                        # 31 more: past 40
    m.project.memo.new_budget()                       # the next file linted
    assert reaches_sink(other, 0) is False


def test_charging_outside_any_question_past_the_budget_is_unknown_too():
    memo = Memo(budget=5)
    memo.charge(5)
    with pytest.raises(TooComplex):
        memo.charge()


def test_a_slice_cuts_one_rules_questions_and_leaves_the_rest_of_the_budget_to_the_next():
    chain = {i: [i + 1] for i in range(60)}
    memo = Memo(budget=100, slice_=30)
    project = FakeProject()
    project.memo = memo
    m = FakeModel(chain, project)
    memo.new_budget()
    memo.new_slice()                                  # the first rule: 30 units
    with pytest.raises(TooComplex):
        reaches_sink(m, 0)                            # 61 evaluations: past its slice
    memo.new_slice()                                  # the next rule still has 30
    assert reaches_sink(m, 40) is False               # 21 evaluations
    memo.new_slice()
    memo.charge(29)
    with pytest.raises(TooComplex):
        memo.charge(2)                                # the slice ends before the budget does
    assert memo.spent < memo.budget


def test_a_slice_never_reaches_past_the_files_budget():
    memo = Memo(budget=50, slice_=40)
    memo.new_budget()
    memo.new_slice()
    memo.charge(30)
    memo.new_slice()                                  # 40 more would pass the budget: 20 left
    memo.charge(20)
    with pytest.raises(TooComplex):
        memo.charge()


def test_an_answer_kept_by_another_questions_walk_is_known_and_a_settled_one_only():
    from ddpcheck.model.memo import keep, known

    m = FakeModel({"a": ["b"], "b": []})
    assert known(reaches_sink, m, "b") is None
    keep(reaches_sink, m, "b", answer=False)          # nothing in progress: settled
    assert known(reaches_sink, m, "b") is False
    assert reaches_sink(m, "b") is False and m.calls == []   # answered without evaluating
