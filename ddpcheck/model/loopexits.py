"""Rank-only exits from loops whose iterations communicate.

`break`, `return`, `raise`, `sys.exit()` inside a branch only some ranks take
(`if rank == 0: ... break`), in a loop every rank runs and whose iterations
make a collective (a DDP forward, an all_reduce, a helper that does): the
ranks that leave stop calling the collective, the others enter the next
iteration and wait in it forever. A decision broadcast or all_reduced first
(`dist.broadcast(stop, 0); if stop.item(): break`) is taken by every rank
alike: its test is not a rank test, so it is not an exit of some ranks. A
`raise` or `sys.exit()` placed before every collective of the iteration is a
configuration check, not judged."""

from __future__ import annotations

from dataclasses import dataclass

from ddpcheck.model.collectives import Event, function_events
from ddpcheck.model.guards import function_worlds, worlds
from ddpcheck.model.memo import query
from ddpcheck.model.script import Exit, Loop, ScriptModel
from ddpcheck.model.worlds import ALL, DISTRIBUTED, only_some_ranks


@dataclass(frozen=True)
class RankOnlyExit:
    exit: Exit
    loop: Loop                 # the loop the ranks that exit leave
    worlds: frozenset[str]     # who takes the exit
    collective: Event          # what the other ranks wait in, in that loop's iterations


def _worlds(model: ScriptModel, ctx) -> frozenset[str]:
    fn = ctx.function
    return worlds(model, ctx) & (function_worlds(model, fn) if fn is not None else ALL)


def _left_loops(e: Exit) -> tuple[Loop, ...]:
    """The loops of its function an exit leaves, innermost first."""
    loops = e.ctx.loops
    if e.kind == "break":
        return loops[-1:]
    return tuple(reversed(loops))


@query(on_cycle=())
def rank_only_exits(model: ScriptModel) -> tuple[RankOnlyExit, ...]:
    found: list[RankOnlyExit] = []
    for e in model.exits:
        if not e.ctx.loops or e.ctx.opaque:
            continue
        worlds = _worlds(model, e.ctx)
        if not only_some_ranks(worlds):
            continue
        events = [ev for ev in function_events(model, e.ctx.function)
                  if ev.worlds & DISTRIBUTED == DISTRIBUTED]
        for loop in _left_loops(e):
            if _worlds(model, loop.ctx) & DISTRIBUTED != DISTRIBUTED:
                continue   # a loop only some ranks run: leaving it strands nobody (a `return` may leave an outer one)
            inside = [ev for ev in events if ev.site.ctx.inside(loop)]
            if e.kind in ("raise", "exit"):
                # an abort before the iteration's first collective is a
                # configuration check (it fires on the first pass, before the
                # ranks ever met); one after it strands ranks mid-training
                inside = [ev for ev in inside if ev.site.ctx.order < e.ctx.order]
            if inside:
                found.append(RankOnlyExit(e, loop, worlds, inside[0]))
                break
    return tuple(found)


__all__ = ["RankOnlyExit", "rank_only_exits"]
