"""Peak memory of one full DDP training step at batch 1 and 2 (inside a worker).

On a GPU the peak is ``torch.cuda.max_memory_allocated`` per phase, and what
``torch.cuda.mem_get_info`` shows beyond the caching allocator (CUDA context,
NCCL buffers, other processes) is kept aside as overhead. On CPU it is the
tensor memory counted the way ``torch.distributed._tools.mem_tracker`` counts
it (parameters, gradients, DDP buckets, optimizer state, activations,
temporaries), which is what the step would allocate on a GPU before the
allocator's rounding and the CUDA context.

Steps are measured at batch 1, 2 and 4, fitted (:mod:`memfit`, the only fit),
and confirmed by a real step at the target batch, or at the largest batch that
fits, refitting after each confirmation until the recommendation is a batch
whose own step fitted. Every step is followed by :func:`collectives.agree`
on the tool's own group: a rank that raised posts its failure first, so a peer
left waiting in DDP's all_reduce is stopped by the launcher within seconds.
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
from ddpcheck.preflight.options import RunSpec
from ddpcheck.preflight.results import (
    FailureKind,
    MemoryResult,
    RankFailure,
    StateBytes,
    failure_from_exception,
)

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


def make_sample(ms, device: torch.device) -> Callable[[int], Any]:
    if ms.sample:
        fn = modelspec.load_ref(ms.sample, "--sample")
        return lambda b: to_device(fn(b), device)
    shape = tuple(ms.input_shape)
    return lambda b: torch.randn((b, *shape), device=device)


def call_model(model: nn.Module, batch: Any) -> Any:
    args, kwargs = modelspec.split_call(batch)
    return model(*args, **kwargs)


# -- optimizer, DDP --------------------------------------------------------------------------


class SetupError(Exception):
    """The optimizer factory or the DDP wrap failed (the user's code or options)."""


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    factory = modelspec.load_ref(name, "--optimizer")
    opt = factory(params)
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"--optimizer {name} returned a {type(opt).__name__}, not a "
                        f"torch.optim.Optimizer")
    return opt


_STATE_COPIES = {"adamw": 2, "adam": 2, "sgd": 1}


def known_optimizer_state(name: str, trainable_bytes: int) -> Optional[int]:
    """Optimizer state after the first step: AdamW/Adam keep two moments per
    parameter, SGD with momentum one; a custom optimizer is not guessed."""
    copies = _STATE_COPIES.get(name)
    return None if copies is None else copies * trainable_bytes


def wrap_ddp(model: nn.Module, device: torch.device, ms, find_unused: bool) -> nn.Module:
    kwargs = {"find_unused_parameters": find_unused,
              "gradient_as_bucket_view": ms.gradient_as_bucket_view,
              "static_graph": ms.static_graph}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index]
    return nn.parallel.DistributedDataParallel(model, **kwargs)


def _unused_names(message: str, ddp: Optional[nn.Module]) -> list[str]:
    match = _UNUSED_NAMES_RE.search(message)
    if match:
        return sorted(n.strip() for n in match.group(1).split(",") if n.strip())
    match = _UNUSED_IDX_RE.search(message)
    if match and ddp is not None:
        names = [n for n, p in ddp.module.named_parameters() if p.requires_grad]
        return [names[int(i)] if int(i) < len(names) else f"#{i}"
                for i in match.group(1).split()]
    return []


def classify(exc: BaseException) -> FailureKind:
    """What a failed step means, by the exception's type (torch's own classes)
    and, where torch raises a plain RuntimeError/ValueError, its message."""
    text = str(exc)
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    if isinstance(exc, oom_types + (MemoryError,)) or \
            (isinstance(exc, RuntimeError) and _OOM_RE.search(text)):
        return FailureKind.OOM
    if isinstance(exc, ValueError) and _BN1_RE.search(text):
        return FailureKind.BN_BATCH1
    if isinstance(exc, RuntimeError) and _UNUSED_RE.search(text):
        return FailureKind.UNUSED
    if isinstance(exc, LossError):
        return FailureKind.LOSS
    return FailureKind.ERROR


class LossError(Exception):
    pass


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
        raise LossError("the model output has no floating-point tensor that needs a "
                        "gradient: pass --loss MODULE:FN(output, batch)")
    return sum(terms)


