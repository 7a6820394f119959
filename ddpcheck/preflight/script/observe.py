"""Watch the user's script from inside one preflight rank (imports torch).

:class:`Observer` installs documented, reversible interceptions before the
script starts and removes them after it ends; nothing outside the preflight's
worker process is touched. What each one records (into :class:`RankFacts`):

================================  =====================================================
``DataLoader.__init__``           real ``len(dataset)``, batch size, sampler kind /
                                  shuffle / drop_last, loader drop_last, workers; the
                                  batch sampler is then steered (:mod:`.steer`)
``Sampler.set_epoch``             calls per epoch (DistributedSampler and subclasses)
``DistributedDataParallel``       construction (device_ids, find_unused_parameters,
                                  BatchNorm / SyncBatchNorm inside) and every forward
``DataParallel.__init__``         construction
``SyncBatchNorm.convert_...``     before or after the DDP wrap
``torch.distributed.<collective>`` op, tensor shapes, dtype, the script's line; each
                                  call, each DDP construction and forward first meets
                                  the other ranks over the c10d store (never the
                                  user's group): the first difference is named and
                                  every rank stops instead of hanging
``init_process_group``            the backend asked for; NCCL without GPUs -> gloo
``optimizer.step``                ``register_optimizer_step_post_hook``: steps, and
                                  which loader was training
``torch.multiprocessing.spawn``   run in place as this rank (mp.spawn scripts)
``torch.cuda.*`` / ``.cuda()``    on a machine without GPUs only: a TorchFunctionMode
                                  that keeps tensors on CPU, and no-op set_device
================================  =====================================================

File writes are kept away from the user's folders by :mod:`.scratch`.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from typing import Optional

import torch
import torch.distributed as dist

from ddpcheck.preflight.script.facts import (
    CollectiveFact,
    LoaderFact,
    MemoryFact,
    MismatchFact,
    PeerPosition,
    RankFacts,
    SyncBNFact,
    WrapFact,
)
from ddpcheck.preflight.script.standin import CudaStandIn, _is_cuda
from ddpcheck.preflight.script.steer import (
    PreflightStop,
    Steering,
    steered_batch_sampler,
    steered_next,
)
from ddpcheck.preflight.script import parallel

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "all_gather_object",
               "broadcast_object_list", "gather_object", "scatter_object_list")
MAX_COLLECTIVES = 200  # kept for the report; all are compared
DDP_FORWARD = "DDP forward"
DDP_INIT = "DDP construction"


class PreflightMismatch(BaseException):
    """This rank's next collective differs from a peer's: stop instead of hanging."""


class PreflightRefused(BaseException):
    """The preflight cannot run this script as it is (message says how to)."""


# -- where in the user's code ------------------------------------------------------------

_LIB_DIRS = tuple(sorted({os.path.realpath(p) for p in (
    sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
    sysconfig.get_paths().get("platlib"), os.path.dirname(os.__file__),
    os.path.dirname(os.path.dirname(torch.__file__))) if p}))
_OWN_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if real.startswith(_OWN_DIR + os.sep):
        return False
    return not any(real.startswith(d + os.sep) for d in _LIB_DIRS)


def short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def user_line(frame=None) -> str:
    """``file:line`` of the innermost frame in the user's code."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def user_frames(tb, limit: int = 6) -> list:
    """The script's own frames of a traceback, outermost first: ``train.py:27 in
    __init__: self.model = model.to(self.gpu_id)``."""
    out = [f"{short_path(e.filename)}:{e.lineno} in {e.name}: {(e.line or '').strip()}"
           for e in traceback.extract_tb(tb) if is_user_file(e.filename)]
    return out[-limit:]


def user_line_of(tb) -> str:
    for entry in reversed(traceback.extract_tb(tb)):
        if is_user_file(entry.filename):
            return f"{short_path(entry.filename)}:{entry.lineno}"
    return ""


# -- the observer ------------------------------------------------------------------------


