"""Where running a function starts the process group (model/distributed.py:
group_start_in): in its body or any number of calls down, across modules and
through constructors and methods; a recursive chain ends."""

from __future__ import annotations

from ddpcheck.model.distributed import group_start_in, script_destroys
from ddpcheck.model.flow import resolve_call
from tests.conftest import write
from tests.semantics.helpers import build_file


def _start(tmp_path, entry_call: str):
    model = build_file(tmp_path / "train.py", tmp_path)
    site = next(c for c in model.calls if c.func == entry_call)
    found = group_start_in(*resolve_call(model, site))
    return None if found is None else (found[0].file_name, found[1].func)


def test_a_group_start_seven_calls_down_across_modules_is_found(tmp_path):
    # no depth is cut: a framework's entry point reaches its init through many helpers
    write(tmp_path / "comm.py", "import torch.distributed as dist\ndef start():\n    dist.init_process_group('nccl')\n")
    chain = "from comm import start\n" + "".join(f"def step{i}():\n    step{i + 1}()\n" for i in range(6)) \
        + "def step6():\n    start()\n"
    write(tmp_path / "steps.py", chain)
    write(tmp_path / "train.py", "from steps import step0\nstep0()\n")
    assert _start(tmp_path, "step0") == ("comm.py", "dist.init_process_group")


def test_a_call_chain_deeper_than_pythons_stack_is_walked_to_its_end(tmp_path):
    # 3,000 functions in a row, each calling the next: the walk is iterative
    chain = "import torch.distributed as dist\n" + "".join(f"def f{i}():\n    f{i + 1}()\n" for i in range(3000)) \
        + "def f3000():\n    dist.init_process_group('gloo')\n"
    write(tmp_path / "deep.py", chain)
    write(tmp_path / "train.py", "from deep import f0\nf0()\n")
    assert _start(tmp_path, "f0") == ("deep.py", "dist.init_process_group")


def test_the_nearest_group_start_is_the_one_named(tmp_path):
    write(tmp_path / "train.py", "import torch.distributed as dist\n"
                                 "def far():\n    a()\ndef a():\n    b()\ndef b():\n    dist.init_process_group('nccl')\n"
                                 "def near():\n    dist.init_process_group('gloo')\n"
                                 "def entry():\n    far()\n    near()\n"
                                 "entry()\n")
    model = build_file(tmp_path / "train.py", tmp_path)
    site = next(c for c in model.calls if c.func == "entry")
    found = group_start_in(*resolve_call(model, site))
    assert found[1].arg("backend", 0).value == "'gloo'"


def test_three_calls_down_through_a_base_class_constructor(tmp_path):
    write(tmp_path / "comm.py", "import torch.distributed as dist\ndef start():\n    dist.init_process_group('nccl')\n")
    write(tmp_path / "base.py", "from comm import start\nclass Base:\n    def __init__(self):\n        self.setup()\n"
                                "    def setup(self):\n        start()\n")
    write(tmp_path / "task.py", "from base import Base\nclass Task(Base):\n    pass\n")
    write(tmp_path / "train.py", "from task import Task\nTask()\n")
    assert _start(tmp_path, "Task") == ("comm.py", "dist.init_process_group")


def test_a_chain_that_starts_nothing(tmp_path):
    write(tmp_path / "walk.py", "import torch.distributed as dist\n"
                                "def down(n):\n    if n:\n        up(n)\n"
                                "def up(n):\n    down(n - 1)\n"
                                "def never():\n    dist.init_process_group('gloo')\n")
    write(tmp_path / "train.py", "from walk import down\ndown(3)\n")
    assert _start(tmp_path, "down") is None


_LAUNCHER = ("import torch.distributed as dist\nimport torch.multiprocessing as mp\n"
             "def launch(main_func, gpus):\n"
             "    mp.start_processes(_worker, nprocs=gpus, args=(main_func,), start_method='spawn')\n"
             "def _worker(index, main_func):\n"
             "    dist.init_process_group('nccl', rank=index)\n"
             "    main_func()\n{teardown}")


def test_a_group_started_in_the_workers_a_helper_spawns(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "from .launch import launch\n")
    write(tmp_path / "pkg" / "launch.py", _LAUNCHER.format(teardown=""))
    # `from pkg import launch` is the function the package re-exports, not its submodule
    write(tmp_path / "train.py", "from pkg import launch\ndef main():\n    pass\nlaunch(main, 2)\n")
    assert _start(tmp_path, "launch") == ("launch.py", "dist.init_process_group")
    model = build_file(tmp_path / "train.py", tmp_path)
    assert script_destroys(model) is False


def test_a_teardown_in_the_spawned_workers_is_seen(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "from .launch import launch\n")
    write(tmp_path / "pkg" / "launch.py", _LAUNCHER.format(teardown="    dist.destroy_process_group()\n"))
    write(tmp_path / "train.py", "from pkg import launch\ndef main():\n    pass\nlaunch(main, 2)\n")
    assert script_destroys(build_file(tmp_path / "train.py", tmp_path)) is True


def test_a_package_that_imports_its_own_submodule_still_gives_the_submodule(tmp_path):
    # `from . import comm` in __init__.py binds the submodule itself: `from pkg import comm` is it
    write(tmp_path / "pkg" / "__init__.py", "from . import comm\n")
    write(tmp_path / "pkg" / "comm.py", "import torch.distributed as dist\ndef start():\n"
                                        "    dist.init_process_group('nccl')\n")
    write(tmp_path / "train.py", "from pkg import comm\ncomm.start()\n")
    assert _start(tmp_path, "comm.start") == ("comm.py", "dist.init_process_group")


def test_a_worker_spawned_as_an_attribute_of_an_imported_module(tmp_path):
    # `mp.spawn(mpu.run, ...)` with `import pkg.workers as mpu`: the import is looked up
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "workers.py", "import torch.distributed as dist\n"
                                           "def run(index, func, cfg):\n"
                                           "    dist.init_process_group('nccl', rank=index)\n    func(cfg)\n")
    write(tmp_path / "pkg" / "jobs.py", "import torch.multiprocessing as mp\nimport pkg.workers as mpu\n"
                                        "def launch_job(cfg, func):\n    mp.spawn(mpu.run, nprocs=2, args=(func, cfg))\n")
    write(tmp_path / "setup.py", "")
    write(tmp_path / "train.py", "from pkg.jobs import launch_job\ndef train(cfg):\n    pass\n"
                                 "launch_job(None, train)\n")
    assert _start(tmp_path, "launch_job") == ("workers.py", "dist.init_process_group")
