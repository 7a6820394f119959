"""Launch evidence: which launcher a documented command uses, how many
processes it starts, what it passes the script, and which script it names."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpcheck.model.launch import (
    ACCELERATE, DEEPSPEED, MPI, PYTHON, SLURM, SUBMITIT, TORCH_LAUNCH, TORCHRUN, LaunchDocs, commands_in_script,
    commands_in_text, launch_commands,
)
from ddpcheck.model.processes import one_process
from ddpcheck.model.project import Project
from ddpcheck.settings import LintSettings
from tests.conftest import write


def one(text: str, where: str = "README.md"):
    (token, command), = commands_in_text(text, where)
    return token, command


@pytest.mark.parametrize("line, launcher, processes, rank_arg", [
    ("torchrun --nproc_per_node=8 train.py --lr 0.1", TORCHRUN, 8, None),
    ("torchrun --nnodes 2 --nproc-per-node 4 train.py", TORCHRUN, 8, None),
    ("python -m torch.distributed.run --nproc_per_node 2 train.py", TORCHRUN, 2, None),
    ("python -m torch.distributed.launch --nproc_per_node=8 train.py", TORCH_LAUNCH, 8, "--local-rank"),
    ("python -m torch.distributed.launch --use_env --nproc_per_node=1 train.py", TORCH_LAUNCH, 1, None),
    ("deepspeed --num_gpus 1 train.py --deepspeed", DEEPSPEED, 1, "--local_rank"),
    ("deepspeed --num_nodes 2 --num_gpus 8 train.py", DEEPSPEED, 16, "--local_rank"),
    ("deepspeed --include localhost:0,1 train.py", DEEPSPEED, 2, "--local_rank"),
    ("accelerate launch --num_processes 4 train.py", ACCELERATE, 4, None),
    ("srun --ntasks=16 python train.py", SLURM, 16, None),
    ("mpirun -np 4 python train.py", MPI, 4, None),
    ("colossalai run --nproc_per_node 4 train.py", TORCHRUN, 4, None),
    ("CUDA_VISIBLE_DEVICES=0 python train.py --epochs 1", PYTHON, 1, None),
    ("$ python3 train.py", PYTHON, 1, None),
])
def test_launchers(line, launcher, processes, rank_arg):
    token, command = one(line)
    assert token == "train.py"
    assert (command.launcher, command.processes, command.rank_argument) == (launcher, processes, rank_arg)


def test_not_launch_commands():
    assert commands_in_text("python -m pip install -e .\nsee train.py for details\n", "README.md") == []
    assert commands_in_text("ddpcheck lint train.py\n", "README.md") == []


def test_shell_variables_continuations_and_divisions():
    text = ("#!/bin/bash\nNGPU=4\nTOTAL=64\nPER_GPU=$((TOTAL/NGPU))\n"
            "# python -m torch.distributed.launch --nproc_per_node=1 old.py\n"
            'run_cmd="deepspeed --num_gpus ${NGPU} \\\n    finetune.py \\\n    --batch_size ${PER_GPU} --lr 1e-5"\n'
            "eval ${run_cmd}\n")
    (token, command), = commands_in_text(text, "run.sh")
    assert token == "finetune.py" and command.launcher == DEEPSPEED and command.processes == 4
    assert command.divided == frozenset({"--batch_size"}) and command.where == "run.sh:6"
    assert command.text.startswith("deepspeed --num_gpus")
    # an unresolved count is unknown, not one
    (_, unknown), = commands_in_text("torchrun --nproc_per_node=$N train.py\n", "run.sh")
    assert unknown.processes is None


def test_a_script_kept_in_a_shell_variable():
    text = ("#!/bin/bash\nGPUS=${2:-4}\nNGPU=4\nMAIN=tools/train.py\nENTRY=$MAIN\n"
            "python -m torch.distributed.launch --nproc_per_node=$NGPU ${ENTRY} --cfg $1\n"
            "torchrun --nproc_per_node 2 $UNSET_SCRIPT\n")
    (token, command), = commands_in_text(text, "dist_train.sh")
    assert token == "tools/train.py" and command.launcher == TORCH_LAUNCH and command.processes == 4
    assert command.where == "dist_train.sh:6"
    # a README's `$SCRIPT` names nothing: only a shell script's own assignments are read
    assert commands_in_text("SCRIPT=train.py\ntorchrun $SCRIPT\n", "README.md") == []
    # a `.py` config in a variable after the script's written path is not the script
    assert commands_in_text('CONFIG=configs/retina.py\npython -m torch.distributed.launch $(dirname "$0")/train.py'
                            ' $CONFIG\n', "dist_train.sh") == []
    # a loop of variables that never ends in a path names nothing
    assert commands_in_text("A=$B\nB=$A\ntorchrun $A\n", "run.sh") == []


def test_documents_name_the_script_by_path(tmp_path):
    script = write(tmp_path / "examples" / "seg" / "train.py", "x = 1\n")
    other = write(tmp_path / "examples" / "cls" / "train.py", "x = 1\n")
    write(tmp_path / "docs" / "usage.md", "torchrun --nproc_per_node 2 examples/seg/train.py\n")
    write(tmp_path / "examples" / "seg" / "scripts" / "run.sh", "deepspeed --num_gpus 1 ../train.py\n")
    write(tmp_path / "examples" / "cls" / "README.md", "accelerate launch train.py\n")
    docs = LaunchDocs(str(tmp_path))
    assert sorted(c.launcher for c in docs.commands_for(str(script))) == [DEEPSPEED, TORCHRUN]
    assert [c.launcher for c in docs.commands_for(str(other))] == [ACCELERATE]


def test_commands_in_the_script_itself():
    text = '"""Usage:\n    torchrun --nproc_per_node=4 train.py --data /d\n"""\n# deepspeed other.py\nx = 1\n'
    (command,) = commands_in_script(text, "train.py")
    assert command.launcher == TORCHRUN and command.where == "train.py:2"


def model_of(path, text: str):
    return Project(LintSettings(enabled=frozenset())).build(str(path), cst.parse_module(text), text)


def test_submitit_and_one_process(tmp_path):
    write(tmp_path / "LICENSE", "")
    main = write(tmp_path / "main_probe.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\n")
    write(tmp_path / "submit_probe.py", "import submitit\nimport main_probe\n")
    assert [c.launcher for c in launch_commands(model_of(main, main.read_text()))] == [SUBMITIT]
    assert one_process(model_of(main, main.read_text())) is None   # submitit's count is not written
    single = write(tmp_path / "compress.py", "import deepspeed\ndeepspeed.init_distributed()\n")
    write(tmp_path / "run.sh", "deepspeed --num_gpus 1 compress.py\npython compress.py --help\n")
    assert "one process" in one_process(model_of(single, single.read_text()))
    write(tmp_path / "run_many.sh", "deepspeed --num_gpus 8 compress.py\n")
    assert one_process(model_of(single, single.read_text())) is None


def test_group_of_one_and_spawning_scripts(tmp_path):
    code = "import torch.distributed as dist\ndist.init_process_group('gloo', rank=0, world_size=1)\n"
    assert "world_size=1" in one_process(model_of(tmp_path / "a.py", code))
    spawn = ("import torch.multiprocessing as mp\nimport torch.distributed as dist\n"
             "def worker(i):\n    dist.init_process_group('nccl')\n"
             "if __name__ == '__main__':\n    mp.spawn(worker, nprocs=4)\n")
    path = write(tmp_path / "spawner.py", spawn)
    write(tmp_path / "README.md", "python spawner.py\n")
    write(tmp_path / "LICENSE", "")
    assert one_process(model_of(path, spawn)) is None   # a plain `python x.py` that spawns its workers


def test_a_plain_python_launch_is_the_one_gpu_run_not_a_group_of_one(tmp_path):
    # the group starts only under a launcher (WORLD_SIZE > 1); the README shows the one-GPU run
    code = ("import os\nimport torch.distributed as dist\n"
            "if int(os.environ.get('WORLD_SIZE', 1)) > 1:\n    dist.init_process_group('nccl')\n")
    path = write(tmp_path / "main.py", code)
    write(tmp_path / "LICENSE", "")
    write(tmp_path / "test.sh", "python main.py --cfg ./config/test.yaml\n")
    assert one_process(model_of(path, code)) is None
    write(tmp_path / "train.sh", "python -m torch.distributed.launch --nproc_per_node=1 main.py\n")
    assert "one process" in one_process(model_of(path, code))   # an explicit count of one still is


def test_lightning_given_one_device_starts_one_process(tmp_path):
    one = ("import lightning as L\n"
           "fabric = L.Fabric(accelerator='auto', devices=1)\nfabric.launch()\n")
    assert "devices=1" in one_process(model_of(tmp_path / "a.py", one))
    many = one.replace("devices=1", "devices=4")
    assert one_process(model_of(tmp_path / "b.py", many)) is None
    nodes = one.replace("devices=1", "devices=1, num_nodes=2")
    assert one_process(model_of(tmp_path / "c.py", nodes)) is None
    trainer = ("from pytorch_lightning import Trainer\n"
               "Trainer(devices=1).fit(model)\nTrainer(devices=2).fit(model)\n")
    assert one_process(model_of(tmp_path / "d.py", trainer)) is None   # one of them runs two


def test_a_count_kept_in_a_shell_variable_is_a_knob_not_one_process(tmp_path):
    code = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    path = write(tmp_path / "train.py", code)
    write(tmp_path / "LICENSE", "")
    write(tmp_path / "launch.sh", "NGPUS=1\npython -m torch.distributed.launch --nproc_per_node=$NGPUS train.py cfg.py\n")
    (command,) = launch_commands(model_of(path, code))
    assert command.processes == 1 and command.count_in_variable
    assert one_process(model_of(path, code)) is None
    write(tmp_path / "launch.sh", "python -m torch.distributed.launch --nproc_per_node=1 train.py cfg.py\n")
    assert "one process" in one_process(model_of(path, code))   # written as a literal: one process


def test_a_model_spread_over_the_gpus_of_one_process(tmp_path):
    code = ("import os\nfrom transformers import AutoModelForCausalLM, AutoTokenizer, Trainer\n"
            "tok = AutoTokenizer.from_pretrained('m')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "Trainer(model=model).train()\n")
    assert "device_map" in one_process(model_of(tmp_path / "a.py", code))
    # the model on this rank's own GPU: one rank per GPU under torchrun
    per_rank = code.replace("device_map='auto'", "device_map={'': int(os.environ['LOCAL_RANK'])}")
    assert one_process(model_of(tmp_path / "b.py", per_rank)) is None
    # spread only on one arm of a test: the other arm may run as several ranks
    arm = code.replace("model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')",
                       "if os.environ.get('WORLD_SIZE') is None:\n"
                       "    model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
                       "else:\n    model = AutoModelForCausalLM.from_pretrained('m')")
    assert one_process(model_of(tmp_path / "c.py", arm)) is None
    # a device map chosen at run time, another load with its own map, a group of its own
    chosen = code.replace("device_map='auto'", "device_map='auto' if single else None")
    assert one_process(model_of(tmp_path / "d.py", chosen)) is None
    second = code + "ref = AutoModelForCausalLM.from_pretrained('m', device_map={'': 0})\n"
    assert one_process(model_of(tmp_path / "e.py", second)) is None
    grouped = "import torch.distributed as dist\ndist.init_process_group('nccl')\n" + code
    assert one_process(model_of(tmp_path / "f.py", grouped)) is None


def test_a_project_without_markers_begins_where_the_run_was_started(tmp_path):
    # a downloaded archive: no .git, packaging file or license anywhere above the script
    code = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    script = write(tmp_path / "proj" / "pkg" / "examples" / "train.py", code)
    write(tmp_path / "proj" / "run.sh", "python -m torch.distributed.launch --nproc_per_node=1 ./pkg/examples/train.py\n")

    def commands(invoked_from):
        settings = LintSettings(enabled=frozenset(), invoked_from=invoked_from)
        return launch_commands(Project(settings).build(str(script), cst.parse_module(code), code))

    assert commands(None) == ()                                   # the script's own folder only
    assert [c.launcher for c in commands(str(tmp_path / "proj"))] == [TORCH_LAUNCH]
    assert commands(str(tmp_path / "elsewhere")) == ()            # a run started outside the project
