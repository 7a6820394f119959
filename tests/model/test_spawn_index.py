"""The process index mp.spawn hands to its worker is a rank, whatever it is called."""

import ddpcheck.model.guards as guards
from tests.rules.lintsnippet import lines

HEAD = ("import torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n")
WORKER = ("def worker(device, world_size):\n"
          "    dist.init_process_group('nccl', rank=device, world_size=world_size)\n"
          "    m = torch.nn.Linear(2, 2).to(device)\n"
          "    if device == 0:\n"
          "        torch.save(m.state_dict(), 'a.pt')\n")
SPAWN = "mp.spawn(worker, args=(2,), nprocs=2)\n"


def test_the_spawn_index_guards_a_save(monkeypatch):
    src = HEAD + WORKER + SPAWN
    assert lines("DDP301", src) == []
    monkeypatch.setattr(guards, "is_spawn_index", lambda *a: False)
    assert lines("DDP301", src) == [8]   # `device == 0` alone says nothing about the rank


def test_the_same_name_is_no_guard_when_the_function_is_not_spawned():
    assert lines("DDP301", HEAD + WORKER + "worker(int(input()), 2)\n") == [8]


def test_a_spawned_method_gets_the_index_after_self(monkeypatch):
    src = HEAD + ("class Trainer:\n"
                  "    def worker(self, device, world_size):\n"
                  "        dist.init_process_group('nccl', rank=device, world_size=world_size)\n"
                  "        m = torch.nn.Linear(2, 2).to(device)\n"
                  "        if device == 0:\n"
                  "            torch.save(m.state_dict(), 'a.pt')\n"
                  "    def run(self):\n"
                  "        mp.spawn(self.worker, args=(2,), nprocs=2)\n"
                  "Trainer().run()\n")
    assert lines("DDP301", src) == []
    monkeypatch.setattr(guards, "is_spawn_index", lambda *a: False)
    assert lines("DDP301", src) == [9]


def test_writes_in_the_launching_functions_run_once():
    src = HEAD + "import wandb\n" + WORKER + (
        "class Launcher:\n    def run(self):\n        mp.spawn(worker, args=(2,), nprocs=2)\n"
        "def main():\n    launcher = Launcher()\n    wandb.init(project='p')\n    launcher.run()\nmain()\n")
    assert lines("DDP301", src) == []
    assert lines("DDP301", src.replace("    launcher.run()\n", "    pass\n")) == [15]
