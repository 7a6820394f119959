"""DDP403 rank-before-init."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ddpcheck.model.collectives import (
    PROCESS_GROUP_NEED, initialized_guarded, needs_process_group, runs_only_uninitialized, starts_group,
)
from ddpcheck.model.distributed import INIT_NEED, function_inits, init_calls, is_init_call
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, FunctionInfo, ScriptModel
from ddpcheck.model.positions import where
from ddpcheck.model.values import exclusive
from ddpcheck.findings import Severity
from ddpcheck.model.filekind import SCRIPTS_ONLY
from ddpcheck.triggers import COLLECTIVE_UNDER_RANK, USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register
from ddpcheck.model.flow import resolve_call


@dataclass(frozen=True)
class _Step:
    kind: str            # "init", "maybe-init" (a helper we cannot see, named like one), "query"
    site: CallSite       # the call in this function
    what: str            # for queries: the torch call that needs the group, and where


@query(on_cycle=None)
def _pre_init_query(model: ScriptModel, fn: FunctionInfo) -> str | None:
    """What `fn` calls that needs a process group before it starts one itself
    (None: nothing, or only behind `is_initialized()` checks)."""
    result = None
    for step in _steps(model, fn):
        if step.kind != "query":
            break
        result = step.what
        break
    return result


@query(on_cycle=[])
def _steps(model: ScriptModel, fn: FunctionInfo | None) -> list[_Step]:
    steps = []
    for c in model.calls_in(fn):
        if is_init_call(model, c):
            # `if not dist.is_initialized(): init_process_group()` ensures a group: one may exist before
            steps.append(_Step("maybe-init" if runs_only_uninitialized(model, c) else "init", c, ""))
            continue
        if needs_process_group(model, c):
            if not initialized_guarded(model, c):
                steps.append(_Step("query", c, f"`{c.func}(...)`"))
            continue
        target = resolve_call(model, c, PROCESS_GROUP_NEED)
        if target is not None:
            tmodel, tfn = target
            if tfn is fn:
                continue
            inits = function_inits(tmodel, tfn)
            inner = _pre_init_query(tmodel, tfn)
            if inner is not None and not inits and not initialized_guarded(model, c):
                # a query helper (`get_rank()` without an is_initialized check); a helper that
                # queries and then inits is reported inside itself
                # the helper's file only (its line is not said, so not computed: a code
                # generation of the whole helper module)
                loc = "" if tmodel is model else f" ({tmodel.file_name.split(':')[0]})"
                steps.append(_Step("query", c, f"`{c.func}(...)`, which calls {inner} in `{tfn.qualname}`{loc},"))
            elif inits:
                steps.append(_Step("init" if starts_group(tmodel, tfn) else "maybe-init", c, ""))
        elif c in init_calls(model):
            steps.append(_Step("maybe-init", c, ""))
    return steps


@register
class RankBeforeInit(Rule):
    code = "DDP403"
    triggers = (USES_DISTRIBUTED, COLLECTIVE_UNDER_RANK)
    name = "rank-before-init"
    short = "rank/world size or a collective used before init_process_group"
    severity = Severity.ERROR
    kinds = SCRIPTS_ONLY
    message = ("`get_rank()` / `get_world_size()` / a collective runs before init_process_group: torch raises "
               "\"Default process group has not been initialized\"")
    fix = ("start the process group first (`dist.init_process_group(...)` or your `init_distributed_mode(args)`), "
           "or read the rank from the launcher's environment before that: `int(os.environ[\"RANK\"])`, "
           "`int(os.environ[\"WORLD_SIZE\"])`")

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        if not model.may_reach(INIT_NEED):
            return   # nothing starts a group: no "before" (an unseen helper named like one is only "maybe")
        for fn in [None, *model.functions]:
            steps = _steps(model, fn)
            inits = [s for s in steps if s.kind != "query"]
            if not any(s.kind == "init" for s in inits):
                continue
            for q in steps:
                if q.kind != "query":
                    continue
                order = q.site.ctx.order
                if any(i.site.ctx.order < order and not exclusive(i.site.ctx, q.site.ctx) for i in inits):
                    continue   # a group was (or may have been) started before
                later = [i for i in inits if i.kind == "init" and i.site.ctx.order > order
                         and not exclusive(i.site.ctx, q.site.ctx)]
                if not later:
                    continue
                init = later[0].site
                yield Hit(q.site.node, message=(
                    f"{q.what} needs the default process group, but it runs before `{init.func}(...)` "
                    f"({where(model, init.node)}) starts it: torch raises \"Default process group has not been "
                    "initialized, please make sure to call init_process_group\" on every rank"
                ))
