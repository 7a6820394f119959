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


def _rank_handed(tmp_path, store: str) -> list[str]:
    from ddpcheck.model.ranks import RankKind, ranks_handed_to_helpers

    write(tmp_path / "engine.py", "def fit(net, opts):\n    net.cuda(opts.rank)\n"
                                  "def run(net, opts):\n    fit(net, opts)\n")
    write(tmp_path / "train.py", "import torch.distributed as dist\nfrom engine import run\n"
                                 "def worker(gpu, opts):\n"
                                 f"    {store}\n"
                                 "    dist.init_process_group('nccl', rank=opts.rank)\n"
                                 "    run(net, opts)\n")
    model = build_file(tmp_path / "train.py", tmp_path)
    site = next(c for c in model.calls if c.func == "run")
    return [h.origin.kind.name for h in ranks_handed_to_helpers(model, site) if h.origin.kind is RankKind.GLOBAL]


def test_an_options_field_handed_to_a_helper_module_two_calls_down_is_what_the_caller_stored(tmp_path):
    assert _rank_handed(tmp_path, "opts.rank = opts.node * opts.gpus + gpu") == ["GLOBAL"]


def test_a_local_index_or_a_store_on_some_paths_only_is_not_the_global_rank(tmp_path):
    assert _rank_handed(tmp_path, "opts.rank = gpu") == []
    assert _rank_handed(tmp_path, "if opts.multi:\n        opts.rank = opts.node * opts.gpus + gpu") == []
