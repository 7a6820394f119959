"""Every rule module registers itself on import."""

from ddpcheck.rules.base import REGISTRY, Hit, Rule, register  # noqa: F401
from ddpcheck.rules import (  # noqa: F401
    ddp101_missing_set_epoch,
)
