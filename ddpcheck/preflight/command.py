"""``ddpcheck preflight``: the click command.

click parses straight into :class:`~ddpcheck.preflight.options.PreflightOptions`.
Importing this module never imports torch (``ddpcheck lint`` must stay
torch-free). The command checks every option here, in the user's process,
then hands the run to :mod:`ddpcheck.preflight.supervisor`, which runs
:func:`run_preflight` (or script mode's driver) in a sandbox as a process of its
own: torch and the user's code are only ever imported there. Usage errors go
through :mod:`ddpcheck.errors`, like every other command.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import click

from ddpcheck.errors import UsageError, fail
from ddpcheck.preflight.checks import FAIL, PASS, WARN, Check, CheckId, exit_code
from ddpcheck.preflight.options import (
    MAX_TIMEOUT,
    OPTIMIZER,
    REF,
    SHAPE,
    SIZE,
    FiniteFloatRange,
    PreflightOptions,
    RunSpec,
    check_bandwidth_size,
    check_capacity,
    check_combinations,
    launch_environment,
    model_spec,
)
from ddpcheck.preflight.results import RankResult, RankStatus

EXAMPLES = """\b
Examples:
  ddpcheck preflight --gpus 2 --dataset-size 8607
  ddpcheck preflight --gpus 4 --dataset-size 8607 --batch-size 4 \\
      --model mypkg.models:build --input-shape 3,224,224 --gpu-memory 24GiB
  ddpcheck preflight --gpus 4 --dataset-size 8607 --batch-size 4 --data-parallel
  torchrun --nnodes 2 --nproc-per-node 8 ... -m ddpcheck preflight --dataset-size 8607
  ddpcheck preflight --gpus 2 -- train.py --epochs 90 --batch-size 32
  ddpcheck preflight --gpus 2 --steps 5 -- -m mypkg.train --config cfg.yaml
