"""DDP307 makedirs-race: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = """\
import os
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
"""


def test_checked_and_bare_creations_say_why():
    src = HEAD + """\
if not os.path.exists(out):
    os.makedirs(out)
os.mkdir(run_dir)
"""
    checked, bare = findings("DDP307", src)
    assert (checked.line, bare.line) == (7, 8)
    assert "not atomic" in checked.message and "FileExistsError" in checked.message
    assert "every other rank raises FileExistsError" in bare.message
    assert "exist_ok=True" in checked.fix


def test_exist_ok_forms():
    src = HEAD + """\
os.makedirs(out, exist_ok=True)
os.makedirs(out, 0o777, True)
os.makedirs(out, exist_ok=args.resume)
Path(out).mkdir(parents=True, exist_ok=True)
Path(out).mkdir(parents=True)
os.makedirs(out, exist_ok=False)
"""
    assert lines("DDP307", src) == [10, 11]


def test_exists_check_spellings():
    src = HEAD + """\
import os.path as osp
if not osp.isdir(a):
    os.makedirs(a)
os.path.exists(b) or os.makedirs(b)
if os.path.exists(c):
    pass
else:
    os.mkdir(c)
p = Path(d)
if not p.exists():
    p.mkdir()
"""
    assert lines("DDP307", src) == [8, 9, 13, 16]


def test_guarded_decorated_per_rank_and_single_process():
    src = HEAD + """\
if rank == 0:
    os.makedirs(a)
if not is_main_process():
    raise SystemExit
os.makedirs(b)
"""
    assert lines("DDP307", src) == []
    per_rank = HEAD + 'os.makedirs(f"{out}/rank_{rank}")\n'
    assert lines("DDP307", per_rank) == []
    dp_only = "import os\nimport torch\nmodel = torch.nn.DataParallel(net)\nos.makedirs(out)\n"
    assert lines("DDP307", dp_only) == []


def test_the_launching_process_of_a_library_launcher_runs_once():
    src = """\
import os
import torch.distributed as dist
from detectron2.engine import launch

def main(args):
    dist.init_process_group("nccl")
    if not os.path.exists(args.eval_dir):
        os.makedirs(args.eval_dir)

if __name__ == "__main__":
    args = parse_args()
    if not os.path.exists(args.output_dir):
        os.makedirs(args.output_dir)
    launch(main, args.num_gpus, num_machines=1, machine_rank=0, dist_url="auto", args=(args,))
"""
    assert lines("DDP307", src) == [8]
