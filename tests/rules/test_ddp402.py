"""DDP402 missing-destroy: beyond the fixtures."""

import textwrap

from ddpcheck.settings import LintSettings
from ddpcheck.lint.engine import lint_path
from tests.rules.lintsnippet import findings, lines


def test_reported_at_the_init_with_info_severity():
    src = """\
import torch.distributed as dist
dist.init_process_group("nccl")
train()
"""
    (f,) = findings("DDP402", src)
    assert f.line == 2 and f.severity.name == "INFO"
    assert "`dist.init_process_group(...)`" in f.message and "never destroys" in f.message
    assert "destroy_process_group()" in f.fix


def test_every_reached_init_is_reported_aliases_included():
    src = """\
from torch.distributed import init_process_group as init_pg
import torch.distributed as dist

def worker(rank):
    init_pg("nccl", rank=rank, world_size=2)

def unused_entry_point():
    dist.init_process_group("gloo")

if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(worker, nprocs=2)
"""
    assert lines("DDP402", src) == [5]


def test_destroy_anywhere_counts():
    for teardown in ("dist.destroy_process_group()",
                     "atexit.register(dist.destroy_process_group)",
                     "cleanup()\n\ndef cleanup():\n    dist.destroy_process_group()",
                     "teardown_distributed()"):   # a helper from a package we cannot read
        src = "import atexit\nimport torch.distributed as dist\nfrom mylib import teardown_distributed\n" \
              "dist.init_process_group('nccl')\n" + teardown + "\n"
        assert lines("DDP402", src) == [], teardown


def test_destroy_in_a_local_helper_module(tmp_path):
    (tmp_path / "dist_helpers.py").write_text(textwrap.dedent("""\
        import torch.distributed as dist

        def finish():
            dist.barrier()
            dist.destroy_process_group()
        """))
    train = tmp_path / "train.py"
    train.write_text("import torch.distributed as dist\nimport dist_helpers\n\n"
                     "dist.init_process_group('nccl')\ndist_helpers.finish()\n")
    assert lint_path(str(train), LintSettings(enabled=frozenset({"DDP402"}))).findings == ()
    # a local helper that does something else is read, and does not count
    (tmp_path / "dist_helpers.py").write_text("import torch.distributed as dist\n\ndef finish():\n    dist.barrier()\n")
    result = lint_path(str(train), LintSettings(enabled=frozenset({"DDP402"})))
    assert [f.line for f in result.findings] == [4]


def test_gloo_group_message_says_how_it_fails():
    """A gloo group gets no NCCL warning; what happens instead is said."""
    src = ("import torch.distributed as dist\nBACKEND = 'gloo'\n\ndef main():\n"
           "    dist.init_process_group(BACKEND)\n\nif __name__ == '__main__':\n    main()\n")
    (f,) = findings("DDP402", src)
    assert "terminate called without an active exception" in f.message and "NCCL" not in f.message
    (g,) = findings("DDP402", src.replace("'gloo'", "'nccl'"))
    assert "warning" in g.message and "terminate" not in g.message
