"""How good is the preflight's memory prediction, and does the batch it
recommends really fit?

Runs the real command (``ddpcheck preflight --gpus 1 ... --format json``) over
three model shapes (a CNN, a transformer, an MLP; benchmarks/memory_models.py),
in fp32 and under bf16 autocast:

* at target batches up to the budget: the fit over batches 1, 2, 4 predicts the
  step at the target, and the confirmation step measures it;
* without a target: the largest batch that fits the budget, confirmed (and
  refitted until its own step fits).

Prints predicted vs measured per case and exits 1 if any recommended batch
peaked above the usable budget in its own step.

    python benchmarks/memory_prediction.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = "benchmarks/memory_models.py"
MiB = 2**20

# (name, factory, input shape, budget, target batches)
CASES = [
    ("CNN", "cnn", "3,32,32", "256MiB", (8, 48)),
    ("transformer", "transformer", "64,128", "256MiB", (8, 24)),
    ("MLP", "mlp", "1024", "1GiB", (64, 1024)),   # 400 MiB of model state before any activation
]


def preflight(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "ddpcheck", "preflight", "--gpus", "1",
                           *args, "--format", "json"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"preflight failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def mib(n) -> str:
    return "-" if n is None else f"{n / MiB:8.2f}"


def main() -> int:
    rows = []
    bad = []
    for name, factory, shape, budget, targets in CASES:
        for amp in ("", "bf16"):
            common = ["--model", f"{MODELS}:{factory}", "--input-shape", shape,
                      "--gpu-memory", budget] + (["--amp", amp] if amp else [])
            label = name + (" bf16" if amp else "")
            for target in targets:
                mem = preflight(*common, "--batch-size", str(target))["memory"]["measured"]
                confirmed = [c for c in mem["confirmations"] if c["purpose"] == "target"]
                if not confirmed:
                    print(f"{label} target {target}: not confirmed ({mem['confirm_skipped'] or mem['step_error']})")
                    continue
                c = confirmed[0]
                rows.append((label, "target", c["batch"], c["predicted"], c["measured"],
                             mem["usable"]))
            mem = preflight(*common)["memory"]["measured"]
            confs = [c for c in mem["confirmations"] if c["purpose"] == "largest"]
            if not confs:
                bad.append((label, mem["largest"], mem["confirm_skipped"] or mem["step_error"]))
                continue
            first = confs[0]
            rows.append((label, "largest (1st fit)", first["batch"], first["predicted"],
                         first["measured"], mem["usable"]))
            last = confs[-1]
            if len(confs) > 1:
                rows.append((label, "largest (refit)", last["batch"], last["predicted"],
                             last["measured"], mem["usable"]))
            # the recommendation must be at or below a batch whose own step fitted
            if not mem["largest_confirmed"] or last["measured"] > mem["usable"] \
                    or mem["largest"] > last["batch"]:
                bad.append((label, mem["largest"], last))
    print(f"{'model':<16} {'case':<18} {'batch':>6} {'predicted':>10} {'measured':>10} "
          f"{'error':>7} {'usable':>9}  fits")
    for label, case, batch, pred, meas, usable in rows:
        err = (pred - meas) / meas * 100
        fits = "yes" if meas <= usable else "NO"
        print(f"{label:<16} {case:<18} {batch:>6} {mib(pred)} MiB {mib(meas)} MiB "
              f"{err:+6.1f}% {mib(usable)}  {fits}")
    print("(MiB of tensor memory per rank for one full training step; CPU, gloo; the "
          "largest batch is the one the preflight recommends)")
    if bad:
        print(f"recommended batch did not fit its own step: {bad}")
        return 1
    print("every recommended batch fitted the budget in its own confirmation step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
