"""CUDA on a machine without GPUs: the CPU stand-in for the CUDA surface scripts use
(inside a preflight rank; imports torch).

Found by running public training scripts, not by guessing. While installed:

* ``torch.cuda`` and ``torch.accelerator`` report ``devices`` devices; device
  selection, synchronisation, caches, seeds, device names and properties,
  memory queries, bf16 support, ``Event`` / ``Stream`` answer as a GPU would,
  without one;
* ``.to(int | "cuda:N" | torch.device("cuda"))`` (tensors and modules),
  ``.cuda(i)``, ``pin_memory()`` / ``pin_memory=True`` and ``non_blocking``
  keep tensors on CPU; ``torch.load(map_location="cuda:N")`` loads to CPU;
* ``torch.amp.GradScaler("cuda")`` and ``torch.autocast("cuda")`` stay enabled
  (they leave CPU tensors alone), ``torch.backends.cudnn`` flags are plain
  attributes already.

Every name the script used is kept in :attr:`CudaStandIn.used`, so the report
can say what ran on the stand-in (NCCL, CUDA placement and GPU memory are not
measured). A failure inside this surface is the stand-in's, never the user's:
:func:`failure_is_stand_in` tells the judge which crashes those are.
"""

from __future__ import annotations

import contextlib
import re
from typing import Optional

import torch

_MISSING = object()

# a crash whose message or frames point here was caused by the stand-in, not the script
_STAND_IN_MESSAGE = re.compile(r"CUDA|cuda|NCCL|nccl|cudnn|accelerator|Torch not compiled with|"
                               r"no kernel image|device-side")
_STAND_IN_FRAMES = ("/torch/cuda/", "/torch/accelerator/", "/torch/backends/cuda",
                    "/torch/amp/grad_scaler.py", "/torch/nn/parallel/comm.py",
                    "/torch/nn/parallel/_functions.py")
# the stand-in's own frames; its tensor pass-through (__torch_function__) is in every
# traceback of a tensor operation and says nothing about the cause
_OWN_FRAME = re.compile(r'standin\.py", line \d+, in (?!__torch_function__)')


def failure_is_stand_in(message: str, traceback_text: str) -> bool:
    """A crash the CPU stand-in caused: a CUDA-only message or frames in torch's CUDA
    modules (the judge reports it as a WARN: what could not be checked on CPU)."""
    text = traceback_text or ""
    return bool(_STAND_IN_MESSAGE.search(message or "")) or bool(_OWN_FRAME.search(text)) \
        or any(frame in text for frame in _STAND_IN_FRAMES)


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _cpu(device):
    return "cpu" if _is_cuda(device) else device


def _index(device) -> int:
    if isinstance(device, torch.device):
        return device.index or 0
    if isinstance(device, str):
        return torch.device(device).index or 0
    return int(device or 0)


class _Properties:
    """What ``torch.cuda.get_device_properties`` answers (the fields scripts read)."""

    def __init__(self, index: int):
        self.name = "CPU stand-in (ddpcheck)"
        self.index = index
        self.major, self.minor = 8, 0
        self.total_memory = 80 * 1024 ** 3
        self.multi_processor_count = 108
        self.is_integrated = False
        self.is_multi_gpu_board = False

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major=8, minor=0)"


class _Stream:
    def __init__(self, *args, **kwargs):
        self.device = torch.device("cuda", 0)

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Event:
    def __init__(self, enable_timing: bool = False, *args, **kwargs):
        self.time: Optional[float] = None

    def record(self, stream=None) -> None:
        import time

        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_Event") -> float:
        if self.time is None or end.time is None:
            return 0.0
        return (end.time - self.time) * 1000.0


class _DeviceContext:
    """``with torch.cuda.device(i):``"""

    def __init__(self, stand_in: "CudaStandIn", device):
        self.stand_in = stand_in
        self.index = _index(device) if device is not None else None
        self.before = 0

    def __enter__(self):
        self.before = self.stand_in.current
        if self.index is not None and self.index >= 0:
            self.stand_in.current = self.index
        return self

    def __exit__(self, *exc) -> None:
        self.stand_in.current = self.before


