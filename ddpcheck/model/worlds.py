"""Which processes run a piece of code.

A script launched with torchrun runs in one of three *worlds*: rank 0 of a
distributed job (D0), any other rank (DN), or a plain single process (S, the
`else` of `if args.distributed:`). Every `if` narrows the set of worlds its
branches run in; a RankGuard is a test that tells those worlds apart. Rules ask
questions such as "can a non-zero rank reach this `torch.save`?" (DDP301) or
"does rank 0 reach this barrier while the other ranks skip it?" (DDP401).
"""

from __future__ import annotations

from dataclasses import dataclass

D0 = "D0"  # rank 0 of a distributed job
DN = "DN"  # a non-zero rank of a distributed job
S = "S"    # a single, non-distributed process

ALL: frozenset[str] = frozenset({D0, DN, S})
NONE: frozenset[str] = frozenset()
MAIN: frozenset[str] = frozenset({D0, S})     # `if rank == 0` / `is_main_process()`
DISTRIBUTED: frozenset[str] = frozenset({D0, DN})  # `if args.distributed`
SINGLE: frozenset[str] = frozenset({S})        # `if not args.distributed`


@dataclass(frozen=True)
class Condition:
    """What a test says about the worlds: `must` are the worlds where it is
    certainly true, `may` where it can be true. An unknown test is
    (NONE, ALL): both branches may run anywhere."""

    must: frozenset[str]
    may: frozenset[str]

    @classmethod
    def exactly(cls, worlds: frozenset[str]) -> "Condition":
        return cls(worlds, worlds)

    @property
    def known(self) -> bool:
        return self.must == self.may

    def negate(self) -> "Condition":
        return Condition(ALL - self.may, ALL - self.must)

    def and_(self, other: "Condition") -> "Condition":
        return Condition(self.must & other.must, self.may & other.may)

    def or_(self, other: "Condition") -> "Condition":
        return Condition(self.must | other.must, self.may | other.may)

    @property
    def true_branch(self) -> frozenset[str]:
        return self.may

    @property
    def false_branch(self) -> frozenset[str]:
        return ALL - self.must


UNKNOWN = Condition(NONE, ALL)
TRUE = Condition(ALL, ALL)
FALSE = Condition(NONE, NONE)


def only_some_ranks(worlds: frozenset[str]) -> bool:
    """Reached by rank 0 or by the other ranks of a distributed job, not both."""
    dist = worlds & DISTRIBUTED
    return len(dist) == 1


def describe(worlds: frozenset[str]) -> str:
    if worlds & DISTRIBUTED == {D0}:
        return "only rank 0"
    if worlds & DISTRIBUTED == {DN}:
        return "only the non-zero ranks"
    if not worlds & DISTRIBUTED:
        return "only without distribution"
    return "every rank"
