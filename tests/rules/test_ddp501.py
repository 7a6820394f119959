"""DDP501 local-rank-arg: beyond the fixtures."""

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from tests.rules.lintsnippet import findings, lines

PARSER = "import argparse\nimport os\nimport torch.distributed as dist\nparser = argparse.ArgumentParser()\n"


def test_message_names_the_option_and_its_default():
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=-1)\nargs = parser.parse_args()\n'
                    'device = args.local_rank\n')
    (f,) = findings("DDP501", src)
    assert f.line == 5 and f.severity.name == "ERROR"
    assert "--local-rank=N" in f.message and "unrecognized arguments" in f.message
    assert "`args.local_rank` stays `-1`" in f.message
    assert '"--local-rank", "--local_rank"' in f.fix and "LOCAL_RANK" in f.fix


def test_dashed_spelling_in_another_add_argument():
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=0)\n'
                    'parser.add_argument("--local-rank", type=int, dest="local_rank")\n')
    assert lines("DDP501", src) == []


def test_every_environment_read_counts_as_a_fallback():
    reads = [
        'local_rank = int(os.environ["LOCAL_RANK"])',
        'local_rank = int(os.environ.get("LOCAL_RANK", 0))',
        'local_rank = int(os.getenv("LOCAL_RANK", "0"))',
        'distributed = "LOCAL_RANK" in os.environ',
        'from os import environ\nlocal_rank = int(environ["LOCAL_RANK"])',
    ]
    for read in reads:
        src = PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\n' + read + "\n"
        assert lines("DDP501", src) == [], read


def test_writing_the_environment_is_not_a_fallback():
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=0)\nargs = parser.parse_args()\n'
                    'os.environ["LOCAL_RANK"] = str(args.local_rank)\n')
    assert lines("DDP501", src) == [5]


def test_own_workers():
    for spawn in ("import torch.multiprocessing as mp\nmp.spawn(main_worker, nprocs=4)",
                  "from torch.multiprocessing import start_processes\nstart_processes(main_worker, nprocs=4)",
                  "import multiprocessing\nmultiprocessing.Process(target=main_worker).start()"):
        src = PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\n' + spawn + "\n"
        assert lines("DDP501", src) == [], spawn


def test_env_read_in_a_local_helper(tmp_path):
    (tmp_path / "misc.py").write_text(textwrap.dedent("""\
        import os
        import torch.distributed as dist

        def init_distributed_mode(args):
            args.gpu = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")

        def unused():
            return os.environ.get("LOCAL_RANK")
        """))
    train = tmp_path / "train.py"
    train.write_text(PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\n'
                     'args = parser.parse_args()\nimport misc\nmisc.init_distributed_mode(args)\n')
    assert lint_path(str(train), LintSettings(enabled=frozenset({"DDP501"}))).findings == ()
    train.write_text(PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\n'
                     'args = parser.parse_args()\nimport misc\ngpu = args.local_rank\n')
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP501"})))
    assert [f.line for f in result.findings] == [5]   # a helper nobody calls is no fallback


def test_an_option_nobody_reads_is_not_reported():
    """swav declares `--local_rank` "to be ignored" and takes the rank from the
    environment: under torchrun it works."""
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=0, help="unused, ignored")\n'
                    'args = parser.parse_args()\nrank = int(os.environ["RANK"])\n')
    assert lines("DDP501", src) == []
    assert lines("DDP501", src + "gpu = args.local_rank\n") == [5]
    assert lines("DDP501", src + 'gpu = getattr(args, "local_rank")\n') == [5]
