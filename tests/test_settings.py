"""Settings reach the analysis as the typed LintSettings: extra main-process
guards from config change what counts as guarded."""

from __future__ import annotations

import dataclasses

import libcst as cst
import pytest

from ddpcheck.model.project import Project
from ddpcheck.model.worlds import DN
from ddpcheck.settings import LintSettings
from ddpcheck.model.guards import worlds

CODE = "import torch\nif on_chief(cfg):\n    torch.save(state, 'ckpt.pt')\n"


def _save_reached_by_other_ranks(settings: LintSettings) -> bool:
    model = Project(settings).build("t.py", cst.parse_module(CODE))
    save = next(c for c in model.calls if c.func == "torch.save")
    return DN in worlds(model, save.ctx)


def test_configured_guard_names_are_read_from_the_typed_settings():
    assert _save_reached_by_other_ranks(LintSettings(enabled=frozenset()))
    assert not _save_reached_by_other_ranks(LintSettings(enabled=frozenset(), main_process_guards=("on_chief",)))


def test_settings_are_typed_fields_of_a_frozen_dataclass():
    fields = dataclasses.fields(LintSettings)
    assert {"enabled", "main_process_guards", "root"} <= {f.name for f in fields}
    assert not [f.name for f in fields if str(f.type).startswith(("dict", "Any"))]   # no untyped bag
    with pytest.raises(dataclasses.FrozenInstanceError):
        LintSettings(enabled=frozenset()).root = "x"  # type: ignore[misc]
