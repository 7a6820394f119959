"""Every rule module registers itself on import."""

from ddpcheck.rules.base import REGISTRY, Hit, Rule, register  # noqa: F401
from ddpcheck.rules import (  # noqa: F401
    ddp101_missing_set_epoch,
    ddp103_undivided_batch,
    ddp201_syncbn_after_ddp,
    ddp202_wrap_before_load,
    ddp301_unguarded_save,
)
