"""Which backend and device the preflight runs on (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass

from ddpcheck.preflight.checks import PASS, WARN


class BackendError(ValueError):
    """The requested backend cannot run here (a usage error)."""


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "nccl" or "gloo"
    device: str  # "cuda" or "cpu"
    status: str  # PASS, or WARN when auto fell back to CPU
    note: str


def choose_backend(requested: str, procs_per_node: int, visible_gpus: int,
                   nccl_available: bool) -> BackendChoice:
    """``--backend auto|gloo|nccl`` for ``procs_per_node`` processes on this node.

    auto: NCCL when there is a CUDA device for every process, else gloo with one
    CPU process standing in for each requested GPU, said plainly.
    """
    if requested not in ("auto", "gloo", "nccl"):
        raise BackendError(f"--backend {requested!r}: use auto, gloo or nccl")
    if requested == "nccl":
        if not nccl_available:
            raise BackendError("--backend nccl: this torch build has no NCCL (a CPU-only "
                               "build?); use --backend gloo to check on CPU")
        if visible_gpus < procs_per_node:
            raise BackendError(
                f"--gpus {procs_per_node} with --backend nccl needs {procs_per_node} CUDA "
                f"devices on this node, it has {visible_gpus}: NCCL wants one GPU per process "
                f"(two ranks on one GPU fail or hang); use --gpus {visible_gpus or 1}"
                + (" " if visible_gpus else " with --backend gloo ") + "or --backend gloo")
        return BackendChoice("nccl", "cuda", PASS,
                             f"NCCL on {procs_per_node} of {visible_gpus} visible GPUs")
    if requested == "gloo":
        return BackendChoice("gloo", "cpu", PASS,
                             f"gloo on CPU as asked: {procs_per_node} CPU processes stand in "
                             f"for {procs_per_node} GPUs; NCCL and GPU memory are not checked")
    if nccl_available and visible_gpus >= procs_per_node:
        return BackendChoice("nccl", "cuda", PASS,
                             f"NCCL on {procs_per_node} of {visible_gpus} visible GPUs")
    if nccl_available and 0 < visible_gpus < procs_per_node:
        # on a GPU machine, CPU stand-ins would pass a run that fails on the GPUs
        raise BackendError(
            f"--gpus {procs_per_node} but this node has {visible_gpus} visible GPU"
            f"{'s' if visible_gpus != 1 else ''}: NCCL wants one GPU per process; use --gpus "
            f"{visible_gpus}, or --backend gloo to let {procs_per_node} CPU processes stand in")
    why = ("no CUDA devices here" if visible_gpus == 0 else "this torch build has no NCCL")
    return BackendChoice(
        "gloo", "cpu", WARN,
        f"{why}: {procs_per_node} CPU processes with gloo stand in for {procs_per_node} GPUs; "
        f"the process group, collectives and arithmetic are real, NCCL, set_device and GPU "
        f"memory were not checked")