"""

POSITIVE = click.IntRange(min=1)


# --help lists the options by the mode they belong to (script mode reads the job
# from the script, so a factory-mode option there is a usage error).
HELP_BOTH = "Both modes"
HELP_FACTORY = "Factory mode only (the job described by options)"
HELP_SCRIPT = "Script mode only (ddpcheck preflight [OPTIONS] -- SCRIPT [ARGS...])"
SCRIPT_ONLY = ("steps", "nodes")
SCRIPT_ROW = ("-- SCRIPT [ARGS...]", "Your training script and its own arguments (or -- -m MODULE "
                                     "[ARGS...]), run on --gpus ranks.")


def option_mode(name: str) -> str:
    """The --help section of the option whose parameter is `name`."""
    from ddpcheck.preflight.script.command import FACTORY_ONLY

    if name in FACTORY_ONLY:
        return HELP_FACTORY
    if name in SCRIPT_ONLY:
        return HELP_SCRIPT
    return HELP_BOTH


class PreflightCommand(click.Command):
    """Bad option values print one line (``ddpcheck: error: ...``), like the rest;
    --help groups the options by mode."""

    def parse_args(self, ctx, args):
        if args and args[-1] == "--" and "--" not in args[:-1]:
            # `preflight --gpus 2 --`: without this check click sees no arguments at all
            # and the factory mode would run instead of the script the user meant
            raise UsageError("nothing to run after --: give SCRIPT [ARGS...] or "
                             "-m MODULE [ARGS...]")
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise UsageError(exc.format_message()) from None

    def format_options(self, ctx, formatter):
        sections = {HELP_BOTH: [], HELP_FACTORY: [], HELP_SCRIPT: [SCRIPT_ROW]}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                sections[option_mode(param.name)].append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)


@click.command("preflight", cls=PreflightCommand, epilog=EXAMPLES,
               short_help="Run the job for a few seconds on real processes first: factory "
                          "mode, or your own script after --.",
               context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.option("--gpus", type=POSITIVE, default=None, metavar="N",
              help="Processes to start, one per GPU (with --data-parallel: the GPUs it "
                   "drives). Default: the visible GPUs; inside torchrun/srun: WORLD_SIZE.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto",
              show_default=True,
              help="auto: NCCL when there is a GPU for every process; gloo CPU stand-ins only "
                   "on a machine without GPUs.")
@click.option("--dataset-size", type=POSITIVE, default=None, metavar="N",
              help="Training samples (len(dataset)): run the data-set arithmetic.")
@click.option("--batch-size", type=POSITIVE, default=None, metavar="B",
              help="The DataLoader's batch_size: per GPU under DDP, the whole batch with "
                   "--data-parallel.")
@click.option("--global-batch-size", type=POSITIVE, default=None, metavar="G",
              help="Global batch instead: divided over GPUs x --grad-accum for you.")
@click.option("--drop-last/--no-drop-last", default=False, show_default=True,
              help="DataLoader/BatchSampler drop_last.")
@click.option("--sampler-drop-last", is_flag=True,
              help="DistributedSampler(drop_last=True): cut instead of pad.")
@click.option("--grad-accum", type=POSITIVE, default=1, show_default=True, metavar="K",
              help="Gradient accumulation steps.")
@click.option("--base-batch", type=POSITIVE, default=None, metavar="G",
              help="Global batch the recipe/baseline was tuned at.")
@click.option("--base-lr", type=FiniteFloatRange(min=0, min_open=True), default=None,
              metavar="LR", help="Its learning rate: prints linear and sqrt scaled lrs.")
@click.option("--data-parallel", is_flag=True,
              help="The script uses nn.DataParallel: one process, each batch chunked over "
                   "the GPUs; nothing is launched.")
@click.option("--model", type=REF, default=None, metavar="MODULE:FACTORY",
              help="Callable returning your nn.Module: measure one training step's memory.")
@click.option("--input-shape", type=SHAPE, default=None, metavar="C,H,W",
              help="Shape of one input sample (random data); or use --sample.")
@click.option("--sample", type=REF, default=None, metavar="MODULE:FN",
              help="FN(batch_size) -> model input: a tensor, a tuple of args, a dict of "
                   "kwargs, or (args_tuple, kwargs_dict).")
@click.option("--loss", type=REF, default=None, metavar="MODULE:FN",
              help="FN(output, batch) -> scalar loss. Default: sum of the outputs' means.")
@click.option("--optimizer", type=OPTIMIZER, default="adamw", show_default=True,
              metavar="adamw|adam|sgd|MODULE:FN",
              help="Optimizer of the measured step (its state is memory); MODULE:FN gets "
                   "the parameters and returns your optimizer.")
@click.option("--amp", type=click.Choice(["bf16", "fp16"]), default=None,
              help="Measure the step under torch.autocast (fp16 with a GradScaler).")
@click.option("--find-unused-parameters", is_flag=True,
              help="DDP(find_unused_parameters=True), as your script sets it.")
@click.option("--gradient-as-bucket-view", is_flag=True,
              help="DDP(gradient_as_bucket_view=True): gradients live in DDP's buckets.")
@click.option("--static-graph", is_flag=True, help="DDP(static_graph=True).")
@click.option("--sync-bn", is_flag=True,
              help="Convert BatchNorm to SyncBatchNorm before the DDP wrap (GPU only).")
@click.option("--gpu-memory", type=SIZE, default=None, metavar="SIZE",
              help="Memory per GPU, e.g. 24GiB. Default: the real device's.")
@click.option("--reserve", type=SIZE, default=None, metavar="SIZE",
              help="Memory to keep for CUDA context/NCCL. Default: measured on GPU, 0 on CPU.")
@click.option("--safety-margin", type=FiniteFloatRange(0, 1, max_open=True), default=0.10,
              show_default=True, help="Fraction of --gpu-memory to leave free.")
@click.option("--timeout", type=FiniteFloatRange(min=0, min_open=True, max=MAX_TIMEOUT),
              default=120.0, show_default=True, metavar="SECONDS",
              help="Longest the whole run may take: then every process of the run is killed "
                   "and the ranks that had not finished are named.")
@click.option("--bandwidth-size", type=SIZE, default=None, metavar="SIZE",
              help="all_reduce size for the bandwidth figure. Default: 256MiB NCCL, 16MiB gloo.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="The report as text, or as JSON for CI.")
@click.option("--allow-unsandboxed", is_flag=True, envvar="DDPCHECK_ALLOW_UNSANDBOXED",
              help="Run even where no OS sandbox can be set up (no user namespaces, no "
                   "Landlock): only Python-level writes are then kept from your files. "
                   "Also DDPCHECK_ALLOW_UNSANDBOXED=1.")
@click.option("--steps", type=POSITIVE, default=None, metavar="K",
              help="Batches served per epoch, the last batch first. Default: 3.")
@click.option("--nodes", type=POSITIVE, default=None, metavar="M",
              help="Split the --gpus ranks over M emulated nodes (LOCAL_RANK, GROUP_RANK per "
                   "node) and report files more than one node writes.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
def preflight(steps, nodes, script_args, **kwargs) -> None:
    """A tiny real distributed run before the real job, on torch's own launcher
    (inside torchrun or srun, this process is one rank).

    \b
    Factory mode describes the job with options: the process group and its
    collectives, the data-set arithmetic (--dataset-size), the memory of one
    training step of your model (--model).
    Script mode (-- SCRIPT ARGS...) runs your own training script on --gpus
    ranks: a few steps per epoch, the last batch first, into epoch 2, its
    writes kept out of your folders, reported beside `ddpcheck lint`.

    Every run happens in a sandbox: your files stay as they are whatever the code
    writes (the report lists what it changed), nothing it starts outlives it, and
    it ends by --timeout.

    Exit 0 when nothing FAILs, 1 when a check FAILs, 2 for usage errors.
    """
    opts = PreflightOptions(**kwargs)
    script_args = list(script_args)
    if script_args:
        from ddpcheck.preflight.script.command import check_script_usage

        folder = check_script_usage(opts, script_args)
        mode = "script"
    else:
        if steps is not None:
            fail("--steps needs a script: ddpcheck preflight --steps K -- SCRIPT [ARGS...]")
        if nodes is not None:
            fail("--nodes needs a script: ddpcheck preflight --gpus N --nodes M -- SCRIPT "
                 "[ARGS...]")
        check_usage(opts)
        folder = None
        mode = "factory"
    sys.exit(run_sandboxed(mode, opts, steps, script_args, folder, nodes))


def check_usage(opts: PreflightOptions) -> None:
    """Everything about the factory mode's options that needs no torch."""
    check_combinations(opts)
    launched = launch_environment()
    if opts.data_parallel:
        return  # one process, nothing launched: --gpus only feeds the arithmetic
    from ddpcheck.preflight import envdetect

    if launched is None:
        check_capacity(opts.gpus)
        check_bandwidth_size(opts.bandwidth_size, opts.gpus)
        if opts.gpus is not None:
            _data_part(opts, opts.gpus)
        try:
            envdetect.master_port()
        except envdetect.LaunchEnvError as exc:
            fail(str(exc))


