"""Summaries per function follow the call graph to its end: no count of
calls cuts a chain of helpers, and a recursion ends at a fixed point (or at
"not proven"), never in a guess that makes a rule report."""

from __future__ import annotations

from ddpcheck.lint.engine import lint_path
from ddpcheck.model.collectives import calls_param, initialized_guarded, runs_only_uninitialized
from ddpcheck.model.devices import FIXED, backends, cuda_initialised_before, init_sites, module_device, placement
from ddpcheck.model.distributed import function_inits
from ddpcheck.model.env import env_writes
from ddpcheck.model.flow import resolve_call
from ddpcheck.model.launch import commands_in_text
from ddpcheck.model.launchers import launches_processes_after, runs_in_launcher_only, spawns_workers
from ddpcheck.model.ranks import RankKind, rank_origin
from ddpcheck.model.saves import is_save_sink, saved_state_dicts
from ddpcheck.settings import LintSettings
from tests.conftest import needs_rule, write
from tests.rules.lintsnippet import lines
from tests.semantics.helpers import build, build_file, marked


def _function(model, name):
    return next(f for f in model.functions if f.name == name)


def _codes(path, code, root):
    settings = LintSettings(enabled=frozenset({code}), root=str(root))
    return [(f.line, f.code) for f in lint_path(str(path), settings).findings]


# -- a chain of four helpers ------------------------------------------------------------

def test_a_spawn_four_calls_down_makes_every_caller_a_launcher():
    model = build("""
        import torch.multiprocessing as mp
        def worker(i):
            pass
        def d():
            mp.spawn(worker, nprocs=2)
        def c():
            d()
        def b():
            c()
        def a():
            b()
            use(0)
    """)
    assert spawns_workers(model, _function(model, "a"))
    _, site = marked(model)
    assert runs_in_launcher_only(model, site.ctx)


def test_functions_calling_each_other_spawn_only_when_one_of_them_does():
    code = """
        import torch.multiprocessing as mp
        def worker(i):
            pass
        def ping(n):
            if n:
                pong(n - 1)
        def pong(n):
            ping(n)
            {spawn}
    """
    quiet = build(code.format(spawn="pass"))
    assert not spawns_workers(quiet, _function(quiet, "ping"))
    spawning = build(code.format(spawn="mp.spawn(worker, nprocs=2)"))
    assert spawns_workers(spawning, _function(spawning, "ping"))


def test_a_save_helper_four_calls_down_is_a_save(tmp_path):
    write(tmp_path / "ckpt.py", "import torch\n"
                                "def d(obj, p):\n    torch.save(obj, p)\n"
                                "def c(obj, p):\n    d(obj, p)\n"
                                "def b(obj, p):\n    c(obj, p)\n"
                                "def a(obj, p):\n    b(obj, p)\n"
                                "def loop(obj, p):\n    if p:\n        loop(obj, p[1:])\n")
    train = write(tmp_path / "train.py", "from ckpt import a, loop\na(m.state_dict(), 'x')\nloop(m, 'x')\n")
    model = build_file(train, tmp_path)
    save, loop = (next(c for c in model.calls if c.func == name) for name in ("a", "loop"))
    assert is_save_sink(model, save)
    assert not is_save_sink(model, loop)   # recursion without a save: the fixed point is "no save"


def test_a_state_dict_nested_three_dicts_deep_is_what_the_save_writes():
    model = build("""
        import torch
        ckpt = {"run": {"weights": {"model": net.state_dict()}}, "step": 3}
        torch.save({"all": {"of": ckpt}}, "x.pt")
    """)
    sink = next(c for c in model.calls if c.qual == "torch.save")
    found = saved_state_dicts(model, sink, lambda m, e: False)
    assert [model.module.code_for_node(s.node) for s in found] == ["net.state_dict()"]


def test_a_rank_named_through_eight_assignments_is_still_the_global_rank():
    names = [f"r{i}" for i in range(9)]
    chain = "\n".join(f"{b} = {a}" for a, b in zip(names, names[1:]))
    model = build("import torch.distributed as dist\ndist.init_process_group('nccl')\n"
                  f"r0 = dist.get_rank()\n{chain}\nuse(r8)\n")
    expr, site = marked(model)
    assert rank_origin(model, expr, site.ctx.function).kind is RankKind.GLOBAL


def test_a_rank_returned_by_functions_calling_each_other_stays_unknown():
    model = build("""
        import torch.distributed as dist
        dist.init_process_group("nccl")
        def first():
            return second()
        def second():
            return first()
        use(first())
    """)
    expr, site = marked(model)
    assert rank_origin(model, expr, site.ctx.function).kind is RankKind.UNKNOWN


# -- through the rules: a chain across modules, and a recursion --------------------------

_TRAIN = ("import torch\nimport torch.distributed as dist\nfrom helpers import a\n\n"
          "dist.init_process_group('nccl')\nmodel = torch.nn.Linear(2, 2)\na(model, 'out')\n")


