"""Fuzzing `ddpcheck lint`: no input may crash, hang or vanish.

Lints thousands of generated inputs with the real runner (worker processes,
the per-file time limit, files named as on a pre-commit command line):

- mutants of every fixture script (fixtures/**.py): lines deleted,
  duplicated, swapped, re-indented, the text truncated, random statements
  (many of them distributed-training idioms) inserted; helper modules of
  the multi-file fixtures are mutated next to them, so helper resolution is
  fuzzed too;
- grammar-generated programs (hypothesmith) behind a DDP prelude and
  before a DDP epilogue, so that they pass the prefilter and reach the
  model and the rules.

It fails (exit 1) on any traceback on stderr, internal error, crashed
worker, timeout, or input without exactly one result, and keeps each
failing input under --keep for a reproduction. A syntax error, a bad
encoding or "too deeply nested" is a correct answer, not a failure.

    python benchmarks/fuzz_lint.py                    # 10,000 inputs
    python benchmarks/fuzz_lint.py --count 500 --seed 7
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ddpcheck.findings import ErrorKind  # noqa: E402
from ddpcheck.lint.config import known_codes  # noqa: E402
from ddpcheck.lint.runner import LintTask, default_jobs, lint_files  # noqa: E402
from ddpcheck.settings import LintSettings  # noqa: E402

# Answers about the input, not failures of ddpcheck.
INPUT_ERRORS = {ErrorKind.SYNTAX, ErrorKind.ENCODING, ErrorKind.TOO_COMPLEX, ErrorKind.UNREADABLE}
FAILURES = {ErrorKind.INTERNAL, ErrorKind.CRASHED, ErrorKind.TIMED_OUT}

PRELUDE = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
"""
EPILOGUE = """
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, sampler=sampler, batch_size=8)
model = DDP(model, device_ids=[local_rank])
for epoch in range(10):
    for batch in loader:
        loss = model(batch).sum()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "ckpt.pt")
"""

STATEMENTS = [
    "dist.barrier()",
    "dist.all_reduce(loss)",
    "if dist.get_rank() == 0:\n    dist.all_reduce(loss)",
    "if rank == 0:\n    torch.save(model.state_dict(), 'ckpt.pt')",
    "torch.save(model.module.state_dict(), f'ckpt{rank}.pt')",
    "sampler.set_epoch(epoch)",
    "model = DDP(model, device_ids=[local_rank])",
    "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)",
    "model = torch.nn.DataParallel(model)",
    "loader = DataLoader(ds, sampler=DistributedSampler(ds), shuffle=True)",
    "loader = DataLoader(ds, batch_size=args.batch_size // dist.get_world_size())",
    "torch.cuda.set_device(local_rank)",
    "device = torch.device('cuda', int(os.environ['LOCAL_RANK']))",
    "for epoch in range(start, epochs):\n    pass",
    "while True:\n    break",
    "return",
    "return model",
    "yield batch",
    "break",
    "continue",
    "global model",
    "nonlocal sampler",
    "del model",
    "pass",
    "raise",
    "x = lambda t: dist.all_reduce(t)",
    "async def step():\n    await dist.barrier()",
    "with torch.no_grad():\n    out = model(x)",
    "try:\n    dist.barrier()\nexcept Exception:\n    raise",
    "class Trainer:\n    def save(self):\n        torch.save(self.model, 'm.pt')",
    "def is_main_process():\n    return dist.get_rank() == 0",
    "def save_on_master(*args, **kwargs):\n    if is_main_process():\n        torch.save(*args, **kwargs)",
    "if is_main_process():\n    save_on_master(model, 'x.pt')",
    "if args.distributed:\n    sampler = DistributedSampler(dataset)\nelse:\n    sampler = None",
    "model.load_state_dict(torch.load(path, map_location='cpu'))",
    "state = {k[7:]: v for k, v in state.items()}",
    "x: int = 1",
    "match x:\n    case [a, *rest]:\n        pass",
    "@torch.no_grad()\ndef evaluate(model):\n    return model",
    "f(*a, **k)",
    "(w := dist.get_world_size())",
    "print(f'{loss!r:>{width}}')",
    "a = b = c = model",
    "model, opt = amp.initialize(model, opt)",
    "import torch.distributed as dist",
    "from utils import save_on_master, is_main_process",
    "from . import utils",
    "if __name__ == '__main__':\n    main()",
    "metrics = [m for m in metrics if m]",
    "os.environ['CUDA_VISIBLE_DEVICES'] = str(local_rank)",
    "del os.environ['RANK']",
    "lambda: (yield)",
    "*a, b = c",
    "x[0].y[1:2] = z",
]