def run_sandboxed(mode: str, opts: PreflightOptions, steps, script_args: list,
                  script_folder, nodes=None) -> int:
    """Run the preflight in the sandbox and print its report; the exit code."""
    from ddpcheck.preflight import sandbox as sandboxing
    from ddpcheck.preflight import supervisor

    start = time.time()
    sandboxing.sweep_stale()
    run_dir = sandboxing.make_run_dir()
    box = None
    try:
        box = sandboxing.choose(run_dir, os.getcwd(), script_folder)
        if box.level == sandboxing.Level.NONE and not opts.allow_unsandboxed:
            fail(sandboxing.describe_unavailable(box))
        environ = {}
        if not box.isolated_processes:
            os.makedirs(box.private_tmp, exist_ok=True)
            environ["TMPDIR"] = box.private_tmp  # a private temp folder, removed after
        request = supervisor.Request(
            mode=mode, options=dataclasses.asdict(opts), cwd=os.getcwd(),
            deadline=start + opts.timeout, sandbox=box.to_dict(), steps=steps,
            script_args=script_args, environ=environ, nodes=nodes)
        outcome = supervisor.run(
            box, request, opts.timeout,
            on_deadline=lambda records, timeout: _deadline_report(mode, opts, box, records,
                                                                  start),
            on_lost=lambda why: _lost_report(mode, opts, box, why, start),
            echo_out=lambda text: click.echo(text, nl=False),
            echo_err=lambda text: click.echo(text, nl=False, err=True))
    finally:
        if box is not None:
            supervisor.finish(box)
        else:
            sandboxing.remove_tree(run_dir)
    if outcome.out:
        click.echo(outcome.out, nl=False)
    if outcome.err:
        click.echo(outcome.err, nl=False, err=True)
    return outcome.code