@needs_rule("DDP301")
def test_a_write_four_calls_down_in_another_module_is_reported_at_the_call(tmp_path):
    write(tmp_path / "helpers.py", "import torch\n"
                                   "def d(m, p):\n    torch.save(m.state_dict(), p)\n"
                                   "def c(m, p):\n    d(m, p)\n"
                                   "def b(m, p):\n    c(m, p)\n"
                                   "def a(m, p):\n    b(m, p)\n")
    train = write(tmp_path / "train.py", _TRAIN)
    assert _codes(train, "DDP301", tmp_path) == [(7, "DDP301")]


@needs_rule("DDP301")
def test_helpers_calling_each_other_end_and_report_only_a_write_they_reach(tmp_path):
    helpers = ("import torch\n"
               "def a(m, p):\n    b(m, p)\n"
               "def b(m, p):\n    if p:\n        a(m, p[1:])\n    {write}\n")
    write(tmp_path / "helpers.py", helpers.format(write="pass"))
    train = write(tmp_path / "train.py", _TRAIN)
    assert _codes(train, "DDP301", tmp_path) == []
    write(tmp_path / "helpers.py", helpers.format(write="torch.save(m.state_dict(), p)"))
    assert _codes(train, "DDP301", tmp_path) == [(7, "DDP301")]


@needs_rule("DDP301")
def test_a_write_reached_through_a_recursion_under_other_arguments_is_reported(tmp_path):
    # the first entry passes `last=False`: its own write is not taken there,
    # the recursive call takes it (each call is unrolled once)
    write(tmp_path / "helpers.py", "import torch\n"
                                   "def a(m, p, last=False):\n"
                                   "    if last:\n        torch.save(m.state_dict(), p)\n"
                                   "    else:\n        a(m, p, last=True)\n")
    train = write(tmp_path / "train.py", _TRAIN)
    assert _codes(train, "DDP301", tmp_path) == [(7, "DDP301")]


@needs_rule("DDP301")
def test_a_recursion_handing_its_parameters_on_forever_ends_without_a_guess(tmp_path):
    # every turn asks a new question (`last` is judged one call further out);
    # the recursive call is followed once, and `last` is False all along
    write(tmp_path / "helpers.py", "import torch\n"
                                   "def a(m, p, last):\n"
                                   "    if last:\n        torch.save(m.state_dict(), p)\n"
                                   "    a(m, p, last)\n")
    train = write(tmp_path / "train.py", _TRAIN.replace("a(model, 'out')", "a(model, 'out', False)"))
    assert _codes(train, "DDP301", tmp_path) == []


@needs_rule("DDP307")
def test_a_folder_created_four_calls_down_in_another_module_is_reported_at_the_call(tmp_path):
    write(tmp_path / "helpers.py", "import os\n"
                                   "def d(m, p):\n    os.mkdir(p)\n"
                                   "def c(m, p):\n    d(m, p)\n"
                                   "def b(m, p):\n    c(m, p)\n"
                                   "def a(m, p):\n    b(m, p)\n"
                                   "    if p:\n        a(m, p[1:])\n")
    train = write(tmp_path / "train.py", _TRAIN)
    assert _codes(train, "DDP307", tmp_path) == [(7, "DDP307")]


@needs_rule("DDP307")
def test_work_reached_around_a_cycle_of_helpers_is_named_at_its_own_line(tmp_path):
    # `a` and `b` call each other handing nothing on: one question each, solved
    # as a fixed point; the message names the mkdir, not a call of the cycle
    write(tmp_path / "helpers.py", "import os\n"
                                   "def a(m, p):\n    b()\n    os.mkdir('out')\n"
                                   "def b():\n    a(None, 'x')\n")
    train = write(tmp_path / "train.py", _TRAIN)
    settings = LintSettings(enabled=frozenset({"DDP307"}), root=str(tmp_path))
    findings = lint_path(str(train), settings).findings
    assert [(f.line, f.code) for f in findings] == [(7, "DDP307")]
    assert "`os.mkdir(...)` (helpers.py:4)" in findings[0].message


# -- the other questions that followed names or calls a fixed number of steps ------------

def _chain(first: str, n: int, prefix: str = "v") -> str:
    """`v0 = first`, then `v1 = v0` ... up to `v{n}`."""
    lines = [f"{prefix}0 = {first}"] + [f"{prefix}{i} = {prefix}{i - 1}" for i in range(1, n + 1)]
    return "\n".join(lines)


def test_a_model_handed_down_four_helpers_is_called_there():
    model = build("""
        def d(net, x):
            return net(x)
        def c(net, x):
            return d(net, x)
        def b(net, x):
            return c(net, x)
        def a(net, x):
            return b(net, x)
        def ping(net, x):
            return pong(net, x)
        def pong(net, x):
            return ping(net, x)
    """)
    assert calls_param(model, _function(model, "a"), "net") is not None
    assert calls_param(model, _function(model, "ping"), "net") is None


