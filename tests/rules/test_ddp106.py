"""DDP106 unreduced-metric: beyond the fixtures."""

from pathlib import Path

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY
from tests.conftest import write
from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
val_loader = DataLoader(ds, sampler=DistributedSampler(ds, drop_last=True))

def evaluate(model, loader):
    correct = 0
    total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.numel()
"""


def test_print_after_the_loop():
    [f] = findings("DDP106", HEAD + "    print(correct / total)\n\nevaluate(model, val_loader)\n")
    assert f.line == 13
    assert "`correct`" in f.message and "`val_loader`" in f.message and "one rank's shard" in f.message
    assert "all_reduce" in f.fix and "torchmetrics" in f.fix


def test_return_of_a_derived_value():
    src = HEAD + "    acc = correct / total\n    return acc\n\nprint(evaluate(model, val_loader))\n"
    assert lines("DDP106", src) == [14]


def test_a_return_every_caller_throws_away_is_no_report():
    src = HEAD + "    acc = correct / total\n    return acc\n\nevaluate(model, val_loader)\n"
    assert lines("DDP106", src) == []


def test_reductions_silence_it():
    for reduction in ("dist.all_reduce(t)", "utils.reduce_across_processes(total)", "reduce_tensor(t)",
                      "metric_logger.synchronize_between_processes()", "dist.all_gather_object(out, correct)",
                      "m.compute()", "accelerator.gather_for_metrics(t)"):
        src = HEAD + f"    {reduction}\n    print(correct / total)\n\nevaluate(model, val_loader)\n"
        assert lines("DDP106", src) == [], reduction


def test_caller_reduces_the_returned_value():
    src = HEAD + "    return torch.tensor([correct, total])\n\n" \
        "t = evaluate(model, val_loader)\ndist.all_reduce(t)\nprint(t[0] / t[1])\n"
    assert lines("DDP106", src) == []


def test_not_distributed_sampler_or_not_eval_is_silent():
    plain = HEAD.replace("DataLoader(ds, sampler=DistributedSampler(ds, drop_last=True))", "DataLoader(ds)")
    assert lines("DDP106", plain + "    print(correct / total)\n\nevaluate(model, val_loader)\n") == []


def test_print_inside_the_loop_is_progress_not_a_report():
    src = HEAD + "            print(correct / total)\n\nevaluate(model, val_loader)\n"
    assert lines("DDP106", src) == []


def test_single_process_only_report_is_silent():
    src = HEAD + "    if not dist.is_initialized():\n        print(correct / total)\n\nevaluate(model, val_loader)\n"
    assert lines("DDP106", src) == []


def test_meter_from_an_unseen_package_is_not_judged():
    src = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from vendor.meters import AverageMeter
val_loader = DataLoader(ds, sampler=DistributedSampler(ds, drop_last=True))
top1 = AverageMeter()
with torch.no_grad():
    for x, y in val_loader:
        top1.update(acc(model(x), y))
print(top1.avg)
"""
    assert lines("DDP106", src) == []


def test_evaluation_in_a_local_module_is_reported_at_the_call(tmp_path: Path):
    write(tmp_path / "engine.py", """\
        import torch
        import torch.distributed as dist

        def run_eval(model, loader):
            errors = []
            for x, y in loader:
                errors.append((model(x) - y).abs().mean())
            return sum(errors) / len(errors)
        """)
    train = write(tmp_path / "train.py", """\
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from engine import run_eval

        dist.init_process_group("nccl")
        test_loader = DataLoader(ds, sampler=DistributedSampler(ds, drop_last=True))
        mae = run_eval(model, test_loader)
        """)
    result = lint_path(str(train), LintSettings(enabled=frozenset(REGISTRY)))
    [f] = [f for f in result.findings if f.code == "DDP106"]
    assert f.line == 7 and "engine.py" in f.message