# -- when the sandbox had to be killed, or its launcher died --------------------------------


def _unfinished(records: dict, world: int) -> list[tuple[int, str]]:
    """``(rank, what it was doing)`` for every rank without a final record."""
    from ddpcheck.preflight.progress import WAITING_PREFIX

    out = []
    now = time.time()
    for rank in range(world):
        rec = records.get(rank)
        if rec is not None and rec.final:
            continue
        if rec is None:
            out.append((rank, "it never reported (still starting)"))
        elif rec.stage.startswith(WAITING_PREFIX) or rec.waiting:
            out.append((rank, f"{rec.stage} (waiting for a peer) for {now - rec.since:.0f} s"))
        else:
            out.append((rank, f"{rec.stage} for {now - rec.since:.0f} s"))
    return out


def _deadline_report(mode: str, opts: PreflightOptions, box, records: dict,
                     start: float) -> str:
    world = max([opts.gpus or 0, len(records)] + [r + 1 for r in records])
    unfinished = _unfinished(records, world)
    named = "; ".join(f"rank {rank}: {what}" for rank, what in unfinished) or \
        "no rank had started yet"
    title = (f"the run did not end within --timeout {opts.timeout:g} s: every process of it "
             f"was killed")
    detail = f"ranks that had not finished: {named}" if unfinished else named
    fix = ("the launcher itself did not stop in time (a rank blocked its own shutdown); "
           "raise --timeout only if the work is just slow")
    return _own_report(mode, opts, box, title, detail, fix, [r for r, _ in unfinished], start)


def _lost_report(mode: str, opts: PreflightOptions, box, why: str, start: float) -> str:
    title = f"the preflight's launcher ended without a report ({why})"
    return _own_report(mode, opts, box, title, "", "rerun; if it repeats, report it with "
                       "the command line and --format json", [], start)


def _own_report(mode, opts, box, title, detail, fix, ranks, start) -> str:
    """A report the supervisor writes itself, in the run's mode and format."""
    from ddpcheck.preflight.checks import FAIL, Check, CheckId

    headline = f"ddpcheck preflight: {title}"
    if mode == "script":
        from ddpcheck.preflight.script import report as script_report

        check = Check(CheckId.RUN_DEADLINE, FAIL, detail, fix, headline=title, ranks=tuple(ranks))
        # what the run did not get to report stays empty (0 nodes: not known here)
        rep = script_report.ScriptReport(
            headline=headline, target="", argv=[], world_size=opts.gpus or 0,
            one_process=False, nodes=0, backend="", device="",
            cuda_stand_in=False, steps=0, checks=[check], lint=[], lint_error="not run",
            seconds=time.time() - start, exit_code=1, sandbox=box.summary(),
            unsandboxed=box.level.value == "none", degraded=not box.isolated_processes)
        if opts.output_format == "json":
            return script_report.render_json(rep) + "\n"
        lines = [headline] + ([box.summary()] if not box.isolated_processes else []) + \
            ["", f"FAIL  {title}"]
        lines += [f"      {detail}"] if detail else []
        lines += [f"      fix: {fix}", "", f"1 FAIL -> exit 1 ({rep.seconds:.1f} s)"]
        return "\n".join(lines) + "\n"
    from ddpcheck.preflight import report as render

    check = Check(CheckId.RUN_DEADLINE, FAIL, f"{title}; {detail}" if detail else title, fix)
    rep = render.PreflightReport(
        headline=headline, world_size=opts.gpus or 0, backend="", device="", launcher="",
        checks=[check], exit_code=1, total_seconds=time.time() - start, sandbox=box.summary(),
        unsandboxed=box.level.value == "none", degraded=not box.isolated_processes)
    text = render.render_json(rep) if opts.output_format == "json" else render.render_text(rep)
    return text + "\n"


