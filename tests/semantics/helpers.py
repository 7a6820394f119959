"""Building a model from a snippet and pointing at a read in it.

A snippet marks the expression a test asks about by passing it to a call of
`use(...)` (or another marker name): `use(loader)` asks about `loader` there.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst

from ddpcheck.model.dataflow import Entry
from ddpcheck.model.project import Project
from ddpcheck.settings import LintSettings

SETTINGS = LintSettings(enabled=frozenset())


def build(code: str, path: str = "t.py", root: Path | None = None):
    settings = SETTINGS if root is None else LintSettings(enabled=frozenset(), root=str(root))
    text = textwrap.dedent(code)
    return Project(settings).build(path, cst.parse_module(text), text)


def build_file(path: Path, root: Path | None = None):
    return build(path.read_text(), str(path), root)


def marked(model, marker: str = "use", nth: int = 0):
    """The expression passed to the `nth` call of `marker(...)`, and the call."""
    sites = [c for c in model.calls if c.func == marker]
    site = sites[nth]
    return site.node.args[0].value, site


def describe(model, binding) -> str:
    """A binding as a test names it: the source of the value it binds
    (`DDP(m)`), `value[1]` for an unpacked element, `kind:key` for the
    other bindings, ENTRY for "from outside this scope"."""
    if isinstance(binding, Entry):
        return "ENTRY"
    source = getattr(binding, "value", None)
    if source is not None and binding.kind == "assign":
        return model.module.code_for_node(source).strip()
    if binding.kind == "assign" and binding.path:
        return f"{model.module.code_for_node(binding.node.value).strip()}{list(binding.path)}"
    return f"{binding.kind}:{binding.key}"


def reaching(code: str, marker: str = "use", nth: int = 0) -> set[str]:
    """What reaches the marked read, described."""
    model = build(code)
    expr, _ = marked(model, marker, nth)
    return {describe(model, b) for b in model.reach[id(expr)]}
