"""DDP501 local-rank-arg."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.arguments import options
from ddpcheck.model.distributed import starts_own_workers
from ddpcheck.model.env import env_reads
from ddpcheck.model.filekind import NOT_TESTS, has_main_guard, library_module
from ddpcheck.model.launch import LaunchCommand, launch_commands, option_module_users, through_launchers
from ddpcheck.model.script import ScriptModel
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import local_rank_edit
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.model.names import string_value
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import callees

def reads_local_rank_env(model: ScriptModel) -> bool:
    """LOCAL_RANK is read from the environment in the script or in a local
    helper it calls (OpenCOOD's `init_distributed_mode(args)`)."""
    if "LOCAL_RANK" in env_reads(model):
        return True
    for m, fn, _ in callees(model, model.calls):
        if any(r is fn for r in env_reads(m).get("LOCAL_RANK", [])):
            return True
    return False


def _uses_deepspeed(model: ScriptModel) -> bool:
    return any(v == "deepspeed" or v.startswith("deepspeed.") for v in model.imports.aliases.values())


def _option_read(model: ScriptModel, dest: str) -> bool:
    """`args.local_rank` (or `opt.local_rank`, `getattr(args, "local_rank")`)
    is read somewhere in the script or a local helper it calls."""
    def used(m: ScriptModel) -> bool:
        if any(r.via_attribute for r in m.references.get(dest, [])):
            return True
        return any(c.attr == "getattr" or c.func == "getattr" for c in m.calls
                   if len(c.node.args) >= 2 and string_value(c.node.args[1].value) == dest)
    return used(model) or any(used(m) for m, _fn, _ in callees(model, model.calls) if m is not model)


# Which launcher passes which spelling (torch/distributed/run.py: `--local-rank={local_rank}`
# unless `--use-env`, since torch 2.0; `--local_rank=` before; torchrun always has use_env).
LAUNCHERS = ("launchers: `torchrun` passes no rank argument (it sets LOCAL_RANK); `python -m "
             "torch.distributed.launch` passes `--local-rank=N` since torch 2.0 (`--local_rank=N` before), "
             "none with `--use-env`")


def _known_args_only(model: ScriptModel) -> bool:
    """The script parses with `parse_known_args()` only: unknown options are
    handed back, not fatal."""
    attrs = {c.attr for c in model.calls}
    return "parse_known_args" in attrs and "parse_args" not in attrs


@register
class LocalRankArg(Rule):
    code = "DDP501"
    triggers = (USES_DISTRIBUTED,)
    name = "local-rank-arg"
    short = "only `--local_rank` accepted: torch>=2.0 passes `--local-rank`"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    fixable = True
    message = (
        "the script only accepts `--local_rank`: torch>=2.0's `torch.distributed.launch` passes "
        "`--local-rank=N` (argparse exits with \"unrecognized arguments\") and torchrun passes nothing, "
        "so the local rank keeps its default on every process"
    )
    fix = ("read the launcher's environment: `local_rank = int(os.environ.get(\"LOCAL_RANK\", 0))` (torchrun sets it); "
           "to stay compatible with `torch.distributed.launch`, accept both spellings: "
           "`parser.add_argument(\"--local-rank\", \"--local_rank\", type=int, default=int(os.environ.get(\"LOCAL_RANK\", -1)))`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        opts = options(model)
        underscore = [o for o in opts if "--local_rank" in o.flags]
        if not underscore or any("--local-rank" in o.flags for o in opts):
            return
        if starts_own_workers(model):
            return   # no launcher: the script spawns its workers
        if library_module(model):
            # a module of an installed package: judged only as the options of a script of the
            # project whose documented launch passes the spelling argparse refuses
            if _options_module(model):
                yield from self._options_module(model, underscore, documented_break_only=True)
            return
        if _options_module(model):
            yield from self._options_module(model, underscore)
            return
        commands = through_launchers(launch_commands(model))
        breaking = [c for c in commands if c.rank_argument == "--local-rank"]
        if breaking:
            # the script's own documented command cannot start it on today's torch
            for o in underscore:
                yield Hit(o.site.node, message=_documented_break(breaking[0]),
                          edit=local_rank_edit(o.site))
            return
        if commands or _uses_deepspeed(model):
            # every documented launcher passes `--local_rank` (deepspeed) or no rank argument
            # (torchrun, accelerate launch, srun, submitit): the spelling is right for
            # them; what is left is an option read instead of LOCAL_RANK under a launcher that sets it
            yield from self._read_without_env(model, underscore, commands)
            return
        env_fallback = reads_local_rank_env(model)
        known_only = _known_args_only(model)
        for o in underscore:
            used = _option_read(model, o.dest)
            default = model.module.code_for_node(o.default).strip() if o.default is not None else "None"
            if used and not env_fallback:
                refused = ("`parse_known_args()` sets the new `--local-rank=N` aside" if known_only else
                           "argparse rejects the new `--local-rank=N` (\"unrecognized arguments: --local-rank=0\")")
                yield Hit(o.site.node, message=(
                    f"`--local_rank` is the only spelling accepted here and nothing reads LOCAL_RANK from the "
                    f"environment: {refused}, and under torchrun `args.{o.dest}` stays `{default}` on every "
                    f"process (every rank picks the same GPU, or the script does not even go distributed); "
                    f"{LAUNCHERS}"
                ), edit=local_rank_edit(o.site))
            elif not known_only:
                why = ("the value is read from LOCAL_RANK too" if env_fallback and used else
                       "the local rank comes from the environment" if env_fallback else "nothing reads the value")
                yield Hit(o.site.node, severity=Severity.INFO, message=(
                    f"`--local_rank` is the only spelling accepted here: {why}, so torchrun runs fine, but "
                    f"`python -m torch.distributed.launch` of torch>=2.0 passes `--local-rank=N` and every "
                    f"process exits at start with \"unrecognized arguments: --local-rank=0\"; {LAUNCHERS}"
                ), fix=("accept both spellings: `parser.add_argument(\"--local-rank\", \"--local_rank\", "
                        "type=int, default=int(os.environ.get(\"LOCAL_RANK\", -1)))`"), edit=local_rank_edit(o.site))

    def _read_without_env(self, model: ScriptModel, underscore, commands) -> Iterator[Hit]:
        """A documented launcher that passes no rank argument, and the script
        reads the option with no fallback to LOCAL_RANK: it keeps its default."""
        silent = next((c for c in commands if c.sets_local_rank_env), None)
        if silent is None or reads_local_rank_env(model) or _known_args_only(model):
            return
        for o in underscore:
            if not _option_read(model, o.dest):
                continue
            default = model.module.code_for_node(o.default).strip() if o.default is not None else "None"
            yield Hit(o.site.node, message=(
                f"`args.{o.dest}` is read, but the documented launcher (`{silent.where}`: `{_short(silent)}`) "
                f"passes no rank argument (it sets LOCAL_RANK), and nothing reads LOCAL_RANK: `args.{o.dest}` "
                f"stays `{default}` on every process, so every rank picks the same GPU (or the script does not "
                f"go distributed); {LAUNCHERS}"
            ), edit=local_rank_edit(o.site))

    def _options_module(self, model: ScriptModel, underscore, documented_break_only: bool = False) -> Iterator[Hit]:
        """`--local_rank` declared in a module of options that scripts import
        (`from options import get_args`): judged by those scripts, as the
        option would be in each of them (`documented_break_only`: only by a
        documented launch that passes `--local-rank=N`)."""
        users = option_module_users(model)
        if not users:
            return   # nobody in the project imports it: who parses it is unknown
        for user in users:
            user_model = model.project.model_for(user.path) if model.project is not None else None
            if user.uses_deepspeed:
                continue   # DeepSpeed's launcher passes `--local_rank`
            if user_model is not None and (_known_args_only(user_model) or starts_own_workers(user_model)):
                continue   # unknown options set aside; no launcher
            commands = through_launchers(user.commands)
            breaking = [c for c in commands if c.rank_argument == "--local-rank"]
            if documented_break_only and not breaking:
                continue
            if not breaking and (user.reads_env or (user_model is not None and reads_local_rank_env(user_model))):
                continue   # LOCAL_RANK read (in the script or a helper it calls), and no documented
                # launcher passes the spelling argparse refuses (that one stops the script before)
            silent = [c for c in commands if c.sets_local_rank_env]
            hits = []
            for o in underscore:
                read = (_option_read(user_model, o.dest) if user_model is not None
                        else f".{o.dest}" in user.text)
                default = model.module.code_for_node(o.default).strip() if o.default is not None else "None"
                if breaking:
                    hits.append(Hit(o.site.node, message=_documented_break(breaking[0], user.name),
                                    edit=local_rank_edit(o.site)))
                elif silent and read:
                    hits.append(Hit(o.site.node, message=(
                        f"`{user.name}` reads `.{o.dest}` from these options and nothing reads LOCAL_RANK, "
                        f"but its documented launcher (`{silent[0].where}`: `{_short(silent[0])}`) passes no "
                        f"rank argument: `{o.dest}` stays `{default}` on every process, so every rank picks "
                        f"the same GPU (or the script does not go distributed); {LAUNCHERS}"
                    ), edit=local_rank_edit(o.site)))
                elif not commands and read and user_model is not None and has_main_guard(user_model):
                    # a script with no documented launch: the option's spelling is the only way in, as
                    # when it is declared in the script (a module importing the options is judged by
                    # its own importers' launchers, which are not followed: unknown)
                    hits.append(Hit(o.site.node, message=(
                        f"`{user.name}` reads `.{o.dest}` from these options, `--local_rank` is the only spelling "
                        f"accepted and nothing reads LOCAL_RANK: argparse rejects the `--local-rank=N` of "
                        f"torch>=2.0's launcher, and under torchrun `{o.dest}` stays `{default}` on every "
                        f"process (every rank picks the same GPU, or the script does not go distributed); "
                        f"{LAUNCHERS}"
                    ), edit=local_rank_edit(o.site)))
            if hits:
                yield from hits   # judged by the first importing script that shows the harm
                return


def _options_module(model: ScriptModel) -> bool:
    """A module of options that scripts import: no main guard, and nothing
    parses the command line at its top level (its importers call it)."""
    return not has_main_guard(model) and not any(
        c.attr in ("parse_args", "parse_known_args") for c in model.calls_in(None))


def _short(command: LaunchCommand, width: int = 90) -> str:
    return command.text if len(command.text) <= width else command.text[: width - 3] + "..."


def _documented_break(command: LaunchCommand, user: str | None = None) -> str:
    whose = f"`{user}`'s documented command" if user else "the documented command"
    return (f"`--local_rank` is the only spelling accepted here, and {whose} (`{command.where}`: "
            f"`{_short(command)}`) runs `python -m torch.distributed.launch` without `--use-env`, which passes "
            "`--local-rank=N` since torch 2.0: every process exits at start with \"unrecognized arguments: "
            f"--local-rank=0\"; {LAUNCHERS}")