# -- the run ---------------------------------------------------------------------------------


def _data_part(opts: PreflightOptions, world: int):
    """The arithmetic checks and tables (no table without --dataset-size)."""
    from ddpcheck.preflight import datachecks, shardplan
    from ddpcheck.preflight.report import Arithmetic

    try:
        choice = shardplan.resolve_batch_size(world, opts.batch_size, opts.global_batch_size,
                                              opts.grad_accum)
    except shardplan.PlanError as exc:
        fail(str(exc))
    if opts.dataset_size is None:
        return datachecks.choice_checks(choice, world, opts.grad_accum), None, choice
    try:
        plan = shardplan.plan_shards(opts.dataset_size, world,
                                     choice.per_gpu if choice else None,
                                     drop_last=opts.drop_last,
                                     sampler_drop_last=opts.sampler_drop_last,
                                     grad_accum=opts.grad_accum)
    except shardplan.PlanError as exc:
        fail(str(exc))
    q = datachecks.DataQuestion(plan, choice, opts.base_batch, opts.base_lr)
    arith = Arithmetic(rows=datachecks.arithmetic_rows(q), ranks=datachecks.rank_rows(plan),
                       rank_headers=datachecks.RANK_HEADERS,
                       guide=datachecks.guide_rows(plan) if choice is None else [],
                       guide_headers=datachecks.GUIDE_HEADERS)
    return datachecks.data_checks(q), arith, choice


def _import_torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        fail("ddpcheck preflight needs torch: pip install 'ddpcheck[preflight]'")
    if not dist.is_available():
        fail("this torch build has no torch.distributed")
    return torch


def _load_user_refs(opts: PreflightOptions) -> None:
    """Import the user's modules here: a typo is a usage error before any process
    starts, and forked workers find them already imported."""
    from ddpcheck.preflight import modelspec

    refs = [(opts.model, "--model"), (opts.sample, "--sample"), (opts.loss, "--loss")]
    if opts.custom_optimizer:
        refs.append((opts.optimizer, "--optimizer"))
    for ref, flag in refs:
        if ref:
            try:
                modelspec.load_ref(ref, flag)
            except modelspec.SpecError as exc:
                fail(str(exc))


def _launch_env_checks(launched) -> list[Check]:
    """An exported MASTER_PORT that is busy here: the job that reads it fails at init."""
    from ddpcheck.preflight import envdetect

    if launched is not None:
        return []
    try:
        port = envdetect.master_port()
    except envdetect.LaunchEnvError as exc:
        fail(str(exc))
    if port is None:
        return []
    addr = os.environ.get("MASTER_ADDR", "localhost")
    if not envdetect.is_local_address(addr):
        return []
    if envdetect.port_in_use(port):
        return [Check(
            CheckId.LAUNCH_ENV, WARN,
            f"MASTER_PORT={port} is exported but already in use on this host: a job that "
            f"reads it (init_method='env://', mp.spawn scripts, torchrun --master-port "
            f"$MASTER_PORT) fails at init_process_group with 'address already in use'; the "
            f"preflight itself rendezvoused on a free port",
            "unset MASTER_PORT and use torchrun --standalone (a free port), or export a free "
            "port; `ss -ltnp | grep PORT` shows who holds it")]
    return [Check(CheckId.LAUNCH_ENV, PASS,
                  f"MASTER_PORT={port} (exported) is free on this host")]


