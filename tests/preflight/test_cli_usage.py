"""Bad input: one line on stderr, exit 2, no traceback, no process started.

The command's checks run in-process here: the run itself (which normally happens
in the sandbox's own process, :mod:`ddpcheck.preflight.inside`) is called
directly, so GPU counts can be faked; starting workers is an error.
tests/preflight/test_sandbox.py checks the same errors through the real
sandboxed command."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ddpcheck.preflight.command import preflight

from .conftest import REPO

TINY = ["--model", "fixtures.models.tiny:build", "--input-shape", "3,32,32"]


@pytest.fixture
def invoke(monkeypatch):
    monkeypatch.chdir(REPO)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)

    def boom(*a, **k):
        raise AssertionError("a usage error must not start workers")

    import ddpcheck.preflight.command as command
    import ddpcheck.preflight.launch as launch

    from .conftest import run_in_this_process

    monkeypatch.setattr(launch, "run_local", boom)
    monkeypatch.setattr(command, "run_sandboxed", run_in_this_process)

    def run(*args):
        result = CliRunner().invoke(preflight, list(args))
        return result.exit_code, result.stderr, result.stdout

    return run


@pytest.mark.parametrize("args, message", [
    (["--gpus", "0"], "Invalid value for '--gpus': 0 is not in the range x>=1"),
    (["--gpus", "-3"], "Invalid value for '--gpus': -3 is not in the range x>=1"),
    (["--gpus", "abc"], "'abc' is not a valid integer"),
    (["--gpus", "2", "--dataset-size", "-5"], "'--dataset-size': -5 is not in the range x>=1"),
    (["--gpus", "2", "--dataset-size", "0"], "'--dataset-size': 0 is not"),
    (["--gpus", "2", "--dataset-size", "10", "--batch-size", "0"], "'--batch-size': 0 is not"),
    (["--gpus", "2", "--batch-size", "4", "--global-batch-size", "8"], "not both"),
    (["--gpus", "4", "--dataset-size", "100", "--global-batch-size", "3"],
     "smaller than 4 GPUs x grad-accum 1"),
    (["--gpus", "2", "--grad-accum", "0"], "'--grad-accum': 0 is not"),
    (["--gpus", "2", "--base-lr", "0.1"], "--base-lr needs --base-batch"),
    (["--gpus", "2", "--timeout", "0"], "'--timeout': 0.0 is not in the range 0<x<=86400.0"),
    (["--gpus", "2", "--timeout", "nan"], "'--timeout': 'nan' is not a finite number"),
    (["--gpus", "2", "--timeout", "inf"], "'--timeout': 'inf' is not a finite number"),
    (["--gpus", "2", "--timeout", "-inf"], "'--timeout': '-inf' is not a finite number"),
    (["--gpus", "2", "--timeout", "1e9"], "'--timeout': 1000000000.0 is not in the range"),
    (["--gpus", "2", "--timeout", "soon"], "'soon' is not a valid float"),
    (["--gpus", "2", "--base-batch", "8", "--base-lr", "nan"], "'--base-lr': 'nan' is not a finite"),
    (["--gpus", "2", "--safety-margin", "nan"], "'--safety-margin': 'nan' is not a finite"),
    (["--gpus", "100000", "--dataset-size", "10"], "--gpus 100000: this machine can run at most"),
    (["--gpus", "2", "--bandwidth-size", "64TiB"], "--bandwidth-size 65536.0 GiB: 2 ranks on CPU"),
    (["--gpus", "2", "--"], "nothing to run after --: give SCRIPT"),
    (["--gpus", "2", "--safety-margin", "1"], "'--safety-margin': 1.0 is not in the range 0<=x<1"),
    (["--gpus", "2", *TINY, "--amp", "fp8"], "Invalid value for '--amp'"),
    (["--gpus", "2", *TINY, "--optimizer", "lion"], "'lion': use adamw, adam, sgd, or MODULE:FN"),
    (["--gpus", "2", *TINY, "--optimizer", "no_such_pkg.opt:make"],
     "--optimizer 'no_such_pkg.opt:make': cannot import no_such_pkg.opt"),
    (["--gpus", "2", "--static-graph"], "--static-graph needs --model"),
    (["--gpus", "4", "--data-parallel", "--dataset-size", "10"],
     "--data-parallel needs --dataset-size and --batch-size"),
    (["--gpus", "2", "--backend", "mpi"], "Invalid value for '--backend'"),
    (["--gpus", "2", "--input-shape", "3,32,32"], "--input-shape needs --model"),
    (["--gpus", "2", "--model", "fixtures.models.tiny:build"], "--model needs an input"),
    (["--gpus", "2", *TINY, "--gpu-memory", "lots"],
     "Invalid value for '--gpu-memory': 'lots' is not a memory size"),
    (["--gpus", "2", "--model", "fixtures.models.tiny:build", "--input-shape", "3,x"],
     "Invalid value for '--input-shape': '3,x': write the shape of ONE sample"),
    (["--gpus", "2", "--model", "no_such_pkg.models:build", "--input-shape", "3,32,32"],
     "cannot import no_such_pkg.models"),
    (["--gpus", "2", "--model", "fixtures.models.tiny:buidl", "--input-shape", "3,32,32"],
     "fixtures.models.tiny has no attribute 'buidl'"),
    (["--gpus", "2", "--model", "fixtures.models.tiny", "--input-shape", "3,32,32"],
     "write MODULE:FUNCTION"),
    (["--gpus", "2", *TINY, "--sample", "fixtures.models.tiny:nope"], "not both"),
    (["--gpus", "2", *TINY, "--loss", "fixtures.models.tiny:nope"], "--loss"),
])
def test_usage_errors_are_one_line_and_exit_2(invoke, args, message):
    code, err, out = invoke(*args)
    assert code == 2, (code, err, out)
    assert message in err
    assert err.startswith("ddpcheck: error: ") and err.count("\n") == 1
    assert "Traceback" not in err + out and out == ""


def test_nccl_with_more_gpus_than_present_is_a_usage_error(invoke, monkeypatch):
    torch = pytest.importorskip("torch")
    import ddpcheck.preflight.gpus as gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda: (2, True))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    code, err, _ = invoke("--gpus", "4", "--backend", "nccl", "--dataset-size", "8607")
    assert code == 2
    assert "--gpus 4 with --backend nccl needs 4 CUDA devices on this node, it has 2" in err
    assert "--gpus 2" in err
    # auto: a GPU machine with too few GPUs fails too, instead of falling back to CPU
    code, err, _ = invoke("--gpus", "4", "--dataset-size", "8607")
    assert code == 2 and "--gpus 4 but this node has 2 visible GPUs" in err


def test_gpus_is_required_without_gpus(invoke, monkeypatch):
    pytest.importorskip("torch")
    import ddpcheck.preflight.gpus as gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda: (0, True))
    code, err, _ = invoke("--dataset-size", "8607")
    assert code == 2 and "--gpus N is required" in err


def test_half_set_launcher_environment(invoke, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    code, err, _ = invoke("--dataset-size", "8607")
    assert code == 2 and "WORLD_SIZE, LOCAL_RANK not" in err


def test_help_lists_the_examples():
    result = CliRunner().invoke(preflight, ["--help"])
    assert result.exit_code == 0
    assert "ddpcheck preflight --gpus 2 --dataset-size 8607" in result.output


def test_gpus_are_capped_by_the_memory_available(tmp_path):
    from ddpcheck.errors import UsageError
    from ddpcheck.preflight.options import RANK_CEILING, check_capacity, rank_capacity

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8388608 kB\nMemAvailable:    4194304 kB\n")  # 4 GiB
    assert rank_capacity(str(meminfo))[0] == 16  # 256 MiB a rank
    check_capacity(16, str(meminfo))
    with pytest.raises(UsageError, match=r"--gpus 17: this machine can run at most 16 ranks "
                                         r"\(4.0 GiB of memory available here"):
        check_capacity(17, str(meminfo))
    meminfo.write_text("MemAvailable:   1073741824 kB\n")  # 1 TiB: the ceiling decides
    assert rank_capacity(str(meminfo))[0] == RANK_CEILING == 64
