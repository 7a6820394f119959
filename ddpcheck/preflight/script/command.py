"""``ddpcheck preflight [options] -- SCRIPT [ARGS...]``: the script mode's driver.

Called by the preflight click command when arguments follow ``--``. Order:
usage checks (no torch), the target, torch and the backend, the launch,
the judgement across ranks, ``ddpcheck lint`` on the same file, the report.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import click

from ddpcheck.errors import fail
from ddpcheck.preflight.options import PreflightOptions, launch_environment

# what script mode reads from the script itself; these factory-mode options may only
# keep their defaults (--gpus, --backend, --timeout, --format apply to both modes)
FACTORY_ONLY = ("dataset_size", "batch_size", "global_batch_size", "drop_last",
                "sampler_drop_last", "grad_accum", "base_batch", "base_lr", "data_parallel",
                "model", "input_shape", "sample", "loss", "optimizer", "amp",
                "find_unused_parameters", "gradient_as_bucket_view", "static_graph", "sync_bn",
                "gpu_memory", "reserve", "safety_margin", "bandwidth_size")
DEFAULT_STEPS = 3


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def factory_only_set(opts: PreflightOptions) -> list[str]:
    """The factory-mode options given a value other than their default."""
    defaults = {f.name: f.default for f in dataclasses.fields(PreflightOptions)}
    return [_flag(name) for name in FACTORY_ONLY if getattr(opts, name) != defaults[name]]


def check_script_usage(opts: PreflightOptions, script_args: list[str]) -> Optional[str]:
    """The usage checks that need neither torch nor the user's code (run before the
    sandbox starts); returns the script's folder (None for ``-m``: the package is
    found from the working folder, inside the sandbox, since finding it imports it)."""
    given = factory_only_set(opts)
    if given:
        fail(f"{given[0]} is for the factory mode; with -- SCRIPT the preflight reads "
             f"sizes, batches, the model and its training step from the script itself")
    from ddpcheck.preflight.options import check_capacity
    from ddpcheck.preflight.script.launch import TargetError, resolve_target

    if script_args[0] == "-m":
        if len(script_args) < 2:
            fail("-m needs a module name: -- -m mypkg.train [ARGS...]")
        folder = None
    else:
        try:
            folder = resolve_target(list(script_args)).folder
        except TargetError as exc:
            fail(str(exc))
    launched = launch_environment()
    if launched is None:
        check_capacity(opts.gpus)
    return folder


@dataclass
class ScriptSetup:
    """What this run is, settled before anything starts (usage errors come first)."""

    target: object  # launch.ScriptTarget
    steps: int
    launched: object  # envdetect.LaunchedEnv, or None when the preflight starts the ranks
    world: int  # ranks, or devices of the one process
    nodes: int
    per_node: int
    gpus_here: int
    fork_safe: bool
    backend: object  # backend.Backend
    cuda_stand_in: bool


def run_script_preflight(opts: PreflightOptions, steps: Optional[int],
                         script_args: list[str], nodes: Optional[int] = None, box=None,
                         deadline: Optional[float] = None) -> int:
    """``opts``: the parsed options (click checked each value's range); ``steps``:
    ``--steps``, None for the default; ``script_args``: what followed ``--``;
    ``nodes``: ``--nodes M`` (the ranks split over M emulated nodes); ``box``: the run's
    :class:`~ddpcheck.preflight.sandbox.Sandbox` (this runs inside it); ``deadline``:
    when the ranks must have finished (``time.time()``)."""
    t0 = time.time()
    # what the sandbox's layers hold now is not the script's (finding a -m target may
    # import its package: that is the script's)
    watched = _watch_changes(box)
    setup = _setup(opts, steps, script_args, nodes or 1)
    outcome = _run(setup, opts.timeout, box, deadline)
    if outcome is None:
        return 0  # a rank other than 0 under torchrun/srun: rank 0 prints the verdict
    run, one_process, how = outcome
    refused = next((f for f in run.facts if f is not None and f.ending.value == "refused"), None)
    if refused is not None:
        fail(f"{setup.target.display}: {refused.ending_detail}")

    from ddpcheck.preflight.script import judge as judging
    from ddpcheck.preflight.script import report as render

    judgement = judging.judge(run.facts, run.ranks, setup.world, _note(setup, one_process),
                              opts.timeout, run.stop_reason, one_process=one_process)
    ended_early = any(f is None or f.ending.value not in ("finished", "exited")
                      for f in run.facts)
    judging.link_lint(judgement, _lint(setup.target, judgement), ended_early)
    if box is not None and run.log_dir:
        from ddpcheck.preflight import supervisor

        supervisor.write_status(box.box, kept_logs=run.log_dir)
    report = _report(setup, run, judgement, one_process, how, time.time() - t0,
                     _writes(run, watched()), box)
    click.echo(render.render_json(report) if opts.output_format == "json"
               else render.render_text(report))
    return report.exit_code


def _setup(opts: PreflightOptions, steps: Optional[int], script_args: list,
           nodes: int) -> ScriptSetup:
    given = factory_only_set(opts)
    if given:
        fail(f"{given[0]} is for the factory mode; with -- SCRIPT the preflight reads "
             f"sizes, batches, the model and its training step from the script itself")
    from ddpcheck.preflight.script.launch import TargetError, resolve_target

    try:
        target = resolve_target(list(script_args))
    except TargetError as exc:
        fail(str(exc))
    launched = launch_environment()
    try:
        import torch.distributed as dist
    except ImportError:
        fail("ddpcheck preflight needs torch: pip install 'ddpcheck[preflight]'")
    from ddpcheck.preflight import gpus
    from ddpcheck.preflight.backend import BackendError, choose_backend

    # never poison fork: count GPUs through NVML where possible
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    gpus_here, fork_safe = gpus.visible_gpus()
    world = launched.world_size if launched else opts.gpus
    if world is None:
        if gpus_here == 0:
            fail("--gpus N is required on a machine without GPUs (N CPU processes stand in "
                 "for N GPUs)")
        world = gpus_here
    if launched and nodes > 1:
        fail("--nodes emulates nodes on this machine; inside torchrun/srun the real nodes "
             "are used: drop --nodes")
    if world % nodes:
        fail(f"--nodes {nodes} must divide the {world} ranks (--gpus is the total over "
             f"all nodes)")
    per_node = launched.local_world_size if launched else world // nodes
    try:
        backend = choose_backend(opts.backend, per_node, gpus_here, dist.is_nccl_available())
    except BackendError as exc:
        fail(str(exc))
    return ScriptSetup(target, DEFAULT_STEPS if steps is None else steps, launched, world,
                       nodes, per_node, gpus_here, fork_safe, backend,
                       gpus_here < per_node or backend.device == "cpu")


def _run(setup: ScriptSetup, timeout: float, box=None, deadline: Optional[float] = None):
    """Run the script: as this rank under torchrun/srun, else as one process (DataParallel
    or plain) or as ranks. (run, one_process, how), or None on a rank other than 0."""
    import torch

    from ddpcheck.preflight.script import launch as script_launch
    from ddpcheck.preflight.script.processes import ProcessShape, plan_processes

    if setup.launched:
        run = script_launch.run_in_launcher(setup.target, setup.steps, setup.cuda_stand_in,
                                            timeout, setup.launched, box=box, deadline=deadline)
        launched = setup.launched
        if launched.rank != 0:
            return None
        return run, False, f"rank {launched.rank} of {launched.world_size} under {launched.launcher}"
    fork_safe = setup.fork_safe
    if fork_safe:
        # DDP's constructor imports torch._dynamo (seconds): once here, shared by every
        # forked worker
        import torch._dynamo  # noqa: F401
    if torch.cuda.is_initialized():
        fork_safe = False
    method = "fork" if fork_safe else "spawn"
    plan = plan_processes(setup.target.path) if setup.nodes == 1 else None
    one_process = plan is not None and plan.shape != ProcessShape.RANKS
    run = _launch(script_launch, setup, timeout, method, one_process, box, deadline)
    if one_process and run.facts and run.facts[0] is not None and run.facts[0].wants_ranks:
        # the script started a process group after all: run it as ranks
        one_process = False
        plan.why += "; it started a process group when run, so it ran again as ranks"
        run = _launch(script_launch, setup, timeout, method, False, box, deadline)
    if one_process:
        return run, True, (f"one process driving {setup.world} devices ({plan.why}), started "
                           f"by torch's elastic_launch in {run.elapsed:.1f} s")
    spread = f" on {setup.nodes} emulated nodes" if setup.nodes > 1 else ""
    return run, False, (f"workers started by torch's elastic_launch ({method}){spread} in "
                        f"{run.elapsed:.1f} s")


def _note(setup: ScriptSetup, one_process: bool) -> str:
    """How the run stands in for the GPUs it does not have."""
    if not setup.cuda_stand_in:
        return setup.backend.note
    if one_process:
        why = ("no CUDA devices here" if setup.gpus_here == 0
               else f"{setup.gpus_here} CUDA devices for {setup.world}")
        return f"{why}: one CPU process stands in for the process driving {setup.world} GPUs"
    why = ("no CUDA devices here" if setup.gpus_here == 0
           else f"{setup.gpus_here} CUDA devices for {setup.per_node} ranks")
    return f"{why}: {setup.per_node} CPU processes stand in for {setup.per_node} GPUs"


def _report(setup: ScriptSetup, run, judgement, one_process: bool, how: str, seconds: float,
            writes: list, box=None):
    from ddpcheck.preflight.script.report import ScriptReport

    unsandboxed = box is not None and box.level.value == "none"
    target, world, backend = setup.target, setup.world, setup.backend
    headline = (("NO SANDBOX: " if unsandboxed else "")
                + f"ddpcheck preflight -- {target.display}{' ' if target.argv else ''}"
                f"{' '.join(target.argv)}: "
                + (f"1 process, {world} devices, " if one_process else
                   f"{world} rank{'s' if world != 1 else ''}, ")
                + f"{backend.backend} on {'CPU' if backend.device == 'cpu' else 'GPU'}, "
                f"{how}; {setup.steps} steps per epoch, last batch first")
    return ScriptReport(
        headline=headline, target=target.display, argv=list(target.argv), world_size=world,
        one_process=one_process, nodes=setup.nodes, backend=backend.backend,
        device=backend.device, cuda_stand_in=setup.cuda_stand_in, steps=setup.steps,
        checks=list(judgement.checks), lint=list(judgement.lint),
        lint_error=judgement.lint_error,
        writes=writes,
        ranks=[f.to_dict() if f is not None else _no_report(i, run)
               for i, f in enumerate(run.facts)],
        seconds=seconds, workers_seconds=run.elapsed, worker_logs=run.log_dir,
        exit_code=judgement.exit_code, sandbox=box.summary() if box is not None else "",
        unsandboxed=unsandboxed, degraded=box is not None and not box.isolated_processes)


def _launch(script_launch, setup: ScriptSetup, timeout: float, method: str,
            one_process: bool, box=None, deadline: Optional[float] = None):
    run = script_launch.launch_script(setup.target, setup.world, setup.steps,
                                      setup.cuda_stand_in, timeout, start_method=method,
                                      one_process=one_process, nodes=setup.nodes, box=box,
                                      deadline=deadline)
    if run.interrupted:
        click.echo("ddpcheck: interrupted; workers stopped", err=True)
        sys.exit(130)
    if run.launcher_error:
        fail(f"torch's elastic launcher failed before the workers ran: {run.launcher_error}")
    return run


def _watch_changes(box):
    """What the sandbox's upper layers hold before the ranks start; the returned
    function lists what changed since (None: no overlays to read)."""
    if box is None or not box.isolated_processes:
        return lambda: None
    from ddpcheck.preflight import sandbox as sandboxing

    before = sandboxing.snapshot(box.trees)
    return lambda: sandboxing.changes(box.trees, before, box.real_view)


def _writes(run, changes) -> list:
    """The report's list: every change the sandbox saw, with the rank and line that
    made it where a rank recorded it."""
    from ddpcheck.preflight import writes as recorded

    by_rank = {f.rank: [(w, getattr(f, "node", None)) for w in f.writes]
               for f in run.facts if f is not None}
    return recorded.rows(recorded.join(changes, by_rank))


def _no_report(rank: int, run) -> dict:
    """A rank whose script never reported: what the launcher saw of its process."""
    out: dict = {"rank": rank, "ending": "no report"}
    seen = next((r for r in run.ranks if r.rank == rank), None)
    if seen is not None:
        out.update(status=seen.status.value, stage=seen.stage, exit=seen.exit_text,
                   stuck_at=seen.stuck_at, collective=seen.collective,
                   last_words=seen.last_words)
    return out


def _lint(target, judgement) -> list:
    """``ddpcheck lint``'s findings for the script file, in-process."""
    if not target.path or not target.path.endswith(".py"):
        judgement.lint_error = "no Python source file to lint"
        return []
    from ddpcheck.lint.config import known_codes
    from ddpcheck.lint.engine import lint_path
    from ddpcheck.settings import LintSettings

    result = lint_path(target.path, LintSettings(enabled=frozenset(known_codes())))
    if result.error:
        judgement.lint_error = result.error
    return list(result.findings)
