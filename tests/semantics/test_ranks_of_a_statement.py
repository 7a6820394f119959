"""Which processes run a statement (model/guards.py, model/reach.py,
model/paths.py): a test that lets one process of the job through (`rank ==
<a value every rank shares>`), a flag an object keeps from its constructor
call, the worlds a function runs in from its calls, and per-rank file
indices from a loop strided over the ranks. Each case has its negative."""

from __future__ import annotations

from ddpcheck.model.flow import resolve_call
from ddpcheck.model.guards import condition_in_call, one_rank_only
from ddpcheck.model.paths import per_rank_path
from ddpcheck.model.reach import reaching_worlds
from ddpcheck.model.worlds import D0, DN, S
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked


def one_rank(code: str) -> bool:
    model = build(code)
    _, site = marked(model)
    return one_rank_only(model, site.ctx)


# -- one process of the job ---------------------------------------------------------

def test_the_last_rank_is_one_process():
    assert one_rank("def f(args):\n"
                    "    if args.tb_dir and args.rank == (args.world_size - 1):\n"
                    "        use(1)\n")


def test_a_literal_rank_other_than_zero_is_one_process():
    assert one_rank("import torch.distributed as dist\n"
                    "def f():\n"
                    "    if dist.get_rank() != 3:\n"
                    "        return\n"
                    "    use(1)\n")


def test_a_world_size_read_through_an_unpacked_name_is_shared_by_every_rank():
    assert one_rank("import torch.distributed as dist\n"
                    "def f():\n"
                    "    rank, world = dist.get_rank(), dist.get_world_size()\n"
                    "    if rank == world - 1:\n"
                    "        use(1)\n")


def test_a_predicate_returning_a_last_rank_test_and_a_flag_bound_to_one():
    assert one_rank("import torch.distributed as dist\n"
                    "def is_last():\n"
                    "    return dist.get_rank() == dist.get_world_size() - 1\n"
                    "def f():\n"
                    "    if is_last():\n"
                    "        use(1)\n")
    assert one_rank("def f(args):\n"
                    "    last = args.rank == args.world_size - 1\n"
                    "    if last:\n"
                    "        use(1)\n")


def test_taking_turns_is_every_rank():
    # the loop index differs per iteration: each rank passes the test once
    assert not one_rank("import torch.distributed as dist\n"
                        "def f():\n"
                        "    for turn in range(dist.get_world_size()):\n"
                        "        if dist.get_rank() == turn:\n"
                        "            use(1)\n")


def test_a_rank_compared_with_a_value_not_known_to_be_shared_is_not_one_process():
    assert not one_rank("def f(args, src):\n"
                        "    if args.rank == src:\n"
                        "        use(1)\n")
    assert not one_rank("def f(args):\n"
                        "    if args.rank == args.world_size - 1 or args.debug:\n"
                        "        use(1)\n")
    assert not one_rank("def f(args):\n"
                        "    if args.rank != args.world_size - 1:\n"
                        "        use(1)\n")


def test_a_rank_compared_with_a_broadcast_value_is_one_process():
    assert one_rank("import torch.distributed as dist\n"
                    "def f(rank, world, draw):\n"
                    "    box = [draw] if rank == 0 else [None]\n"
                    "    dist.broadcast_object_list(box, src=0)\n"
                    "    if dist.get_rank() == box[0]:\n"
                    "        use(1)\n")
    assert one_rank("import torch, torch.distributed as dist\n"
                    "def f():\n"
                    "    t = torch.tensor([dist.get_rank()])\n"
                    "    dist.all_reduce(t)\n"
                    "    if dist.get_rank() == int(t):\n"
                    "        use(1)\n")


def test_a_list_read_before_its_broadcast_or_broadcast_only_in_one_arm_is_not_shared():
    assert not one_rank("import torch.distributed as dist\n"
                        "def f(rank, draw):\n"
                        "    box = [draw]\n"
                        "    if dist.get_rank() == box[0]:\n"
                        "        use(1)\n"
                        "    dist.broadcast_object_list(box, src=0)\n")
    assert not one_rank("import torch.distributed as dist\n"
                        "def f(rank, draw, sync):\n"
                        "    box = [draw]\n"
                        "    if sync:\n"
                        "        dist.broadcast_object_list(box, src=0)\n"
                        "    if dist.get_rank() == box[0]:\n"
                        "        use(1)\n")


