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


def severities(src: str) -> list[str]:
    return [f.severity.name for f in findings("DDP501", src)]


def test_every_environment_read_counts_as_a_fallback():
    """LOCAL_RANK read from the environment: torchrun works, only the
    `--local-rank=N` of torch>=2.0's launch is refused: info, not an error."""
    reads = [
        'local_rank = int(os.environ["LOCAL_RANK"])',
        'local_rank = int(os.environ.get("LOCAL_RANK", 0))',
        'local_rank = int(os.getenv("LOCAL_RANK", "0"))',
        'distributed = "LOCAL_RANK" in os.environ',
        'from os import environ\nlocal_rank = int(environ["LOCAL_RANK"])',
    ]
    for read in reads:
        src = (PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\nargs = parser.parse_args()\n'
               + read + "\n")
        assert severities(src) == ["INFO"], read


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
    (f,) = lint_path(str(train), LintSettings(enabled=frozenset({"DDP501"}))).findings
    assert f.severity.name == "INFO" and "comes from the environment" in f.message
    train.write_text(PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\n'
                     'args = parser.parse_args()\nimport misc\ngpu = args.local_rank\n')
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP501"})))
    # a helper nobody calls is no fallback
    assert [(f.line, f.severity.name) for f in result.findings] == [(5, "ERROR")]


def test_an_option_nobody_reads_is_info():
    """swav declares `--local_rank` "to be ignored" and takes the rank from the
    environment: torchrun works, but argparse still refuses torch>=2.0 launch's
    `--local-rank=N` before the script reads anything."""
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=0, help="unused, ignored")\n'
                    'args = parser.parse_args()\nrank = int(os.environ["RANK"])\n')
    (f,) = findings("DDP501", src)
    assert (f.line, f.severity.name) == (5, "INFO")
    assert "nothing reads the value" in f.message and "torchrun runs fine" in f.message
    assert '"--local-rank", "--local_rank"' in f.fix
    assert severities(src + "gpu = args.local_rank\n") == ["ERROR"]
    assert severities(src + 'gpu = getattr(args, "local_rank")\n') == ["ERROR"]


def test_message_says_which_launcher_passes_which_spelling():
    src = PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\nargs = parser.parse_args()\n'
    for extra in ("", "gpu = args.local_rank\n"):
        (f,) = findings("DDP501", src + extra)
        assert "`torchrun` passes no rank argument" in f.message
        assert "passes `--local-rank=N` since torch 2.0 (`--local_rank=N` before)" in f.message
        assert "`--use-env`" in f.message


def test_parse_known_args_sets_the_new_spelling_aside():
    """`parse_known_args()` does not exit on `--local-rank=N`: only a value the
    script relies on (and that then keeps its default) is reported."""
    src = PARSER + ('parser.add_argument("--local_rank", type=int, default=-1)\n'
                    'args, unknown = parser.parse_known_args()\n')
    assert findings("DDP501", src) == []
    (f,) = findings("DDP501", src + "torch_device = args.local_rank\n")
    assert f.severity.name == "ERROR" and "`parse_known_args()` sets the new `--local-rank=N` aside" in f.message
    assert findings("DDP501", src + 'rank = int(os.environ["LOCAL_RANK"])\n') == []


def test_deepspeed_and_spawn_scripts_are_not_launched_by_torch():
    src = PARSER + 'parser.add_argument("--local_rank", type=int, default=0)\nargs = parser.parse_args()\n'
    assert findings("DDP501", "import deepspeed\n" + src) == []
    assert findings("DDP501", src + "import torch.multiprocessing as mp\nmp.spawn(main_worker, nprocs=2)\n") == []
