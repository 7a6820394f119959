"""A process group of one process is not a multi-rank group.

Some scripts start a process group although they run as one process: a
DeepSpeed engine needs a group even on one GPU (`deepspeed --num_gpus 1`,
`python -m torch.distributed.launch --nproc_per_node=1`), a library
initialises one with `world_size=1, rank=0`. Races between ranks, collectives
only some ranks reach, a batch multiplied by the world size: none of that can
happen with one process. `one_process` says when the script's own evidence
shows one process:

- every process group it starts is given the literal `world_size=1` (a
  positional 1 is not looked for); or
- it starts no group of its own and every Lightning `Fabric` / `Trainer` it
  builds is given the literal `devices=1` (with no `num_nodes`); or
- it starts no group of its own, wraps nothing in DDP, and loads its model
  with `from_pretrained(..., device_map="auto")` (or `"balanced"`,
  `"balanced_low_0"`, `"sequential"`) on every path, and no `from_pretrained`
  call passes another `device_map`: that spreads one model over every
  visible GPU in one process, and transformers' Trainer and accelerate refuse to train
  such a model in any distributed mode ("You can't train a model that has
  been loaded with `device_map='auto'` in any distributed mode"), so the
  script cannot run as several ranks; or
- every documented launch command of the script (model/launch.py) that
  names a process count runs one process (`--nproc_per_node=1`,
  `--num_gpus 1`), and there is at least one.

An undocumented process count (`--nproc_per_node=$NGPU`) is not one process,
nor is a count the command reads from a shell variable the script sets to 1
(`NGPUS=1` above `--nproc_per_node=$NGPUS`): the variable is the knob its
user turns for the multi-GPU run.
A plain `python train.py` is not evidence either way: it is how a script that
works on one GPU is run today, and moving it to several is what the user is
about to do (a script whose group starts only when WORLD_SIZE > 1, documented
with `python main.py`, still runs as several ranks under torchrun).
"""

from __future__ import annotations

import re

import libcst as cst

from ddpcheck.model.distributed import is_init_call
from ddpcheck.model.flow import called_qual
from ddpcheck.model.launch import launch_commands, through_launchers
from ddpcheck.model.memo import query
from ddpcheck.model.script import ScriptModel
from ddpcheck.model.values import wraps


_WORLD_OF_ONE = re.compile(r"world_size\s*=\s*1\b")
_ONE_DEVICE = re.compile(r"devices\s*=\s*1\b")
# Lightning's launchers: the processes they start are the `devices` argument's count per node
_LIGHTNING = (("lightning.", "Fabric"), ("lightning.", "Trainer"), ("pytorch_lightning.", "Trainer"))


def _literal_one(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Integer) and expr.evaluated_value == 1


def _lightning_on_one_device(model: ScriptModel) -> bool:
    if any(is_init_call(model, c) for c in model.calls):
        return False
    built = [c for c in model.calls
             if any((called_qual(model, c) or "").startswith(prefix) and (called_qual(model, c) or "").endswith(name)
                    for prefix, name in _LIGHTNING)]
    return bool(built) and all(_literal_one(c.arg("devices")) and c.arg("num_nodes") is None
                               and not c.has_star_args for c in built)


# `device_map` values with which accelerate's big-model loading spreads one
# model over all the GPUs the process sees (naive model parallelism)
_SPREAD_DEVICE_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})


def _spread_device_map(site) -> bool | None:
    """True: `site` passes a literal `device_map` that spreads the model over
    every GPU; False: it passes another one (`{"": local_rank}`, a name, a
    conditional); None: it passes none."""
    expr = site.arg("device_map")
    if expr is None:
        return False if site.has_star_args else None
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value in _SPREAD_DEVICE_MAPS


def _model_spread_over_gpus(model: ScriptModel) -> bool:
    """The script's model is spread over the GPUs of one process on every
    path, and nothing of its own makes it distributed (see the docstring)."""
    if any(is_init_call(model, c) for c in model.calls) or any(w.kind == "DistributedDataParallel"
                                                                for w in wraps(model)):
        return False
    loads = [(c, _spread_device_map(c)) for c in model.calls if c.attr == "from_pretrained"]
    if any(spread is False for _, spread in loads):
        return False
    return any(spread and not c.ctx.branches and not c.ctx.opaque for c, spread in loads)


@query(on_cycle=None)
def one_process(model: ScriptModel) -> str | None:
    """Why the script runs as one process (for messages and tests), or None
    when it may run several."""
    if _WORLD_OF_ONE.search(model.text):   # a literal group of one is written `world_size=1`
        inits = [c for c in model.calls if is_init_call(model, c)]
        if inits and all(_literal_one(c.arg("world_size", 3)) for c in inits):
            return "its process group is started with `world_size=1`"
    if _ONE_DEVICE.search(model.text) and _lightning_on_one_device(model):
        return "Lightning is given `devices=1`: it starts one process"
    if "device_map" in model.text and _model_spread_over_gpus(model):
        return "its model is loaded with a `device_map` that spreads it over the GPUs of one process"
    commands = through_launchers(launch_commands(model))
    if not commands or any(c.processes != 1 or c.count_in_variable for c in commands):
        return None
    return f"every documented launch runs one process ({commands[0].where}: `{commands[0].text}`)"


__all__ = ["one_process"]
