"""Tests that provably hold the same value at two places (model/feasibility.py),
a rank flag kept as a dict's entry (model/guards.py through flow.entry_expressions),
a wrapper used only to load `module.`-prefixed weights (wrappers.prefix_adapter),
and a group start skipped once a group exists (distributed.starts_only_once).

Each feature has a case where the engine concludes and one where it must not
(a name rebound in between, another flag, an `or`, a wrapper also called)."""

from __future__ import annotations

from ddpcheck.model.distributed import init_calls, starts_only_once
from ddpcheck.model.feasibility import never_together
from ddpcheck.model.guards import worlds
from ddpcheck.model.values import wraps
from ddpcheck.model.worlds import ALL, D0, DN, MAIN
from ddpcheck.model.wrappers import prefix_adapter, wrapper_in
from tests.semantics.helpers import build, marked


def _wrap_and_use(code: str):
    model = build(code)
    (w,) = wraps(model)
    _, site = marked(model)
    return model, w, site


def _apart(code: str) -> bool:
    model, w, site = _wrap_and_use(code)
    return never_together(model, w.site.ctx, site.ctx)


# -- equivalent conditions ------------------------------------------------------

def test_nested_tests_and_their_conjunction_exclude_the_else_arm():
    assert _apart("""
        from torch.nn import DataParallel
        def main(a, b, m):
            if a:
                if b:
                    m = DataParallel(m)
            if a and b:
                pass
            else:
                use(m)
        """)


def test_the_negated_conjunction_is_the_same_exclusion():
    assert _apart("""
        from torch.nn import DataParallel
        def main(a, b, m):
            if a:
                if b:
                    m = DataParallel(m)
            if not (a and b):
                use(m)
        """)


def test_an_or_of_the_tests_does_not_exclude():
    assert not _apart("""
        from torch.nn import DataParallel
        def main(a, b, m):
            if a or b:
                m = DataParallel(m)
            if a:
                pass
            else:
                use(m)
        """)
    # `not a or not b` is `not (a and b)`: the else arm of `a and b` again
    assert _apart("""
        from torch.nn import DataParallel
        def main(a, b, m):
            if a:
                if b:
                    m = DataParallel(m)
            if not a or not b:
                use(m)
        """)


def test_a_test_rebound_in_between_is_another_value():
    assert not _apart("""
        from torch.nn import DataParallel
        def main(a, b, m):
            if a:
                if b:
                    m = DataParallel(m)
            b = flip()
            if a and b:
                pass
            else:
                use(m)
        """)


def test_a_run_constant_call_is_the_same_value_and_an_unknown_call_is_not():
    assert _apart("""
        import torch
        def main(m):
            if torch.cuda.device_count() > 1:
                m = torch.nn.DataParallel(m)
            if torch.cuda.device_count() > 1:
                pass
            else:
                use(m)
        """)
    assert not _apart("""
        import torch, random
        def main(m):
            if random.random() > 0.5:
                m = torch.nn.DataParallel(m)
            if not random.random() > 0.5:
                use(m)
        """)


def test_a_name_bound_to_a_dict_entry_is_that_entry():
    assert _apart("""
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main(env, m):
            ddp = env["ddp"]
            if ddp:
                m = DDP(m)
            if not env["ddp"]:
                use(m)
        """)
    assert not _apart("""
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main(env, m):
            if env["ddp"]:
                m = DDP(m)
            if not env["distributed"]:
                use(m)
        """)


# -- a conditional unwrap in a helper, decided by the flag of the wrap ---------------

