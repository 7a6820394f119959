"""Which bindings a read of a name can see (`flow.bindings_seen`): the one
answer the rules ask instead of looking up assignments by name. It follows
reaching definitions, then, where a path reaches the read unbound, the place
the name lives (an enclosing function, the module), the methods of the class
for `self.<x>`, and the file's stores for a namespace attribute."""

from __future__ import annotations

from ddpcheck.model.flow import bindings_seen, sole_binding
from tests.semantics.helpers import build, describe, marked


def seen(code: str, nth: int = 0) -> set[str]:
    model = build(code)
    expr, _ = marked(model, nth=nth)
    return {describe(model, b) for b in bindings_seen(model, expr)}


def test_a_rebinding_hides_the_earlier_value():
    assert seen("a = DataLoader(x)\na = 5\nuse(a)\n") == {"5"}


def test_branches_are_both_seen():
    assert seen("if c:\n    a = DataLoader(x)\nelse:\n    a = 5\nuse(a)\n") == {"DataLoader(x)", "5"}


def test_a_name_unbound_in_the_function_is_the_module_one():
    code = """
        rank = dist.get_rank()
        def save():
            use(rank)
        """
    assert seen(code) == {"dist.get_rank()"}


def test_a_local_name_does_not_see_the_module_one():
    code = """
        rank = dist.get_rank()
        def save(c):
            if c:
                rank = 0
            use(rank)
        """
    # unbound on one path: that path raises, it does not read the module's name
    assert seen(code) == {"0"}


def test_a_parameter_is_a_binding_of_its_own_kind():
    assert seen("def f(rank):\n    use(rank)\n") == {"param:rank"}


def test_self_attributes_come_from_every_method_of_the_class():
    code = """
        class Trainer:
            def __init__(self, model):
                self.model = model
            def wrap(self):
                self.model = DDP(self.model)
            def save(self):
                use(self.model)
        """
    assert seen(code) == {"model", "DDP(self.model)"}


def test_a_namespace_attribute_set_in_another_function():
    code = """
        def setup(config):
            config.master = dist.get_rank() == 0
        def train(config):
            use(config.master)
        """
    assert seen(code) == {"dist.get_rank() == 0"}


def test_a_builtin_adds_nothing():
    assert seen("use(len)\n") == set()


def test_sole_binding_only_when_one_reaches_on_every_path():
    model = build("a = 1\nif c:\n    a = 2\nuse(a)\nb = 3\nuse(b)\n")
    first, _ = marked(model, nth=0)
    second, _ = marked(model, nth=1)
    assert sole_binding(model, first) is None
    assert describe(model, sole_binding(model, second)) == "3"
