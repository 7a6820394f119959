"""The rule pack. Every module here named `ddpNNN_<name>.py` defines one rule
and registers it on import; adding a rule is adding a module (and its page in
rules/<CODE>.md)."""

import importlib
import pkgutil
import re

from ddpcheck.rules.base import REGISTRY, Hit, Rule, register  # noqa: F401

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    if re.fullmatch(r"ddp\d{3}_\w+", _info.name):
        importlib.import_module(f"{__name__}.{_info.name}")
