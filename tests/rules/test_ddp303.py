"""DDP303 load-without-map-location: beyond the fixtures."""

from pathlib import Path

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY
from tests.conftest import write
from tests.rules.lintsnippet import findings, lines

DIST = """\
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
model = build().cuda()
"""


def test_message_names_the_call_and_the_fix():
    [f] = findings("DDP303", DIST + "ckpt = torch.load(args.resume)\n")
    assert f.line == 5
    assert "torch.load(args.resume)" in f.message and "cuda:0" in f.message
    assert 'map_location="cpu"' in f.fix
    assert f.severity.name == "WARNING"


def test_map_location_forms_are_all_fine():
    for call in (
        'torch.load(p, map_location="cpu")',
        "torch.load(p, loc)",
        "torch.load(p, map_location=lambda s, l: s)",
        "torch.load(p, **kw)",
        "torch.hub.load('pytorch/vision', 'resnet50')",
        "torch.jit.load(p)",
    ):
        assert lines("DDP303", DIST + f"x = {call}\n") == [], call


def test_aliases():
    src = DIST + "from torch import load as tload\nckpt = tload(args.resume)\n"
    assert lines("DDP303", src) == [6]


def test_data_files_are_not_checkpoints():
    src = DIST + "features = torch.load(cached_features_file)\nds = TensorDataset(torch.load('labels.pt'))\n" \
        "sd = torch.load(path)\nmodel.load_state_dict(sd)\n"
    assert lines("DDP303", src) == [7]


def test_not_distributed_or_not_cuda_is_silent():
    assert lines("DDP303", "import torch\n# torchrun\nx = torch.load(p)\n") == []
    gloo = 'import torch\nimport torch.distributed as dist\ndist.init_process_group("gloo")\nx = torch.load(p)\n'
    assert lines("DDP303", gloo) == []


def test_rank_zero_and_single_process_arms_are_silent():
    src = DIST + """
if dist.get_rank() == 0:
    a = torch.load(p)
if args.distributed:
    pass
else:
    b = torch.load(p)
"""
    assert lines("DDP303", src) == []


def test_constructor_reached_through_its_class():
    src = DIST + """
class Trainer:
    def __init__(self, path):
        self.state = torch.load(path)

Trainer("snap.pt")
"""
    assert lines("DDP303", src) == [8]


def test_local_helper_resolution(tmp_path: Path):
    write(tmp_path / "helpers.py", """\
        import torch.distributed as dist

        def prepare():
            dist.init_process_group("nccl")

        def leader():
            return dist.get_rank() == 0
        """)
    train = write(tmp_path / "train.py", """\
        # torchrun --nproc_per_node=8 train.py
        import torch
        from helpers import leader, prepare

        prepare()
        model = build().cuda()
        a = torch.load("a.pth")
        if leader():
            b = torch.load("b.pth")
        """)
    result = lint_path(str(train), LintSettings(enabled=frozenset(REGISTRY)))
    assert [f.line for f in result.findings if f.code == "DDP303"] == [7]
    # without the helper module nothing says the script is distributed
    (tmp_path / "helpers.py").unlink()
    result = lint_path(str(train), LintSettings(enabled=frozenset(REGISTRY)))
    assert [f.line for f in result.findings if f.code == "DDP303"] == []


def test_other_arm_maps_the_same_file():
    src = DIST + """
if args.gpu is None:
    checkpoint = torch.load(args.resume)
else:
    checkpoint = torch.load(args.resume, map_location="cuda:{}".format(args.gpu))
"""
    assert lines("DDP303", src) == []