@dataclass
class Figures:
    inputs: int = 0
    by_source: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)     # analysed / syntax / encoding / ...
    findings: Counter = field(default_factory=Counter)     # rule code -> count
    failures: list[tuple[str, str]] = field(default_factory=list)
    seconds_generating: float = 0.0
    seconds_linting: float = 0.0


# --- mutants ---------------------------------------------------------------------

def fixture_scripts() -> list[Path]:
    return sorted(p for p in (REPO / "fixtures").rglob("*.py"))


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def mutate(text: str, rng: random.Random) -> str:
    """One to three random edits of a script."""
    lines = text.splitlines(keepends=True) or ["\n"]
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(("delete", "duplicate", "swap", "truncate", "insert", "insert", "indent", "blank"))
        i = rng.randrange(len(lines))
        if op == "delete":
            del lines[i:i + rng.randint(1, 3)]
        elif op == "duplicate":
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "truncate":
            joined = "".join(lines)
            lines = joined[: rng.randrange(len(joined) + 1)].splitlines(keepends=True)
        elif op == "insert":
            indent = _indent_of(lines[i]) if rng.random() < 0.8 else " " * rng.choice((0, 4, 8))
            statement = rng.choice(STATEMENTS)
            lines.insert(i, "".join(indent + s + "\n" for s in statement.splitlines()))
        elif op == "indent":
            lines[i] = (" " * rng.choice((0, 2, 4, 8))) + lines[i].lstrip(" ")
        elif op == "blank":
            lines[i] = "\n"
        if not lines:
            lines = ["\n"]
    return "".join(lines)


def mutants(count: int, rng: random.Random) -> list[tuple[str, str, dict[str, str]]]:
    """(name, text, helper modules to write next to it) for `count` mutants."""
    scripts = fixture_scripts()
    texts = {p: p.read_text(encoding="utf-8") for p in scripts}
    out = []
    for n in range(count):
        path = rng.choice(scripts)
        helpers = {}
        if "multifile" in path.parts:
            # Its sibling modules, mutated too: helper resolution gets fuzzed.
            helpers = {s.name: mutate(texts[s], rng) if rng.random() < 0.7 else texts[s]
                       for s in scripts if s.parent == path.parent and s != path}
        out.append((f"mutant{n:05d}.py", mutate(texts[path], rng), helpers))
    return out


# --- grammar-generated programs --------------------------------------------------

def grammar_programs(count: int, seed: int) -> list[str]:
    """`count` programs from hypothesmith's Python grammar strategy, seeded.
    Drawn in runs of at most 500 examples: one long Hypothesis run keeps
    every example's data and grows to gigabytes."""
    import hypothesmith
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    programs: list[str] = []
    strategy = hypothesmith.from_grammar()
    run_number = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hypothesmith compiles what it generates: SyntaxWarnings
        while len(programs) < count:
            wanted = min(500, count - len(programs))

            @hypothesis_seed(seed * 1_000 + run_number)
            @settings(max_examples=wanted, database=None, phases=[Phase.generate], deadline=None,
                      suppress_health_check=list(HealthCheck))
            @given(strategy)
            def collect(source: str) -> None:
                programs.append(source)

            before = len(programs)
            collect()
            run_number += 1
            if len(programs) == before:
                break
    return programs[:count]


def behind_prelude(program: str) -> str:
    return PRELUDE + program.rstrip("\n") + "\n" + EPILOGUE


# --- linting ---------------------------------------------------------------------