# -- the run --------------------------------------------------------------------------------

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Trainer:
    def __init__(self, spec: RunSpec, group, model: nn.Module, meter):
        self.ms = spec.model
        self.group = group
        self.model = model
        self.meter = meter
        self.sample = make_sample(self.ms, group.device)
        self.loss_fn = modelspec.load_ref(self.ms.loss, "--loss") if self.ms.loss else None
        self.ddp = None
        self.opt = None
        self.scaler = None
        self.find_unused = self.ms.find_unused_parameters

    def wrap(self, find_unused: bool) -> None:
        self.opt = None
        self.ddp = None
        gc.collect()
        self.find_unused = find_unused
        with self.meter.phase("setup"):
            self.ddp = wrap_ddp(self.model, self.group.device, self.ms, find_unused)
            self.opt = make_optimizer(self.ms.optimizer, self.ddp.parameters())
            if self.ms.amp == "fp16":
                self.scaler = torch.amp.GradScaler(self.group.device.type)

    def _autocast(self):
        if not self.ms.amp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.group.device.type, dtype=_AMP_DTYPES[self.ms.amp])

    def step(self, batch_size: int, stage: str) -> memfit.StepMemory:
        """One full training step; the peaks of its phases."""
        try:
            with self.meter.phase(PHASE_FB):
                batch = self.sample(batch_size)
                with self._autocast():
                    out = call_model(self.ddp, batch)
                    loss = self.loss_fn(out, batch) if self.loss_fn else default_loss(out)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                del out, loss, batch
            with self.meter.phase(PHASE_OPT):
                if self.scaler:
                    self.scaler.step(self.opt)
                    self.scaler.update()
                else:
                    self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        except Exception as exc:  # classified and shared with the other ranks
            kind = classify(exc)
            failure = failure_from_exception(exc, stage, kind, batch_size)
            if kind == FailureKind.UNUSED:
                failure.names = _unused_names(str(exc), self.ddp)
        else:
            failure = None
        if failure is not None:
            # raised outside the except block: no traceback keeps the failed
            # step's frames (and a DDP reducer) alive
            self.opt.zero_grad(set_to_none=True)
            gc.collect()
            if self.group.device.type == "cuda":
                torch.cuda.empty_cache()
            raise StepFailure(failure)
        return memfit.StepMemory(batch_size, {PHASE_FB: self.meter.peaks[PHASE_FB],
                                              PHASE_OPT: self.meter.peaks[PHASE_OPT]})

    def shared_step(self, batch_size: int, progress, what: str):
        """A step on every rank, then meet: ``(StepMemory or None, RankFailure or None)``;
        the failure is this rank's, else the first other rank's."""
        stage = f"{what} at batch {batch_size}"
        progress.stage(stage)
        mem, fail = None, None
        try:
            mem = self.step(batch_size, stage)
        except StepFailure as exc:
            fail = exc.failure
        votes = collectives.agree(self.group, stage, failure=fail)
        if fail is None:
            fail = next((v["failure"] for v in votes if v["failure"] is not None), None)
        return (None if fail is not None else mem), fail


class StepFailure(Exception):
    def __init__(self, failure: RankFailure):
        super().__init__(failure.message)
        self.failure = failure


def _decide(group, what: str, value):
    """Rank 0 decides for everybody (ranks may measure a few bytes apart on GPUs)."""
    return collectives.agree(group, what, info=value)[0]["info"]


def run(spec: RunSpec, group, progress) -> MemoryResult:
    """Build, wrap, and measure; every rank runs the same steps."""
    ms = spec.model
    device = group.device
    out = MemoryResult(device=str(device), amp=ms.amp or "")
    model = _build_model(ms, group, progress, out)
    if model is None:
        return out
    _count_state(out, model, ms)
    _set_budget(out, spec, device)
    if _nothing_to_measure(out, group, device):
        return out
    if ms.sync_bn:
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before the DDP wrap
            out.sync_bn = "converted"
        else:
            out.sync_bn = "not on CPU"
    model.train()
    meter = make_meter(device)
    out.tool = meter.tool
    trainer = _wrap(spec, group, model, meter, progress, out)
    if trainer is None:
        return out

    steps = _measure(trainer, out, progress, spec)
    out.steps = list(steps)
    if out.step_error is not None:
        _finish_budget(out, meter, spec, device)
        return out
    _finish_budget(out, meter, spec, device)
    _fit_and_confirm(trainer, out, steps, progress, spec)
    out.steps = [s for s in steps if s.batch not in {c.batch for c in out.confirmations}]
    return out


