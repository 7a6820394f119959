"""The one memo mechanism: keyed on the query function and its arguments,
cycles answered with on_cycle, nothing cached from a cut-short recursion."""

from ddpcheck.model.query import QueryCache, query


class FakeModel:
    def __init__(self, edges):
        self.queries = QueryCache()
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


def test_cycles_across_models_are_caught():
    a, b = FakeModel({}), FakeModel({})

    @query(on_cycle="cut")
    def ping(model, n):
        other = b if model is a else a
        return ping(other, n)

    assert ping(a, 1) == "cut"
