"""A parameter handed on, unchanged, through a chain of helper functions in
other modules: which parameter of which callee it binds (flow.params_handed_on),
and what is not handed on (rebound first, hidden behind `**kwargs`)."""

from __future__ import annotations

from ddpcheck.model.flow import params_handed_on, resolve_call
from tests.conftest import write
from tests.semantics.helpers import build_file


def _handed(model, fn_name: str) -> set[tuple[str, str, str, str]]:
    site = next(c for c in model.calls if c.func == fn_name)
    tmodel, fn = resolve_call(model, site)
    return {(p, callee.name, tmodel2.file_name, tp) for p, _, tmodel2, callee, tp in params_handed_on(tmodel, fn)}


def test_a_parameter_handed_on_to_a_function_of_a_third_module(tmp_path):
    write(tmp_path / "storage.py", "import torch\ndef write_state(net, path):\n"
                                   "    torch.save(net.state_dict(), path)\n")
    write(tmp_path / "book.py", "from storage import write_state\n"
                                "def end_of_epoch(model, epoch, out):\n"
                                "    write_state(model, out + str(epoch))\n")
    train = write(tmp_path / "train.py", "from book import end_of_epoch\nend_of_epoch(m, 1, 'o')\n")
    assert _handed(build_file(train), "end_of_epoch") == {("model", "write_state", "storage.py", "net")}


def test_by_keyword_and_to_a_constructor(tmp_path):
    write(tmp_path / "rec.py", "class Recorder:\n    def __init__(self, folder, rank=0):\n"
                               "        self.folder = folder\n")
    write(tmp_path / "book.py", "from rec import Recorder\n"
                                "def start(out, rank):\n    return Recorder(rank=rank, folder=out)\n")
    train = write(tmp_path / "train.py", "from book import start\nstart('o', 0)\n")
    assert _handed(build_file(train), "start") == {("out", "__init__", "rec.py", "folder"),
                                                  ("rank", "__init__", "rec.py", "rank")}


def test_a_parameter_rebound_before_the_call_is_not_handed_on(tmp_path):
    write(tmp_path / "storage.py", "def write_state(net, path):\n    pass\n")
    write(tmp_path / "book.py", "from storage import write_state\n"
                                "def end_of_epoch(model, out, flag):\n"
                                "    if flag:\n        model = model.module\n"
                                "    write_state(model, out)\n"
                                "    out = out + '/x'\n"
                                "    write_state(net=None, path=out)\n")
    train = write(tmp_path / "train.py", "from book import end_of_epoch\nend_of_epoch(m, 'o', f)\n")
    # `model` may be the unwrapped module; the second `out` is a new value
    assert _handed(build_file(train), "end_of_epoch") == {("out", "write_state", "storage.py", "path")}


def test_a_call_spreading_kwargs_binds_nothing(tmp_path):
    write(tmp_path / "storage.py", "def write_state(net, path):\n    pass\n")
    write(tmp_path / "book.py", "from storage import write_state\n"
                                "def end_of_epoch(model, **kw):\n    write_state(model, **kw)\n")
    train = write(tmp_path / "train.py", "from book import end_of_epoch\nend_of_epoch(m, path='o')\n")
    # what `**kw` holds decides which parameters are left: nothing is claimed
    assert _handed(build_file(train), "end_of_epoch") == set()
