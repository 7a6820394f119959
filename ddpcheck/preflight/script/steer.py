"""Bound the script's run and aim it at the failures that come late (inside a rank).

* Every DataLoader with a batch sampler serves the epoch's **last** batch first
  (the short one: a last batch of 1 sample breaking BatchNorm shows in step 1,
  not after hours), then its first batches, ``steps`` in all, then ends the
  epoch, so the script's own loop goes on to its per-epoch evaluation,
  checkpoint and the next epoch's ``set_epoch``.
* The batches are the real epoch's: the batch sampler is iterated in full (its
  sampler's shuffle and ``set_epoch`` apply as always), only the order in which
  they are served changes. The DataLoader keeps its ``len``, ``batch_size`` and
  ``sampler``.
* An epoch is a pass over the training loader (the one an optimizer stepped
  during) in which the optimizer stepped: a peek (``next(iter(loader))`` to
  read the batch size), an evaluation pass or a ``len()`` is not one. The run
  is stopped at the second batch of the first pass after a training epoch:
  the second epoch's first step runs, then :class:`PreflightStop` ends the
  script on every rank at the same point.
* A script without a DataLoader is stopped after ``3 x steps`` optimizer steps.

:class:`PreflightStop` derives from ``BaseException`` so the script's own
``except Exception:`` does not swallow it.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Optional

from ddpcheck.preflight.script.facts import EpochFact, LoaderFact

HEAD = 8  # indices kept per epoch for the report
MAX_UNSTEPPED = 16  # batches served to a pass in which the optimizer has not stepped yet


class PreflightStop(BaseException):
    """The preflight's planned end of the script's run."""


def order_digest(batches: list) -> str:
    h = hashlib.blake2b(digest_size=8)
    for batch in batches:
        h.update(repr(batch).encode())
        h.update(b";")
    return h.hexdigest()


def schedule(total: int, steps: int) -> list[int]:
    """Positions of the batches served: the last one first, then the first ones."""
    if total <= 0:
        return []
    if total == 1:
        return [0]
    return [total - 1] + list(range(min(steps - 1, total - 1)))


class Steering:
    """The plan: how many steps per epoch, when to stop."""

    def __init__(self, steps: int):
        self.steps = max(1, steps)
        self.optimizer_steps = 0
        self.current: Optional[LoaderFact] = None  # the loader whose batch came last
        self.on_batch: Optional[Callable[[LoaderFact, int, int], None]] = None
        self.stop_reason = ""

    def optimizer_stepped(self, loaders: list) -> None:
        self.optimizer_steps += 1
        if self.current is not None:
            self.current.training = True
            if self.current.epochs:
                self.current.epochs[-1].steps += 1
        if self.optimizer_steps >= 3 * self.steps and not any(f.training and f.steered
                                                               for f in loaders):
            self.stop_reason = (f"{self.optimizer_steps} optimizer steps without a DataLoader "
                                f"the preflight could steer")
            raise PreflightStop(self.stop_reason)

    def should_stop(self, fact: LoaderFact, served: int) -> bool:
        """Stop at the second batch of a pass that follows a training epoch (a peek
        before the next epoch's ``set_epoch`` serves its one batch and goes on)."""
        return served >= 1 and any(e.training for e in fact.epochs[:-1])


def steered_batch_sampler(inner, fact: LoaderFact, steering: Steering,
                          set_epoch_calls: Callable[[], int], sampler):
    """A torch ``Sampler`` over batches that serves ``inner``'s real epoch in the
    preflight's order (see the module doc)."""
    from torch.utils.data import Sampler

    class SteeredBatchSampler(Sampler):
        def __init__(self):
            self.inner = inner

        def __len__(self):
            return len(inner)

        def __getattr__(self, name):  # batch_size, drop_last, sampler of the real one
            return getattr(inner, name)

        def __iter__(self):
            batches = [list(b) for b in inner]
            number = len(fact.epochs) + 1
            epoch = EpochFact(number=number,
                              sampler_epoch=getattr(sampler, "epoch", None),
                              set_epoch_calls=set_epoch_calls(),
                              order_digest=order_digest(batches),
                              head=[i for b in batches[:2] for i in b][:HEAD],
                              batches_total=len(batches),
                              first_batch=len(batches[-1]) if batches else 0)
            fact.epochs.append(epoch)
            served = 0
            for pos in schedule(len(batches), len(batches)):
                # `steps` batches; when the script consumed them all without an optimizer
                # step (gradient accumulation), on until it steps (loader workers fetch
                # ahead of the script: there the plan stays `steps` batches)
                accumulating = not epoch.steps and epoch.batches_served == served
                if served >= steering.steps and (not accumulating or served >= MAX_UNSTEPPED):
                    break
                served += 1
                yield batches[pos]

    steered = SteeredBatchSampler()
    steered.ddpcheck_fact = fact
    return steered


def steered_next(real_next, steering: Steering):
    """``_BaseDataLoaderIter.__next__`` that counts the batches a steered loader
    *delivers* (with workers, indices are fetched ahead; delivery is what the
    training loop sees) and stops the run at the planned batch."""
    import functools

    @functools.wraps(real_next)
    def __next__(it):
        fact = getattr(getattr(it, "_index_sampler", None), "ddpcheck_fact", None)
        if fact is None:
            return real_next(it)
        served = getattr(it, "_ddpcheck_served", 0)
        if steering.should_stop(fact, served):
            fact.epochs[-1].ended_run = True
            before = sum(1 for e in fact.epochs[:-1] if e.training)
            steering.stop_reason = (f"epoch {before + 1} of the training DataLoader "
                                    f"({fact.where}) reached")
            raise PreflightStop(steering.stop_reason)
        steering.current = fact
        if steering.on_batch is not None and served:
            before = sum(1 for e in fact.epochs[:-1] if e.training)
            steering.on_batch(fact, before + 1, served)
        batch = real_next(it)
        it._ddpcheck_served = served + 1
        fact.epochs[-1].batches_served = served + 1
        return batch

    return __next__