class Observer:
    def __init__(self, facts: RankFacts, steering: Steering, deadline: float,
                 cuda_stand_in: bool, run_key: str, measure_memory: bool = True,
                 devices: int = 1, one_process: bool = False):
        self.facts = facts
        self.devices = devices  # CUDA devices this process sees (emulated on CPU)
        self.one_process = one_process  # DataParallel / plain script: no ranks
        self.stand_in = None
        self.steering = steering
        self.deadline = deadline
        self.cuda_stand_in = cuda_stand_in
        self.run_key = run_key
        self.measure_memory = measure_memory
        self._saved: list = []
        self._handles: list = []
        self._modes: list = []
        self._lock = threading.RLock()
        self._inside = threading.local()
        self._seq = 0
        self._set_epoch_calls: dict[int, int] = {}
        self._wrapped_modules: list = []
        self._optimizers: list = []
        self._meter = None
        self._meter_mode = None
        self.store = None
        self.spawned = False

    # -- patching helpers ------------------------------------------------------------

    def _patch(self, owner, name: str, new) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name))
                            if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, new)

    def install(self) -> None:
        self._install_data()
        self._install_wrappers()
        self._install_collectives()
        self._install_init()
        self._install_optimizer()
        self._install_spawn()
        if self.cuda_stand_in:
            self._install_cuda_stand_in()

    def uninstall(self) -> None:
        self._stop_meter(record=False)  # a step cut short measures nothing
        self._remove_cuda_stand_in()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)

    # -- DataLoader, samplers ---------------------------------------------------------

    def _install_data(self) -> None:
        from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

        obs = self
        real_init = DataLoader.__init__

        @functools.wraps(real_init)
        def loader_init(loader, *args, **kwargs):
            real_init(loader, *args, **kwargs)
            try:
                obs._loader_built(loader, DistributedSampler, RandomSampler)
            except Exception as exc:  # observing must never break the script
                obs.facts.notes.append(f"DataLoader not observed: {exc}")

        self._patch(DataLoader, "__init__", loader_init)

        real_set_epoch = DistributedSampler.set_epoch

        @functools.wraps(real_set_epoch)
        def set_epoch(sampler, epoch, *args, **kwargs):
            obs._set_epoch_calls[id(sampler)] = obs._set_epoch_calls.get(id(sampler), 0) + 1
            return real_set_epoch(sampler, epoch, *args, **kwargs)

        self._patch(DistributedSampler, "set_epoch", set_epoch)
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self._patch(_BaseDataLoaderIter, "__next__",
                    steered_next(_BaseDataLoaderIter.__next__, self.steering))
        real_reset = _BaseDataLoaderIter._reset

        @functools.wraps(real_reset)
        def reset(it, *args, **kwargs):
            it._ddpcheck_served = 0  # a persistent-workers iterator is reused every epoch
            return real_reset(it, *args, **kwargs)

        self._patch(_BaseDataLoaderIter, "_reset", reset)
        del Sampler

    def _loader_built(self, loader, DistributedSampler, RandomSampler) -> None:
        dataset = loader.dataset
        try:
            size = len(dataset)
        except TypeError:
            size = None
        sampler = loader.sampler
        distributed = isinstance(sampler, DistributedSampler)
        if distributed:
            shuffle = bool(sampler.shuffle)
        elif isinstance(sampler, RandomSampler):
            shuffle = True
        else:
            shuffle = False if type(sampler).__name__ == "SequentialSampler" else None
        try:
            batches = len(loader)
        except TypeError:
            batches = None
        fact = LoaderFact(
            index=len(self.facts.loaders), where=user_line(sys._getframe(2)),
            dataset_type=type(dataset).__name__, dataset_len=size,
            batch_size=loader.batch_size, drop_last=bool(loader.drop_last),
            sampler=type(sampler).__name__, distributed=distributed, shuffle=shuffle,
            sampler_drop_last=bool(sampler.drop_last) if distributed else None,
            num_replicas=sampler.num_replicas if distributed else None,
            sampler_rank=sampler.rank if distributed else None,
            num_workers=int(loader.num_workers), batches=batches, steered=False)
        self.facts.loaders.append(fact)
        inner = loader.batch_sampler
        if inner is not None and size is not None:
            steered = steered_batch_sampler(
                inner, fact, self.steering,
                lambda: self._set_epoch_calls.pop(id(sampler), 0), sampler)
            # DataLoader refuses to reassign batch_sampler after __init__: set the
            # attribute beneath its guard; len(), batch_size and sampler stay the same
            object.__setattr__(loader, "batch_sampler", steered)
            fact.steered = True

    # -- DDP, DataParallel, SyncBatchNorm ---------------------------------------------

    def _install_wrappers(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        obs = self
        real_ddp_init = DistributedDataParallel.__init__

        signature = inspect.signature(real_ddp_init)

        @functools.wraps(real_ddp_init)
        def ddp_init(ddp, *args, **kwargs):
            where = user_line(sys._getframe(1))
            try:
                bound = signature.bind(ddp, *args, **kwargs)
            except TypeError:  # let DDP say what is wrong with the call
                return real_ddp_init(ddp, *args, **kwargs)
            given = dict(bound.arguments)
            given.pop("self", None)
            module = given.get("module")
            device_ids = given.get("device_ids")
            dropped = False
            if obs.cuda_stand_in and (device_ids is not None
                                      or given.get("output_device") is not None):
                # the module stands on CPU, where DDP wants device_ids=None
                given.pop("device_ids", None)
                given.pop("output_device", None)
                dropped = True
            obs._record_wrap("DistributedDataParallel", module, where, device_ids,
                             given.get("output_device"),
                             bool(given.get("find_unused_parameters", False)),
                             given.get("broadcast_buffers") is not False, dropped)
            obs.sync(DDP_INIT, where, [], None)
            extra = given.pop("kwargs", {}) if "kwargs" in signature.parameters else {}
            real_ddp_init(ddp, **given, **extra)
            obs._wrapped_modules.append(module)

        self._patch(DistributedDataParallel, "__init__", ddp_init)

        real_forward = DistributedDataParallel.forward

        @functools.wraps(real_forward)
        def ddp_forward(ddp, *args, **kwargs):
            obs.sync(DDP_FORWARD, user_line(sys._getframe(1)), [], None,
                     compared=forward_communicates(ddp))
            return real_forward(ddp, *args, **kwargs)

        self._patch(DistributedDataParallel, "forward", ddp_forward)
        self._install_data_parallel()
        self._install_sync_batchnorm()

    def _install_data_parallel(self) -> None:
        """DataParallel recorded; on the CPU stand-in its devices emulated (parallel.py)."""
        from torch.nn.parallel import DataParallel

        obs = self
        real_dp_init = DataParallel.__init__

        @functools.wraps(real_dp_init)
        def dp_init(dp, module, *args, **kwargs):
            names = ("device_ids", "output_device", "dim")
            given = dict(zip(names, args))
            given.update(kwargs)
            obs._record_wrap("DataParallel", module, user_line(sys._getframe(1)),
                             given.get("device_ids"), given.get("output_device"), False, True,
                             False)
            if obs.cuda_stand_in:
                parallel.emulate_init(dp, module, obs.devices, **given)
            else:
                real_dp_init(dp, module, *args, **kwargs)

        self._patch(DataParallel, "__init__", dp_init)
        real_dp_forward = DataParallel.forward

        @functools.wraps(real_dp_forward)
        def dp_forward(dp, *args, **kwargs):
            if not getattr(dp, parallel.EMULATED, False):
                return real_dp_forward(dp, *args, **kwargs)
            return parallel.emulate_forward(dp, args, kwargs, obs.facts.data_parallel)

        self._patch(DataParallel, "forward", dp_forward)

    def _install_sync_batchnorm(self) -> None:
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel

        obs = self
        real_convert = nn.SyncBatchNorm.convert_sync_batchnorm.__func__

        def convert(cls, module, *args, **kwargs):
            after = isinstance(module, DistributedDataParallel) or any(
                m is module or any(sub is m for sub in module.modules())
                for m in obs._wrapped_modules)
            where = user_line(sys._getframe(1))
            if obs.cuda_stand_in:
                # SyncBatchNorm's forward needs a GPU: record the call, keep BatchNorm
                obs.facts.syncbn.append(SyncBNFact(where, after, False))
                return module
            obs.facts.syncbn.append(SyncBNFact(where, after, True))
            return real_convert(cls, module, *args, **kwargs)

        self._patch(nn.SyncBatchNorm, "convert_sync_batchnorm", classmethod(convert))

    def _record_wrap(self, kind, module, where, device_ids, output_device, find_unused,
                     broadcast_buffers, dropped) -> None:
        from torch import nn

        bns = sum(1 for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                  and not isinstance(m, nn.SyncBatchNorm))
        sbns = sum(1 for m in module.modules() if isinstance(m, nn.SyncBatchNorm))
        params = list(module.parameters())
        self.facts.wraps.append(WrapFact(
            kind=kind, where=where,
            device_ids=[str(d) for d in device_ids] if device_ids is not None else None,
            output_device=None if output_device is None else str(output_device),
            find_unused_parameters=find_unused, broadcast_buffers=broadcast_buffers,
            batchnorms=bns, syncbatchnorms=sbns, parameters=sum(p.numel() for p in params),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            device_ids_dropped=dropped))

    # -- collectives and their order across ranks -------------------------------------

    def _install_collectives(self) -> None:
        obs = self
        for name in COLLECTIVES:
            real = getattr(dist, name, None)
            if real is None:
                continue

            def make(op, fn):
                @functools.wraps(fn)
                def collective(*args, **kwargs):
                    if getattr(obs._inside, "active", False):
                        return fn(*args, **kwargs)
                    where = user_line(sys._getframe(1))
                    shapes, dtype = _tensor_signature(args, kwargs)
                    group = kwargs.get("group")
                    on_world = group is None or group is dist.GroupMember.WORLD
                    obs.sync(op, where, shapes, dtype, compared=on_world)
                    obs._inside.active = True
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        obs._inside.active = False
                return collective

            self._patch(dist, name, make(name, real))

    def _get_store(self):
        if self.store is None and dist.is_initialized():
            try:
                self.store = dist.distributed_c10d._get_default_store()
            except Exception:
                self.store = None
        return self.store

    def _key(self, *parts) -> str:
        return "/".join(("ddpcheck", self.run_key) + tuple(str(p) for p in parts))

    def sync(self, op: str, where: str, shapes: list, dtype: Optional[str],
             compared: bool = True) -> None:
        """Record this call and meet the other ranks at it over the store."""
        with self._lock:
            if not compared:  # a sub-group collective, or a forward that meets nobody
                self.facts.uncompared += 1
                return
            seq = self._seq
            self._seq += 1
            fact = CollectiveFact(seq, op, where, shapes, dtype, compared)
            self.facts.collective_count += 1
            if len(self.facts.collectives) < MAX_COLLECTIVES:
                self.facts.collectives.append(fact)
            store = self._get_store()
            world = self.facts.world_size
            if store is None or world < 2:
                return
            store.set(self._key("seq", seq, self.facts.rank), json.dumps(
                {"op": op, "where": where, "shapes": shapes, "dtype": dtype}))
            mismatch = self._compare(store, seq, fact)
        if mismatch is not None:
            self.facts.mismatch = mismatch
            raise PreflightMismatch(f"collective #{seq + 1} differs across ranks")

    def _compare(self, store, seq: int, mine: CollectiveFact) -> Optional[MismatchFact]:
        peers = [r for r in range(self.facts.world_size) if r != self.facts.rank]
        positions: dict[int, PeerPosition] = {}
        delay = 0.001
        while len(positions) < len(peers):
            for peer in peers:
                if peer in positions:
                    continue
                key = self._key("seq", seq, peer)
                if store.check([key]):
                    data = json.loads(store.get(key))
                    positions[peer] = PeerPosition(peer, data["op"], data["where"],
                                                   data["shapes"], data["dtype"])
                    continue
                end_key = self._key("end", peer)
                if store.check([end_key]) and not store.check([key]):
                    data = json.loads(store.get(end_key))
                    positions[peer] = PeerPosition(peer, ended=data["ending"],
                                                   ended_where=data.get("where", ""))
            if len(positions) == len(peers):
                break
            if time.time() > self.deadline:
                return None  # the launcher's watchdog names who is missing
            time.sleep(delay)
            delay = min(0.05, delay * 2)
        reason = ""
        for pos in positions.values():
            if pos.op == mine.op and pos.where != mine.where and not self.facts.first_divergence:
                # the same step from another line: not a hang by itself, but where the
                # ranks' sequences part if they later disagree
                self.facts.first_divergence = (f"#{seq + 1}: rank {self.facts.rank} {mine.op} at "
                                               f"{mine.where}, rank {pos.rank} at {pos.where}")
            if pos.ended is not None:
                reason = "ended"
            elif pos.op != mine.op:
                reason = reason or "op"
            elif mine.op not in (DDP_FORWARD, DDP_INIT) and pos.shapes != mine.shapes \
                    and mine.op not in ("all_gather_object", "broadcast_object_list",
                                        "gather_object", "scatter_object_list"):
                reason = reason or "shape"
            elif pos.dtype != mine.dtype:
                reason = reason or "dtype"
        if not reason:
            return None
        return MismatchFact(seq, mine, sorted(positions.values(), key=lambda p: p.rank), reason)

    def announce_end(self, ending: str, where: str) -> None:
        """Tell peers waiting at a collective that this rank will not come."""
        store = self._get_store()
        if store is None:
            return
        try:
            store.set(self._key("end", self.facts.rank),
                      json.dumps({"ending": ending, "where": where}))
        except Exception:
            pass

    # -- init_process_group -----------------------------------------------------------

    def _install_init(self) -> None:
        obs = self
        real_init = dist.init_process_group

        @functools.wraps(real_init)
        def init_process_group(*args, **kwargs):
            facts = obs.facts
            facts.init_where = user_line(sys._getframe(1))
            if obs.one_process:
                # the script starts a process group after all: it needs ranks
                facts.wants_ranks = True
                raise PreflightStop("the script starts a process group")
            backend = kwargs.get("backend", args[0] if args else None)
            facts.backend_asked = None if backend is None else str(backend)
            if args:
                kwargs["backend"] = args[0]
                args = args[1:]
            if obs.cuda_stand_in and backend is not None and "nccl" in str(backend).lower():
                kwargs["backend"] = "gloo"
                facts.init_notes.append(f"backend {backend!r} -> 'gloo'")
            if obs.cuda_stand_in and _is_cuda(kwargs.get("device_id")):
                kwargs.pop("device_id")
            # the preflight's launcher owns the rendezvous: a hard-coded tcp:// address
            # or port would wait for a server nobody starts
            method = kwargs.get("init_method")
            if method not in (None, "env://"):
                kwargs["init_method"] = "env://"
                facts.init_notes.append(f"init_method {method!r} -> the preflight's "
                                        f"rendezvous (env://)")
            for key in ("MASTER_ADDR", "MASTER_PORT"):
                mine = obs.launcher_env.get(key)
                if mine and os.environ.get(key) != mine:
                    facts.init_notes.append(f"{key}={os.environ.get(key)} set by the script -> "
                                            f"the preflight's {mine}")
                    os.environ[key] = mine
            for key, env in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
                if kwargs.get(key) is not None and int(kwargs[key]) != int(os.environ[env]):
                    raise PreflightRefused(
                        f"the script passes {key}={kwargs[key]} to init_process_group but the "
                        f"preflight started this process as {env}={os.environ[env]}: derive "
                        f"them from the RANK/WORLD_SIZE environment variables torchrun sets")
            result = real_init(*args, **kwargs)
            facts.backend_used = dist.get_backend()
            obs._get_store()  # held from here on: it outlives the script's destroy_process_group
            return result

        self.launcher_env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        self._patch(dist, "init_process_group", init_process_group)

    # -- optimizer steps and memory ----------------------------------------------------

    def _install_optimizer(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        obs = self

        def stepped(optimizer, args, kwargs):
            obs.facts.optimizer_steps += 1
            if not any(o is optimizer for o in obs._optimizers):
                obs._optimizers.append(optimizer)
            obs._stop_meter()
            obs.steering.optimizer_stepped(obs.facts.loaders)

        self._handles.append(register_optimizer_step_post_hook(stepped))
        if self.measure_memory:
            self.steering.on_batch = self._maybe_start_meter

    def _maybe_start_meter(self, fact: LoaderFact, epoch: int, served: int) -> None:
        """Meter the step of the first full batch of the first training epoch (the
        script's own batch size; the batch served first is the short last one)."""
        if self.facts.memory is not None or self._meter is not None:
            return
        if not (fact.training and epoch == 1 and served >= 1):
            return
        try:
            if torch.cuda.is_available() and not self.cuda_stand_in:
                torch.cuda.reset_peak_memory_stats()
                self._meter = ("cuda", torch.cuda.memory_allocated(), fact.batch_size)
                return
            from ddpcheck.preflight.memory import CpuMeter

            meter = CpuMeter()
            for module in self._wrapped_modules:
                meter.watch(module)
                for p in module.parameters():
                    if p.grad is not None:
                        meter.track(p.grad)
            for opt in self._optimizers:
                for state in opt.state.values():
                    for value in state.values():
                        if isinstance(value, torch.Tensor):
                            meter.track(value)
            mode = meter._mode_cls()
            mode.__enter__()
            meter.peak = meter.current
            self._meter = ("cpu", meter, mode, meter.current, fact.batch_size)
        except Exception as exc:
            self.facts.notes.append(f"memory not measured: {exc}")
            self._meter = None

    def _stop_meter(self, record: bool = True) -> None:
        meter, self._meter = self._meter, None
        if meter is None:
            return
        if not record:
            if meter[0] == "cpu":
                try:
                    meter[2].__exit__(None, None, None)
                except Exception:
                    pass
            return
        try:
            if meter[0] == "cuda":
                self.facts.memory = MemoryFact(meter[2], int(torch.cuda.max_memory_allocated()),
                                               int(meter[1]), "torch.cuda.max_memory_allocated")
                return
            _, cpu, mode, baseline, batch = meter
            mode.__exit__(None, None, None)
            self.facts.memory = MemoryFact(batch, int(cpu.peak), int(baseline), cpu.tool)
        except Exception as exc:
            self.facts.notes.append(f"memory not measured: {exc}")

    # -- scripts that start their own processes ---------------------------------------

    def _install_spawn(self) -> None:
        import torch.multiprocessing as mp

        obs = self

        def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
            world = int(os.environ.get("LOCAL_WORLD_SIZE", obs.facts.world_size))
            if obs.spawned:
                raise PreflightRefused("the script calls mp.spawn twice: run each stage "
                                       "as its own script under torchrun")
            if nprocs != world or not join:
                raise PreflightRefused(
                    f"the script starts {nprocs} processes itself with mp.spawn (join="
                    f"{join}) but the preflight runs {world} ranks: run it with --gpus "
                    f"{nprocs}, or let torchrun start the processes (read RANK/LOCAL_RANK "
                    f"from the environment) and call the worker function directly")
            obs.spawned = True
            obs.facts.notes.append(f"mp.spawn({getattr(fn, '__name__', fn)}, nprocs={nprocs}) "
                                   f"ran in place: each preflight rank is one spawned process")
            fn(int(os.environ.get("LOCAL_RANK", "0")), *args)
            return None

        for name in ("spawn", "start_processes"):
            self._patch(mp, name, spawn)

    # -- CUDA stand-in on CPU ----------------------------------------------------------

    def _install_cuda_stand_in(self) -> None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.stand_in = CudaStandIn(self.devices, local)
        self.stand_in.install()
        self.facts.cuda_stand_in = True

    def _remove_cuda_stand_in(self) -> None:
        if self.stand_in is None:
            return
        self.stand_in.uninstall()
        self.facts.set_device = list(self.stand_in.set_device_calls)
        self.facts.stand_in_used = sorted(self.stand_in.used)
        self.stand_in = None


def _tensor_signature(args, kwargs) -> tuple[list, Optional[str]]:
    shapes: list = []
    dtype = None

    def visit(value) -> None:
        nonlocal dtype
        if isinstance(value, torch.Tensor):
            shapes.append(list(value.shape))
            dtype = dtype or str(value.dtype).replace("torch.", "")
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            for item in value:
                visit(item)

    for value in list(args) + list(kwargs.values()):
        visit(value)
    return shapes, dtype


def forward_communicates(ddp) -> bool:
    """Does this DDP forward make the ranks meet? DDP's own rules: the backward
    all-reduces gradients when grad mode is on and the module is not inside
    ``no_sync()``; the forward broadcasts buffers when DDP says it will (after a
    synchronised step, with buffers to sync); a Join context meets every forward.
    A ``no_grad`` / ``no_sync`` forward with nothing to broadcast meets nobody."""
    try:
        if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            return True
        if ddp._check_sync_bufs_pre_fwd() or ddp._check_sync_bufs_post_fwd():
            return True
        return bool(getattr(getattr(ddp, "_join_config", None), "enable", False))
    except Exception:  # a DDP without these attributes: assume it meets
        return True
