"""Reaching definitions (model/dataflow.py): a read sees the bindings that
can reach it, the way Python runs the code.

Each case is a few lines of Python and the set of values the marked read
`use(x)` can see, named by their source (`ENTRY`: no binding in this scope
on some path, so the value comes from where the name lives: an outer
scope, the module, another method that set the attribute)."""

from __future__ import annotations

from tests.semantics.helpers import reaching


def test_straight_line_the_latest_binding_wins():
    assert reaching("x = 1\nx = 2\nuse(x)\n") == {"2"}


def test_branches_merge():
    assert reaching("if c:\n    x = 1\nelse:\n    x = 2\nuse(x)\n") == {"1", "2"}
    assert reaching("x = 0\nif c:\n    x = 1\nuse(x)\n") == {"0", "1"}


def test_an_arm_that_leaves_does_not_flow_on():
    code = """
        def f(c):
            x = 0
            if c:
                x = 1
                return
            use(x)
        """
    assert reaching(code) == {"0"}
    assert reaching("import sys\nx = 0\nif c:\n    x = 1\n    sys.exit(1)\nuse(x)\n") == {"0"}
    assert reaching("x = 0\nif c:\n    x = 1\n    raise ValueError\nuse(x)\n") == {"0"}


def test_a_literally_true_or_false_test_takes_one_arm():
    # `if True:` groups imports after a sys.path change: the body always runs
    assert reaching("if True:\n    import torch\nuse(torch)\n") == {"import:torch"}
    assert reaching("x = 0\nif 1:\n    x = 1\nelse:\n    x = 2\nuse(x)\n") == {"1"}
    assert reaching("x = 0\nif False:\n    x = 1\nuse(x)\n") == {"0"}
    # any other test: both arms
    assert reaching("x = 0\nif flag:\n    x = 1\nuse(x)\n") == {"0", "1"}


def test_a_loop_reads_what_its_previous_iteration_bound():
    assert reaching("x = 0\nfor i in r:\n    use(x)\n    x = 1\n") == {"0", "1"}
    # bound earlier in the same iteration: the earlier value cannot reach
    assert reaching("x = 0\nfor i in r:\n    x = 1\n    use(x)\n") == {"1"}
    # after the loop: zero or more iterations
    assert reaching("x = 0\nfor i in r:\n    x = 1\nuse(x)\n") == {"0", "1"}


def test_nested_loops_reach_their_fixed_point():
    code = """
        x = 0
        for i in r:
            for j in s:
                use(x)
            x = 1
        """
    assert reaching(code) == {"0", "1"}
    code = """
        x = 0
        for i in r:
            if c:
                x = 1
            for j in s:
                use(x)
                x = 2
        """
    assert reaching(code) == {"0", "1", "2"}


def test_while_true_ends_only_by_break_and_continue_loops_back():
    code = """
        x = 0
        while True:
            x = 1
            if c:
                break
            x = 2
        use(x)
        """
    assert reaching(code) == {"1"}
    code = """
        x = 0
        for i in r:
            if c:
                x = 1
                continue
            x = 2
        use(x)
        """
    assert reaching(code) == {"0", "1", "2"}


def test_an_except_arm_sees_every_binding_of_the_try_body():
    code = """
        x = 0
        try:
            x = 1
            x = 2
        except OSError:
            use(x)
        """
    assert reaching(code) == {"0", "1", "2"}


def test_rebinding_an_object_replaces_what_its_attributes_held():
    code = """
        def f():
            cfg.lr = 0.1
            cfg = load()
            use(cfg.lr)
        """
    assert reaching(code) == {"ENTRY"}   # the new object's attribute: looked up where it is set
    code = """
        class Trainer:
            def setup(self, m):
                self.model = DDP(m)
                use(self.model)
        """
    assert reaching(code) == {"DDP(m)"}


def test_attributes_and_keys_are_bound_per_target():
    assert reaching("cfg['lr'] = 0.1\ncfg['bs'] = 8\nuse(cfg['lr'])\n") == {"0.1"}
    assert reaching("args.lr = 0.1\nargs.lr = args.lr * 2\nuse(args.lr)\n") == {"args.lr * 2"}


def test_scopes_that_do_not_leak():
    # a comprehension's variable and a class body's names stay inside them
    assert reaching("x = 1\nys = [x for x in r]\nuse(x)\n") == {"1"}
    assert reaching("x = 1\nclass C:\n    x = 2\nuse(x)\n") == {"1"}
    # a function reads a module name at call time: from outside its scope
    assert reaching("x = 1\ndef f():\n    use(x)\n") == {"ENTRY"}


def test_other_binding_forms():
    assert reaching("for a, (b, c) in items:\n    use(c)\n") == {"for:c"}
    assert reaching("with open(p) as f:\n    use(f)\n") == {"with:f"}
    assert reaching("import torch.distributed as dist\nuse(dist)\n") == {"import:dist"}
    assert reaching("if (n := len(r)) > 1:\n    use(n)\n") == {"walrus:n"}
    assert reaching("def f(loader, *args, **kw):\n    use(kw)\n") == {"param:kw"}
    assert reaching("a, (b, c) = build()\nuse(c)\n") == {"build()[1, 1]"}
    assert reaching("x = 1\ndel x\nuse(x)\n") == set()


def test_a_comprehension_in_a_loop_reads_the_previous_iteration_too():
    code = """
        x = 0
        for i in r:
            ys = [use(x) for j in s]
            x = 1
        """
    assert reaching(code) == {"0", "1"}
