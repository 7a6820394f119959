"""The folders the write-route probe runs in, and what each route changes.

:func:`make_tree` builds ``base/{project,outside,home,tmp}`` with the files the
routes change; :func:`snapshot` records every entry's type, mode, size,
content hash, mtime and link target (``lstat``, links not followed), so a
comparison catches a changed byte, mode or time; :data:`CHANGES` says which
entries each route of ``write_routes.py`` changes when it really runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "write_routes.py"

# route -> the entries (relative to the tree's base) it creates, changes or removes
CHANGES = {
    "open_cwd": ["project/open_cwd.out"],
    "open_outside_abs": ["outside/open_outside_abs.out"],
    "open_dotdot": ["outside/open_dotdot.out"],
    "open_tmp_new": ["tmp/open_tmp_new.out"],
    "open_tmp_existing": ["tmp/tmp_existing.txt"],
    "open_home": ["home/open_home.out"],
    "open_after_chdir": ["outside/after_chdir.out"],
    "append_existing": ["project/append_me.txt"],
    "torch_save": ["project/torch_save.pt"],
    "torch_serialization_save": ["project/serialization_save.pt"],
    "torch_jit_save": ["project/jit_save.pt"],
    "tarfile": ["project/archive.tar"],
    "io_fileio": ["project/fileio.out"],
    "numpy_savetxt": ["project/savetxt.out"],
    "os_truncate": ["project/truncate_me.txt"],
    "os_chmod": ["project/chmod_me.txt"],
    "os_utime": ["project/utime_me.txt"],
    "os_symlink": ["project/made_symlink"],
    "write_through_symlink": ["home/through_link.txt"],
    "os_link": ["project/hard_link.out"],
    "os_open_dir_fd": ["project/dir_fd.out"],
    "torch_from_file_shared": ["project/from_file.bin"],
    "sqlite3": ["project/db.sqlite"],
    "shutil_copy": ["project/shutil_copy.out"],
    "shutil_copy2": ["project/shutil_copy2.out"],
    "shutil_copytree": ["project/shutil_copytree.out"],
    "shutil_move": ["project/move_me.txt", "project/shutil_move.out"],
    "os_remove": ["project/remove_me.txt"],
    "os_rename": ["project/rename_me.txt", "project/os_rename.out"],
    "os_replace": ["project/os_replace.out"],
    "os_makedirs": ["project/made_dir"],
    "shutil_rmtree": ["project/rmtree_me"],
    "numpy_memmap": ["project/memmap.bin"],
    "subprocess": ["project/subprocess.out"],
    "os_system": ["project/os_system.out"],
    "dataloader_fork": ["project/dataloader_fork0.out", "project/dataloader_fork1.out"],
    "dataloader_spawn": ["project/dataloader_spawn0.out", "project/dataloader_spawn1.out"],
    "thread": ["project/thread_log.txt"],
}


def make_tree(base: Path) -> dict:
    """The probe's folders under ``base``; returns the environment to run it with."""
    project, outside, home, tmp = (base / n for n in ("project", "outside", "home", "tmp"))
    for folder in (project, outside, home, tmp):
        folder.mkdir(parents=True)
    shutil.copy(SCRIPT, project / "write_routes.py")
    texts = {
        "project/append_me.txt": "first\n", "project/truncate_me.txt": "0123456789\n",
        "project/chmod_me.txt": "mode\n", "project/utime_me.txt": "time\n",
        "project/link_src.txt": "linked\n", "project/copy_src.txt": "copied\n",
        "project/copy_dir/a.txt": "a\n", "project/move_me.txt": "moved\n",
        "project/remove_me.txt": "removed\n", "project/rename_me.txt": "renamed\n",
        "project/rmtree_me/x.txt": "x\n", "project/thread_log.txt": "kept\n",
        "outside/keep.txt": "outside\n", "tmp/tmp_existing.txt": "tmp\n",
        "home/through_link.txt": "home\n", "home/.bashrc": "# rc\n",
    }
    for rel, text in texts.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    (project / "from_file.bin").write_bytes(bytes(8))
    (project / "memmap.bin").write_bytes(bytes(4))
    (project / "link_to_home").symlink_to(home / "through_link.txt")
    return {"PROBE_OUTSIDE": str(outside), "HOME": str(home), "TMPDIR": str(tmp)}


def snapshot(base: Path) -> dict:
    """``relative path -> (kind, mode, size, sha256, mtime_ns, link target)`` of every entry."""
    out = {}
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, base)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", stat.S_IMODE(st.st_mode), 0, "", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), 0, "", 0, "")
            else:
                with open(path, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_size, digest,
                            st.st_mtime_ns, "")
    return out


def changed(before: dict, after: dict) -> set:
    """Entries created, removed or changed (files: bytes, mode or mtime; folders: mode)."""
    return {rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)}


def routes_that_changed(before: dict, after: dict) -> dict:
    """``route -> the entries it was expected to change that did change``."""
    diff = changed(before, after)
    out = {}
    for route, entries in CHANGES.items():
        hit = [e for e in entries if e in diff or any(d.startswith(e + os.sep) for d in diff)]
        if hit:
            out[route] = hit
    return out
