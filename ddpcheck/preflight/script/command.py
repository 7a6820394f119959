"""``ddpcheck preflight [options] -- SCRIPT [ARGS...]``: the script mode's driver.

Called by the preflight click command when arguments follow ``--``. Order:
usage checks (no torch), the target, torch and the backend, the launch,
the judgement across ranks, ``ddpcheck lint`` on the same file, the report.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

import click

# factory-mode options that mean nothing for a script (their defaults are allowed)
FACTORY_ONLY = {"dataset_size": None, "batch_size": None, "global_batch_size": None,
                "sampler_drop_last": False, "base_batch": None, "base_lr": None,
                "data_parallel": False, "model": None, "input_shape": None, "sample": None,
                "loss": None, "sync_bn": False, "gpu_memory": None, "reserve": None,
                "bandwidth_size": None}
DEFAULT_STEPS = 3


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def run_script_preflight(opts: dict, script_args: list, fail) -> int:
    """``fail(message)`` raises the command's usage error (exit 2)."""
    t0 = time.time()
    for key, default in FACTORY_ONLY.items():
        if opts.get(key, default) != default:
            fail(f"{_flag(key)} is for the factory mode; with -- SCRIPT the preflight reads "
                 f"sizes, batches and the model from the script itself")
    if opts.get("drop_last"):
        fail("--drop-last is for the factory mode; the script's own DataLoader settings apply")
    if opts.get("grad_accum", 1) != 1:
        fail("--grad-accum is for the factory mode")
    steps = DEFAULT_STEPS if opts.get("steps") is None else opts["steps"]
    if steps < 1:
        fail(f"--steps {steps}: at least 1 step per epoch")
    if opts["gpus"] is not None and opts["gpus"] < 1:
        fail(f"--gpus {opts['gpus']}: need at least 1 process (one per GPU)")
    if opts["timeout"] <= 0:
        fail(f"--timeout {opts['timeout']:g}: must be a positive number of seconds")

    from ddpcheck.preflight.script.launch import TargetError, resolve_target

    try:
        target = resolve_target(list(script_args))
    except TargetError as exc:
        fail(str(exc))

    from ddpcheck.preflight.launch import LaunchEnvError, detect_launched

    try:
        launched = detect_launched()
    except LaunchEnvError as exc:
        fail(str(exc))

    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        fail("ddpcheck preflight needs torch: pip install 'ddpcheck[preflight]'")
    from ddpcheck.preflight.backend import BackendError, choose_backend
    from ddpcheck.preflight.launch import visible_gpus

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    gpus_here, fork_safe = visible_gpus()
    world = launched.world_size if launched else opts["gpus"]
    if world is None:
        if gpus_here == 0:
            fail("--gpus N is required on a machine without GPUs (N CPU processes stand in "
                 "for N GPUs)")
        world = gpus_here
    per_node = launched.local_world_size if launched else world
    try:
        backend = choose_backend(opts["backend"], per_node, gpus_here, dist.is_nccl_available())
    except BackendError as exc:
        fail(str(exc))
    cuda_stand_in = gpus_here < per_node or backend.device == "cpu"

    from ddpcheck.preflight.script import judge as judging
    from ddpcheck.preflight.script import launch as script_launch

    if launched:
        run = script_launch.run_in_launcher(target, steps, cuda_stand_in, opts["timeout"],
                                            launched)
        how = f"rank {launched.rank} of {launched.world_size} under {launched.launcher}"
        if launched.rank != 0:
            return 0  # rank 0 prints the verdict for everyone
    else:
        if fork_safe:
            # DDP's constructor imports torch._dynamo (seconds): once here, shared by
            # every forked worker
            import torch._dynamo  # noqa: F401
        if torch.cuda.is_initialized():
            fork_safe = False
        method = "fork" if fork_safe else "spawn"
        run = script_launch.launch_script(target, world, steps, cuda_stand_in,
                                          opts["timeout"], start_method=method)
        if run.interrupted:
            click.echo("ddpcheck: interrupted; workers stopped", err=True)
            sys.exit(130)
        if run.launcher_error:
            fail(f"torch's elastic launcher failed before the workers ran: {run.launcher_error}")
        how = f"workers started by torch's elastic_launch ({method}) in {run.elapsed:.1f} s"

    refused = next((f for f in run.facts if f is not None and f.ending.value == "refused"), None)
    if refused is not None:
        fail(f"{target.display}: {refused.ending_detail}")

    ends = [_rank_end(ro) for ro in run.outcomes]
    if cuda_stand_in:
        why = ("no CUDA devices here" if gpus_here == 0
               else f"{gpus_here} CUDA devices for {per_node} ranks")
        note = f"{why}: {per_node} CPU processes stand in for {per_node} GPUs"
    else:
        note = backend.note
    judgement = judging.judge(run.facts, ends, world, note, opts["timeout"])
    judging.link_lint(judgement, _lint(target, judgement))
    code = judgement.exit_code
    report = {
        "headline": (f"ddpcheck preflight -- {target.display}{' ' if target.argv else ''}"
                     f"{' '.join(target.argv)}: {world} rank{'s' if world != 1 else ''}, "
                     f"{backend.backend} on {'CPU' if backend.device == 'cpu' else 'GPU'}, "
                     f"{how}; {steps} steps per epoch, last batch first"),
        "mode": "script",
        "target": target.display,
        "argv": list(target.argv),
        "world_size": world,
        "backend": backend.backend,
        "device": backend.device,
        "cuda_stand_in": cuda_stand_in,
        "steps": steps,
        "verdicts": [v.to_dict() for v in judgement.verdicts],
        "lint": [vars(x) for x in judgement.lint],
        "lint_error": judgement.lint_error,
        "writes": [dict(vars(w), rank=f.rank) for f in run.facts if f is not None
                   for w in f.writes],
        "ranks": [f.to_dict() if f is not None else {"rank": i, "ending": "no report"}
                  for i, f in enumerate(run.facts)],
        "timing": {"total_seconds": time.time() - t0, "workers_seconds": run.elapsed},
        "worker_logs": run.log_dir,
        "exit_code": code,
    }
    from ddpcheck.preflight.script import report as render

    if opts["output_format"] == "json":
        click.echo(render.render_json(report))
    else:
        click.echo(render.render_text(report))
    return code


def _rank_end(ro) -> Optional[object]:
    from ddpcheck.preflight.launch import describe_exit
    from ddpcheck.preflight.script.judge import RankEnd

    if ro is None:
        return None
    return RankEnd(ro.rank, hung=ro.hung, crashed=ro.crashed, stopped=ro.stopped,
                   exit_text=describe_exit(ro.exitcode) if ro.crashed else "",
                   stuck_at=ro.stderr_tail)


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
