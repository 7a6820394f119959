"""DDP101 missing-set-epoch."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.model.epochs import epoch_loops, instance_epoch_loops
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.names import dotted_name
from ddpcheck.model.values import loaders, returned_loaders
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import set_epoch_edit
from ddpcheck.rules.base import Hit, Rule, register


@register
class MissingSetEpoch(Rule):
    code = "DDP101"
    name = "missing-set-epoch"
    short = "DistributedSampler never gets `set_epoch()`: every epoch replays the same order"
    severity = Severity.ERROR
    fixable = True
    message = (
        "DistributedSampler is iterated every epoch but set_epoch() is never called: "
        "its shuffle is seeded with the epoch, so every epoch replays the same order"
    )
    fix = "call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating the loader"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        all_loaders = loaders(model) + returned_loaders(model)
        known = {l.key for l in all_loaders if l.key} | {s.key for l in all_loaders for s in l.samplers if s.key}
        for loader in all_loaders:
            shuffling = [s for s in loader.samplers if s.shuffle is True]
            if not shuffling or loader.key is None or loader.looks_like_eval():
                continue
            accepted = {loader.key + suffix for suffix in (".sampler", ".batch_sampler", ".batch_sampler.sampler")}
            for s in shuffling:
                if s.key:
                    accepted |= {s.key}
            for k in loader.batch_sampler_keys:
                accepted |= {k, k + ".sampler"}
            reported = set()
            found = [(e, loader.key) for e in epoch_loops(model, loader.key, loader.scope)]
            found += list(instance_epoch_loops(model, loader.key, loader.scope))
            for epoch, held_as in found:
                if held_as != loader.key:   # kept on an instance: `self.train_data.sampler.set_epoch(e)`
                    accepted = accepted | {held_as + s for s in (".sampler", ".batch_sampler", ".batch_sampler.sampler")}
                if id(epoch.loop) in reported or _sets_epoch(model, epoch.loop, accepted, known):
                    continue
                reported.add(id(epoch.loop))
                # name the sampler the way this loop can reach it
                sampler = (f"{held_as}.sampler" if held_as != loader.key
                           else next((s.key for s in shuffling if s.key), f"{loader.key}.sampler"))
                yield Hit(
                    epoch.loop.node,
                    message=(
                        f"`{held_as}` draws from a shuffling DistributedSampler but this epoch loop never "
                        f"calls `{sampler}.set_epoch(...)`: the sampler seeds its shuffle with the epoch, so "
                        "every epoch replays the epoch-0 order on every rank"
                    ),
                    fix=f"call `{sampler}.set_epoch(epoch)` at the top of this loop, before iterating `{held_as}`",
                    edit=set_epoch_edit(model, epoch.loop, sampler, loader.site.arg("sampler", 3)),
                )


def _sets_epoch(model: ScriptModel, loop, accepted: set[str], known: set[str]) -> bool:
    inside = model.calls_inside(loop)
    for m, call in [(model, c) for c in inside] + [(m, c) for m, fn, _ in model.callees(inside) for c in m.calls_in(fn)]:
        if call.attr != "set_epoch":
            continue
        receiver = dotted_name(call.receiver) if call.receiver is not None else None
        if m is not model or receiver is None or receiver in accepted:
            return True
        base = receiver.split(".")[0] if not receiver.startswith("self.") else receiver
        # a set_epoch on something we cannot tell apart (a parameter, `self.x`) counts
        if receiver not in known and base not in known:
            return True
    return False
