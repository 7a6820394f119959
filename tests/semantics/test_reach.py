"""Which code the other ranks run (model/reach.py): up the call graph of the
file, through constructors (`cls(...)` in a classmethod too), and from the
functions the file hands to a worker spawn, directly or through a helper
(in another module) that spawns its parameter. A function nobody runs stays
unjudged."""

from __future__ import annotations

from ddpcheck.model.flow import call_sites_of
from ddpcheck.model.reach import other_ranks_reach
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked


def reached(model, marker: str = "use") -> bool:
    _, site = marked(model, marker)
    return other_ranks_reach(model, site.ctx)


_LAUNCH = ("import torch.multiprocessing as mp\n"
           "def launch(fn, cfg, *args):\n"
           "    mp.spawn(fn, args=(cfg, *args), nprocs=cfg.gpus)\n")


def test_a_function_handed_to_a_helper_that_spawns_it_runs_on_every_rank(tmp_path):
    write(tmp_path / "launching.py", _LAUNCH)
    train = write(tmp_path / "runner.py",
                  "import launching\n"
                  "class Runner:\n"
                  "    def __init__(self, cfg):\n"
                  "        self.cfg = cfg\n"
                  "        self.restore()\n"
                  "    def restore(self):\n"
                  "        use(self.cfg)\n"
                  "    @classmethod\n"
                  "    def _worker(cls, rank, cfg):\n"
                  "        runner = cls(cfg)\n"
                  "    @classmethod\n"
                  "    def start(cls, cfg):\n"
                  "        launching.launch(cls._worker, cfg)\n")
    assert reached(build_file(train))


def test_a_helper_that_hands_its_parameter_on_to_the_spawn(tmp_path):
    write(tmp_path / "launching.py", _LAUNCH + "def start(entry, cfg):\n    launch(entry, cfg)\n")
    train = write(tmp_path / "train.py",
                  "from launching import start\n"
                  "def worker(rank, cfg):\n"
                  "    use(cfg)\n"
                  "def main(cfg):\n"
                  "    start(worker, cfg)\n")
    assert reached(build_file(train))


def test_a_function_handed_to_a_helper_that_only_stores_it_is_not_judged(tmp_path):
    write(tmp_path / "hooks.py", "HOOKS = []\ndef register(fn, cfg):\n    HOOKS.append(fn)\n")
    train = write(tmp_path / "train.py",
                  "from hooks import register\n"
                  "def worker(rank, cfg):\n"
                  "    use(cfg)\n"
                  "def main(cfg):\n"
                  "    register(worker, cfg)\n")
    assert not reached(build_file(train))


def test_mp_spawn_of_a_function_runs_it_on_every_rank_even_in_an_uncalled_launcher():
    model = build("""
        import torch.multiprocessing as mp
        def worker(rank, cfg):
            use(cfg)
        def main(cfg):
            mp.spawn(worker, args=(cfg,), nprocs=2)
        """)
    assert reached(model)


def test_cls_outside_a_classmethod_does_not_construct_the_class():
    model = build("""
        import torch.distributed as dist
        class Runner:
            def __init__(self):
                use(self)
        def make(cls):
            return cls()
        dist.init_process_group("nccl")
        make(dict)
        """)
    assert not reached(model)


def test_a_function_nobody_runs_is_not_judged():
    model = build("""
        def worker(rank, cfg):
            use(cfg)
        """)
    assert not reached(model)


_RESUMABLE = ("import torch.distributed as dist\n"
              "class Net:\n"
              "    def __init__(self, width, resume=False, weights=''):\n"
              "        super(Net, self).__init__()\n"
              "        if resume:\n"
              "            use(weights)\n"
              "def main(flag):\n"
              "    dist.init_process_group('nccl')\n"
              "    net = {call}\n"
              "main(read_flag())\n")


def test_an_arm_no_call_of_the_file_enters_is_not_run():
    # every construction leaves `resume` at its default False: the arm never runs
    assert not reached(build(_RESUMABLE.format(call="Net(128)")))
    assert not reached(build(_RESUMABLE.format(call="Net(128, resume=False)")))


def test_an_arm_some_call_may_enter_is_run():
    assert reached(build(_RESUMABLE.format(call="Net(128, resume=True, weights='w.pt')")))
    assert reached(build(_RESUMABLE.format(call="Net(128, resume=flag)")))   # unknown: may be taken
    both = _RESUMABLE.format(call="Net(128)\n    other = Net(64, True)")
    assert reached(build(both))


def test_a_function_whose_callers_are_unknown_keeps_its_arms():
    # handed on (`factory = Net`): some caller elsewhere may pass resume=True
    assert reached(build(_RESUMABLE.format(call="build(Net)")))


def test_super_naming_its_class_constructs_nothing():
    # `super(Net, self)` is no use of Net that hides its callers
    model = build(_RESUMABLE.format(call="Net(128)"))
    _, site = marked(model)
    assert [c.func for c in call_sites_of(model, site.ctx.function)] == ["Net"]
