"""Count GPUs without poisoning fork (imports torch when called)."""

from __future__ import annotations


def visible_gpus() -> tuple[int, bool]:
    """``(CUDA devices visible, fork still safe)``.

    Counts through NVML first, which does not initialise CUDA; only when NVML is
    unavailable does it ask the CUDA runtime, after which forked workers could
    not use CUDA, so the caller must spawn them instead.
    """
    import torch

    if not hasattr(torch._C, "_cuda_getDeviceCount"):
        return 0, True
    nvml = getattr(torch.cuda, "_device_count_nvml", None)
    if nvml is not None:
        try:
            count = nvml()
        except Exception:  # pragma: no cover - depends on the driver
            count = -1
        if count >= 0:
            return count, True
    return torch.cuda.device_count(), False
