"""DDP001 unused-noqa: `# noqa` hygiene (ruff's RUF100).

A `# noqa:` comment is text, not a fact of the ScriptModel: whether it is
used is only known once every other rule has run on the file, so the driver
reports this code (ddpcheck/lint/noqa.py) and `check` finds nothing in the
model. The class is here so the code can be selected, ignored, listed and
documented like every other rule."""

from __future__ import annotations

from typing import Iterator

from ddpcheck.findings import Severity
from ddpcheck.rules.base import Hit, Rule, register


@register
class UnusedNoqa(Rule):
    code = "DDP001"
    name = "unused-noqa"
    short = "`# noqa` directive that suppresses nothing"
    severity = Severity.WARNING
    message = ("a `# noqa: DDPnnn` names a code that is not a ddpcheck rule, or a rule that reports nothing on "
               "that line: a stale suppression silently hides the next real finding there")
    fix = "remove the codes that are not needed and fix misspelt ones (`ddpcheck rules` lists the codes)"
    fixable = False

    def check(self, model) -> Iterator[Hit]:
        return iter(())
