"""Peak memory = fixed + per_sample x batch, fitted per phase of a training step.

Pure Python, and the only fit: the worker fits, picks the batches to confirm
and refits with every confirmation; the verdict only reads the result.

A step has phases (forward+backward, optimizer step); each grows with the
batch at its own rate (activations live in forward+backward, the optimizer
step is nearly flat), so the peak of a step is the largest of the phase lines.
Each line is a least-squares fit over every measured batch, then lifted so no
measured point lies above it: memory grows slightly faster than linearly
(workspaces, allocator rounding, temporaries that scale with the batch), so a
plain two-point line predicts low at large batches. The worker also refits
after each confirmation step at a large batch, so the recommendation rests on
a measurement near the batch it recommends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass(frozen=True)
class StepMemory:
    batch: int
    phases: dict = field(default_factory=dict)  # phase -> peak bytes during that phase

    @property
    def peak(self) -> int:
        return max(self.phases.values())


@dataclass(frozen=True)
class PhaseLine:
    phase: str
    fixed: float
    per_sample: float

    def at(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch


@dataclass(frozen=True)
class MemoryFit:
    lines: tuple[PhaseLine, ...]
    batches: tuple[int, ...] = ()  # the measured batches the fit rests on

    def predict(self, batch: int) -> int:
        return int(math.ceil(max(line.at(batch) for line in self.lines)))

    def dominant(self, batch: int) -> PhaseLine:
        return max(self.lines, key=lambda line: line.at(batch))

    def largest_batch(self, usable: float) -> Optional[int]:
        """Largest batch whose predicted peak fits in ``usable`` bytes.

        0 when even batch 1 does not fit; ``None`` when no phase grows with the
        batch (memory does not bound it).
        """
        best = math.inf
        for line in self.lines:
            if line.per_sample > 0:
                best = min(best, math.floor((usable - line.fixed) / line.per_sample))
            elif line.fixed > usable:
                return 0
        if best == math.inf:
            return None
        best = int(best)
        while best >= 1 and self.predict(best) > usable:  # rounding right at the edge
            best -= 1
        return max(best, 0)


@dataclass(frozen=True)
class Confirmation:
    """One real step at a batch the fit predicted (a target or the largest)."""

    batch: int
    predicted: int
    measured: Optional[int] = None  # None when the step failed
    failed: str = ""  # what went wrong instead
    purpose: str = "target"  # "target" or "largest"

    @property
    def error(self) -> Optional[float]:
        """(predicted - measured) / measured: negative when the fit was low."""
        if self.measured is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def fit_steps(steps: Sequence[StepMemory]) -> MemoryFit:
    """A line per phase over steps at two or more distinct batches: least
    squares, then the intercept raised so that every measured point is on or
    below the line."""
    batches = sorted({s.batch for s in steps})
    if len(batches) < 2:
        raise ValueError("need steps at two different batch sizes to fit memory")
    phases = sorted({p for s in steps for p in s.phases}, key=str)
    lines = []
    for phase in phases:
        pts = [(s.batch, s.phases[phase]) for s in steps if phase in s.phases]
        if len({b for b, _ in pts}) < 2:
            continue
        n = len(pts)
        mx = sum(b for b, _ in pts) / n
        my = sum(m for _, m in pts) / n
        sxx = sum((b - mx) ** 2 for b, _ in pts)
        sxy = sum((b - mx) * (m - my) for b, m in pts)
        slope = max(0.0, sxy / sxx)  # memory cannot shrink with the batch; noise can
        fixed = max(m - slope * b for b, m in pts)
        lines.append(PhaseLine(phase, fixed, slope))
    return MemoryFit(tuple(lines), tuple(batches))


def usable_memory(budget: int, reserve: int = 0, safety_margin: float = 0.1) -> int:
    """What a step may use: the budget less the safety margin and the reserve."""
    return int(budget * (1.0 - safety_margin)) - int(reserve)


def fewest_gpus(global_batch: int, per_gpu_max: Optional[int], grad_accum: int = 1) -> Optional[int]:
    """GPUs needed to reach ``global_batch`` when each holds ``per_gpu_max``."""
    if per_gpu_max is None or per_gpu_max < 1:
        return None
    return -(-global_batch // (per_gpu_max * grad_accum))


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured else math.inf