def _build_model(ms, group, progress, out: MemoryResult):
    """The model from the --model factory on every rank (None, with the failure in
    ``out``, when the factory failed on any rank: every rank stops together)."""
    progress.stage("building the model (--model factory)")
    model, err = None, None
    try:
        factory = modelspec.load_ref(ms.factory, "--model")
        torch.manual_seed(0)
        model = factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"returned {modelspec.with_article(type(model).__name__)}, not a torch.nn.Module")
    except Exception as exc:
        err = failure_from_exception(exc, "building the model (--model factory)")
        model = None
    votes = collectives.agree(group, "model built", failure=err)
    bad = [(r, v["failure"]) for r, v in enumerate(votes) if v["failure"] is not None]
    if bad:
        out.factory_error = bad[0][1]
        out.failed_ranks = [r for r, _ in bad]
        return None
    return model


def _count_state(out: MemoryResult, model, ms) -> None:
    """Parameters, gradients, DDP buckets and optimizer state: the bytes every GPU holds
    before any activation."""
    params = list(model.parameters())
    out.params = sum(p.numel() for p in params)
    out.param_bytes = sum(p.numel() * p.element_size() for p in params)
    out.trainable_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    out.batchnorm_layers = sum(isinstance(m, nn.modules.batchnorm._BatchNorm)
                               for m in model.modules())
    out.state = StateBytes(out.param_bytes, out.trainable_bytes,
                           0 if ms.gradient_as_bucket_view else out.trainable_bytes,
                           known_optimizer_state(ms.optimizer, out.trainable_bytes))


def _nothing_to_measure(out: MemoryResult, group, device) -> bool:
    """The model's state alone exceeds the budget (no batch fits), or the CPU processes
    would not fit the host's memory: every rank stops here together."""
    if out.usable is not None and out.state.total > out.usable:
        # parameters, gradients, buckets and optimizer state alone exceed the
        # budget: no batch fits, and there is nothing to measure
        collectives.agree(group, "model state vs budget")
        return True
    if device.type == "cpu":
        # do not let the host's OOM killer answer for us
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        ram = host_memory()
        if ram and out.state.total * local_world > 0.8 * ram:
            out.host_too_small = ram
            collectives.agree(group, "host memory check")
            return True
    return False


def _wrap(spec: RunSpec, group, model, meter, progress, out: MemoryResult):
    """The model on its device, wrapped in DDP with its optimizer (None, with the
    failure in ``out``, when that failed on any rank)."""
    try:
        meter.watch(model)
        with meter.phase("to device"):
            model.to(group.device)
        trainer = Trainer(spec, group, model, meter)
        progress.stage("wrapping the model in DDP, building the optimizer")
        trainer.wrap(find_unused=spec.model.find_unused_parameters)
        setup_error = None
    except Exception as exc:
        setup_error = failure_from_exception(exc, "wrapping the model in DDP, building the "
                                                  "optimizer")
    votes = collectives.agree(group, "DDP wrap", failure=setup_error)
    setup_error = next((v["failure"] for v in votes if v["failure"] is not None), None)
    if setup_error is not None:
        out.step_error = setup_error
        return None
    return trainer


def _set_budget(out: MemoryResult, spec: RunSpec, device) -> None:
    out.reserve = spec.reserve or 0
    out.budget = spec.gpu_memory
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if not out.budget:
            out.budget = int(total)
            out.budget_from_device = True
        if not spec.reserve:
            out.outside_allocator = int(max(0, total - free - torch.cuda.memory_reserved(device)))
            out.reserve = out.outside_allocator
    if out.budget:
        out.usable = memfit.usable_memory(out.budget, out.reserve, spec.safety_margin)


def _finish_budget(out: MemoryResult, meter, spec: RunSpec, device) -> None:
    if device.type == "cuda":
        over = meter.overhead()
        out.outside_allocator = over["outside_allocator"]
        if not spec.reserve:
            out.reserve = out.outside_allocator
        if out.budget:
            out.usable = memfit.usable_memory(out.budget, out.reserve, spec.safety_margin)


