"""Command-line options a script declares with argparse (`add_argument`):
their dest, option strings, default and help text. DDP103 reads the help text
("total batch size across all GPUs"), DDP501 the `--local_rank` spellings."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.flow import called_name
from ddpcheck.model.names import string_value
from ddpcheck.model.memo import query
from ddpcheck.model.script import CallSite, ScriptModel


@dataclass(frozen=True)
class Option:
    site: CallSite
    flags: tuple[str, ...]
    dest: str
    help: str

    @property
    def default(self) -> cst.BaseExpression | None:
        return self.site.arg("default")




@query
def options(model: ScriptModel) -> list[Option]:
    found = []
    for site in model.calls:
        if site.attr != "add_argument" and called_name(model, site) != "add_argument":
            continue   # `parser.add_argument(...)`, or an alias of it: `arg = parser.add_argument; arg(...)`
        flags = tuple(s for s in (string_value(a.value) for a in site.node.args if a.keyword is None) if s)
        if not flags:
            continue
        dest = string_value(site.arg("dest"))
        if dest is None:
            longs = [f for f in flags if f.startswith("--")]
            dest = (longs[0] if longs else flags[0]).lstrip("-").replace("-", "_")
        found.append(Option(site, flags, dest, string_value(site.arg("help")) or ""))
    return found