def run_preflight(opts: PreflightOptions, box=None, deadline=None) -> int:
    """The factory mode, inside the sandbox (:mod:`ddpcheck.preflight.inside`).
    ``box``: the run's :class:`~ddpcheck.preflight.sandbox.Sandbox`; ``deadline``: when
    the ranks must have finished (``time.time()``)."""
    t0 = time.time()
    check_combinations(opts)
    launched = launch_environment()
    if opts.data_parallel:
        if launched is not None:
            fail("--data-parallel is one process driving every GPU: run it without torchrun/srun")
        return _run_data_parallel(opts, t0, box)

    world = launched.world_size if launched else opts.gpus
    pre_checks = _launch_env_checks(launched)
    if launched and opts.gpus is not None and opts.gpus != launched.world_size:
        pre_checks.append(_gpus_vs_launcher(opts.gpus, launched))
    if world is not None:
        data_checks, arith, choice = _data_part(opts, world)

    torch = _import_torch()
    from ddpcheck.preflight import gpus
    from ddpcheck.preflight.backend import BackendError, choose_backend

    # never poison fork: count GPUs through NVML where possible
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    gpus_here, fork_safe = gpus.visible_gpus()
    if world is None:
        if gpus_here == 0:
            fail("--gpus N is required on a machine without GPUs (N CPU processes stand in "
                 "for N GPUs)")
        world = gpus_here
        data_checks, arith, choice = _data_part(opts, world)
    per_node = launched.local_world_size if launched else world
    try:
        backend = choose_backend(opts.backend, per_node, gpus_here,
                                 torch.distributed.is_nccl_available())
    except BackendError as exc:
        fail(str(exc))

    # from here on the user's code runs (its modules are imported next): what the
    # sandbox's layers hold before this is the launcher's own
    watched = _watch_changes(box)
    if opts.model:
        fork_safe = _load_model_code(opts, torch, fork_safe)
    spec = _run_spec(opts, backend, choice, box)

    quiet = False
    log_dir = None
    if launched:
        results, how, launch_s = _run_in_launcher(spec, launched, deadline)
        quiet = launched.rank != 0  # every rank reaches the same verdict; rank 0 prints it
    else:
        results, how, launch_s, log_dir = _run_local(spec, world, fork_safe, box, deadline)
    writes = watched()
    if box is not None and log_dir:
        from ddpcheck.preflight import supervisor

        supervisor.write_status(box.box, kept_logs=log_dir)

    from ddpcheck.preflight import verdict

    pg_checks = verdict.failure_checks(results, opts.timeout, log_dir)
    pg_checks += verdict.process_group_checks(results, backend.backend, backend.device, world)
    mem, mq, mem_checks = _memory_part(opts, results, spec.batch_size, world, choice)
    if mem is not None and mem.bn_batch1:
        data_checks = _escalate_last_batch_of_one(data_checks)
    checks = [Check(CheckId.BACKEND, backend.status, backend.note)] + pre_checks + pg_checks \
        + data_checks + mem_checks
    return _print(opts, quiet, checks, t0, results=results, how=how, launch_s=launch_s,
                  world=world, backend=backend.backend, device=backend.device, arith=arith,
                  mem=mem, mq=mq, log_dir=log_dir, box=box, writes=writes)


def _memory_part(opts: PreflightOptions, results: list, batch_size, world: int, choice):
    """The memory the ranks measured (with --model), the question it answers (the
    target batch, the baseline's global batch) and its checks."""
    from ddpcheck.preflight import memverdict

    mem = next((r.memory for r in results if r.memory is not None), None) if opts.model \
        else None
    mq = memverdict.MemoryQuestion(
        target_batch=batch_size, world_size=world, grad_accum=opts.grad_accum,
        baseline_global=opts.base_batch or (choice.effective_global if choice else None),
        safety_margin=opts.safety_margin, model=opts.model or "", optimizer=opts.optimizer)
    return mem, mq, memverdict.memory_checks(mem, mq)


def _gpus_vs_launcher(gpus: int, launched) -> Check:
    return Check(
        CheckId.GPUS_VS_LAUNCHER, WARN,
        f"--gpus {gpus} but {launched.launcher} started {launched.world_size} ranks: "
        f"the arithmetic uses {launched.world_size}",
        "drop --gpus when running under a launcher")


def _load_model_code(opts: PreflightOptions, torch, fork_safe: bool) -> bool:
    """Import the user's --model / --loss / ... modules here, once, before the workers
    start; returns whether forking the workers is still safe (not when importing them
    initialised CUDA)."""
    _load_user_refs(opts)
    if fork_safe:
        # DDP's constructor imports torch._dynamo (seconds): once here, shared by
        # every forked worker, instead of once per worker
        import torch._dynamo  # noqa: F401
    return fork_safe and not torch.cuda.is_initialized()


