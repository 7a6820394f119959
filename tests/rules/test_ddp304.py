"""DDP304 download-on-every-rank: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import os
import torch.distributed as dist
from torchvision import datasets, models
dist.init_process_group("nccl")
rank = dist.get_rank()
"""


def test_message_names_the_call_the_race_and_the_fix():
    (f,) = findings("DDP304", HEAD + 'ds = datasets.CIFAR10("data", download=True)\n')
    assert f.line == 6 and f.severity.name == "WARNING"
    assert "`datasets.CIFAR10(...)`" in f.message and "every rank" in f.message and "corrupt" in f.message
    assert "dist.barrier()" in f.fix and "download=False" in f.fix


def test_only_a_literal_download_true_counts():
    src = HEAD + """\
a = datasets.MNIST("data", download=False)
b = datasets.MNIST("data", download=args.download)
c = datasets.MNIST("data")
d = datasets.MNIST("data", download=True)
"""
    assert lines("DDP304", src) == [9]


def test_hub_weights_and_non_distributed_scripts_are_not_judged():
    assert lines("DDP304", HEAD + "net = models.resnet50(pretrained=True)\n") == []
    single = 'from torchvision import datasets\nimport torch\nds = datasets.CIFAR10("d", download=True)\nx = local_rank\n'
    assert lines("DDP304", single) == []


def test_guards_early_exits_and_try_bodies():
    src = HEAD + """\
def build(root):
    if not is_main_process():
        return None
    return datasets.CIFAR10(root, download=True)

def build_retry(root):
    try:
        return datasets.CIFAR10(root, download=True)
    except RuntimeError:
        return None

if rank == 0:
    datasets.CIFAR10("data", download=True)
build("data")
build_retry("data")
"""
    assert lines("DDP304", src) == []


def test_rank_zero_first_context_managers_by_name():
    src = HEAD + """\
def main(training_args):
    with training_args.main_process_first(desc="dataset map pre-processing"):
        a = datasets.CIFAR10("data", download=True)
    with torch_distributed_zero_first(rank):
        b = datasets.CIFAR10("data", download=True)
    c = datasets.CIFAR10("data", download=True)
main(args)
"""
    assert lines("DDP304", src) == [11]


def test_the_sandwich_orders_what_is_between_its_halves_only():
    src = HEAD + """\
def main():
    if rank != 0:
        dist.barrier()
    a = datasets.STL10("data", download=True)
    if rank == 0:
        dist.barrier()
    b = datasets.STL10("data", split="test", download=True)
    c = datasets.SVHN("data", split="test", download=True)
main()
"""
    # after the sandwich, the same data set finds rank 0's files; another one downloads again
    assert lines("DDP304", src) == [13]


def test_a_caller_ordering_covers_the_helper():
    src = HEAD + """\
def build(root):
    return datasets.CIFAR10(root, download=True)

def main():
    if rank != 0:
        dist.barrier()
    build("data")
    if rank == 0:
        dist.barrier()
main()
"""
    assert lines("DDP304", src) == []
    unordered = src.replace("    if rank != 0:\n        dist.barrier()\n", "")
    assert lines("DDP304", unordered) == [7]


def test_a_download_in_the_launching_process_runs_once():
    src = """\
import torch.distributed as dist
import torch.multiprocessing as mp
from torchvision import datasets

def worker(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    ds = datasets.MNIST("data", download=True)

def main():
    datasets.MNIST("data", download=True)
    mp.spawn(worker, args=(4,), nprocs=4)

if __name__ == "__main__":
    datasets.MNIST("data", train=False, download=True)
    main()
"""
    assert lines("DDP304", src) == [7]
