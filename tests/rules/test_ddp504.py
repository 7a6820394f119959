"""DDP504 lr-not-scaled: beyond the fixtures."""

from pathlib import Path

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from ddpcheck.rules import REGISTRY
from tests.conftest import write
from tests.rules.lintsnippet import findings, lines

HEAD = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("nccl")
train_loader = DataLoader(ds, batch_size=args.batch_size, sampler=DistributedSampler(ds))
"""
OPT = "optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)\n"


def test_message_offers_linear_and_sqrt():
    [f] = findings("DDP504", HEAD + OPT)
    assert f.line == 6 and f.severity.name == "INFO"
    assert "`args.lr`" in f.message and "args.batch_size x world size" in f.message
    assert "args.lr * W" in f.fix and "W ** 0.5" in f.fix and "dividing" in f.fix


def test_world_factors_anywhere_silence_it():
    for scaling in (
        "args.lr = args.lr * dist.get_world_size()\n",
        "args.lr *= args.world_size\n",
        "world = dist.get_world_size()\nbase_lr = args.lr * world ** 0.5\n",
        "eff = args.batch_size * dist.get_world_size()\nargs.lr = args.blr * eff / 256\n",
        "scale_lr(args)\n",
    ):
        assert lines("DDP504", HEAD + scaling + OPT) == [], scaling
    assert lines("DDP504", HEAD + "optimizer = torch.optim.SGD(p, lr=args.lr * accelerator.num_processes)\n") == []


def test_param_group_assignment_counts():
    src = HEAD + OPT + "for g in optimizer.param_groups:\n    g['lr'] = args.lr * dist.get_world_size()\n"
    assert lines("DDP504", src) == []


def test_divided_or_global_batch_is_silent():
    for batch in ("args.batch_size // dist.get_world_size()", "args.total_batch_size"):
        src = HEAD.replace("batch_size=args.batch_size", f"batch_size={batch}") + OPT
        assert lines("DDP504", src) == [], batch


def test_unseen_inputs_are_silent():
    assert lines("DDP504", HEAD + "optimizer = build_optimizer(cfg, model)\n") == []
    in_function = HEAD + "def make(model, lr):\n    return torch.optim.SGD(model.parameters(), lr=lr)\n"
    assert lines("DDP504", in_function) == []
    no_sampler = HEAD.replace("sampler=DistributedSampler(ds)", "shuffle=True") + OPT
    assert lines("DDP504", no_sampler) == []


def test_documented_option():
    opt = 'parser.add_argument("--lr", type=float, default=0.1, help="lr for 8 GPUs x 32 images")\n'
    assert lines("DDP504", HEAD + opt + OPT) == []
    opt = 'parser.add_argument("--lr", type=float, default=0.1, help="initial learning rate")\n'
    assert lines("DDP504", HEAD + opt + OPT) == [7]


def test_one_finding_per_script():
    src = HEAD + OPT + "opt_d = torch.optim.Adam(disc.parameters(), lr=args.lr)\n"
    assert lines("DDP504", src) == [6]


def test_scaling_in_a_helper_of_the_tree(tmp_path: Path):
    write(tmp_path / "sched.py", """\
        import torch.distributed as dist

        def prepare(args):
            args.lr = args.base_lr * dist.get_world_size()
        """)
    train = write(tmp_path / "train.py", HEAD.replace("import torch\n", "import torch\nfrom sched import prepare\n")
                  + "prepare(args)\n" + OPT)
    result = lint_path(str(train), LintSettings(enabled=frozenset(REGISTRY)))
    assert [f for f in result.findings if f.code == "DDP504"] == []


def test_scheduler_keyword_with_world_size():
    src = HEAD + OPT + "sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr * dist.get_world_size(), total_steps=100)\n"
    assert lines("DDP504", src) == []


def test_an_optimizer_made_in_a_helper_module_is_followed_and_unrelated_helpers_are_not_parsed(tmp_path: Path):
    """The walk into helper modules for optimizers follows only modules that
    can reach one (a module naming `optim`, or importing one that does):
    `build_optimizer` of optim_utils.py is reported at the call, and
    logging_utils.py, which can make no optimizer, is not parsed to look for one."""
    import ddpcheck.model.project as project_module
    from ddpcheck.lint.engine import Projects

    write(tmp_path / "optim_utils.py", """\
        import torch

        def build_optimizer(model, lr):
            return torch.optim.SGD(model.parameters(), lr=lr)
        """)
    write(tmp_path / "logging_utils.py", """\
        def log_start(args):
            print("starting", args)
        """)
    imports = "import torch\nfrom optim_utils import build_optimizer\nfrom logging_utils import log_start\n"
    train = write(tmp_path / "train.py", HEAD.replace("import torch\n", imports)
                  + "log_start(args)\noptimizer = build_optimizer(model, args.lr)\n")
    plain = write(tmp_path / "plain.py", HEAD.replace("import torch\n", imports) + "log_start(args)\n")
    parsed: list[str] = []
    real = project_module.Project._build_helper

    def counting(self, key):
        parsed.append(Path(key).name)
        return real(self, key)

    project_module.Project._build_helper = counting
    try:
        settings = LintSettings(enabled=frozenset({"DDP504"}), root=str(tmp_path))
        result = lint_path(str(train), settings, projects=Projects())
        assert [(f.code, f.line) for f in result.findings] == [("DDP504", 9)]
        assert "args.lr" in result.findings[0].message
        del parsed[:]
        assert lint_path(str(plain), settings, projects=Projects()).findings == ()
    finally:
        project_module.Project._build_helper = real
    assert "logging_utils.py" not in parsed
