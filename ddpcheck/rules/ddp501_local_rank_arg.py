"""DDP501 local-rank-arg."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.arguments import options
from ddpcheck.model.distributed import starts_own_workers
from ddpcheck.model.env import env_reads
from ddpcheck.model.script import ScriptModel
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import local_rank_edit
from ddpcheck.model.filekind import SCRIPTS_ONLY
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
                   if len(c.node.args) >= 2 and dest in m.module.code_for_node(c.node.args[1].value))
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
    name = "local-rank-arg"
    short = "only `--local_rank` accepted: torch>=2.0 passes `--local-rank`"
    severity = Severity.ERROR
    kinds = SCRIPTS_ONLY
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
        if starts_own_workers(model) or _uses_deepspeed(model):
            return   # no torch launcher: the script spawns its workers, or DeepSpeed's passes `--local_rank`
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