_HELPER = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    def save(m, path, is_wrapped):
        raw = m.module if is_wrapped else m
        use(raw)
    def main(env):
        model = torch.nn.Linear(2, 2)
        if env["ddp"]:
            model = DDP(model)
        save(model, "c.pt", is_wrapped=ARG)
    """


def _holds_wrapper(code: str) -> bool:
    """The marked read may hold the DDP wrapper."""
    model = build(code)
    expr, site = marked(model)
    return wrapper_in(model, expr, site.ctx) is not None


def _helper_holds_wrapper(arg: str) -> bool:
    return _holds_wrapper(_HELPER.replace("ARG", arg))


def test_the_plain_arm_of_an_unwrap_on_the_wraps_own_flag_never_holds_the_wrapper():
    assert not _helper_holds_wrapper('env["ddp"]')


def test_another_flag_or_a_literal_leaves_the_wrapper_possible():
    assert _helper_holds_wrapper('env["amp"]')
    assert _helper_holds_wrapper("False")


def test_an_if_statement_unwrap_on_the_same_flag():
    model = build("""
        from torch.nn.parallel import DistributedDataParallel as DDP
        def save(m, wrapped):
            if wrapped:
                m = m.module
            use(m)
        def main(model, distributed):
            if distributed:
                model = DDP(model)
            save(model, distributed)
        """)
    expr, site = marked(model)
    assert wrapper_in(model, expr, site.ctx) is None


_OPTIONS_FLAG = """
    import argparse
    from torch.nn.parallel import DistributedDataParallel as DDP
    def train(args, generator):
        if args.distributed:
            g_module = generator.module
        else:
            g_module = generator
        use(g_module)
    if __name__ == "__main__":
        args = argparse.ArgumentParser().parse_args()
        args.distributed = True
        generator = make()
        if args.distributed:
            generator = DDP(generator)
        BETWEEN
        train(args, generator)
    """


def _options_helper_holds_wrapper(between: str) -> bool:
    return _holds_wrapper(_OPTIONS_FLAG.replace("BETWEEN", between))


def test_an_options_flag_tested_in_the_helper_is_the_callers_same_flag_at_the_call():
    # the helper's plain arm needs `not args.distributed`, the wrap needs it true: never together
    assert not _options_helper_holds_wrapper("pass")


def test_the_flag_stored_again_before_the_call_is_another_value():
    assert _options_helper_holds_wrapper("args.distributed = False")
    assert _options_helper_holds_wrapper("if flip:\n            args.distributed = False")


# -- a rank flag kept as an entry of a returned dict --------------------------------

def _guard_worlds(code: str):
    model = build(code)
    _, site = marked(model)
    return worlds(model, site.ctx)


def test_an_entry_of_a_returned_dict_holding_a_rank_test_is_a_rank_guard():
    found = _guard_worlds("""
        import torch.distributed as dist
        def setup():
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            return {"rank": rank, "master_process": rank == 0}
        def main():
            env = setup()
            for step in range(10):
                if step % 5 == 0 and env["master_process"]:
                    use(step)
        """)
    assert DN not in found and D0 in found


def test_dict_keywords_too():
    found = _guard_worlds("""
        import torch.distributed as dist
        def setup():
            rank = dist.get_rank()
            return dict(rank=rank, is_master=rank == 0)
        env = setup()
        if env["is_master"]:
            use(env)
        """)
    assert found == MAIN & found and DN not in found


def test_entries_stored_one_by_one_in_each_arm_of_the_setup():
    found = _guard_worlds("""
        import os
        import torch.distributed as dist
        def setup():
            env = {}
            env["ddp"] = int(os.environ.get("RANK", -1)) != -1
            if env["ddp"]:
                dist.init_process_group("nccl")
                env["rank"] = int(os.environ["RANK"])
                env["master_process"] = env["rank"] == 0
            else:
                env["master_process"] = True
            return env
        env = setup()
        def train():
            if env["master_process"]:
                use(env)
        train()
        """)
    assert DN not in found and MAIN <= found


def test_an_entry_not_about_ranks_or_of_an_unknown_dict_is_no_guard():
    assert _guard_worlds("""
        def setup():
            return {"log": True}
        env = setup()
        if env["log"]:
            use(env)
        """) == ALL
    assert _guard_worlds("""
        def main(env):
            if env["checkpoint"]:
                use(env)
        """) == ALL
    # named like a main-process flag, an entry of a dict not seen is judged by its name,
    # as an attribute of that name is
    assert DN not in _guard_worlds("""
        def main(env):
            if env["master_process"]:
                use(env)
        """)


# -- a wrapper used only to load `module.`-prefixed weights -------------------------

def _adapter(code: str) -> bool:
    model = build(code)
    (w,) = wraps(model)
    return prefix_adapter(model, w)


def test_a_wrapper_loaded_into_then_unwrapped_is_a_prefix_adapter():
    assert _adapter("""
        import torch.nn as nn
        def build(sd):
            m = nn.Linear(2, 2)
            m = nn.DataParallel(m)
            m.load_state_dict(sd)
            m = m.module
            return m
        """)


def test_a_wrapper_returned_called_or_never_unwrapped_is_not():
    assert not _adapter("""
        import torch.nn as nn
        def build(sd):
            m = nn.DataParallel(nn.Linear(2, 2))
            m.load_state_dict(sd)
            return m
        """)
    assert not _adapter("""
        import torch.nn as nn
        def build(sd, x):
            m = nn.DataParallel(nn.Linear(2, 2))
            m.load_state_dict(sd)
            y = m(x)
            m = m.module
            return m, y
        """)
    assert not _adapter("""
        import torch.nn as nn
        def build(sd):
            m = nn.DataParallel(nn.Linear(2, 2))
            m.load_state_dict(sd)
            keep = lambda: m
            m = m.module
            return m, keep
        """)


# -- a group start skipped once a group exists --------------------------------------

def _once(code: str) -> bool:
    model = build(code)
    (init,) = init_calls(model)
    return starts_only_once(model, init)


def test_an_early_return_on_an_existing_group_starts_only_once():
    assert _once("""
        import torch.distributed as dist
        def init_group():
            if dist.is_initialized():
                return
            dist.init_process_group("nccl")
        """)
    assert _once("""
        import torch.distributed as dist
        def init_group():
            if dist.is_available() and dist.is_initialized():
                return dist.get_world_size(), dist.get_rank()
            dist.init_process_group("nccl")
            return dist.get_world_size(), dist.get_rank()
        """)
    assert _once("""
        import torch.distributed as dist
        def init_group():
            if not dist.is_initialized():
                dist.init_process_group("nccl")
        """)


def test_other_tests_do_not():
    assert not _once("""
        import torch.distributed as dist
        def init_group(args):
            if not args.distributed:
                return
            dist.init_process_group("nccl")
        """)
    assert not _once("""
        import torch.distributed as dist
        def init_group():
            if dist.is_initialized():
                dist.init_process_group("nccl")
        """)
    assert not _once("""
        import torch.distributed as dist
        def init_group(args):
            if args.distributed and dist.is_initialized():
                return
            dist.init_process_group("nccl")
        """)


def test_a_parameter_every_call_feeds_the_same_value_is_that_value():
    code = """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def save(m, is_wrapped):
            raw = m.module if is_wrapped else m
            use(raw)
        def train(model, env):
            save(model, env["ddp"])
        def main(env):
            model = torch.nn.Linear(2, 2)
            if env["ddp"]:
                model = DDP(model)
            train(model, ENV)
        """
    same = build(code.replace("ENV", "env"))
    expr, site = marked(same)
    assert wrapper_in(same, expr, site.ctx) is None
    other = build(code.replace("ENV", "other_env"))
    expr, site = marked(other)
    assert wrapper_in(other, expr, site.ctx) is not None


# -- a rank flag kept as a field of a returned record --------------------------------

_RECORD = """
    import torch.distributed as dist
    from dataclasses import dataclass
    from typing import NamedTuple
    CLASS
    def setup():
        rank = dist.get_rank()
        return MAKE
    env = setup()
    if env.leader:
        use(env)
    """


def _record_worlds(cls: str, make: str):
    return _guard_worlds(_RECORD.replace("CLASS", cls).replace("MAKE", make))


def test_a_field_of_a_dataclass_or_named_tuple_made_from_a_rank_test_is_a_guard():
    dataclass = "@dataclass\n    class Env:\n        rank: int\n        leader: bool = False\n"
    named = "class Env(NamedTuple):\n        rank: int\n        leader: bool\n"
    assert DN not in _record_worlds(dataclass, "Env(rank=rank, leader=rank == 0)")
    assert DN not in _record_worlds(named, "Env(rank, rank == 0)")


def test_a_record_field_not_about_ranks_or_a_class_with_its_own_init_is_no_guard():
    dataclass = "@dataclass\n    class Env:\n        rank: int\n        leader: bool = False\n"
    # a constant field (the default False) says nothing of ranks: not judged from it
    assert _record_worlds(dataclass, "Env(rank=rank)") == ALL
    assert _record_worlds(dataclass, "Env(rank=rank, leader=True)") == ALL
    own_init = ("class Env:\n        leader: bool\n"
                "        def __init__(self, rank, leader):\n            self.leader = not leader\n")
    assert _record_worlds(own_init, "Env(rank, rank == 0)") != MAIN
