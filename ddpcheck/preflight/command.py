"""``ddpcheck preflight``: the click command.

Importing this module never imports torch (``ddpcheck lint`` must stay
torch-free): torch is imported inside the command, after the arguments and
the data-set arithmetic have been checked.
"""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn, Optional

import click

from ddpcheck.preflight.checks import FAIL, WARN, Check, exit_code

EXIT_USAGE = 2

EXAMPLES = """\b
Examples:
  ddpcheck preflight --gpus 2 --dataset-size 8607
  ddpcheck preflight --gpus 4 --dataset-size 8607 --batch-size 4 \\
      --model mypkg.models:build --input-shape 3,224,224 --gpu-memory 24GiB
  torchrun --nnodes 2 --nproc-per-node 8 ... -m ddpcheck preflight --dataset-size 8607
  ddpcheck preflight --gpus 2 -- train.py --epochs 90 --batch-size 32
  ddpcheck preflight --gpus 2 --steps 5 -- -m mypkg.train --config cfg.yaml
"""


class UsageFailure(click.ClickException):
    """A user mistake: one line on stderr, exit 2, no traceback, no usage dump."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(f"ddpcheck: error: {self.format_message()}", err=True)


def fail(message: str) -> NoReturn:
    raise UsageFailure(message)


class PreflightCommand(click.Command):
    """Bad option values print one line (``ddpcheck: error: ...``), like the rest."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise UsageFailure(exc.format_message()) from None


