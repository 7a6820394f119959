"""``nn.DataParallel`` on CPU: one process driving N emulated devices (imports torch).

On a machine without GPUs ``DataParallel`` silently becomes a pass-through, so
the crash it is known for -- a last batch smaller than the device count leaving
a replica with no input -- could never show. Here its forward runs with torch's
own rules: :func:`torch.nn.parallel.scatter_gather.scatter_kwargs` (each tensor
chunked along ``dim`` with ``Tensor.chunk``, which is what the CUDA scatter
does; non-tensor arguments copied per device; positional and keyword arguments
scattered separately and padded with ``()`` / ``{}``), one replica per chunk
(the module itself, run once per chunk in device order), failures re-raised as
``parallel_apply`` does ("Caught TypeError in replica 3 on device 3."), and
torch's own ``gather`` concatenating the outputs. Only the device copies are
replaced, by CPU chunks and a CPU concatenation.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

EMULATED = "_ddpcheck_emulated"  # set on a DataParallel whose forward is emulated here
KEPT_FORWARDS = 8  # scatters kept for the report


class _CpuScatter:
    """Stands for ``torch.nn.parallel._functions.Scatter``: the CUDA scatter splits
    with ``tensor.chunk(len(devices), dim)`` (so 3 samples over 4 devices give 3
    chunks); here the chunks stay on CPU."""

    @staticmethod
    def apply(target_gpus, chunk_sizes, dim, tensor):
        if chunk_sizes:
            return tuple(tensor.split(list(chunk_sizes), dim))
        return tuple(tensor.chunk(len(target_gpus), dim))


class _CpuGather:
    """Stands for ``torch.nn.parallel._functions.Gather``: concatenation along ``dim``
    (scalars become a vector, as torch does with a warning)."""

    @staticmethod
    def apply(target_device, dim, *outputs):
        if all(t.dim() == 0 for t in outputs):
            outputs = tuple(t.view(1) for t in outputs)
        return torch.cat(outputs, dim)


@contextlib.contextmanager
def _cpu_copies():
    from torch.nn.parallel import scatter_gather

    saved = scatter_gather.Scatter, scatter_gather.Gather
    scatter_gather.Scatter, scatter_gather.Gather = _CpuScatter, _CpuGather
    try:
        yield scatter_gather
    finally:
        scatter_gather.Scatter, scatter_gather.Gather = saved


def _device_index(device) -> int:
    if isinstance(device, torch.device):
        return device.index or 0
    if isinstance(device, str):
        return torch.device(device).index or 0
    return int(device)


def emulate_init(dp, module, devices: int, device_ids=None, output_device=None,
                 dim: int = 0) -> None:
    """``DataParallel.__init__`` as it runs with ``devices`` GPUs."""
    nn.Module.__init__(dp)
    dp.module = module
    if device_ids is None:
        device_ids = list(range(devices))
    dp.device_ids = [_device_index(d) for d in device_ids]
    dp.output_device = _device_index(output_device if output_device is not None
                                     else dp.device_ids[0] if dp.device_ids else 0)
    dp.dim = dim
    dp.src_device_obj = torch.device("cpu")
    setattr(dp, EMULATED, True)


def _batch_sizes(values, dim: int) -> list:
    return [v.shape[dim] if isinstance(v, torch.Tensor) and v.dim() > dim else None
            for v in values]


def emulate_forward(dp, inputs: tuple, kwargs: dict, record: list):
    """``DataParallel.forward`` with torch's scatter, replicas and gather on CPU.
    ``record`` gets one entry per forward (the first few): batch and replicas."""
    if not dp.device_ids:
        return dp.module(*inputs, **kwargs)
    with _cpu_copies() as sg:
        scattered, scattered_kwargs = sg.scatter_kwargs(inputs, kwargs, dp.device_ids, dp.dim)
    if not scattered and not scattered_kwargs:
        scattered, scattered_kwargs = ((),), ({},)
    if len(record) < KEPT_FORWARDS:
        tensors = [v for v in list(inputs) + list(kwargs.values()) if isinstance(v, torch.Tensor)]
        record.append({"devices": len(dp.device_ids),
                       "batch": _batch_sizes(tensors, dp.dim)[:1][0] if tensors else None,
                       "replicas": len(scattered),
                       "positional": [len(a) for a in scattered],
                       "keyword": [len(k) for k in scattered_kwargs]})
    if len(dp.device_ids) == 1:
        return dp.module(*scattered[0], **scattered_kwargs[0])
    from torch._utils import ExceptionWrapper

    outputs = []
    for i, (args, kw) in enumerate(zip(scattered, scattered_kwargs)):
        try:
            outputs.append(dp.module(*args, **kw))
        except Exception:
            # parallel_apply's own wrapping: the exception names the replica
            ExceptionWrapper(where=f"in replica {i} on device {dp.device_ids[i]}").reraise()
    with _cpu_copies() as sg:
        return sg.gather(outputs, dp.output_device, dp.dim)
