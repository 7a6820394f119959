"""DDP503 missing-set-device: beyond the fixtures."""

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from tests.rules.lintsnippet import findings, lines

HEAD = "import os\nimport torch\nimport torch.distributed as dist\n"


def test_reported_at_the_init_naming_the_placement():
    src = HEAD + 'dist.init_process_group("nccl")\nx = torch.ones(2).cuda()\n'
    (f,) = findings("DDP503", src)
    assert f.line == 4 and f.severity.name == "WARNING"
    assert "(line 5)" in f.message and "GPU 0" in f.message
    assert "torch.cuda.set_device(local_rank)" in f.fix


def test_backends():
    nccl = ['"nccl"', 'backend="nccl"', '"cuda:nccl,cpu:gloo"', "dist.Backend.NCCL", "",
            '"nccl" if torch.cuda.is_available() else "gloo"']
    for backend in nccl:
        src = HEAD + f"dist.init_process_group({backend})\nmodel = build().cuda()\n"
        assert lines("DDP503", src) == [4], backend
    for backend in ('"gloo"', 'backend="mpi"', "args.backend", "dist.Backend.GLOO"):
        src = HEAD + f"dist.init_process_group({backend})\nmodel = build().cuda()\n"
        assert lines("DDP503", src) == [], backend


def test_what_counts_as_choosing_the_gpu():
    chosen = [
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
        "ctx = torch.cuda.device(int(os.environ['LOCAL_RANK']))",
        "y = t.cuda(int(os.environ['LOCAL_RANK']))",
        "y = t.to(local_rank)",
        "y = t.to(f'cuda:{local_rank}')",
        "y = t.to(torch.device('cuda', args.gpu))",
        "y = t.to('cuda:{}'.format(rank))",
        "torch.set_default_device(f'cuda:{local_rank}')",
        "os.environ['CUDA_VISIBLE_DEVICES'] = os.environ['LOCAL_RANK']",
        "setup_device(args)",   # a helper we cannot read
    ]
    for line in chosen:
        src = HEAD + f"{line}\ndist.init_process_group('nccl')\nmodel = build().cuda()\n"
        assert lines("DDP503", src) == [], line


def test_fixed_devices_are_bare():
    for placement in ('x = t.to("cuda")', 'x = t.to("cuda:0")', "x = t.to(torch.device('cuda'))",
                      "x = torch.zeros(3, device='cuda')", "x = t.cuda(non_blocking=True)",
                      "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\nx = t.to(device)"):
        src = HEAD + "dist.init_process_group('nccl')\n" + placement + "\n"
        assert lines("DDP503", src) == [4], placement


def test_bare_placement_only_without_distribution():
    src = HEAD + """\
if args.distributed:
    dist.init_process_group("nccl")
    model = model.to(f"cuda:{args.gpu}")
else:
    model = model.cuda()
"""
    assert lines("DDP503", src) == []
    src = HEAD + """\
if args.distributed:
    dist.init_process_group("nccl")
if not args.distributed:
    model = model.cuda()
"""
    assert lines("DDP503", src) == []


def test_helper_module_without_set_device_is_reported_at_its_call(tmp_path):
    (tmp_path / "launch_utils.py").write_text(textwrap.dedent("""\
        import torch.distributed as dist

        def setup(backend="nccl"):
            dist.init_process_group(backend)
        """))
    train = tmp_path / "train.py"
    train.write_text("import torch\nimport torch.distributed as dist\nfrom launch_utils import setup\n\n"
                     "setup()\nmodel = torch.nn.parallel.DistributedDataParallel(build().cuda())\n")
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP503"})))
    assert [f.line for f in result.findings] == [5]
    assert "`setup(...)`" in result.findings[0].message