def _run_spec(opts: PreflightOptions, backend, choice, box) -> RunSpec:
    """What every rank runs: the backend, the bandwidth figure's size, the model and
    its memory question, the sandbox's folder."""
    return RunSpec(
        backend=backend.backend, device=backend.device, timeout=float(opts.timeout),
        bandwidth_bytes=opts.bandwidth_size or (256 * 2**20 if backend.device == "cuda"
                                                else 16 * 2**20),
        bandwidth_iters=5 if backend.device == "cuda" else 3,
        model=model_spec(opts), gpu_memory=opts.gpu_memory, reserve=opts.reserve,
        safety_margin=opts.safety_margin, batch_size=choice.per_gpu if choice else None,
        box=box.box if box is not None else None,
        redirect=box is not None and not box.isolated_processes)


def _watch_changes(box):
    """Note what the sandbox's upper layers hold before the ranks start (the launcher's
    own start-up writes); the returned function lists what the user's code changed."""
    if box is None or not box.isolated_processes:
        return lambda results=None: []
    from ddpcheck.preflight import sandbox as sandboxing

    before = sandboxing.snapshot(box.trees)
    return lambda: sandboxing.changes(box.trees, before, box.real_view)


def _factory_writes(results: list, changes: list) -> list:
    from ddpcheck.preflight import writes as recorded

    by_rank = {r.rank: [(w, None) for w in r.writes] for r in results}
    return recorded.join(changes, by_rank)


def _print(opts: PreflightOptions, quiet: bool, checks: list, t0: float, *, results, how,
           launch_s, world, backend, device, arith, mem, mq, log_dir, box=None,
           writes=None) -> int:
    from ddpcheck.preflight import report as render

    code = exit_code(checks)
    where = "CPU" if device == "cpu" else "GPU"
    unsandboxed = box is not None and box.level.value == "none"
    changed = _factory_writes(results, writes if box is not None and
                              box.isolated_processes else None)
    rep = render.PreflightReport(
        headline=("NO SANDBOX: " if unsandboxed else "")
        + (f"ddpcheck preflight: {world} rank{'s' if world != 1 else ''}, {backend} on "
           f"{where}, {how}" if backend else f"ddpcheck preflight: {how}"),
        sandbox=box.summary() if box is not None else "", unsandboxed=unsandboxed,
        degraded=box is not None and not box.isolated_processes,
        writes=changed,
        world_size=world, backend=backend, device=device, launcher=how, checks=checks,
        exit_code=code, total_seconds=time.time() - t0, workers_seconds=launch_s,
        arithmetic=arith, memory=mem, memory_target=mq.target_batch if mq else None,
        safety_margin=opts.safety_margin, baseline_global=mq.baseline_global if mq else None,
        grad_accum=opts.grad_accum, ranks=results, worker_logs=log_dir)
    if quiet:
        return code
    if opts.output_format == "json":
        click.echo(render.render_json(rep))
    else:
        click.echo(render.render_text(rep))
    return code


def _escalate_last_batch_of_one(checks: list[Check]) -> list[Check]:
    return [dataclasses.replace(c, status=FAIL,
                                detail=c.detail + "; this model does raise at batch 1 (measured)")
            if c.id == CheckId.LAST_BATCH_OF_ONE else c for c in checks]


def _run_local(spec: RunSpec, world: int, fork_safe: bool, box=None, deadline=None):
    from ddpcheck.preflight import launch

    method = "fork" if fork_safe else "spawn"
    workdir = os.path.join(box.box, "launch") if box is not None else None
    outcome = launch.run_local(world, spec, start_method=method, workdir=workdir,
                               deadline=deadline)
    if outcome.interrupted:
        click.echo("ddpcheck: interrupted; workers stopped", err=True)
        sys.exit(130)
    if outcome.launcher_error:
        fail(f"torch's elastic launcher failed before the workers ran: {outcome.launcher_error}")
    how = f"workers started by torch's elastic_launch ({method}) in {outcome.elapsed:.1f} s"
    if any(r.status == RankStatus.NOT_STARTED for r in outcome.ranks):
        how = "no worker started (--timeout ended during the start-up)"
    return outcome.ranks, how, outcome.elapsed, outcome.log_dir