def test_a_flag_holding_is_initialized_through_six_names_guards_the_call():
    model = build("import torch.distributed as dist\n" + _chain("dist.is_initialized()", 6)
                  + "\nif v6:\n    use(dist.get_rank())\n")
    _, site = marked(model)
    assert initialized_guarded(model, site)
    assert not runs_only_uninitialized(model, site)


def test_a_flag_that_depends_on_itself_guards_as_what_it_comes_from():
    code = """
        import torch.distributed as dist
        ready = {first}
        for _ in range(3):
            ready = ready and dist.is_initialized()
        if ready:
            use(dist.get_rank())
    """
    for first, guarded in (("dist.is_initialized()", True), ("load()", False)):
        model = build(code.format(first=first))
        _, site = marked(model)
        assert initialized_guarded(model, site) is guarded, first


def test_a_backend_read_through_six_names():
    model = build("import torch.distributed as dist\n" + _chain("'nccl'", 6, "b") + "\n"
                  "def start():\n    dist.init_process_group(b6)\n"
                  "def ping():\n    pong()\ndef pong():\n    ping()\n"
                  "start()\n")
    assert not function_inits(model, _function(model, "ping"))
    call = next(c for c in model.calls if c.func == "start")
    (init_model, init), = init_sites(model, call)
    assert backends(init_model, init) == frozenset({"nccl"})


def test_a_device_named_through_six_names_and_a_module_placed_in_a_helper_four_calls_down():
    model = build("import torch\n" + _chain("'cuda'", 6, "d") + "\n"
                  "def build4():\n    return torch.nn.Linear(2, 2).cuda()\n"
                  "def build3():\n    return build4()\ndef build2():\n    return build3()\n"
                  "def build1():\n    return build2()\n"
                  "x = torch.zeros(2).to(d6)\nnet = build1()\nuse(net)\n")
    to = next(c for c in model.calls if c.attr == "to")
    assert placement(model, to) == frozenset({FIXED})
    expr, site = marked(model)
    assert module_device(model, expr, None, site.ctx.order) == frozenset({FIXED})


def test_a_name_re_exported_through_five_packages_and_a_circle_of_re_exports(tmp_path):
    write(tmp_path / "p5" / "__init__.py", "def helper():\n    pass\n")
    for i in range(4, 0, -1):
        write(tmp_path / f"p{i}" / "__init__.py", f"from p{i + 1} import helper\n")
    write(tmp_path / "c1" / "__init__.py", "from c2 import helper\n")
    write(tmp_path / "c2" / "__init__.py", "from c1 import helper\n")
    train = write(tmp_path / "train.py", "from p1 import helper\nfrom c1 import helper as other\nhelper()\nother()\n")
    model = build_file(train, tmp_path)
    found, other = (resolve_call(model, next(c for c in model.calls if c.func == name)) for name in ("helper", "other"))
    assert found is not None and found[1].name == "helper" and found[0].path.endswith("__init__.py")
    assert other is None


def test_a_process_count_through_six_shell_variables_and_a_circle_of_them():
    chained = "A=4\nB=$A\nC=$B\nD=$C\nE=$D\nF=$E\ntorchrun --nproc_per_node=$F train.py\n"
    circle = "X=$Y\nY=$X\ntorchrun --nproc_per_node=$X train.py\n"
    assert [c.processes for _, c in commands_in_text(chained, "run.sh")] == [4]
    assert [c.processes for _, c in commands_in_text(circle, "run.sh")] == [None]


def test_cuda_initialised_four_callers_up_and_a_launch_four_callers_up():
    model = build("""
        import os
        import subprocess
        import torch
        def d():
            os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        def c():
            d()
        def b():
            c()
        def a():
            b()
        def top():
            torch.cuda.synchronize()
            a()
        def quiet_d():
            os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        def quiet_c():
            quiet_d()
        def quiet_b():
            quiet_c()
        def quiet_a():
            quiet_b()
            subprocess.run(["python", "worker.py"])
        def ping():
            pong()
        def pong():
            ping()
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        ping()
        top()
        quiet_a()
    """)
    by_fn = {w.ctx.function.name: w.ctx for w in env_writes(model, "CUDA_VISIBLE_DEVICES")}
    init = cuda_initialised_before(model, by_fn["d"])
    assert init is not None and init.qual == "torch.cuda.synchronize"
    assert launches_processes_after(model, by_fn["quiet_d"]) is not None
    assert launches_processes_after(model, by_fn["d"]) is None
    assert cuda_initialised_before(model, by_fn["pong"]) is None   # callers calling each other: nothing before


_LR = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("nccl")
train_loader = DataLoader(ds, batch_size=args.batch_size, sampler=DistributedSampler(ds))
"""


def test_a_learning_rate_read_from_config_through_five_names_is_not_scaled():
    chain = "lr0 = args.lr\n" + "".join(f"lr{i} = lr{i - 1}\n" for i in range(1, 6))
    assert lines("DDP504", _LR + chain + "optimizer = torch.optim.SGD(model.parameters(), lr=lr5)\n") == [12]
    nested = "lr = float(float(float(float(float(args.lr)))))\n"
    assert lines("DDP504", _LR + nested + "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n") == [7]
