"""Probe: every route a training script can take to change a file.

Run as a 2-rank job (under torchrun, or under ``ddpcheck preflight --gpus 2 --``)
from a project folder prepared by ``tests/preflight/probes/tree.py``. Route
number ``i`` runs on rank ``i % world``; each route writes or changes the file
named after it, in the working folder (P), a folder beside it (O), the temp
folder (T, ``$TMPDIR``) or HOME (H). A route that raises is printed to stderr
and the others still run. Paths come from the environment the test sets:
PROBE_OUTSIDE, PROBE_HOME_FILE.
"""

import io
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

OUTSIDE = os.environ.get("PROBE_OUTSIDE", "../outside")


class WritingDataset(Dataset):
    """Each sample writes one file from the DataLoader worker that loads it."""

    def __init__(self, prefix):
        self.prefix = prefix

    def __len__(self):
        return 2

    def __getitem__(self, index):
        with open(os.path.join(self.root, f"{self.prefix}{index}.out"), "w") as fh:
            fh.write(str(os.getpid()))
        return torch.zeros(1)

    root = os.getcwd()


def _tiny():
    return torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2))


def _thread_log():
    # keeps appending after the script's main body returned
    for i in range(40):
        with open("thread_log.txt", "a") as fh:
            fh.write(f"line {i}\n")
        time.sleep(0.05)


def _loader(prefix, context):
    ds = WritingDataset(prefix)
    ds.root = os.getcwd()
    loader = DataLoader(ds, batch_size=1, num_workers=2, multiprocessing_context=context)
    for _ in loader:
        pass


ROUTES = [
    ("open_cwd", lambda: open("open_cwd.out", "w").write("x")),
    ("open_outside_abs", lambda: open(os.path.join(os.path.abspath(OUTSIDE), "open_outside_abs.out"), "w").write("x")),
    ("open_dotdot", lambda: open(os.path.join(OUTSIDE, "open_dotdot.out"), "w").write("x")),
    ("open_tmp_new", lambda: open(os.path.join(tempfile.gettempdir(), "open_tmp_new.out"), "w").write("x")),
    ("open_tmp_existing", lambda: open(os.path.join(tempfile.gettempdir(), "tmp_existing.txt"), "w").write("x")),
    ("open_home", lambda: open(os.path.expanduser("~/open_home.out"), "w").write("x")),
    ("open_after_chdir", lambda: (os.chdir(OUTSIDE), open("after_chdir.out", "w").write("x"))),
    ("append_existing", lambda: open("append_me.txt", "a").write("more\n")),
    ("torch_save", lambda: torch.save({"w": torch.ones(2)}, "torch_save.pt")),
    ("torch_serialization_save", lambda: torch.serialization.save({"w": 1}, "serialization_save.pt")),
    ("torch_jit_save", lambda: torch.jit.save(_tiny(), "jit_save.pt")),
    ("tarfile", lambda: tarfile.open("archive.tar", "w").close()),
    ("io_fileio", lambda: io.FileIO("fileio.out", "w").write(b"x")),
    ("numpy_savetxt", lambda: np.savetxt("savetxt.out", np.ones(3))),
    ("os_truncate", lambda: os.truncate("truncate_me.txt", 1)),
    ("os_chmod", lambda: os.chmod("chmod_me.txt", 0o600)),
    ("os_utime", lambda: os.utime("utime_me.txt", (1, 1))),
    ("os_symlink", lambda: os.symlink("/etc/hostname", "made_symlink")),
    ("write_through_symlink", lambda: open("link_to_home", "w").write("x")),
    ("os_link", lambda: os.link("link_src.txt", "hard_link.out")),
    ("os_open_dir_fd", lambda: os.close(os.open("dir_fd.out", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=os.open(".", os.O_RDONLY)))),
    ("torch_from_file_shared", lambda: torch.from_file("from_file.bin", shared=True, size=8, dtype=torch.uint8).fill_(7)),
    ("sqlite3", lambda: sqlite3.connect("db.sqlite").execute("create table t (x)")),
    ("shutil_copy", lambda: shutil.copy("copy_src.txt", "shutil_copy.out")),
    ("shutil_copy2", lambda: shutil.copy2("copy_src.txt", "shutil_copy2.out")),
    ("shutil_copytree", lambda: shutil.copytree("copy_dir", "shutil_copytree.out")),
    ("shutil_move", lambda: shutil.move("move_me.txt", "shutil_move.out")),
    ("os_remove", lambda: os.remove("remove_me.txt")),
    ("os_rename", lambda: os.rename("rename_me.txt", "os_rename.out")),
    ("os_replace", lambda: (open("replace.tmp", "w").write("x"), os.replace("replace.tmp", "os_replace.out"))),
    ("os_makedirs", lambda: os.makedirs("made_dir/sub")),
    ("shutil_rmtree", lambda: shutil.rmtree("rmtree_me")),
    ("numpy_memmap", lambda: np.memmap("memmap.bin", mode="r+", dtype=np.uint8).__setitem__(0, 9)),
    ("subprocess", lambda: subprocess.run(["sh", "-c", "echo sub > subprocess.out"], check=True)),
    ("os_system", lambda: os.system("echo sys > os_system.out")),
    ("dataloader_fork", lambda: _loader("dataloader_fork", "fork")),
    ("dataloader_spawn", lambda: _loader("dataloader_spawn", "spawn")),
    ("thread", lambda: threading.Thread(target=_thread_log).start()),
]

HERE = os.getcwd()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    failed = []
    for index, (name, route) in enumerate(ROUTES):
        if index % world != rank:
            continue
        try:
            route()
        except BaseException as exc:  # noqa: BLE001 - report and go on
            print(f"probe {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
        os.chdir(HERE)
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        raise RuntimeError(f"routes that raised on rank {rank}: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