# -- a flag an object keeps from its constructor call --------------------------------

_LOGGER = ("import wandb\n"
           "class Tracker:\n"
           "    def __init__(self, enabled):\n"
           "        self.enabled = enabled\n"
           "    def record(self, d):\n"
           "        if self.enabled:\n"
           "            wandb.log(d)\n")


def _record_condition(tmp_path, construct: str):
    write(tmp_path / "tracking.py", _LOGGER)
    script = build_file(write(tmp_path / "train.py",
                              "import torch.distributed as dist\n"
                              "from tracking import Tracker\n"
                              "def main():\n"
                              "    rank = dist.get_rank()\n"
                              f"    t = {construct}\n"
                              "    t.record({})\n"))
    call = next(c for c in script.calls if c.func == "t.record")
    helper, record = resolve_call(script, call)
    test = next(c for c in helper.calls if c.func == "wandb.log").ctx.branches[0].test
    return condition_in_call(helper, test, record, ((script, call),))


def test_a_method_guarded_by_a_flag_its_object_got_from_the_constructor(tmp_path):
    cond = _record_condition(tmp_path, "Tracker(rank == 0)")
    assert DN not in cond.true_branch and D0 in cond.true_branch


def test_an_object_made_with_a_true_flag_writes_on_every_rank(tmp_path):
    cond = _record_condition(tmp_path, "Tracker(True)")
    assert DN in cond.true_branch


def test_a_flag_stored_then_tested_in_the_constructor_is_the_argument(tmp_path):
    write(tmp_path / "boards.py",
          "from torch.utils.tensorboard import SummaryWriter\n"
          "class Board:\n"
          "    def __init__(self, folder, on=True):\n"
          "        self.on = on and SummaryWriter is not None\n"
          "        self.w = SummaryWriter(folder) if self.on else None\n")
    script = build_file(write(tmp_path / "train.py",
                              "import torch.distributed as dist\n"
                              "from boards import Board\n"
                              "b = Board('runs', on=dist.get_rank() == 0)\n"
                              "c = Board('runs')\n"))
    guarded, default = (c for c in script.calls if c.func == "Board")
    helper, init = resolve_call(script, guarded)
    test = next(c for c in helper.calls if c.func == "SummaryWriter").ctx.branches[0].test
    assert DN not in condition_in_call(helper, test, init, ((script, guarded),)).true_branch
    assert DN in condition_in_call(helper, test, init, ((script, default),)).true_branch


_SWITCHES = ("from torch.utils.tensorboard import SummaryWriter\n"
             "class Switches:\n"
             "    def __init__(self, folder, enable=True, features={'board': True}):\n"
             "        self.enable = enable\n"
             "        self.features = features\n"
             "        for name, wanted in self.features.items():\n"
             "            self.features[name] = wanted and self.enable\n"
             "{after}"
             "        if self.features['board']:\n"
             "            self.w = SummaryWriter(folder)\n")


def _board_condition(tmp_path, after: str, construct: str):
    write(tmp_path / "switches.py", _SWITCHES.replace("{after}", after))
    script = build_file(write(tmp_path / "train.py",
                              "import torch.distributed as dist\n"
                              "from switches import Switches\n"
                              f"s = {construct}\n"))
    call = next(c for c in script.calls if c.func == "Switches")
    helper, init = resolve_call(script, call)
    test = next(c for c in helper.calls if c.func == "SummaryWriter").ctx.branches[-1].test
    return condition_in_call(helper, test, init, ((script, call),))


def test_a_dict_entry_after_a_loop_that_rewrites_every_entry_holds_what_it_stored(tmp_path):
    cond = _board_condition(tmp_path, "", "Switches('runs', enable=dist.get_rank() == 0)")
    assert DN not in cond.true_branch
    assert DN in _board_condition(tmp_path, "", "Switches('runs')").true_branch


