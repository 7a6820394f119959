"""Peak memory of one full DDP training step at batch 1 and 2 (inside a worker).

On a GPU the peak is ``torch.cuda.max_memory_allocated`` per phase, and what
``torch.cuda.mem_get_info`` shows beyond the caching allocator (CUDA context,
NCCL buffers, other processes) is kept aside as overhead. On CPU it is the
tensor memory tracked by ``torch.distributed._tools.mem_tracker.MemTracker``
(parameters, gradients, DDP buckets, optimizer state, activations,
temporaries), which is what the step would allocate on a GPU before the
allocator's rounding and the CUDA context.

Every step is followed by :func:`collectives.agree`, so all ranks stop at the
same point when one of them fails.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import weakref
from typing import Any, Callable, Optional

import torch
from torch import nn

from ddpcheck.preflight import collectives, memfit, modelspec

PHASE_FB = "forward+backward"
PHASE_OPT = "optimizer step"

# torch's messages, matched to say what went wrong in words
_BN1_RE = re.compile(r"Expected more than 1 value per channel when training")
_UNUSED_RE = re.compile(r"Expected to have finished reduction in the prior iteration")
_UNUSED_NAMES_RE = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_UNUSED_IDX_RE = re.compile(r"Parameter indices which did not receive grad for rank \d+: "
                            r"([\d ]+)")
_OOM_RE = re.compile(r"out of memory|can't allocate memory|DefaultCPUAllocator", re.I)

# a confirmation step on CPU above this is skipped (it would only test the host)
CPU_CONFIRM_LIMIT = 4 * 2**30


def host_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_step_limit(local_world: int) -> int:
    """Bytes one CPU rank may spend on a step: 4 GiB, or less when this host's
    RAM shared by every local rank (with room to spare) is smaller."""
    ram = host_memory()
    if not ram:
        return CPU_CONFIRM_LIMIT
    return min(CPU_CONFIRM_LIMIT, ram // (2 * max(1, local_world)))


class StepFailed(Exception):
    def __init__(self, kind: str, message: str, extra: Optional[dict] = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra or {}


# -- meters -----------------------------------------------------------------------


class CudaMeter:
    tool = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: dict[str, int] = {}

    def watch(self, model: nn.Module) -> None:
        pass

    @contextlib.contextmanager
    def phase(self, name: str):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self.peaks[name] = int(torch.cuda.max_memory_allocated(self.device))

    def overhead(self) -> dict:
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        return {"total": int(total), "used": int(total - free), "reserved": int(reserved),
                "outside_allocator": int(max(0, total - free - reserved))}


class CpuMeter:
    """Tensor memory on CPU, counted the way ``torch.distributed._tools.mem_tracker``
    counts it: a ``TorchDispatchMode`` sees every tensor an op creates (forward,
    backward, DDP's buckets, optimizer state), adds its storage's bytes once and
    subtracts them when the storage is freed. One mode context per phase gives
    each phase its own peak; the tests check it against MemTracker itself.
    (MemTracker is not used at run time: importing it pulls in DTensor and sympy,
    seconds per worker, and it does not exist before torch 2.5.)
    """

    tool = "tensor memory via TorchDispatchMode (CPU; as torch's mem_tracker counts it)"

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_map_only

        meter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tree_map_only(torch.Tensor, meter.track, out)
                return out

        self._mode_cls = _Mode
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.peaks: dict[str, int] = {}

    def track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, meta, wrapper subclasses
            return
        if storage.device.type == "meta":
            return
        key = storage._cdata
        if key in self.live:
            return
        size = storage.nbytes()
        self.live[key] = size
        self.current += size
        if self.current > self.peak:
            self.peak = self.current
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def watch(self, model: nn.Module) -> None:
        for t in list(model.parameters()) + list(model.buffers()):
            self.track(t)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.peak = self.current
        with self._mode_cls():
            yield
        self.peaks[name] = int(self.peak)

    def overhead(self) -> dict:
        return {}


def make_meter(device: torch.device):
    return CudaMeter(device) if device.type == "cuda" else CpuMeter()


# -- batches, loss, optimizer ------------------------------------------------------------


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def make_sample(spec: dict, device: torch.device) -> Callable[[int], Any]:
    if spec.get("sample"):
        fn = modelspec.load_ref(spec["sample"], "--sample")
        return lambda b: to_device(fn(b), device)
    shape = tuple(spec["input_shape"])
    return lambda b: torch.randn((b, *shape), device=device)


def call_model(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(*batch)
    return model(batch)


def default_loss(output: Any) -> torch.Tensor:
    """Sum of the means of every floating-point tensor in the output."""
    terms = []

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() and obj.requires_grad:
                terms.append(obj.float().mean())
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)
        elif hasattr(obj, "__dict__"):  # dataclass-like model outputs
            for v in vars(obj).values():
                walk(v)

    walk(output)
    if not terms:
        raise StepFailed("loss", "the model output has no floating-point tensor that needs a "
                                 "gradient: pass --loss MODULE:FN(output, batch)")
    return sum(terms)


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.AdamW(params, lr=1e-4)


def wrap_ddp(model: nn.Module, device: torch.device, find_unused: bool) -> nn.Module:
    kwargs = {"find_unused_parameters": find_unused}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index]
    return nn.parallel.DistributedDataParallel(model, **kwargs)


def _unused_names(message: str, ddp: nn.Module) -> list[str]:
    match = _UNUSED_NAMES_RE.search(message)
    if match:
        return sorted(n.strip() for n in match.group(1).split(",") if n.strip())
    match = _UNUSED_IDX_RE.search(message)
    if match:
        names = [n for n, p in ddp.module.named_parameters() if p.requires_grad]
        return [names[int(i)] if int(i) < len(names) else f"#{i}"
                for i in match.group(1).split()]
    return []


def classify(exc: BaseException, ddp: Optional[nn.Module]) -> StepFailed:
    if isinstance(exc, StepFailed):
        return exc
    text = str(exc)
    oom_type = getattr(torch.cuda, "OutOfMemoryError", ())
    if (oom_type and isinstance(exc, oom_type)) or isinstance(exc, MemoryError) or \
            (isinstance(exc, RuntimeError) and _OOM_RE.search(text)):
        return StepFailed("oom", collectives.first_line(exc))
    if isinstance(exc, ValueError) and _BN1_RE.search(text):
        return StepFailed("bn1", collectives.first_line(exc))
    if isinstance(exc, RuntimeError) and _UNUSED_RE.search(text):
        return StepFailed("unused", "DDP: " + collectives.first_line(exc, 120),
                          {"names": _unused_names(text, ddp) if ddp is not None else []})
    return StepFailed("error", f"{type(exc).__name__}: {collectives.first_line(exc)}")


# -- the run --------------------------------------------------------------------------------


class Trainer:
    def __init__(self, spec: dict, group, model: nn.Module, meter):
        self.spec = spec
        self.group = group
        self.model = model
        self.meter = meter
        self.sample = make_sample(spec, group.device)
        self.loss_fn = modelspec.load_ref(spec["loss"], "--loss") if spec.get("loss") else None
        self.ddp = None
        self.opt = None

    def wrap(self, find_unused: bool) -> None:
        self.opt = None
        self.ddp = None
        gc.collect()
        with self.meter.phase("setup"):
            self.ddp = wrap_ddp(self.model, self.group.device, find_unused)
            self.opt = make_optimizer(self.spec.get("optimizer", "adamw"), self.ddp.parameters())

    def step(self, batch_size: int) -> memfit.StepMemory:
        """One full training step; the peaks of its phases."""
        try:
            with self.meter.phase(PHASE_FB):
                batch = self.sample(batch_size)
                out = call_model(self.ddp, batch)
                loss = self.loss_fn(out, batch) if self.loss_fn else default_loss(out)
                loss.backward()
                del out, loss, batch
            with self.meter.phase(PHASE_OPT):
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        except Exception as exc:  # classified and shared with the other ranks
            failure = classify(exc, self.ddp)
        else:
            failure = None
        if failure is not None:
            # raised outside the except block: no traceback keeps the failed
            # step's frames (and a DDP reducer) alive
            self.opt.zero_grad(set_to_none=True)
            gc.collect()
            if self.group.device.type == "cuda":
                torch.cuda.empty_cache()
            raise failure
        return memfit.StepMemory(batch_size, {PHASE_FB: self.meter.peaks[PHASE_FB],
                                              PHASE_OPT: self.meter.peaks[PHASE_OPT]})

    def shared_step(self, batch_size: int, progress, what: str):
        """A step on every rank, then agree: ``(StepMemory or None, failure or None)``."""
        progress.stage(f"{what} at batch {batch_size}")
        mem, fail = None, None
        try:
            mem = self.step(batch_size)
        except StepFailed as exc:
            fail = exc
            fail.__traceback__ = None
        info = None if fail is None else {"kind": fail.kind, "message": fail.message,
                                          "extra": fail.extra}
        votes = collectives.agree(self.group, f"{what} at batch {batch_size}",
                                  ok=fail is None, info=info)
        failed = [(r, v["info"]) for r, v in enumerate(votes) if not v["ok"]]
        if failed and fail is None:
            rank, info = failed[0]
            fail = StepFailed(info["kind"], f"(rank {rank}) {info['message']}", info["extra"])
        if fail is not None:
            fail.ranks = [r for r, _ in failed]
            fail.batch = batch_size
        return mem, fail


def _steps_out(steps) -> list:
    return [{"batch": s.batch, "phases": dict(s.phases), "peak": s.peak} for s in steps]


def run(spec: dict, group, progress) -> dict:
    """Build, wrap, and measure; every rank runs the same steps."""
    device = group.device
    out: dict = {"device": str(device), "steps": []}

    progress.stage("building the model (--model factory)")
    model, err = None, None
    try:
        factory = modelspec.load_ref(spec["model"], "--model")
        torch.manual_seed(0)
        model = factory()
        if not isinstance(model, nn.Module):
            err = {"type": "TypeError",
                   "message": f"returned {modelspec.with_article(type(model).__name__)}, not a torch.nn.Module"}
    except Exception as exc:
        err = {"type": type(exc).__name__, "message": collectives.first_line(exc)}
    votes = collectives.agree(group, "model built", ok=err is None, info=err)
    bad = [(r, v["info"]) for r, v in enumerate(votes) if not v["ok"]]
    if bad:
        out["factory_error"] = dict(bad[0][1], ranks=[r for r, _ in bad])
        return out

    params = [p for p in model.parameters()]
    out["params"] = sum(p.numel() for p in params)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in params)
    out["trainable_bytes"] = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    out["batchnorm_layers"] = sum(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                  for m in model.modules())
    if device.type == "cpu":
        # parameters + gradients + DDP buckets (+ two Adam moments) exist before
        # any activation; do not let the host's OOM killer answer for us
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        states = 2 if spec.get("optimizer", "adamw") in ("adam", "adamw") else 1
        floor = out["param_bytes"] + out["trainable_bytes"] * (2 + states)
        ram = host_memory()
        if ram and floor * local_world > 0.8 * ram:
            out["host_too_small"] = {"per_rank": floor, "ranks": local_world, "ram": ram}
            collectives.agree(group, "host memory check")
            return out
    if spec.get("sync_bn"):
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before DDP (seed 000)
            out["sync_bn"] = "converted"
        else:
            out["sync_bn"] = "not on CPU"
    model.train()

    meter = make_meter(device)
    out["tool"] = meter.tool
    try:
        meter.watch(model)
        with meter.phase("to device"):
            model.to(device)
        trainer = Trainer(spec, group, model, meter)
        progress.stage("wrapping the model in DDP")
        trainer.wrap(find_unused=False)
    except Exception as exc:
        out["step_error"] = {"kind": "error", "batch": None,
                             "message": f"{type(exc).__name__}: {collectives.first_line(exc)}"}
        collectives.agree(group, "DDP wrap", ok=False)
        return out
    collectives.agree(group, "DDP wrap")

    budget = spec.get("gpu_memory")
    reserve = spec.get("reserve") or 0
    out["budget"] = budget
    out["reserve"] = reserve
    lo = 1
    # step 1 warms up (optimizer state appears); DDP's unused-parameter error
    # shows on step 2, so the first measured step is a second step
    mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
    if fail is not None and fail.kind == "bn1":
        out["bn_batch1"] = fail.message
        lo = 2
        mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
    steps = []
    if fail is None:
        mem, fail = trainer.shared_step(lo, progress, "training step")
        if fail is not None and fail.kind == "unused":
            out["unused"] = {"names": fail.extra.get("names", []), "message": fail.message}
            progress.stage("re-wrapping with find_unused_parameters=True")
            trainer.wrap(find_unused=True)
            collectives.agree(group, "DDP re-wrap")
            mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
            if fail is None:
                mem, fail = trainer.shared_step(lo, progress, "training step")
    if fail is None:
        steps.append(mem)
        if budget and device.type == "cpu" and mem.peak + reserve > budget:
            fail = StepFailed("oom", f"tensor memory at batch {lo} is {mem.peak} bytes, more "
                                     f"than --gpu-memory {budget}")
            fail.simulated = True
            fail.batch = lo
    if fail is None:
        mem, fail = trainer.shared_step(lo + 1, progress, "training step")
        if fail is None:
            steps.append(mem)
    out["steps"] = _steps_out(steps)
    if fail is not None:
        out["step_error"] = {"kind": fail.kind, "batch": fail.batch, "message": fail.message,
                             "simulated": getattr(fail, "simulated", False)}
        out["overhead"] = meter.overhead()
        return out

    out["overhead"] = meter.overhead()
    if device.type == "cuda" and not budget:
        budget = out["overhead"]["total"]
        out["budget_from_device"] = True
    if device.type == "cuda" and not spec.get("reserve"):
        reserve = out["overhead"]["outside_allocator"]
    out["budget"] = budget
    out["reserve"] = reserve

    fit = memfit.fit_steps(steps)
    target = spec.get("batch_size")
    usable = memfit.usable_memory(budget, reserve, spec.get("safety_margin", 0.1)) \
        if budget else None
    largest = fit.largest_batch(usable) if usable is not None else None
    # rank 0 decides the confirmation step for everybody
    confirm, reason = _confirm_batch(fit, target, largest, usable, device,
                                     [s.batch for s in steps])
    votes = collectives.agree(group, "confirm batch", info=(confirm, reason))
    confirm, reason = votes[0]["info"]
    if confirm is None:
        out["confirm"] = {"skipped": reason}
        return out
    mem, fail = trainer.shared_step(confirm, progress, "confirmation step")
    predicted = fit.predict(confirm)
    if fail is not None:
        out["confirm"] = {"batch": confirm, "predicted": predicted, "failed": fail.kind,
                          "message": fail.message}
    else:
        out["confirm"] = {"batch": confirm, "predicted": predicted, "measured": mem.peak,
                          "phases": dict(mem.phases)}
    return out


def _confirm_batch(fit, target, largest, usable, device, measured):
    if target and target in measured:
        return None, f"batch {target} was measured directly"
    if target:
        batch = target
    elif largest:
        batch = largest
    else:
        return None, "no --batch-size and no memory budget to pick a batch from"
    predicted = fit.predict(batch)
    if usable is not None and predicted > usable:
        return None, f"batch {batch} is predicted not to fit, so it was not run"
    limit = cpu_step_limit(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if device.type == "cpu" and predicted > limit:
        return None, (f"batch {batch} would allocate {predicted / 2**30:.1f} GiB of host memory "
                      f"on every rank, more than this CPU check allows "
                      f"({limit / 2**30:.1f} GiB)")
    return batch, ""

