"""Does analysis time grow linearly with file size?

Generates training-script-like modules (a DDP prelude so they pass the
prefilter, then N pairs of functions, about 26 lines per pair: loaders with samplers,
optimizers, epoch loops, rank guards, saves, collectives, helpers calling one
another, a Trainer class every tenth) at several
sizes, up to 1,000 pairs (2,000+ functions, ~27,000 lines), and times (CPU time, in this process):
the bare libcst parse (the baseline), the model build, the rules, and the
positions of the findings. The figure that matters is analysis / parse per
size: flat means linear; a ratio that grows with the size means a
superlinear spot.

    python benchmarks/lint_scaling.py              # 250, 500, 1000 function pairs
    python benchmarks/lint_scaling.py --sizes 1000 --profile   # where the time goes
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import libcst as cst

from ddpcheck.lint.analyze import analyze
from ddpcheck.model.project import Project
from ddpcheck.rules import REGISTRY
from ddpcheck.settings import LintSettings

PRELUDE = '''\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
rank = dist.get_rank()
world_size = dist.get_world_size()
model = DDP(build_model().cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])

'''

FUNCTION = '''\
def step_{i}(batch, cfg, loader_{i}):
    x = batch["input"].cuda() * cfg.scale_{i}
    loss = model(x).mean() / world_size
    if rank == 0 and {i} % 7 == 0:
        print("step", {i}, loss.item())
    for j, item in enumerate(loader_{i}):
        loss = loss + helper_{prev}(item, j)
    if cfg.save_{i}:
        torch.save(model.state_dict(), f"ckpt_{i}.pt")
    return loss


def build_{i}(cfg, ds):
    sampler = DistributedSampler(ds, shuffle=cfg.shuffle_{i})
    loader = DataLoader(ds, batch_size=cfg.batch_size // world_size, sampler=sampler)
    val_loader = DataLoader(ds, batch_size=cfg.eval_batch, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr_{i})
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        step_{i}(next(iter(loader)), cfg, loader)
    with torch.no_grad():
        for x, y in val_loader:
            acc = (model(x).argmax(1) == y).float().mean()
    dist.all_reduce(acc)
    return loader, opt


'''

CLASS = '''\
class Trainer{i}:
    def __init__(self, cfg):
        self.cfg = cfg
        self.model = DDP(build_model().cuda())
        self.is_main = dist.get_rank() == 0

    def save(self, path):
        if self.is_main:
            torch.save(self.model.module.state_dict(), path)

    def fit(self, loader):
        for epoch in range(self.cfg.epochs):
            for batch in loader:
                self.model(batch).backward()
            self.save(f"epoch{{epoch}}.pt")


'''


def generate(functions: int) -> str:
    parts = [PRELUDE]
    for i in range(functions):
        parts.append(FUNCTION.format(i=i, prev=max(0, i - 1)))
        if i % 10 == 0:
            parts.append(f"def helper_{i}(item, j):\n    return item.sum() * j\n\n\n")
            parts.append(CLASS.format(i=i))
    parts.append("sampler = DistributedSampler(ds)\n"
                 "loader = DataLoader(ds, batch_size=cfg.global_batch_size, sampler=sampler)\n")
    return "".join(parts)


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()   # CPU time: other load on the machine does not count
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000], help="function pairs per module")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="profile the analysis of the largest size")
    args = parser.parse_args()
    settings = LintSettings(enabled=frozenset(REGISTRY))

    print(f"{'pairs':>9} {'lines':>7} {'parse s':>8} {'build s':>8} {'analyze s':>9} "
          f"{'findings':>8} {'analyze/parse':>13}")
    ratios = []
    for n in args.sizes:
        text = generate(n)
        lines = text.count("\n")
        module = cst.parse_module(text)
        parse_s = best_of(args.repeat, lambda: cst.parse_module(text))
        build_s = best_of(args.repeat, lambda: Project(settings).build("scale.py", module))
        findings: list = []
        analyze_s = best_of(args.repeat, lambda: findings.__setitem__(slice(None), analyze(text, "scale.py", settings).findings))
        # analyze() parses too: what it adds over the parse is the analysis
        ratio = (analyze_s - parse_s) / parse_s
        ratios.append(ratio)
        print(f"{n:>9} {lines:>7} {parse_s:>8.2f} {build_s:>8.2f} {analyze_s:>9.2f} {len(findings):>8} "
              f"{ratio:>12.2f}x")
    growth = ratios[-1] / ratios[0] if ratios[0] > 0 else float("nan")
    size_growth = args.sizes[-1] / args.sizes[0]
    print(f"analysis/parse grew {growth:.2f}x while the file grew {size_growth:.0f}x "
          f"({'linear' if growth < 1.5 else 'SUPERLINEAR'})")
    if args.profile:
        text = generate(args.sizes[-1])
        profile = cProfile.Profile()
        profile.enable()
        analyze(text, "scale.py", settings)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