def test_an_entry_stored_again_after_the_loop_is_not_judged_by_the_loop(tmp_path):
    cond = _board_condition(tmp_path, "        self.features['board'] = True\n",
                            "Switches('runs', enable=dist.get_rank() == 0)")
    assert DN in cond.true_branch


# -- the worlds a function runs in, from its calls -----------------------------------

def test_a_helper_called_only_in_a_one_process_job_runs_only_there():
    model = build("def preview(m):\n"
                  "    use(m)\n"
                  "def main(args, m):\n"
                  "    if not args.distributed:\n"
                  "        preview(m)\n")
    _, site = marked(model)
    assert reaching_worlds(model, site.ctx) == frozenset({S})


def test_a_helper_also_called_unguarded_runs_everywhere():
    model = build("def preview(m):\n"
                  "    use(m)\n"
                  "def main(args, m):\n"
                  "    if not args.distributed:\n"
                  "        preview(m)\n"
                  "    preview(m)\n")
    _, site = marked(model)
    assert DN in reaching_worlds(model, site.ctx)


# -- per-rank file indices -----------------------------------------------------------

def _path_is_per_rank(code: str) -> bool:
    model = build(code)
    site = next(c for c in model.calls if c.func == "torch.save")
    return per_rank_path(model, site.arg("f", 1), site.ctx.function)


def test_indices_strided_over_the_ranks_name_a_file_per_rank():
    assert _path_is_per_rank("import torch, torch.distributed as dist\n"
                             "def f(out, n):\n"
                             "    for i in range(dist.get_rank(), n, dist.get_world_size()):\n"
                             "        torch.save(i, f'{out}/{i}.pt')\n")


def test_indices_from_the_rank_without_the_stride_overlap():
    assert not _path_is_per_rank("import torch, torch.distributed as dist\n"
                                 "def f(out, n):\n"
                                 "    for i in range(dist.get_rank(), n):\n"
                                 "        torch.save(i, f'{out}/{i}.pt')\n")


def test_a_path_unpacked_beside_the_rank_is_not_built_from_it():
    # `save_dir, rank = Path(d), opt.rank` pairs element by element: the path is the first one only
    code = ("import torch\nfrom pathlib import Path\n"
            "def f(opt, net):\n"
            "    save_dir, epochs, rank = Path(opt.save_dir), opt.epochs, opt.global_rank\n"
            "    torch.save(net, save_dir / 'last.pt')\n")
    assert not _path_is_per_rank(code)
    assert _path_is_per_rank(code.replace("save_dir / 'last.pt'", "save_dir / f'last{rank}.pt'"))


# -- what a rank test reads ------------------------------------------------------------

def _zero_test_is_rank_zero(code: str) -> bool:
    from ddpcheck.model.guards import is_rank_expr

    model = build(code)
    expr, site = marked(model)
    return is_rank_expr(model, expr, site.ctx.function)


_INIT = ("import torch.distributed as dist\n"
         "from pkg.config import cfg\n"
         "def init_dist():\n"
         "    dist.init_process_group('nccl')\n"
         "    return dist.get_world_size(), dist.get_rank()\n")


def test_an_attribute_unpacked_from_what_a_helper_returns_is_a_rank():
    assert _zero_test_is_rank_zero(_INIT + "def main():\n    total, cfg.leader = init_dist()\n    use(cfg.leader)\n")
    # the other element is the world size: no rank
    assert not _zero_test_is_rank_zero(_INIT + "def main():\n    cfg.total, leader = init_dist()\n    use(cfg.total)\n")


def test_a_config_attribute_in_capitals_is_named_like_a_rank():
    assert _zero_test_is_rank_zero("def main(cfg):\n    use(cfg.LOCAL_RANK)\n")
    assert not _zero_test_is_rank_zero("def main(cfg):\n    use(cfg.NUM_GPUS)\n")
