"""How fast is `ddpcheck preflight --gpus 2 --dataset-size 8607`?

Times the real command (a fresh process each time, as a user runs it) next to
a bare `torchrun --nproc-per-node 2` hello-world (init_process_group + one
all_reduce + destroy) measured in the same run, on the same machine, and
prints the ratio ddpcheck / torchrun (target: at most 0.7). Runs alternate
between the two so a busy machine slows both alike; the medians are compared.

    python benchmarks/preflight_speed.py             # 3 runs of each
    python benchmarks/preflight_speed.py --repeat 5 --check   # exit 1 above target

Why it can beat torchrun although it does more (collectives, a bandwidth
figure, the arithmetic): torchrun starts every worker as a new Python process
that imports torch again (about 2 s each); the preflight's workers are forked
by torch's elastic launcher from a parent that has imported torch once.

The preflight runs inside its sandbox (bwrap overlays and a PID namespace), so
the ratio includes it; the same script under both (the hello-world above, as
`ddpcheck preflight --gpus 2 -- hello.py`) is timed too, and the sandbox's own
set-up and tear-down around an empty command are printed apart.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HELLO = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddpcheck_command() -> list[str]:
    script = Path(sys.executable).with_name("ddpcheck")
    if script.exists():
        return [str(script), "preflight"]
    return [sys.executable, "-m", "ddpcheck", "preflight"]


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed with exit {proc.returncode}:\n{proc.stdout}\n"
                 f"{proc.stderr}")
    return elapsed


def sandbox_overhead(workdir: str, repeat: int = 5) -> str:
    """The sandbox's own cost: choosing and setting it up (one trial run of bwrap),
    then running an empty command in it, against the same command run bare."""
    sys.path.insert(0, str(REPO))
    from ddpcheck.preflight import sandbox as sandboxing

    setups, boxed, bare = [], [], []
    for _ in range(repeat):
        run_dir = sandboxing.make_run_dir(workdir)
        start = time.perf_counter()
        box = sandboxing.choose(run_dir, workdir)
        setups.append(time.perf_counter() - start)
        if box.level == sandboxing.Level.OVERLAY:
            start = time.perf_counter()
            subprocess.run(list(box.command) + ["/bin/true"], check=True)
            boxed.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        bare.append(time.perf_counter() - start)
        sandboxing.remove_tree(run_dir)
    if not boxed:
        return f"{box.level.value} ({box.why}); choosing it took {statistics.median(setups):.3f} s"
    return (f"{box.tool}; choosing and trying it {statistics.median(setups) * 1000:.0f} ms, "
            f"an empty command in it {statistics.median(boxed) * 1000:.0f} ms "
            f"(bare {statistics.median(bare) * 1000:.0f} ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--target", type=float, default=0.7, help="ratio to meet (default 0.7)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    workdir = tempfile.mkdtemp(prefix="preflight-bench-")
    hello = Path(workdir, "hello.py")
    hello.write_text(HELLO)
    ours = ddpcheck_command() + ["--gpus", "2", "--dataset-size", "8607"]
    print(f"ddpcheck: {' '.join(ours)}")
    print("baseline: torchrun --nproc-per-node 2 hello.py  (init_process_group + all_reduce)")
    script = ddpcheck_command() + ["--gpus", "2", "--", str(hello)]
    rows = []
    script_times = []
    try:
        # one untimed run of each warms the file cache for both
        timed(ours, env)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), str(hello)]
        timed(torchrun, env)
        for i in range(args.repeat):
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), str(hello)]
            pair = [("ddpcheck", ours), ("torchrun", torchrun)]
            if i % 2:
                pair.reverse()
            times = {name: timed(cmd, env) for name, cmd in pair}
            rows.append((times["ddpcheck"], times["torchrun"]))
            script_times.append(timed(script, env))
            print(f"run {i + 1}: ddpcheck {times['ddpcheck']:.2f} s   "
                  f"torchrun {times['torchrun']:.2f} s   "
                  f"ddpcheck -- hello.py {script_times[-1]:.2f} s")
        sandbox_cost = sandbox_overhead(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ddp = statistics.median(r[0] for r in rows)
    base = statistics.median(r[1] for r in rows)
    ratio = ddp / base
    verdict = "met" if ratio <= args.target else "NOT met"
    print(f"median: ddpcheck preflight {ddp:.2f} s, bare torchrun hello-world {base:.2f} s")
    print(f"ratio ddpcheck / torchrun = {ratio:.2f}x (target <= {args.target:.2f}x: {verdict}; "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]})")
    print(f"the same hello.py in script mode: {statistics.median(script_times):.2f} s "
          f"({statistics.median(script_times) / base:.2f}x torchrun; it also lints the file "
          f"and judges the run)")
    print(f"sandbox: {sandbox_cost}")
    return 1 if args.check and ratio > args.target else 0


if __name__ == "__main__":
    sys.exit(main())
