"""Line numbers of nodes other than the reported one, for messages that point
elsewhere ("CUDA was initialised at line 12"). Positions cost a metadata pass,
so they are computed once per model and only when a rule asks (rules ask
only when they are about to report)."""

from __future__ import annotations

from libcst.metadata import MetadataWrapper, PositionProvider

from ddpcheck.model.query import query
from ddpcheck.model.script import ScriptModel


@query
def _positions(model: ScriptModel):
    return MetadataWrapper(model.module, unsafe_skip_copy=True).resolve(PositionProvider)


def line_of(model: ScriptModel, node) -> int | None:
    pos = _positions(model).get(node)
    return pos.start.line if pos is not None else None


def where(model: ScriptModel, node, here: ScriptModel | None = None) -> str:
    """`line 12`, or `utils.py:12` when the node is in another file than `here`."""
    line = line_of(model, node)
    if here is not None and model is not here:
        name = model.path.replace("\\", "/").rpartition("/")[2]
        return f"{name}:{line}" if line else name
    return f"line {line}" if line else "elsewhere"
