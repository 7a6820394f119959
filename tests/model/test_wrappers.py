"""Which name holds the DDP wrapper where, through parameters; and key renaming
that drops DDP's `module.` prefix, recognised wherever the state dict flows."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ddpcheck.model.project import Project
from ddpcheck.model.wrappers import strips_prefix, wrapper_in
from ddpcheck.settings import LintSettings

SETTINGS = LintSettings(enabled=frozenset())
PRE = "import re\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def _saved(body: str):
    code = PRE + "def save(model, sd, path):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    model = Project(SETTINGS).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "torch.save")
    return model, site.node.args[0].value, site.ctx.function


@pytest.mark.parametrize("body", [
    "torch.save({k[7:]: v for k, v in sd.items()}, path)\n",
    'torch.save({k[len("module."):]: v for k, v in sd.items()}, path)\n',
    'torch.save({k.replace("module.", ""): v for k, v in sd.items()}, path)\n',
    'torch.save({k.removeprefix("module."): v for k, v in sd.items()}, path)\n',
    'torch.save({k.split("module.")[-1]: v for k, v in sd.items()}, path)\n',
    'torch.save({re.sub(r"^module\\.", "", k): v for k, v in sd.items()}, path)\n',
    'prefix = "module."\ntorch.save({k[len(prefix):]: v for k, v in sd.items()}, path)\n',
    'new = {}\nfor k, v in sd.items():\n    name = k[7:] if k.startswith("module.") else k\n    new[name] = v\n'
    'torch.save(new, path)\n',
    'torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")\ntorch.save(sd, path)\n',
])
def test_renamed_keys(body):
    model, expr, scope = _saved(body)
    assert strips_prefix(model, expr, scope)


@pytest.mark.parametrize("body", [
    "torch.save(sd, path)\n",
    "torch.save({k: v.cpu() for k, v in sd.items()}, path)\n",
    "torch.save({k[1:]: v for k, v in sd.items()}, path)\n",
    'torch.save({k.replace("-", "_"): v for k, v in sd.items()}, path)\n',
])
def test_keys_kept(body):
    model, expr, scope = _saved(body)
    assert not strips_prefix(model, expr, scope)


def test_wrapper_followed_into_a_parameter():
    code = PRE + textwrap.dedent("""
        def save_checkpoint(model, path):
            marker(model)
        def main():
            model = DDP(Net())
            save_checkpoint(model, "a.pt")
            save_checkpoint(model.module, "b.pt")
    """)
    model = Project(SETTINGS).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "marker")
    found = wrapper_in(model, site.node.args[0].value, site.ctx)
    assert found is not None and found[0].kind == "DistributedDataParallel"
    assert found[1].func == "save_checkpoint" and found[1].node.args[0].value.value == "model"


def test_inner_module_passed_is_not_the_wrapper():
    code = PRE + textwrap.dedent("""
        def save_checkpoint(model, path):
            marker(model)
        def main():
            model = DDP(Net())
            save_checkpoint(model.module, "b.pt")
    """)
    model = Project(SETTINGS).build("t.py", cst.parse_module(code))
    site = next(c for c in model.calls if c.func == "marker")
    assert wrapper_in(model, site.node.args[0].value, site.ctx) is None