def _measure(trainer: Trainer, out: MemoryResult, progress, spec: RunSpec) -> list:
    """Steps at batch 1, 2 and 4 (2, 3 and 6 when batch 1 cannot train)."""
    group = trainer.group
    lo = 1
    # step 1 warms up (optimizer state appears); DDP's unused-parameter error
    # shows on step 2, so the first measured step is a second step
    mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
    if fail is not None and fail.kind == FailureKind.BN_BATCH1:
        out.bn_batch1 = fail.message
        lo = 2
        mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
    if fail is None:
        mem, fail = trainer.shared_step(lo, progress, "training step")
        if fail is not None and fail.kind == FailureKind.UNUSED and not trainer.find_unused:
            out.unused = fail
            progress.stage("re-wrapping with find_unused_parameters=True")
            trainer.wrap(find_unused=True)
            collectives.agree(group, "DDP re-wrap")
            mem, fail = trainer.shared_step(lo, progress, "training step (warm-up)")
            if fail is None:
                mem, fail = trainer.shared_step(lo, progress, "training step")
    steps = []
    if fail is None:
        steps.append(mem)
        if out.budget and group.device.type == "cpu" and mem.peak + out.reserve > out.budget:
            fail = RankFailure(FailureKind.OOM, f"training step at batch {lo}", "",
                               f"tensor memory at batch {lo} is {mem.peak} bytes, more than "
                               f"--gpu-memory {out.budget}", "", lo)
            out.simulated_oom = True
    for batch in (lo + 1, 2 * (lo + 1)):
        if fail is not None:
            break
        if len(steps) >= 2:
            fit = memfit.fit_steps(steps)
            skip = _too_big(fit.predict(batch), out, group.device)
            if _decide(group, f"measure batch {batch}", skip is not None):
                break
        mem, fail = trainer.shared_step(batch, progress, "training step")
        if fail is None:
            steps.append(mem)
    out.step_error = fail
    return steps


def _too_big(predicted: int, out: MemoryResult, device) -> Optional[str]:
    if out.usable is not None and predicted > out.usable:
        return "is predicted not to fit, so it was not run"
    limit = cpu_step_limit(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if device.type == "cpu" and predicted > limit:
        return (f"would allocate {predicted / 2**30:.1f} GiB of host memory on every rank, "
                f"more than this CPU check allows ({limit / 2**30:.1f} GiB)")
    return None


def _fit_and_confirm(trainer: Trainer, out: MemoryResult, steps: list, progress,
                     spec: RunSpec) -> None:
    if len({s.batch for s in steps}) < 2:
        return
    out.fit = memfit.fit_steps(steps)
    out.largest = out.fit.largest_batch(out.usable) if out.usable is not None else None
    measured = {s.batch for s in steps}
    target = spec.batch_size
    if target and target in measured:
        out.confirm_skipped = f"batch {target} was measured directly"
    elif target:
        _confirm(trainer, out, steps, progress, target, "target")
    if not target:
        if out.largest is None:
            out.confirm_skipped = ("no --batch-size and no memory budget to pick a batch from"
                                   if out.usable is None else "")
            return
        # refit with every confirmation until the largest batch's own step fits
        for _ in range(4):
            batch = out.largest
            if batch is None or batch < 1 or batch in measured:
                out.largest_confirmed = batch in measured and \
                    next(s for s in steps if s.batch == batch).peak <= out.usable
                break
            mem = _confirm(trainer, out, steps, progress, batch, "largest")
            if mem is None:
                break
            measured.add(batch)
            if mem.peak <= out.usable:
                out.largest_confirmed = True
                break
            refit = out.fit.largest_batch(out.usable)
            out.largest = min(refit if refit is not None else batch - 1, batch - 1)


def _confirm(trainer: Trainer, out: MemoryResult, steps: list, progress, batch: int,
             purpose: str) -> Optional[memfit.StepMemory]:
    """One real step at ``batch``; the fit is refitted with it."""
    group = trainer.group
    predicted = out.fit.predict(batch)
    skip = _decide(group, f"confirm batch {batch}", _too_big(predicted, out, group.device))
    if skip:
        out.confirm_skipped = f"batch {batch} {skip}"
        return None
    mem, fail = trainer.shared_step(batch, progress, "confirmation step")
    if fail is not None:
        out.confirmations.append(memfit.Confirmation(batch, predicted, None, fail.text(),
                                                     purpose))
        return None
    out.confirmations.append(memfit.Confirmation(batch, predicted, mem.peak, "", purpose))
    steps.append(mem)
    out.fit = memfit.fit_steps(steps)
    if out.usable is not None:
        out.largest = out.fit.largest_batch(out.usable)
    return mem
