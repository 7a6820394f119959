"""Which saved state dicts lost the wrapper's `module.` prefix on the way to
the file (model/wrappers.py `strips_prefix`, through a helper of the project
in any module), and which loads read back a checkpoint the module wrote from
a wrapper (`loads_own_wrapped_checkpoint`)."""

from __future__ import annotations

import pytest

from ddpcheck.model.wrappers import loads_own_wrapped_checkpoint, renames_prefix_on_load, strips_prefix
from tests.conftest import write
from tests.semantics.helpers import build, build_file, marked

LOOP_HELPER = """
def {name}(sd):
    out = {{}}
    for key, value in sd.items():
        {test}
            out[{key}] = value
        {other}
    return out
"""


def _stripped(code: str) -> bool:
    model = build(code)
    expr, site = marked(model)
    return strips_prefix(model, expr, site.ctx.function)


@pytest.mark.parametrize("test,key,other,expected", [
    ("if 'module' in key:", "key[7:]", "else:\n            out[key] = value", True),
    ("if key.startswith('module.'):", "key[len('module.'):]", "", True),
    ("if True:", "key.replace('module.', '')", "", False),   # a test that says nothing of the key
    ("if 'module' in key:", "key[6:]", "", False),             # another prefix's length
    ("if 'module' in key:", "key.replace('model.', '')", "", False),
    ("if 'module' in key:", "key", "", False),                 # copied unchanged
])
def test_a_loop_helper_that_drops_the_prefix(test, key, other, expected):
    code = LOOP_HELPER.format(name="translate", test=test, key=key, other=other) + \
        "use(translate(net.state_dict()))\n"
    assert _stripped(code) is expected


def test_an_unconditional_loop_and_a_comprehension_helper():
    assert _stripped("def plain(sd):\n    new = {}\n    for k, v in sd.items():\n        new[k[7:]] = v\n"
                     "    return new\nuse(plain(net.state_dict()))\n")
    assert _stripped("def plain(sd):\n    return {k.replace('module.', ''): v for k, v in sd.items()}\n"
                     "use(plain(net.state_dict()))\n")


def test_a_helper_with_one_plain_return_does_not_strip():
    assert not _stripped("def plain(sd, keep):\n    if keep:\n        return sd\n"
                         "    return {k[7:]: v for k, v in sd.items()}\nuse(plain(net.state_dict(), flag))\n")


def test_an_unknown_helper_stays_unknown():
    assert not _stripped("import tools\nuse(tools.translate(net.state_dict()))\n")


def test_a_helper_of_another_module(tmp_path):
    write(tmp_path / "ckpt_tools.py", LOOP_HELPER.format(
        name="translate", test="if 'module' in key:", key="key[7:]", other=""))
    train = write(tmp_path / "train.py", "from ckpt_tools import translate\nuse(translate(net.state_dict()))\n")
    model = build_file(train, root=tmp_path)
    expr, site = marked(model)
    assert strips_prefix(model, expr, site.ctx.function)


ROUND_TRIP = """
import os
import torch
from torch.nn import DataParallel
from torch.nn.parallel import DistributedDataParallel as DDP

def fit(log):
    net = {saved_kind}(make())
    torch.save([net.state_dict(), 3], os.path.join(log, "checkpoint.pth"))

def sample(log, other):
    net = DataParallel(make())
    ckpt = torch.load({path})
    use(ckpt[0])
"""


@pytest.mark.parametrize("saved_kind,path,expected", [
    ("DataParallel", 'os.path.join(log, "checkpoint.pth")', True),
    ("DataParallel", 'f"{log}/checkpoint.pth"', True),              # the same path, spelled another way
    ("DataParallel", '"{}/checkpoint.pth".format(log)', True),
    ("DataParallel", 'os.path.join(log, "best.pth")', False),      # another file
    ("DataParallel", "other", False),                               # a path from elsewhere
    ("DataParallel", 'os.path.join(other, "checkpoint.pth")', False),   # another folder
    ("DDP", 'os.path.join(log, "checkpoint.pth")', True),           # DDP's keys carry the same `module.`
    ("make", 'os.path.join(log, "checkpoint.pth")', False),         # written from the bare network
])
def test_a_load_of_the_modules_own_wrapped_checkpoint(saved_kind, path, expected):
    model = build(ROUND_TRIP.format(saved_kind=saved_kind, path=path))
    expr, _site = marked(model)
    assert loads_own_wrapped_checkpoint(model, expr) is expected


OPENED = """
import os
import torch
from torch.nn import DataParallel

def train(model_dir):
    net = DataParallel(make())
    path = os.path.join(model_dir, "model.pth")
    torch.save(net.state_dict(), path)

def serve(model_dir):
    net = DataParallel(make())
    with open({opened}, "rb") as f:
        use(torch.load(f))
"""


@pytest.mark.parametrize("opened,expected", [
    ('os.path.join(model_dir, "model.pth")', True),    # a file opened at the path the variable holds
    ('os.path.join(model_dir, "other.pth")', False),
])
def test_a_file_opened_at_the_saved_path(opened, expected):
    model = build(OPENED.format(opened=opened))
    expr, _site = marked(model)
    assert loads_own_wrapped_checkpoint(model, expr) is expected


