"""Start the user's script on N ranks the way torchrun would, and run one rank.

Parent side, :func:`launch_script`: the factory mode's own launcher,
:func:`ddpcheck.preflight.launch.run_local` (torch's ``elastic_launch``, c10d
rendezvous on a free port, workers forked from this process, the same
watchdog), with :func:`run_script_rank` as the entry point. Every worker gets
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT).

Rank side, :func:`run_script_rank`: sets the script's own ``sys.argv`` and
``sys.path[0]``, installs the observer and the write recorder (and, only where
no OS sandbox could be set up, the Python-level scratch redirection), runs the
script with ``runpy`` as ``__main__`` (its own ``init_process_group`` runs
unchanged, modulo the NCCL -> gloo switch on a machine without GPUs), then
undoes every interception and writes its :class:`RankFacts` to the run's facts
folder (under torchrun / srun: the shared store), and its
:class:`~ddpcheck.preflight.results.RankResult` to the progress protocol the
watchdog reads.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Optional

from ddpcheck.preflight.launch import LaunchOutcome
from ddpcheck.preflight.results import FailureKind, RankFailure, RankResult, RankStatus
from ddpcheck.preflight.script.facts import CrashFact, Ending, RankFacts
from ddpcheck.preflight.watchdog import StopReason


class TargetError(ValueError):
    """The script or module cannot be found (a usage error)."""


@dataclass(frozen=True)
class ScriptTarget:
    """What to run: a file or a module (``-m``), with the script's own arguments."""

    path: Optional[str]  # absolute path of the script file (the file -m resolves to)
    module: Optional[str]  # -m NAME
    argv: tuple = ()

    @property
    def display(self) -> str:
        return f"-m {self.module}" if self.module else os.path.relpath(self.path)

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path) if self.path else os.getcwd()


def resolve_target(args: list[str]) -> ScriptTarget:
    """``SCRIPT ARGS...`` or ``-m MODULE ARGS...`` (what follows ``--``)."""
    if not args:
        raise TargetError("nothing to run after --: give SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    if args[0] == "-m":
        if len(args) < 2:
            raise TargetError("-m needs a module name: -- -m mypkg.train [ARGS...]")
        name = args[1]
        # like `python -m`: the working folder comes first on the path
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            raise TargetError(f"-m {name}: {exc}") from None
        finally:
            sys.path.remove(os.getcwd())
        if spec is None:
            raise TargetError(f"-m {name}: no module named {name!r} from {os.getcwd()}")
        origin = spec.origin
        if spec.submodule_search_locations:  # a package: python -m runs its __main__
            main = importlib.util.find_spec(f"{name}.__main__")
            origin = main.origin if main else None
            if origin is None:
                raise TargetError(f"-m {name}: a package without __main__.py")
        return ScriptTarget(os.path.abspath(origin) if origin else None, name, tuple(args[2:]))
    path = args[0]
    if not os.path.exists(path):
        raise TargetError(f"{path}: no such file")
    if os.path.isdir(path):
        raise TargetError(f"{path}: a folder; give the training script (a .py file)")
    return ScriptTarget(os.path.abspath(path), None, tuple(args[1:]))


# -- the spec every rank gets -----------------------------------------------------------


@dataclass(frozen=True)
class ScriptSpec:
    """What one script rank needs (picklable: spawned workers get it too). The
    launcher fills ``results_dir``, ``deadline`` and ``launched_by``."""

    display: str  # the target as the report names it
    path: Optional[str]
    module: Optional[str]
    argv: tuple
    folder: str  # the script's folder (the Python-level redirection treats it as the user's)
    steps: int
    cuda_stand_in: bool
    timeout: float
    scratch: str  # where the Python-level redirection puts writes (used when ``redirect``)
    facts_dir: Optional[str]  # where each rank leaves its facts (None under torchrun/srun)
    run_key: str  # prefix of this run's keys in the shared store
    results_dir: Optional[str] = None
    deadline: float = 0.0
    launched_by: str = "ddpcheck"
    gather: bool = False  # under a launcher: rank 0 gathers every rank's facts from the store
    threads: Optional[int] = None
    one_process: bool = False  # DataParallel / plain script: one process, `devices` devices
    devices: int = 1  # CUDA devices the one process drives (emulated on CPU)
    nodes: int = 1  # --nodes M: the ranks split over M emulated nodes
    box: Optional[str] = None  # the run's own folder (the sandbox's box): never reported
    redirect: bool = True  # no OS sandbox: redirect Python-level writes into ``scratch``


# what torchrun sets for a worker; a one-process run starts the way `python train.py` does
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                "MASTER_PORT")