def lint_batch(inputs: list[tuple[str, str, dict[str, str]]], folder: Path, jobs: int, time_limit: float,
               figures: Figures, keep: Path | None) -> None:
    """Write the batch as files, lint them all like a pre-commit run (named
    files, worker processes), check every result."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    settings = LintSettings(enabled=frozenset(known_codes()), root=str(folder))
    tasks = []
    sub_folders = 0
    for name, text, helpers in inputs:
        where = folder
        if helpers:
            sub_folders += 1
            where = folder / f"project{sub_folders:05d}"
            where.mkdir()
            for helper, helper_text in helpers.items():
                (where / helper).write_text(helper_text, encoding="utf-8")
                tasks.append(LintTask(str(where / helper), settings, True))
        (where / name).write_text(text, encoding="utf-8")
        tasks.append(LintTask(str(where / name), settings, True))

    stderr_file = tempfile.TemporaryFile()
    saved_stderr = os.dup(2)
    sys.stderr.flush()
    os.dup2(stderr_file.fileno(), 2)   # workers inherit it: a traceback anywhere lands here
    started = time.perf_counter()
    try:
        results = lint_files(tasks, jobs, time_limit=time_limit)
    finally:
        figures.seconds_linting += time.perf_counter() - started
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    stderr_file.seek(0)
    stderr = stderr_file.read().decode("utf-8", "replace")
    stderr_file.close()

    by_path = Counter(r.path for r in results)
    for task in tasks:
        if by_path[task.path] != 1:
            fail(figures, task.path, f"{by_path[task.path]} results instead of 1 (lost file)", keep)
    for result in results:
        figures.inputs += 1
        figures.findings.update(f.code for f in result.findings)
        if result.error is None:
            figures.outcomes["analysed"] += 1
        else:
            figures.outcomes[result.error.kind.value] += 1
            if result.error.kind in FAILURES or result.error.kind not in INPUT_ERRORS | {ErrorKind.PARSER}:
                fail(figures, result.path, f"{result.error.kind.value}: {result.error.message}", keep)
    if "Traceback" in stderr or stderr.strip():
        fail(figures, str(folder), "output on stderr: " + stderr.strip()[:2000], keep)


def fail(figures: Figures, path: str, why: str, keep: Path | None) -> None:
    figures.failures.append((path, why))
    if keep is not None and os.path.isfile(path):
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, keep / f"{len(figures.failures):04d}_{os.path.basename(path)}")


def run(count: int, seed: int, grammar_share: float, batch_size: int, jobs: int, time_limit: float,
        keep: Path | None, quiet: bool = False) -> Figures:
    rng = random.Random(seed)
    figures = Figures()
    started = time.perf_counter()
    n_grammar = int(count * grammar_share)
    inputs = mutants(count - n_grammar, rng)
    figures.by_source["mutants of fixture scripts"] = len(inputs)
    programs = grammar_programs(n_grammar, seed) if n_grammar else []
    figures.by_source["hypothesmith programs behind a DDP prelude"] = len(programs)
    inputs += [(f"grammar{n:05d}.py", behind_prelude(p), {}) for n, p in enumerate(programs)]
    rng.shuffle(inputs)
    figures.seconds_generating = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="ddpcheck-fuzz-") as tmp:
        for start in range(0, len(inputs), batch_size):
            lint_batch(inputs[start:start + batch_size], Path(tmp) / "batch", jobs, time_limit, figures, keep)
            if not quiet:
                print(f"  {min(start + batch_size, len(inputs))}/{len(inputs)} inputs, "
                      f"{len(figures.failures)} failures", file=sys.stderr, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000, help="generated inputs (default 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grammar-share", type=float, default=0.3,
                        help="share of hypothesmith programs among the inputs (default 0.3)")
    parser.add_argument("--batch", type=int, default=1000, help="inputs per lint run (default 1000)")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--time-limit", type=float, default=20.0, help="per-file time limit, seconds")
    parser.add_argument("--keep", type=Path, default=Path("fuzz-failures"),
                        help="folder for failing inputs (default ./fuzz-failures)")
    args = parser.parse_args(argv)

    figures = run(args.count, args.seed, args.grammar_share, args.batch, args.jobs, args.time_limit, args.keep)
    total = figures.seconds_generating + figures.seconds_linting
    print(f"inputs linted:        {figures.inputs:,} (seed {args.seed}, {args.jobs} jobs)")
    for source, n in figures.by_source.items():
        print(f"  {source}: {n:,}")
    print("outcomes:             " + ", ".join(f"{k} {v:,}" for k, v in figures.outcomes.most_common()))
    print("findings:             " + (", ".join(f"{k} {v:,}" for k, v in sorted(figures.findings.items())) or "none"))
    print(f"time:                 {figures.seconds_generating:.1f} s generating, {figures.seconds_linting:.1f} s "
          f"linting ({figures.inputs / max(figures.seconds_linting, 1e-9):.0f} inputs/s), {total:.1f} s in all")
    print(f"failures:             {len(figures.failures)}")
    for path, why in figures.failures[:20]:
        print(f"  {path}: {why}")
    return 1 if figures.failures else 0


if __name__ == "__main__":
    sys.exit(main())