def _run_in_launcher(spec: RunSpec, launched, deadline=None):
    """This process is one rank of the user's torchrun/srun job."""
    from ddpcheck.preflight.worker import run_in_this_process

    launched.export()
    start = time.time()
    spec = dataclasses.replace(spec, gather=True, launched_by=launched.launcher,
                               deadline=deadline if deadline is not None
                               else start + spec.timeout)
    mine = run_in_this_process(spec)
    elapsed = time.time() - start
    if mine.everyone:
        results = list(mine.everyone)
    else:
        # the group broke before the results were gathered: only this rank's view
        results = [mine if rank == launched.rank else
                   RankResult(rank, RankStatus.RUNNING,
                              stage="an unknown stage (its result never arrived)")
                   for rank in range(launched.world_size)]
    how = f"rank {launched.rank} of {launched.world_size} under {launched.launcher}"
    return results, how, elapsed


# -- nn.DataParallel: one process, nothing launched ------------------------------------------


def _run_data_parallel(opts: PreflightOptions, t0: float, box=None) -> int:
    from ddpcheck.preflight import datachecks, shardplan
    from ddpcheck.preflight.report import Arithmetic

    batch = opts.batch_size or opts.global_batch_size
    if opts.dataset_size is None or batch is None:
        fail("--data-parallel needs --dataset-size and --batch-size (the DataLoader's "
             "batch_size: with DataParallel it is the whole batch, split over the GPUs)")
    if opts.grad_accum != 1 or opts.sampler_drop_last:
        fail("--grad-accum and --sampler-drop-last are not DataParallel options here")
    gpus = opts.gpus
    if gpus is None:
        _import_torch()
        from ddpcheck.preflight import gpus as gpu_count

        gpus = gpu_count.visible_gpus()[0]
        if gpus == 0:
            fail("--gpus N is required on a machine without GPUs")
    try:
        dp = shardplan.plan_data_parallel(opts.dataset_size, gpus, batch, opts.drop_last)
    except shardplan.PlanError as exc:
        fail(str(exc))
    watched = _watch_changes(box)
    call = _dp_call(opts) if opts.model else None
    checks = datachecks.data_parallel_checks(dp, call)
    if opts.model:
        checks.append(Check(
            CheckId.TRAINING_STEP, WARN,
            "memory is not measured in DataParallel mode: DataParallel keeps the module, "
            "the gathered outputs and the loss on GPU 0, which needs more than the others",
            "measure the per-GPU step under DDP (drop --data-parallel) to size the batch"))
    arith = Arithmetic(rows=datachecks.dp_arithmetic_rows(dp),
                       title="Batch arithmetic (what one DataLoader + nn.DataParallel give "
                             "every GPU)")
    how = (f"nn.DataParallel over {gpus} GPU{'s' if gpus != 1 else ''}, one process "
           f"(nothing launched)")
    return _print(opts, False, checks, t0, results=[], how=how, launch_s=0.0, world=gpus,
                  backend="", device="", arith=arith, mem=None, mq=None, log_dir=None,
                  box=box, writes=watched())


def _dp_call(opts: PreflightOptions):
    """``n -> (args, kwargs)`` skeletons of the model's call at batch ``n``."""
    from ddpcheck.preflight.shardplan import TensorLeaf

    if opts.input_shape is not None:
        return lambda n: ((TensorLeaf(n),), {})
    _import_torch()
    _load_user_refs(opts)
    from ddpcheck.preflight import modelspec

    fn = modelspec.load_ref(opts.sample, "--sample")
    import torch

    def skeleton(obj):
        if isinstance(obj, torch.Tensor):
            return TensorLeaf(obj.shape[0] if obj.dim() else 0)
        if isinstance(obj, dict):
            return {k: skeleton(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(skeleton(v) for v in obj) if not hasattr(obj, "_fields") \
                else tuple(skeleton(v) for v in obj)
        return obj

    def call(n: int):
        try:
            value = fn(n)
        except Exception as exc:  # the user's function: one line, not a traceback
            fail(f"--sample {opts.sample}: FN({n}) raised {type(exc).__name__}: {exc}")
        args, kwargs = modelspec.split_call(value)
        return skeleton(args), skeleton(kwargs)

    return call