def rank_environment(spec: ScriptSpec, environ=None) -> dict:
    """The environment changes the script should see on this rank: none of torchrun's
    variables for a one-process run; each emulated node's LOCAL_RANK /
    LOCAL_WORLD_SIZE / GROUP_RANK under --nodes. Values None are removed."""
    env = os.environ if environ is None else environ
    if spec.one_process:
        return {k: None for k in env if k in LAUNCHER_ENV or k.startswith("TORCHELASTIC_")}
    if spec.nodes <= 1:
        return {}
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    per_node = max(1, world // spec.nodes)
    return {"LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node),
            "GROUP_RANK": str(rank // per_node), "GROUP_WORLD_SIZE": str(spec.nodes)}


def node_of(environ=None) -> tuple[int, int]:
    """This rank's node and the node count: torchrun's GROUP_RANK / GROUP_WORLD_SIZE,
    srun's SLURM_NODEID / SLURM_NNODES."""
    env = os.environ if environ is None else environ
    for node, count in (("GROUP_RANK", "GROUP_WORLD_SIZE"), ("SLURM_NODEID", "SLURM_NNODES")):
        if node in env:
            try:
                return int(env[node]), int(env.get(count, "1"))
            except ValueError:
                pass
    return 0, 1


FACTS_NAME = "facts{rank}.json"


# -- the rank side -------------------------------------------------------------------------


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _crash(exc: BaseException) -> CrashFact:
    from ddpcheck.preflight.script.observe import user_frames, user_line_of

    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    lines = [x for x in str(exc).strip().splitlines() if x.strip()]
    return CrashFact(type(exc).__name__, first_line(exc), user_line_of(exc.__traceback__),
                     "".join(tb)[-3000:], user_frames(exc.__traceback__),
                     lines[-1].strip()[:300] if len(lines) > 1 else "")


def _rank_result(facts: RankFacts, stage: str) -> RankResult:
    """The rank's line in the progress protocol: OK when the script ran (to its end, or
    until the steering stopped it), FAILED with the failure when it did not."""
    result = RankResult(facts.rank, RankStatus.OK, stage="done", pid=facts.pid)
    if facts.ending in (Ending.CRASHED, Ending.MISMATCH, Ending.REFUSED):
        result.status = RankStatus.FAILED
        result.stage = stage
        crash = facts.crash
        result.failure = RankFailure(
            FailureKind.ERROR, stage, crash.type if crash else "",
            crash.message if crash else facts.ending_detail, crash.where if crash else "")
    return result


def run_script_rank(spec: ScriptSpec) -> dict:
    """One rank of the user's script under observation (module-level: spawn can pickle it).

    Never raises: the facts go to the facts folder (or the store) and the return value;
    the rank's :class:`RankResult` to its progress file.
    """
    from ddpcheck.preflight.progress import Progress

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    progress = Progress(spec.results_dir, rank)
    progress.stage("starting the script")
    saved_env = _set_environment(rank_environment(spec))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    node, nodes = node_of()
    facts = RankFacts(rank=rank, world_size=world,
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")), pid=os.getpid(),
                      target=spec.display, node=node, nodes=nodes,
                      one_process=spec.one_process,
                      devices=spec.devices if spec.one_process else local_world)
    started = time.time()
    saved = (list(sys.argv), list(sys.path), os.getcwd())
    run = _ObservedRun(spec, facts, progress)
    try:
        run.start(local_world)
        try:
            run.run_script()
        finally:
            run.tear_down()
    except Exception as exc:  # the preflight's own machinery failed
        facts.ending = Ending.CRASHED
        facts.crash = _crash(exc)
        facts.notes.append("the preflight failed to run the script (a ddpcheck bug)")
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        try:
            os.chdir(saved[2])
        except OSError:
            pass
        _set_environment(saved_env)
    facts.seconds = time.time() - started
    result = {"rank": rank, "facts": facts.to_dict()}
    if spec.gather and run.observer is not None:
        result["all"] = _gather_facts(run.observer, facts, spec.deadline)
    _write_facts(spec.facts_dir, facts)
    progress.final(_rank_result(facts, "running the script"))
    return result


def _set_environment(changes: dict) -> dict:
    """Apply ``changes`` to os.environ (None: unset); returns what puts it back."""
    saved = {k: os.environ.get(k) for k in changes}
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return saved


class _ObservedRun:
    """The user's script in this rank, under observation: the instruments installed
    (:meth:`start`), the script run as ``__main__`` and how it ended recorded
    (:meth:`run_script`), every instrument taken off again (:meth:`tear_down`)."""

    def __init__(self, spec: ScriptSpec, facts: RankFacts, progress):
        self.spec, self.facts, self.progress = spec, facts, progress
        self.observer = self.scratch = self.recorder = self.steering = self.exits = None
        self.old_debug = None

    def start(self, local_world: int) -> None:
        from ddpcheck.preflight.worker import prepare_process

        spec = self.spec
        prepare_process(spec, local_world)
        import torch
        import torch.distributed as dist

        from ddpcheck.preflight.script.observe import Observer, user_line
        from ddpcheck.preflight.script.scratch import Scratch
        from ddpcheck.preflight.script.steer import Steering
        from ddpcheck.preflight.writes import WriteRecorder

        self.steering = Steering(spec.steps)
        self.observer = Observer(self.facts, self.steering, spec.deadline, spec.cuda_stand_in,
                                 spec.run_key, measure_memory=True, devices=self.facts.devices,
                                 one_process=spec.one_process)
        if spec.redirect:
            self.scratch = Scratch(spec.scratch, [os.getcwd(), spec.folder], user_line)
        self.recorder = WriteRecorder(user_line, own=(spec.box, spec.scratch, spec.results_dir,
                                                      spec.facts_dir),
                                      spill=_spill_file(spec.box, self.facts.rank))
        self.old_debug = dist.get_debug_level()
        # DDP names the parameters that got no gradient at INFO (DETAIL wraps the
        # group in checks that crash on some CPU builds)
        dist.set_debug_level(dist.DebugLevel.INFO)
        if self.scratch is not None:
            self.scratch.install(torch)
        self.recorder.install(torch)
        self.observer.install()
        self.exits = _ExitReport(spec, self.facts, self.observer, self.progress,
                                 lambda: _write_facts_of(self.recorder, self.scratch))
        self.exits.install()

    def run_script(self) -> None:
        """Run the script as ``__main__``; how it ended (finished, stopped by the
        steering, crashed, ...) goes to the facts, never up."""
        import runpy

        from ddpcheck.preflight.script.observe import PreflightMismatch, PreflightRefused
        from ddpcheck.preflight.script.steer import PreflightStop

        spec, facts = self.spec, self.facts
        try:
            self.progress.stage("running the script")
            if spec.module:
                sys.argv = [spec.path or spec.module, *spec.argv]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(spec.module, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [spec.path, *spec.argv]
                sys.path.insert(0, os.path.dirname(spec.path))
                runpy.run_path(spec.path, run_name="__main__")
            facts.ending = Ending.FINISHED
        except PreflightStop:
            facts.ending = Ending.STOPPED
            facts.ending_detail = self.steering.stop_reason
        except PreflightMismatch as exc:
            facts.ending = Ending.MISMATCH
            facts.ending_detail = str(exc)
        except PreflightRefused as exc:
            facts.ending = Ending.REFUSED
            facts.ending_detail = str(exc)
        except SystemExit as exc:
            code = exc.code
            if code in (None, 0):
                facts.ending = Ending.EXITED
                facts.ending_detail = f"sys.exit({code!r}) at {_user_line_of(exc)}"
            else:
                facts.ending = Ending.CRASHED
                facts.exit_code = code if isinstance(code, int) else 1
                facts.crash = CrashFact("SystemExit", f"sys.exit({code!r})",
                                        _user_line_of(exc), "")
        except BaseException as exc:  # the script's own failure: the report's subject
            facts.ending = Ending.CRASHED
            facts.crash = _crash(exc)

    def tear_down(self) -> None:
        """Tell the other ranks how this one ended, take every instrument off, hand the
        writes to the facts, post them, end the script's process group."""
        import torch.distributed as dist

        facts = self.facts
        where = facts.crash.where if facts.crash else ""
        self.observer.announce_end(facts.ending.value, where)
        self.progress.stage("tearing down")
        self.exits.uninstall()
        self.observer.uninstall()
        self.recorder.uninstall()
        if self.scratch is not None:
            self.scratch.uninstall()
        facts.writes = _write_facts_of(self.recorder, self.scratch)
        if self.spec.gather:
            _post_facts(self.observer, facts)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        dist.set_debug_level(self.old_debug)


def _write_facts_of(recorder, scratch) -> list:
    """The rank's writes for its facts: the recorder's, and the redirection's where it
    ran (it saw the path the script named before sending the write to scratch)."""
    from ddpcheck.preflight.script.facts import WriteFact

    out = list(scratch.writes) if scratch is not None else []
    seen = {(w.kind, w.path) for w in out}
    for w in recorder.collect():
        if (w.kind, w.path) not in seen:
            out.append(WriteFact(w.kind, w.path, w.where, True, w.count))
    return out


def _spill_file(box: Optional[str], rank: int) -> Optional[str]:
    """Where the rank's forked children (DataLoader workers) leave their write records."""
    if not box:
        return None
    folder = os.path.join(box, "writes")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"rank{rank}.{os.getpid()}.jsonl")


class _ExitReport:
    """``os._exit`` in the script (on this rank's own process, not a forked child):
    leave this rank's facts and final progress record, and tell the peers it ended,
    then exit as asked. Without it the launcher would learn nothing from the rank,
    and a peer would wait for it in its next collective."""

    def __init__(self, spec: ScriptSpec, facts: RankFacts, observer, progress, writes):
        self.spec, self.facts, self.observer, self.progress = spec, facts, observer, progress
        self.writes = writes
        self.pid = os.getpid()
        self.real = None
        self.progress_started = time.time()

    def install(self) -> None:
        self.real = os._exit
        os._exit = self._exit

    def uninstall(self) -> None:
        if self.real is not None:
            os._exit = self.real

    def _exit(self, code) -> None:
        real = self.real or os.__dict__["_exit"]
        if os.getpid() != self.pid:
            real(code)
        try:
            from ddpcheck.preflight.script.observe import user_line

            where = user_line()
            self.facts.ending = Ending.EXITED if code == 0 else Ending.CRASHED
            self.facts.exit_code = code
            self.facts.ending_detail = f"os._exit({code})" + (f" at {where}" if where else "")
            if code != 0:
                self.facts.crash = CrashFact("os._exit", f"os._exit({code})", where, "")
            self.observer.announce_end(self.facts.ending.value, where)
            self.facts.writes = self.writes()
            self.facts.seconds = time.time() - self.progress_started
            if self.spec.gather:
                _post_facts(self.observer, self.facts)
            _write_facts(self.spec.facts_dir, self.facts)
            self.progress.final(_rank_result(self.facts, "running the script"))
        except BaseException:  # noqa: BLE001 - the script asked to exit: it does
            pass
        real(code)


def _write_facts(facts_dir: Optional[str], facts: RankFacts) -> None:
    """Atomically, before the final progress record: the launcher reads the facts of
    every rank whose record is final."""
    if not facts_dir:
        return
    path = os.path.join(facts_dir, FACTS_NAME.format(rank=facts.rank))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(facts.to_dict(), fh, default=str)
    os.replace(tmp, path)


def _read_facts(facts_dir: str, rank: int) -> Optional[RankFacts]:
    try:
        with open(os.path.join(facts_dir, FACTS_NAME.format(rank=rank))) as fh:
            return RankFacts.from_dict(json.load(fh))
    except (OSError, ValueError):
        return None


def _user_line_of(exc: BaseException) -> str:
    from ddpcheck.preflight.script.observe import user_line_of

    return user_line_of(exc.__traceback__)


def _post_facts(observer, facts: RankFacts) -> None:
    store = observer.store
    if store is None:
        return
    try:
        store.set(observer._key("facts", facts.rank), json.dumps(facts.to_dict(), default=str))
    except Exception:
        pass


def _gather_facts(observer, facts: RankFacts, deadline: float) -> list:
    """Under torchrun/srun: every rank's facts, read from the store (rank 0 only)."""
    if facts.rank != 0 or observer.store is None:
        return []
    out = []
    for rank in range(facts.world_size):
        key = observer._key("facts", rank)
        while True:
            try:
                if observer.store.check([key]):
                    out.append(json.loads(observer.store.get(key)))
                    break
            except Exception:
                break
            if time.time() > deadline:
                break
            time.sleep(0.05)
    return out


# -- the parent side -----------------------------------------------------------------------


@dataclass
class ScriptRun:
    """Every rank's facts and how its process ended."""

    facts: list = field(default_factory=list)  # RankFacts per rank (None when it never reported)
    ranks: list[RankResult] = field(default_factory=list)  # the launcher's view (local runs)
    stop_reason: StopReason = StopReason.NONE  # why the watchdog stopped the run, if it did
    elapsed: float = 0.0
    start_method: str = "fork"
    log_dir: Optional[str] = None
    interrupted: bool = False
    launcher_error: Optional[str] = None


def make_spec(target: ScriptTarget, steps: int, cuda_stand_in: bool, timeout: float,
              scratch: str, facts_dir: Optional[str], **shape) -> ScriptSpec:
    return ScriptSpec(display=target.display, path=target.path, module=target.module,
                      argv=tuple(target.argv), folder=target.folder, steps=steps,
                      cuda_stand_in=cuda_stand_in, timeout=timeout, scratch=scratch,
                      facts_dir=facts_dir, run_key=uuid.uuid4().hex[:12], **shape)


def launch_script(target: ScriptTarget, world: int, steps: int, cuda_stand_in: bool,
                  timeout: float, start_method: str = "fork", one_process: bool = False,
                  nodes: int = 1, box=None, deadline: Optional[float] = None) -> ScriptRun:
    """Run the script on ``world`` local ranks through the preflight's launcher.

    ``box``: the run's :class:`~ddpcheck.preflight.sandbox.Sandbox` (the progress files,
    logs, facts and any redirected writes go into its box; the supervisor removes it);
    None: a private temp folder of its own, removed here, and Python-level redirection.
    ``deadline``: when the ranks are stopped (``time.time()``; default now + timeout).
    """
    from ddpcheck.preflight import launch

    workdir = box.box if box is not None else tempfile.mkdtemp(prefix="ddpcheck-script-")
    scratch, facts_dir = os.path.join(workdir, "scratch"), os.path.join(workdir, "facts")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(facts_dir, exist_ok=True)
    redirect = box is None or not box.isolated_processes
    try:
        # one process would take every core; forked from a parent that has run OpenMP
        # regions (a notebook, a test session), a new parallel region deadlocks (GNU
        # OpenMP is not fork-safe): one thread keeps it out of them
        spec = make_spec(target, steps, cuda_stand_in, timeout, scratch, facts_dir,
                         one_process=one_process, devices=world, nodes=nodes,
                         threads=1 if one_process and start_method == "fork" else None,
                         box=workdir, redirect=redirect)
        # a rank that finished waits this long for the rest before they are stopped
        grace = max(5.0, min(20.0, timeout / 4))
        outcome = launch.run_local(1 if one_process else world, spec,
                                   start_method=start_method, grace=grace,
                                   entrypoint=run_script_rank,
                                   workdir=os.path.join(workdir, "launch") if box else None,
                                   deadline=deadline)
        facts = [_read_facts(facts_dir, r.rank) if r.finished else None
                 for r in outcome.ranks]
    finally:
        if box is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return _script_run(outcome, facts)


def _script_run(outcome: LaunchOutcome, facts: list) -> ScriptRun:
    return ScriptRun(facts=facts, ranks=list(outcome.ranks), stop_reason=outcome.stop_reason,
                     elapsed=outcome.elapsed, start_method=outcome.start_method,
                     log_dir=outcome.log_dir, interrupted=outcome.interrupted,
                     launcher_error=outcome.launcher_error)


def run_in_launcher(target: ScriptTarget, steps: int, cuda_stand_in: bool, timeout: float,
                    launched, box=None, deadline: Optional[float] = None) -> ScriptRun:
    """This process is one rank of the user's torchrun/srun job: run the script here.
    ``box``: this rank's sandbox (its own folder); None: a private temp folder."""
    launched.export()
    # private (0700, unpredictable name): never a path another user could guess and plant
    workdir = box.box if box is not None else tempfile.mkdtemp(prefix="ddpcheck-rank-")
    scratch = os.path.join(workdir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    start = time.time()
    spec = make_spec(target, steps, cuda_stand_in, timeout, scratch, None, box=workdir,
                     redirect=box is None or not box.isolated_processes)
    # every rank must use the same keys in the shared store
    run_key = os.environ.get("TORCHELASTIC_RUN_ID") or \
        f"{os.environ.get('MASTER_ADDR')}-{os.environ.get('MASTER_PORT')}"
    spec = dataclasses.replace(spec, run_key=run_key, gather=True,
                               deadline=deadline if deadline is not None else start + timeout,
                               launched_by=launched.launcher)
    try:
        result = run_script_rank(spec)
    finally:
        if box is None:
            shutil.rmtree(workdir, ignore_errors=True)
    run = ScriptRun(elapsed=time.time() - start, start_method=launched.launcher)
    everyone = {d["rank"]: RankFacts.from_dict(d) for d in result.get("all") or []}
    everyone.setdefault(launched.rank, RankFacts.from_dict(result["facts"]))
    run.facts = [everyone.get(r) for r in range(launched.world_size)]
    return run