@click.command("preflight", cls=PreflightCommand, epilog=EXAMPLES,
               context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.option("--gpus", type=int, default=None, metavar="N",
              help="Processes to start, one per GPU. Default: the visible GPUs; inside "
                   "torchrun/srun: WORLD_SIZE.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto",
              show_default=True,
              help="auto: NCCL when there is a GPU for every process, else gloo on CPU.")
@click.option("--dataset-size", type=int, default=None, metavar="N",
              help="Training samples (len(dataset)): run the data-set arithmetic.")
@click.option("--batch-size", type=int, default=None, metavar="B",
              help="Per-GPU batch (what a DDP script passes to its DataLoader).")
@click.option("--global-batch-size", type=int, default=None, metavar="G",
              help="Global batch instead: divided over GPUs x --grad-accum for you.")
@click.option("--drop-last/--no-drop-last", default=False, show_default=True,
              help="DataLoader/BatchSampler drop_last.")
@click.option("--sampler-drop-last", is_flag=True,
              help="DistributedSampler(drop_last=True): cut instead of pad.")
@click.option("--grad-accum", type=int, default=1, show_default=True, metavar="K",
              help="Gradient accumulation steps.")
@click.option("--base-batch", type=int, default=None, metavar="G",
              help="Global batch the recipe/baseline was tuned at.")
@click.option("--base-lr", type=float, default=None, metavar="LR",
              help="Its learning rate: prints linear and sqrt scaled lrs.")
@click.option("--data-parallel", is_flag=True,
              help="The script uses nn.DataParallel (one process, batches chunked over GPUs).")
@click.option("--model", default=None, metavar="MODULE:FACTORY",
              help="Callable returning your nn.Module: measure one training step's memory.")
@click.option("--input-shape", default=None, metavar="C,H,W",
              help="Shape of one input sample (random data); or use --sample.")
@click.option("--sample", default=None, metavar="MODULE:FN",
              help="FN(batch_size) -> model input: a tensor, a tuple of args or a dict of kwargs.")
@click.option("--loss", default=None, metavar="MODULE:FN",
              help="FN(output, batch) -> scalar loss. Default: sum of the outputs' means.")
@click.option("--optimizer", type=click.Choice(["adamw", "adam", "sgd"]), default="adamw",
              show_default=True, help="Optimizer for the measured step (its state is memory).")
@click.option("--sync-bn", is_flag=True,
              help="Convert BatchNorm to SyncBatchNorm before the DDP wrap (GPU only).")
@click.option("--gpu-memory", default=None, metavar="SIZE",
              help="Memory per GPU, e.g. 24GiB. Default: the real device's.")
@click.option("--reserve", default=None, metavar="SIZE",
              help="Memory to keep for CUDA context/NCCL. Default: measured on GPU, 0 on CPU.")
@click.option("--safety-margin", type=float, default=0.10, show_default=True,
              help="Fraction of --gpu-memory to leave free.")
@click.option("--timeout", type=float, default=120.0, show_default=True, metavar="SECONDS",
              help="Longest the whole run may take; a rank still busy then is named and killed.")
@click.option("--bandwidth-size", default=None, metavar="SIZE",
              help="all_reduce size for the bandwidth figure. Default: 256MiB NCCL, 16MiB gloo.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("--steps", type=int, default=None, metavar="K",
              help="Script mode: batches per epoch (the last batch first). Default: 3.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
def preflight(**opts) -> None:
    """A tiny real distributed run before the real job: process group and collectives,
    memory of one training step at batch 1 and 2, and the data-set arithmetic.

    Workers start on torch's own elastic launcher; inside torchrun or srun,
    this process is the worker. Exit 0 when nothing FAILs, 1 when a check
    FAILs, 2 for usage errors.

    With `-- SCRIPT ARGS...` (or `-- -m MODULE ARGS...`) it runs your own training
    script instead: a few steps per epoch, the last batch first, into the next
    epoch, with its writes kept out of your folders, and reports what it saw
    beside `ddpcheck lint`'s findings.
    """
    script_args = opts.pop("script_args")
    steps = opts.pop("steps")
    if script_args:
        from ddpcheck.preflight.script.command import run_script_preflight

        sys.exit(run_script_preflight(dict(opts, steps=steps), list(script_args), fail))
    if steps is not None:
        fail("--steps needs a script: ddpcheck preflight --steps K -- SCRIPT [ARGS...]")
    code = run_preflight(opts)
    sys.exit(code)


# -- the run ---------------------------------------------------------------------------------


def _size(opts: dict, key: str, flag: str) -> Optional[int]:
    from ddpcheck.preflight.units import parse_size

    if opts.get(key) is None:
        return None
    try:
        return parse_size(opts[key])
    except ValueError as exc:
        fail(f"{flag}: {exc}")


def validate(opts: dict) -> None:
    """Usage errors that need no torch, with messages that say why."""
    if opts["gpus"] is not None and opts["gpus"] < 1:
        fail(f"--gpus {opts['gpus']}: need at least 1 process (one per GPU)")
    if opts["dataset_size"] is not None and opts["dataset_size"] < 1:
        fail(f"--dataset-size {opts['dataset_size']}: a data set needs at least 1 sample")
    for key, flag in (("batch_size", "--batch-size"), ("global_batch_size", "--global-batch-size"),
                      ("base_batch", "--base-batch")):
        if opts[key] is not None and opts[key] < 1:
            fail(f"{flag} {opts[key]}: a batch needs at least 1 sample")
    if opts["grad_accum"] < 1:
        fail(f"--grad-accum {opts['grad_accum']}: must be at least 1")
    if opts["batch_size"] is not None and opts["global_batch_size"] is not None:
        fail("give either --batch-size (per GPU) or --global-batch-size (all GPUs), not both")
    if opts["base_lr"] is not None and opts["base_lr"] <= 0:
        fail(f"--base-lr {opts['base_lr']}: must be positive")
    if opts["base_lr"] is not None and opts["base_batch"] is None:
        fail("--base-lr needs --base-batch (the global batch that lr was tuned at)")
    if opts["timeout"] <= 0:
        fail(f"--timeout {opts['timeout']:g}: must be a positive number of seconds")
    if not 0 <= opts["safety_margin"] < 1:
        fail(f"--safety-margin {opts['safety_margin']}: a fraction between 0 and 1")
    if opts["model"] is None:
        for key in ("input_shape", "sample", "loss", "gpu_memory", "reserve"):
            if opts[key] is not None:
                fail(f"--{key.replace('_', '-')} needs --model MODULE:FACTORY")
        if opts["sync_bn"]:
            fail("--sync-bn needs --model MODULE:FACTORY")
    else:
        if opts["input_shape"] is None and opts["sample"] is None:
            fail("--model needs an input: --input-shape C,H,W or --sample MODULE:FN")
        if opts["input_shape"] is not None and opts["sample"] is not None:
            fail("give --input-shape or --sample, not both")


def _data_part(opts: dict, world: int):
    """The arithmetic checks and tables, or ``([], None)`` without --dataset-size."""
    from ddpcheck.preflight import datachecks, shardplan

    try:
        choice = shardplan.resolve_batch_size(world, opts["batch_size"],
                                              opts["global_batch_size"], opts["grad_accum"])
    except shardplan.PlanError as exc:
        fail(str(exc))
    if opts["dataset_size"] is None:
        return datachecks.choice_checks(choice, world, opts["grad_accum"]), None, choice
    try:
        plan = shardplan.plan_shards(opts["dataset_size"], world,
                                     choice.per_gpu if choice else None,
                                     drop_last=opts["drop_last"],
                                     sampler_drop_last=opts["sampler_drop_last"],
                                     grad_accum=opts["grad_accum"])
    except shardplan.PlanError as exc:
        fail(str(exc))
    q = datachecks.DataQuestion(plan, choice, opts["base_batch"], opts["base_lr"],
                                opts["data_parallel"])
    arith = {
        "rows": datachecks.arithmetic_rows(q),
        "ranks": datachecks.rank_rows(plan),
        "guide": datachecks.guide_rows(plan) if choice is None else [],
    }
    return datachecks.data_checks(q), arith, choice


def _import_torch():
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        fail("ddpcheck preflight needs torch: pip install 'ddpcheck[preflight]'")
    if not dist.is_available():
        fail("this torch build has no torch.distributed")
    return torch


def run_preflight(opts: dict) -> int:
    t0 = time.time()
    validate(opts)
    gpu_memory = _size(opts, "gpu_memory", "--gpu-memory")
    reserve = _size(opts, "reserve", "--reserve")
    bw_size = _size(opts, "bandwidth_size", "--bandwidth-size")
    input_shape = None
    from ddpcheck.preflight import modelspec

    if opts["input_shape"] is not None:
        try:
            input_shape = modelspec.parse_input_shape(opts["input_shape"])
        except modelspec.SpecError as exc:
            fail(str(exc))

    from ddpcheck.preflight.launch import LaunchEnvError, detect_launched

    try:
        launched = detect_launched()
    except LaunchEnvError as exc:
        fail(str(exc))

    world = launched.world_size if launched else opts["gpus"]
    pre_checks: list = []
    if launched and opts["gpus"] is not None and opts["gpus"] != launched.world_size:
        pre_checks.append(Check(
            "--gpus vs launcher", WARN,
            f"--gpus {opts['gpus']} but {launched.launcher} started {launched.world_size} ranks: "
            f"the arithmetic uses {launched.world_size}",
            "drop --gpus when running under a launcher"))
    if world is not None:
        data_checks, arith, choice = _data_part(opts, world)

    torch = _import_torch()
    from ddpcheck.preflight.backend import BackendError, choose_backend
    from ddpcheck.preflight.launch import visible_gpus

    # never poison fork: count GPUs through NVML where possible
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    gpus_here, fork_safe = visible_gpus()
    if world is None:
        if gpus_here == 0:
            fail("--gpus N is required on a machine without GPUs (N CPU processes stand in "
                 "for N GPUs)")
        world = gpus_here
        data_checks, arith, choice = _data_part(opts, world)
    per_node = launched.local_world_size if launched else world
    try:
        backend = choose_backend(opts["backend"], per_node, gpus_here,
                                 torch.distributed.is_nccl_available())
    except BackendError as exc:
        fail(str(exc))

    if opts["model"]:
        # import the user's module here: a typo is a usage error before any
        # process starts, and forked workers find it already imported
        for key, flag in (("model", "--model"), ("sample", "--sample"), ("loss", "--loss")):
            if opts[key]:
                try:
                    modelspec.load_ref(opts[key], flag)
                except modelspec.SpecError as exc:
                    fail(str(exc))
        if fork_safe:
            # DDP's constructor imports torch._dynamo (seconds): once here, shared by
            # every forked worker, instead of once per worker
            import torch._dynamo  # noqa: F401
        if torch.cuda.is_initialized():
            fork_safe = False

    spec = {
        "backend": backend.backend,
        "device": backend.device,
        "timeout": float(opts["timeout"]),
        "bandwidth_bytes": bw_size or (256 * 2**20 if backend.device == "cuda" else 16 * 2**20),
        "bandwidth_iters": 5 if backend.device == "cuda" else 3,
        "model": opts["model"],
        "input_shape": list(input_shape) if input_shape else None,
        "sample": opts["sample"],
        "loss": opts["loss"],
        "optimizer": opts["optimizer"],
        "sync_bn": opts["sync_bn"],
        "gpu_memory": gpu_memory,
        "reserve": reserve,
        "safety_margin": opts["safety_margin"],
        "batch_size": choice.per_gpu if choice else None,
    }
    from ddpcheck.preflight import verdict

    quiet = False
    log_dir = None
    if launched:
        views, how, launch_s = _run_in_launcher(spec, launched)
        quiet = launched.rank != 0  # every rank reaches the same verdict; rank 0 prints it
    else:
        views, how, launch_s, log_dir = _run_local(spec, world, fork_safe, opts["timeout"])

    pg_checks = verdict.failure_checks(views, opts["timeout"], log_dir)
    pg_checks += verdict.process_group_checks(views, backend.backend, backend.device, world)
    mq = verdict.MemoryQuestion(
        target_batch=spec["batch_size"], world_size=world, grad_accum=opts["grad_accum"],
        baseline_global=opts["base_batch"] or (choice.effective_global if choice else None),
        safety_margin=opts["safety_margin"], budget_given=gpu_memory is not None,
        reserve_given=reserve is not None, model=opts["model"] or "")
    mem = verdict.memory_report(views, mq) if opts["model"] else verdict.MemoryReport()

    if mem.data.get("bn_batch1"):
        data_checks = _escalate_last_batch_of_one(data_checks)
    checks = [Check("backend", backend.status, backend.note)] + pre_checks + pg_checks \
        + data_checks + mem.checks
    code = exit_code(checks)
    report = {
        "headline": (f"ddpcheck preflight: {world} rank{'s' if world != 1 else ''}, "
                     f"{backend.backend} on {backend.device.upper() if backend.device == 'cpu' else 'GPU'}"
                     f", {how}"),
        "world_size": world,
        "backend": backend.backend,
        "device": backend.device,
        "launcher": how,
        "checks": [c.to_dict() for c in checks],
        "arithmetic": arith,
        "memory": {"steps": mem.steps, "facts": mem.facts, "measured": mem.data} if opts["model"]
        else None,
        "ranks": [_rank_json(v) for v in views],
        "timing": {"total_seconds": time.time() - t0, "workers_seconds": launch_s},
        "worker_logs": log_dir,
        "exit_code": code,
    }
    from ddpcheck.preflight import report as render

    if quiet:
        return code
    if opts["output_format"] == "json":
        click.echo(render.render_json(report))
    else:
        click.echo(render.render_text(report))
    return code


def _escalate_last_batch_of_one(checks: list) -> list:
    out = []
    for c in checks:
        if c.name == "batch: last batch" and c.status == WARN and "holds 1 sample" in c.detail:
            c = Check(c.name, FAIL, c.detail + "; this model does raise at batch 1 (measured)",
                      c.fix)
        out.append(c)
    return out


def _rank_json(view) -> dict:
    res = view.result or {}
    return {"rank": view.rank, "ok": bool(view.result) and not res.get("error")
            and not res.get("aborted"), "crashed": view.crashed, "hung": view.hung,
            "stopped": view.stopped, "exit": view.exit_text, "stage": view.stage,
            "init_seconds": res.get("init_seconds"), "host": (res.get("identity") or {}).get("host"),
            "error": res.get("error"), "aborted": res.get("aborted")}


def _run_local(spec: dict, world: int, fork_safe: bool, timeout: float):
    from ddpcheck.preflight import launch, verdict

    method = "fork" if fork_safe else "spawn"
    outcome = launch.run_local(world, spec, timeout, start_method=method)
    if outcome.interrupted:
        click.echo("ddpcheck: interrupted; workers stopped", err=True)
        sys.exit(130)
    if outcome.launcher_error:
        fail(f"torch's elastic launcher failed before the workers ran: {outcome.launcher_error}")
    views = []
    for ro in outcome.ranks:
        views.append(verdict.RankView(
            ro.rank, ro.result, crashed=ro.crashed, hung=ro.hung, stopped=ro.stopped,
            exitcode=ro.exitcode, exit_text=launch.describe_exit(ro.exitcode) if ro.crashed else "",
            stage=ro.stage, stage_age=ro.stage_age, stderr_tail=ro.stderr_tail))
    how = f"workers started by torch's elastic_launch ({method}) in {outcome.elapsed:.1f} s"
    return views, how, outcome.elapsed, outcome.log_dir


def _run_in_launcher(spec: dict, launched):
    """This process is one rank of the user's torchrun/srun job."""
    from ddpcheck.preflight import verdict
    from ddpcheck.preflight.worker import run_rank

    launched.export()
    start = time.time()
    spec = dict(spec, deadline=start + spec["timeout"], gather=True, launched_by=launched.launcher)
    result = run_rank(spec)
    elapsed = time.time() - start
    everyone = result.pop("all", None)
    views = []
    if everyone:
        for r in everyone:
            r.pop("all", None)
            views.append(verdict.RankView(r["rank"], r, stage="done"))
    else:
        # the group broke before the results were gathered: only this rank's view
        for rank in range(launched.world_size):
            if rank == launched.rank:
                views.append(verdict.RankView(rank, result, stage="done"))
            else:
                views.append(verdict.RankView(rank, None, hung=True,
                                              stage="an unknown stage (its result never arrived)"))
    how = f"rank {launched.rank} of {launched.world_size} under {launched.launcher}"
    return views, how, elapsed
