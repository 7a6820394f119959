"""DDP102 sampler-shuffle-conflict."""

from __future__ import annotations

from typing import Iterator


from ddpcheck.model.script import CallSite, ScriptModel, exclusive
from ddpcheck.model.names import dotted_name
from ddpcheck.model.flow import (
    Made, argument_places, call_argument, called_name, instance_class, instance_of, resolved,
)
from ddpcheck.model.values import loaders
from ddpcheck.findings import Severity
from ddpcheck.rules.autofix import shuffle_edit
from ddpcheck.model.filekind import NOT_TESTS
from ddpcheck.triggers import USES_DISTRIBUTED
from ddpcheck.rules.base import Hit, Rule, register


def _sampler_objects(model: ScriptModel, site: CallSite, keyword: str, position: int) -> list[Made]:
    """The objects a loader's `sampler=` / `batch_sampler=` can visibly hold:
    objects made by a class (a constructor never returns None), through any
    name, helper or `**kwargs`; `None`, parameters and values the engine
    cannot see do not count."""
    value = call_argument(model, site, keyword, position)
    if value is None:
        return []
    found = [a for a in resolved(model, value).made if _makes_an_object(a)]
    return sorted(found, key=lambda a: (a.model.path, a.site.ctx.order))


def _never_together(model: ScriptModel, site: CallSite, keyword: str, position: int) -> bool:
    """`shuffle` and the sampler come from stores into a `**kwargs` dict made
    in the two arms of one `if` (`if distributed: kw["sampler"] = ... else:
    kw["shuffle"] = True`): no run passes both."""
    shuffles = argument_places(model, site, "shuffle", 2)
    samplers = argument_places(model, site, keyword, position)
    return bool(shuffles) and bool(samplers) and all(
        a is not None and b is not None and exclusive(a, b) for a in shuffles for b in samplers)


def _makes_an_object(atom: Made) -> bool:
    if instance_class(atom.model, atom) is not None:
        return True
    name = called_name(atom.model, atom.site) or ""
    return name[:1].isupper()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


@register
class SamplerShuffleConflict(Rule):
    code = "DDP102"
    triggers = (USES_DISTRIBUTED,)
    name = "sampler-shuffle-conflict"
    short = "`shuffle=True` with a sampler: DataLoader raises ValueError"
    severity = Severity.ERROR
    kinds = NOT_TESTS
    fixable = True
    message = ("DataLoader gets both a sampler and shuffle=True: it raises "
               "`ValueError: sampler option is mutually exclusive with shuffle`")
    fix = "pass `shuffle=(sampler is None)`: the sampler (a DistributedSampler shuffles by itself) decides the order"

    def check(self, model: ScriptModel) -> Iterator[Hit]:
        for loader in loaders(model):
            site = loader.site
            shuffle = call_argument(model, site, "shuffle", 2)
            if shuffle is None or resolved(model, shuffle).constant is not True:
                continue
            node = site.arg("shuffle", 2)
            for kw, pos in (("sampler", 3), ("batch_sampler", 4)):
                objects = _sampler_objects(model, site, kw, pos)
                if not objects or _never_together(model, site, kw, pos):
                    continue
                expr = site.arg(kw, pos)
                yield Hit(node if node is not None else site.node,
                          message=self._message(model, kw, expr, objects), fix=self._fix(model, kw, expr),
                          edit=shuffle_edit(site, node, expr) if node is not None and expr is not None else None)
                break

    def _message(self, model: ScriptModel, kw: str, expr, objects: list[Made]) -> str:
        name = (dotted_name(expr) or _short(model.module.code_for_node(expr))) if expr is not None else \
            f"{kw} (passed through **kwargs)"
        distributed = any(instance_of(a, "DistributedSampler") for a in objects)
        error = ("sampler option is mutually exclusive with shuffle" if kw == "sampler" else
                 "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
        when = ("in the distributed run, where it holds a DistributedSampler" if distributed
                else "whenever it is not None")
        return (f"`{kw}={name}` and `shuffle=True` on one DataLoader: the loader raises `ValueError: {error}` "
                f"{when}; the order is the sampler's job (a DistributedSampler shuffles its shard itself, "
                "reseeded by set_epoch)")

    def _fix(self, model: ScriptModel, kw: str, expr) -> str:
        name = dotted_name(expr) if expr is not None else None
        if kw == "batch_sampler":
            return ("remove `shuffle=True` (a loader with a batch_sampler takes no shuffle, batch_size, sampler or "
                    "drop_last): shuffle in the sampler the BatchSampler wraps, e.g. a DistributedSampler reseeded "
                    "by `set_epoch(epoch)`")
        if name:
            return f"pass `shuffle=({name} is None)` (and call `{name}.set_epoch(epoch)` each epoch)"
        return f"drop `shuffle=True`: the {kw} decides the order"