def test_a_load_bound_to_two_sources_is_not_tied():
    code = ROUND_TRIP.format(saved_kind="DataParallel", path='os.path.join(log, "checkpoint.pth")').replace(
        "    use(ckpt[0])", "    if other:\n        ckpt = torch.load(other)\n    use(ckpt[0])")
    model = build(code)
    expr, _site = marked(model)
    assert not loads_own_wrapped_checkpoint(model, expr)


def test_a_save_in_a_module_the_script_imports(tmp_path):
    write(tmp_path / "trainer.py", (
        "import os\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "CKPT = 'last.pt'\n"
        "def fit(cfg):\n    net = DDP(make())\n    torch.save(net.state_dict(), os.path.join(cfg.out_dir, CKPT))\n"))
    train = write(tmp_path / "run.py", (
        "import os\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from trainer import fit, CKPT\n"
        "def main(cfg):\n    fit(cfg)\n    net = DDP(make())\n    last = os.path.join(cfg.out_dir, CKPT)\n"
        "    use(torch.load(last))\n    use(torch.load(os.path.join(cfg.out_dir, 'first.pt')))\n"))
    model = build_file(train, root=tmp_path)
    tied, other = (marked(model, nth=i)[0] for i in (0, 1))
    assert loads_own_wrapped_checkpoint(model, tied)
    assert not loads_own_wrapped_checkpoint(model, other)


LOADER = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class Interpolator:
    def __init__(self):
        self.net = DDP(make())

    def load_model(self, folder):
        def convert(weights):
            return {{{key}: v for k, v in weights.items() if "module." in k and "grid" not in k}}
        self.net.load_state_dict(convert(torch.load(folder + "/net.pkl")))
"""


@pytest.mark.parametrize("key,expected", [
    ('k.replace("module.", "")', True),
    ("k[7:]", True),
    ('k.replace("encoder.", "")', False),   # another prefix
    ("k", False),                           # the keys kept as they are
])
def test_a_local_function_of_the_loading_method_that_drops_the_prefix(key, expected):
    model = build(LOADER.format(key=key))
    assert renames_prefix_on_load(model) is expected


@pytest.mark.parametrize("handed,folder,expected", [
    ("net", "cfg.out_dir", True),           # the wrapper and the folder the load reads
    ("net.module", "cfg.out_dir", False),   # the plain model's keys
    ("net", "cfg.tmp_dir", False),          # another folder
])
def test_a_save_helper_handed_the_wrapper_and_the_folder(tmp_path, handed, folder, expected):
    write(tmp_path / "ckpt_utils.py", (
        "import os\nimport torch\n"
        "def save_weights(model, out_dir):\n"
        "    torch.save(model.state_dict(), os.path.join(out_dir, 'weights.pt'))\n"))
    run = write(tmp_path / "run.py", (
        "import os\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from ckpt_utils import save_weights\n"
        f"def main(cfg):\n    net = DDP(make())\n    save_weights({handed}, {folder})\n"
        "    use(torch.load(f'{cfg.out_dir}/weights.pt'))\n"))
    model = build_file(run, root=tmp_path)
    expr, _site = marked(model)
    assert loads_own_wrapped_checkpoint(model, expr) is expected


_EVALUATE = ("import torch\nfrom torch.nn import DataParallel\n"
             "def validation(net, loader):\n    return [net(x) for x in loader]\n"
             "def main(opt):\n    net = DataParallel(make())\n    use(torch.load(opt.saved_model))\n")
_TRAIN = ("import os\nimport torch\nfrom torch.nn import DataParallel\nfrom evaluate import validation\n"
          "def train(opt):\n    opt.exp = f'{opt.arch}-{opt.seed}'\n    net = DataParallel(make())\n"
          "    optimizer = torch.optim.Adam(net.parameters())\n    validation(net, [])\n"
          "    torch.save(net.state_dict(), f'./saved_models/{opt.exp}/best.pth')\n"
          "    torch.save(net.module.state_dict(), os.path.join(opt.out, 'plain.pth'))\n")
_README = "python evaluate.py --data val/ --saved_model {}\n"


def _run_time_path_is_own(tmp_path, train: str | None, documented: list[str]) -> bool:
    write(tmp_path / "LICENSE", "")
    evaluate = write(tmp_path / "evaluate.py", _EVALUATE)
    if train is not None:
        write(tmp_path / "train.py", train)
    write(tmp_path / "README.md", "".join(_README.format(d) for d in documented))
    model = build_file(evaluate, root=tmp_path)
    return loads_own_wrapped_checkpoint(model, marked(model)[0])


def test_a_documented_option_value_names_a_file_the_project_writes_wrapped(tmp_path):
    # the training script beside it imports it and writes best.pth from the DataParallel wrapper
    assert _run_time_path_is_own(tmp_path, _TRAIN, ["saved_models/resnet-1/best.pth"])


@pytest.mark.parametrize("documented", [
    [],                                                            # no documented value: unknown
    ["weights/released.pth"],                                      # a file the project does not write
    ["saved_models/resnet-1/best.pth", "pretrained/plain.pth"],    # one documented file is plain weights
    ["$CKPT"],
])
def test_other_documented_values_leave_the_path_unknown(tmp_path, documented):
    assert not _run_time_path_is_own(tmp_path, _TRAIN, documented)


def test_a_writer_that_does_not_import_the_loading_module_is_another_program(tmp_path):
    alone = _TRAIN.replace("from evaluate import validation\n", "").replace("    validation(net, [])\n", "")
    assert not _run_time_path_is_own(tmp_path, alone, ["saved_models/resnet-1/best.pth"])
