"""DDP505 global-rank-as-device: beyond the fixtures."""

import pytest

from tests.rules.lintsnippet import findings, lines

HEAD = "import os\nimport torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"


@pytest.mark.parametrize("use", [
    "torch.cuda.set_device(rank)",
    "model.to(rank)",
    "model.cuda(rank)",
    "x = torch.zeros(3, device=rank)",
    "m = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])",
    "m = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], output_device=rank)",
    'd = torch.device("cuda", rank)',
    'd = f"cuda:{rank}"',
    'd = "cuda:%d" % rank',
    'd = "cuda:{}".format(rank)',
    'd = "cuda:" + str(rank)',
])
def test_every_way_of_picking_a_gpu(use):
    src = HEAD + "rank = dist.get_rank()\n" + use + "\n"
    assert lines("DDP505", src) == [6], use


@pytest.mark.parametrize("source", [
    "dist.get_rank()",
    'int(os.environ["RANK"])',
    'int(os.environ.get("RANK", 0))',
    'int(os.getenv("SLURM_PROCID"))',
    'int(os.environ["OMPI_COMM_WORLD_RANK"])',
    "args.node_rank * args.gpus_per_node + gpu",
    'int(os.environ["RANK"]) if "RANK" in os.environ else 0',
])
def test_global_sources(source):
    src = HEAD + f"rank = {source}\ntorch.cuda.set_device(rank)\n"
    (f,) = findings("DDP505", src)
    assert f.line == 6 and f.severity.name == "WARNING"
    assert "global rank" in f.message and "invalid device ordinal" in f.message
    assert 'LOCAL_RANK' in f.fix and "torch.cuda.device_count()" in f.fix


@pytest.mark.parametrize("source", [
    'int(os.environ["LOCAL_RANK"])',
    'int(os.environ["SLURM_LOCALID"])',
    "dist.get_rank() % torch.cuda.device_count()",
    "args.rank % ngpus_per_node",
    "args.local_rank",
    "gpu",
    "0",
])
def test_local_or_unknown_sources_are_not_reported(source):
    src = HEAD + f"rank = {source}\ntorch.cuda.set_device(rank)\n"
    assert lines("DDP505", src) == [], source


def test_a_parameter_is_unknown():
    """The DDP tutorial's `demo_basic(rank, world_size)`: mp.spawn's index."""
    src = HEAD + "def worker(rank, world_size):\n    torch.cuda.set_device(rank)\n    model.to(rank)\n"
    assert lines("DDP505", src) == []


def test_a_name_with_a_local_and_a_global_assignment_is_unknown():
    src = HEAD + ("rank = dist.get_rank()\nif torch.cuda.device_count() < 8:\n"
                  "    rank = rank % torch.cuda.device_count()\ntorch.cuda.set_device(rank)\n")
    assert lines("DDP505", src) == []


def test_message_names_the_source():
    src = HEAD + 'grank = int(os.environ["RANK"])\nmodel = model.to(grank)\n'
    (f,) = findings("DDP505", src)
    assert "`model.to(grank)`" in f.message and "`grank` comes from the `RANK` environment variable" in f.message


def test_script_that_writes_rank_itself():
    src = HEAD + ('os.environ["RANK"] = str(local_index)\nrank = int(os.environ["RANK"])\n'
                  "torch.cuda.set_device(rank)\n")
    assert lines("DDP505", src) == []


def test_spawned_workers_get_rank_is_the_spawn_index():
    src = HEAD + ("import torch.multiprocessing as mp\n"
                  "def worker(i, n):\n    dist.init_process_group('nccl', rank=i, world_size=n)\n"
                  "    torch.cuda.set_device(dist.get_rank())\n"
                  "mp.spawn(worker, args=(4,), nprocs=4)\n")
    assert lines("DDP505", src) == []
    multi = src.replace("rank=i,", "rank=args.nr * 4 + i,").replace(
        "torch.cuda.set_device(dist.get_rank())", "rank = args.nr * 4 + i\n    torch.cuda.set_device(rank)")
    assert lines("DDP505", multi) == [9]


def test_single_process_arm_is_not_reported():
    src = HEAD + ("rank = dist.get_rank()\nif args.distributed:\n    torch.cuda.set_device(args.gpu)\n"
                  "else:\n    torch.cuda.set_device(rank)\n")
    assert lines("DDP505", src) == []


def test_local_helper_returning_the_global_rank():
    src = HEAD + ("def get_rank():\n    if not dist.is_initialized():\n        return 0\n    return dist.get_rank()\n"
                  "torch.cuda.set_device(get_rank())\n")
    (f,) = findings("DDP505", src)
    assert f.line == 9 and "`get_rank()`, which returns `dist.get_rank()`" in f.message


def test_rank_passed_into_a_setup_function():
    src = HEAD + ("def setup(rank, world_size):\n    torch.cuda.set_device(rank)\n"
                  "def main():\n    rank = int(os.environ['RANK'])\n    setup(rank, 8)\n")
    (f,) = findings("DDP505", src)
    assert f.line == 6 and "passed in by `setup(...)`" in f.message
    local = src.replace("os.environ['RANK']", "os.environ['LOCAL_RANK']")
    assert lines("DDP505", local) == []
    spawned = HEAD + ("import torch.multiprocessing as mp\ndef setup(rank, world_size):\n"
                      "    torch.cuda.set_device(rank)\nmp.spawn(setup, args=(8,), nprocs=8)\n")
    assert lines("DDP505", spawned) == []


def test_tuple_assignment():
    src = HEAD + "rank, ws = dist.get_rank(), dist.get_world_size()\ntorch.cuda.set_device(rank)\n"
    assert lines("DDP505", src) == [6]
    src = HEAD + "ws, rank = dist.get_world_size(), int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(rank)\n"
    assert lines("DDP505", src) == []


def test_one_value_reported_once_per_function_naming_the_other_uses():
    """GPT-2 trainers: `local_rank = dist.get_rank()` then set_device, torch.device and device_ids:
    one mistake, one finding at the first use; another function's use is its own finding."""
    src = HEAD + ("rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n"
                  "device = torch.device('cuda', rank)\n"
                  "m = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], output_device=rank)\n"
                  "def evaluate():\n    r = dist.get_rank()\n    return torch.zeros(1).to(r)\n")
    found = findings("DDP505", src)
    assert [f.line for f in found] == [6, 11]
    assert "picks the GPU again below" in found[0].message and "torch.device" in found[0].message
    assert "again" not in found[1].message