def _torch_function_mode():
    from torch.overrides import TorchFunctionMode

    class TensorsStayOnCpu(TorchFunctionMode):
        """Tensors asked to go to a CUDA device (or pinned) stay on CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
                return args[0]
            if func is torch.Tensor.is_pinned:
                return False
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
                args = (args[0], "cpu") + tuple(args[2:])
            return func(*args, **kwargs)

    return TensorsStayOnCpu()


class CudaStandIn:
    """Install / remove the stand-in (reversible; this process only)."""

    def __init__(self, devices: int, current: int = 0):
        self.devices = max(1, devices)
        self.current = current if 0 <= current < self.devices else 0
        self.set_device_calls: list = []
        self.used: set = set()
        self._saved: list = []
        self._mode = None

    def _patch(self, owner, name: str, value, label: Optional[str] = None) -> None:
        if not hasattr(owner, name) and owner is not torch.cuda:
            return
        old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else \
            getattr(owner, name, _MISSING)
        self._saved.append((owner, name, old))
        if callable(value) and not isinstance(value, type) and label is not None:
            inner = value

            def counted(*args, **kwargs):
                self.used.add(label)
                return inner(*args, **kwargs)

            value = counted
        setattr(owner, name, value)

    # -- what the script can ask -----------------------------------------------------

    def _set_device(self, device) -> None:
        index = _index(device)
        self.set_device_calls.append(index)
        self.current = index

    def install(self) -> None:
        cuda = torch.cuda
        answers = {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": lambda: None,
            "device_count": lambda: self.devices,
            "set_device": self._set_device,
            "current_device": lambda: self.current,
            "synchronize": lambda *a, **k: None,
            "empty_cache": lambda: None,
            "ipc_collect": lambda: None,
            # torch.manual_seed seeds "every CUDA device" through these: no GPU, nothing to seed
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "seed": lambda: None,
            "seed_all": lambda: None,
            "get_rng_state": lambda *a, **k: torch.get_rng_state(),
            "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
            "get_device_name": lambda *a, **k: _Properties(0).name,
            "get_device_capability": lambda *a, **k: (8, 0),
            "get_device_properties": lambda device=None: _Properties(_index(device)),
            "is_bf16_supported": lambda *a, **k: True,
            "mem_get_info": lambda *a, **k: (80 * 1024 ** 3, 80 * 1024 ** 3),
            "memory_allocated": lambda *a, **k: 0,
            "max_memory_allocated": lambda *a, **k: 0,
            "memory_reserved": lambda *a, **k: 0,
            "max_memory_reserved": lambda *a, **k: 0,
            "memory_cached": lambda *a, **k: 0,
            "max_memory_cached": lambda *a, **k: 0,
            "reset_peak_memory_stats": lambda *a, **k: None,
            "reset_max_memory_allocated": lambda *a, **k: None,
            "memory_summary": lambda *a, **k: "(CPU stand-in: no GPU memory measured)",
            "memory_stats": lambda *a, **k: {},
            "current_stream": lambda *a, **k: _Stream(),
            "default_stream": lambda *a, **k: _Stream(),
            "stream": lambda *a, **k: contextlib.nullcontext(),
            "is_current_stream_capturing": lambda: False,
            "device": lambda device=None: _DeviceContext(self, device),
        }
        for name, value in answers.items():
            self._patch(cuda, name, value, f"torch.cuda.{name}")
        self._patch(cuda, "Stream", _Stream)
        self._patch(cuda, "Event", _Event)
        self._install_accelerator()
        self._install_placement()

    def _install_accelerator(self) -> None:
        acc = getattr(torch, "accelerator", None)
        if acc is None:
            return
        answers = {
            "is_available": lambda: True,
            "device_count": lambda: self.devices,
            "current_accelerator": lambda check_available=False: torch.device("cuda"),
            "set_device_index": self._set_device,
            "set_device_idx": self._set_device,
            "current_device_index": lambda: self.current,
            "current_device_idx": lambda: self.current,
            "current_stream": lambda *a, **k: _Stream(),
            "synchronize": lambda *a, **k: None,
            "empty_cache": lambda: None,
        }
        for name, value in answers.items():
            self._patch(acc, name, value, f"torch.accelerator.{name}")
        import torch.distributed as dist

        if hasattr(dist, "get_default_backend_for_device"):
            real = dist.get_default_backend_for_device
            self._patch(dist, "get_default_backend_for_device",
                        lambda device: "gloo" if _is_cuda(device) or device == "cuda"
                        else real(device))

    def _install_placement(self) -> None:
        from torch import nn

        real_module_to = nn.Module.to

        def module_to(module, *args, **kwargs):
            args = tuple(_cpu(a) for a in args)
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            return real_module_to(module, *args, **kwargs)

        self._patch(nn.Module, "to", module_to)
        self._patch(nn.Module, "cuda", lambda module, device=None: module)
        real_load = torch.load

        def load(f, map_location=None, *args, **kwargs):
            if map_location is not None and not callable(map_location):
                if isinstance(map_location, dict):
                    map_location = {k: _cpu(v) for k, v in map_location.items()}
                else:
                    map_location = _cpu(map_location)
            elif map_location is None:
                map_location = "cpu"  # a checkpoint saved on a GPU comes back to CPU
            return real_load(f, map_location, *args, **kwargs)

        self._patch(torch, "load", load)
        import torch.utils.data._utils.pin_memory as pinning

        self._patch(pinning, "pin_memory", lambda data, device=None: data)
        self._mode = _torch_function_mode()
        self._mode.__enter__()

    def uninstall(self) -> None:
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:
                pass
            self._mode = None
        while self._saved:
            owner, name, old = self._saved.pop()
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
