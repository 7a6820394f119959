"""Metric objects through containers and helpers (model/metrics.py), and
loaders sharded on every path a distributed run takes (model/evaluation.py).

- A helper that calls `update` on an entry of its parameter
  (`scores["op"][i].update(*pair)`) updates the metric objects of the
  container its caller passes (`containers_updated_by`).
- A parameter holding a dict of metric objects built by the caller is those
  objects (`accumulating_object` reads what the file's calls pass).
- A loader factory that makes a DistributedSampler when `distributed` is true
  and a RandomSampler otherwise gives a sharded loader to a distributed run
  (`sharded_when_distributed`), when the flag is the run's world size."""

from __future__ import annotations

from ddpcheck.model.evaluation import sharded_when_distributed
from ddpcheck.model.metrics import accumulating_object, containers_updated_by
from ddpcheck.model.values import held_loaders
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

SCORES = """\
class Hits:
    def __init__(self):
        self.n = 0
    def update(self, p, t):
        self.n += int((p == t).sum())
class Sealed:
    def update(self, p, t):
        self.last = p
def update_all(scores, pairs):
    for i, pair in enumerate(pairs):
        scores["op"][i].update(*pair)
"""


def _containers(tmp_path, made: str) -> list[str]:
    write(tmp_path / "scores.py", SCORES)
    model = build_file(write(tmp_path / "train.py", "from scores import Hits, Sealed, update_all\n"
                                                    f"scores = {{'op': [{made}]}}\n"
                                                    "update_all(scores, [(1, 1)])\n"), tmp_path)
    site = next(c for c in model.calls if c.func == "update_all")
    return [model.module.code_for_node(e) for e in containers_updated_by(model, site)]


def test_a_helper_updating_the_entries_of_its_parameter_updates_the_callers_metrics(tmp_path):
    assert _containers(tmp_path, "Hits()") == ["scores"]


def test_objects_that_keep_no_running_value_are_not_metrics(tmp_path):
    assert _containers(tmp_path, "Sealed()") == []


def test_a_parameter_holds_the_metric_objects_its_callers_pass():
    code = """
        class Hits:
            def __init__(self):
                self.n = 0
            def update(self, p, t):
                self.n += 1
        def validate(scores):
            use(scores["op"][0])
        validate({"op": [Hits()]})
        """
    model = build(code)
    expr, _ = marked(model)
    assert accumulating_object(model, expr, "update")


FACTORY = """\
import torch
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler
def make(ds, distributed):
    if distributed:
        sampler = DistributedSampler(ds, shuffle=False)
    else:
        sampler = RandomSampler(ds)
    return DataLoader(ds, sampler=sampler)
"""


def _sharded(tmp_path, flag: str) -> list[str]:
    write(tmp_path / "data.py", FACTORY)
    model = build_file(write(tmp_path / "train.py", "import os\nfrom data import make\n"
                                                    f"distributed = {flag}\n"
                                                    "val_loader = make([1, 2, 3], distributed)\n"), tmp_path)
    assert [h.key for h in held_loaders(model)] == ["val_loader"]
    return [h.key for h in sharded_when_distributed(model)]


def test_a_sampler_made_only_for_a_single_process_leaves_the_loader_sharded(tmp_path):
    assert _sharded(tmp_path, "int(os.environ.get('WORLD_SIZE', 1)) > 1") == ["val_loader"]
    assert _sharded(tmp_path, "int(os.environ['WORLD_SIZE']) > 1") == ["val_loader"]


def test_a_flag_not_known_to_follow_the_world_size_leaves_it_unknown(tmp_path):
    assert _sharded(tmp_path, "os.environ.get('SHARD') == '1'") == []


def test_a_local_name_bound_to_an_entry_of_the_parameter(tmp_path):
    write(tmp_path / "scores.py", SCORES.replace('        scores["op"][i].update(*pair)\n',
                                                 '        op = scores["op"][i]\n        op.update(*pair)\n'))
    model = build_file(write(tmp_path / "train.py", "from scores import Hits, update_all\n"
                                                    "scores = {'op': [Hits()]}\nupdate_all(scores, [(1, 1)])\n"),
                       tmp_path)
    site = next(c for c in model.calls if c.func == "update_all")
    assert [model.module.code_for_node(e) for e in containers_updated_by(model, site)] == ["scores"]
