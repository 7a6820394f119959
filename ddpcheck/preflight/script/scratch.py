"""Python-level write redirection: the fallback where no OS sandbox with overlays
can be set up (:mod:`ddpcheck.preflight.sandbox`: the Landlock level, where the
kernel refuses every other write, and the no-sandbox level, where nothing else
protects the user's files). With bwrap's overlays nothing here is installed.

While the script runs, the Python-level ways to write a file are wrapped:
``open`` / ``io.open`` / ``os.open`` with a write mode, ``os.makedirs`` /
``os.mkdir``, ``os.remove`` / ``os.unlink`` / ``os.rmdir``, ``os.rename`` /
``os.replace``, ``os.chmod`` / ``os.chown`` / ``os.utime`` / ``os.truncate``,
``os.link`` / ``os.symlink``, ``shutil.rmtree`` and ``torch.save`` (whose C++ writer opens
the path itself). A write to a path the user owns goes to the same path under
the preflight's scratch folder instead (an overlay: ``<scratch>/fs/<abs path>``),
and reads and ``os.stat`` (so ``os.path.exists``/``isdir``) see the overlay
first, so a script that saves and reloads its checkpoint still works. All
ranks share the overlay, as they would share the real disk. The launcher
deletes the scratch folder afterwards; :class:`Scratch` records every write
(what, which line) for the report.

"The user's" means: under the working folder or the script's folder, or
anywhere outside the system temp folder. /dev, /proc, /sys and the temp
folder (outside those two) are left alone.

Not covered (docs: the preflight's limits, without a sandbox): writes from
C/C++ code other than torch.save (h5py, some image libraries' encoders, native
loggers), ``os.listdir``/glob of a directory (they see only the real folder),
subprocesses the script starts.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import tempfile
from typing import Callable, Optional

from ddpcheck.preflight.script.facts import WriteFact

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
MAX_WRITES = 200


def _is_write_mode(mode) -> bool:
    return isinstance(mode, str) and any(ch in mode for ch in "wax+")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class Scratch:
    """The overlay and the record of writes for one rank."""

    def __init__(self, root: str, user_dirs: list[str], where: Callable[[], str]):
        self.root = os.path.realpath(root)
        self.fs = os.path.join(self.root, "fs")
        self.user_dirs = [os.path.realpath(d) for d in user_dirs if d]
        self.temp = os.path.realpath(tempfile.gettempdir())
        self.where = where
        self.writes: list[WriteFact] = []
        self._index: dict = {}
        self._saved: list = []
        self._real: dict = {}

    # -- policy --------------------------------------------------------------------------

    def owned_by_user(self, path: str) -> bool:
        if _under(path, self.root):
            return False
        for system in ("/dev", "/proc", "/sys"):
            if _under(path, system):
                return False
        if any(_under(path, d) for d in self.user_dirs):
            return True
        return not _under(path, self.temp)

    def overlay(self, path) -> Optional[str]:
        """The overlay path for ``path`` when it is the user's, else None."""
        if isinstance(path, int):  # a file descriptor
            return None
        try:
            text = os.fspath(path)
        except TypeError:
            return None
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        full = os.path.abspath(text)
        if not self.owned_by_user(full):
            return None
        return os.path.join(self.fs, full.lstrip(os.sep))

    def record(self, kind: str, path, redirected: bool = True) -> None:
        try:
            full = os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            full = str(path)
        key = (kind, full)
        if key in self._index:
            self._index[key].count += 1
            return
        if len(self.writes) >= MAX_WRITES:
            return
        fact = WriteFact(kind, full, self.where(), redirected)
        self._index[key] = fact
        self.writes.append(fact)

    # -- the overlay ---------------------------------------------------------------------

    def _exists(self, path: str) -> bool:
        try:
            self._real["stat"](path)
            return True
        except OSError:
            return False

    def for_write(self, path, copy_existing: bool) -> str:
        """Overlay path ready to be written: its parent made when the real parent
        exists (so a missing real folder still fails like it would), the real
        file copied in first for appends and read-write modes."""
        mapped = self.overlay(path)
        real = os.path.abspath(os.fsdecode(os.fspath(path)))
        parent = os.path.dirname(mapped)
        if not self._exists(parent) and self._exists(os.path.dirname(real)):
            self._real["makedirs"](parent, exist_ok=True)
        if copy_existing and not self._exists(mapped) and self._exists(real):
            shutil.copyfile(real, mapped)
        return mapped

    def for_read(self, path):
        mapped = self.overlay(path)
        if mapped is not None and self._exists(mapped):
            return mapped
        return path

    # -- the patches ---------------------------------------------------------------------

    def install(self, torch_module=None) -> None:
        """Wrap every Python-level way to write a file (the module's docstring lists
        them; ``torch_module``: torch, whose ``save`` is wrapped too)."""
        self._real = {"stat": os.stat, "makedirs": os.makedirs, "mkdir": os.mkdir,
                      "open": builtins.open}
        open_ = _opening(self, builtins.open)
        patches = [(builtins, "open", open_), (io, "open", open_),
                   (os, "open", _os_opening(self, os.open)),
                   (os, "stat", _stating(self)), (os, "mkdir", _making_dir(self)),
                   (os, "makedirs", _making_dirs(self)),
                   (os, "remove", _removing(self, "remove", os.remove)),
                   (os, "unlink", _removing(self, "remove", os.unlink)),
                   (os, "rmdir", _removing(self, "rmdir", os.rmdir)),
                   (os, "rename", _renaming(self, os.rename)),
                   (os, "replace", _renaming(self, os.replace)),
                   (os, "chmod", _metadata(self, "chmod", os.chmod)),
                   (os, "chown", _metadata(self, "chown", os.chown)),
                   (os, "utime", _metadata(self, "utime", os.utime)),
                   (os, "truncate", _metadata(self, "truncate", os.truncate)),
                   (os, "link", _linking(self, "link", os.link)),
                   (os, "symlink", _linking(self, "symlink", os.symlink)),
                   (shutil, "rmtree", _removing_tree(self, shutil.rmtree))]
        if torch_module is not None:
            patches.append((torch_module, "save", _saving(self, torch_module.save)))
        for module, name, new in patches:
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, new)

    def uninstall(self) -> None:
        while self._saved:
            module, name, old = self._saved.pop()
            setattr(module, name, old)


# -- the wrappers: each takes the real function and sends the user's paths to the overlay ---


def _opening(scratch: Scratch, real_open):
    def open_(file, mode="r", *args, **kwargs):
        if scratch.overlay(file) is not None:
            if _is_write_mode(mode):
                scratch.record("open", file)
                keep = "a" in mode or ("+" in mode and "w" not in mode)
                file = scratch.for_write(file, copy_existing=keep)
            else:
                file = scratch.for_read(file)
        return real_open(file, mode, *args, **kwargs)
    return open_


def _os_opening(scratch: Scratch, real_os_open):
    def os_open(path, flags, mode=0o777, *args, **kwargs):
        if kwargs.get("dir_fd") is None and scratch.overlay(path) is not None:
            if flags & _WRITE_FLAGS:
                scratch.record("open", path)
                path = scratch.for_write(path, copy_existing=not flags & os.O_TRUNC)
            else:
                path = scratch.for_read(path)
        return real_os_open(path, flags, mode, *args, **kwargs)
    return os_open


def _stating(scratch: Scratch):
    def stat_(path, *args, **kwargs):
        if not args and not kwargs.get("dir_fd"):
            path = scratch.for_read(path)
        return scratch._real["stat"](path, *args, **kwargs)
    return stat_


def _making_dir(scratch: Scratch):
    def mkdir_(path, mode=0o777, *args, **kwargs):
        mapped = scratch.overlay(path)
        if mapped is not None and not kwargs.get("dir_fd"):
            scratch.record("mkdir", path)
            real = os.path.abspath(os.fsdecode(os.fspath(path)))
            if scratch._exists(real):
                raise FileExistsError(17, "File exists", os.fsdecode(os.fspath(path)))
            scratch.for_write(path, copy_existing=False)
            path = mapped
        return scratch._real["mkdir"](path, mode, *args, **kwargs)
    return mkdir_


def _making_dirs(scratch: Scratch):
    def makedirs_(name, mode=0o777, exist_ok=False):
        mapped = scratch.overlay(name)
        if mapped is not None:
            scratch.record("makedirs", name)
            real = os.path.abspath(os.fsdecode(os.fspath(name)))
            if scratch._exists(real) and not os.path.isdir(mapped):
                if not exist_ok:
                    raise FileExistsError(17, "File exists", os.fsdecode(os.fspath(name)))
                return None
            name = mapped
        return scratch._real["makedirs"](name, mode, exist_ok)
    return makedirs_


def _removing(scratch: Scratch, kind: str, real_fn):
    def remove_(path, *args, **kwargs):
        mapped = scratch.overlay(path)
        if mapped is not None and not kwargs.get("dir_fd"):
            scratch.record(kind, path)
            if scratch._exists(mapped):
                return real_fn(mapped, *args, **kwargs)
            if scratch._exists(os.path.abspath(os.fsdecode(os.fspath(path)))):
                return None  # the user's file stays; the run goes on as if removed
        return real_fn(path, *args, **kwargs)
    return remove_


def _renaming(scratch: Scratch, real_fn):
    def rename_(src, dst, *args, **kwargs):
        msrc, mdst = scratch.overlay(src), scratch.overlay(dst)
        if (msrc is not None or mdst is not None) and not kwargs:
            scratch.record("rename", dst)
            if msrc is not None:
                if scratch._exists(msrc):
                    src = msrc
                elif scratch._exists(os.path.abspath(os.fsdecode(os.fspath(src)))):
                    target = scratch.for_write(dst, False) if mdst else dst
                    shutil.copy2(src, target)  # the user's file stays where it is
                    return None
            if mdst is not None:
                dst = scratch.for_write(dst, copy_existing=False)
        return real_fn(src, dst, *args, **kwargs)
    return rename_


def _metadata(scratch: Scratch, kind: str, real_fn):
    """chmod / chown / utime / truncate of the user's file: applied to its copy
    in the overlay (made first), never to the file itself."""
    def meta_(path, *args, **kwargs):
        mapped = scratch.overlay(path)
        if mapped is None or kwargs.get("dir_fd") is not None:
            return real_fn(path, *args, **kwargs)
        scratch.record(kind, path)
        real = os.path.abspath(os.fsdecode(os.fspath(path)))
        if not scratch._exists(mapped) and scratch._exists(real):
            if os.path.isdir(real):
                scratch._real["makedirs"](mapped, exist_ok=True)
            else:
                scratch.for_write(path, copy_existing=True)
        return real_fn(mapped, *args, **kwargs)
    return meta_


def _linking(scratch: Scratch, kind: str, real_fn):
    def link_(src, dst, *args, **kwargs):
        mapped = scratch.overlay(dst)
        if mapped is None or kwargs:
            return real_fn(src, dst, *args, **kwargs)
        scratch.record(kind, dst)
        target = scratch.for_write(dst, copy_existing=False)
        if kind == "link":  # a copy: a hard link would make the user's file writable
            shutil.copy2(scratch.for_read(src), target)
            return None
        return real_fn(src, target, *args, **kwargs)
    return link_


def _removing_tree(scratch: Scratch, real_rmtree):
    def rmtree_(path, *args, **kwargs):
        mapped = scratch.overlay(path)
        if mapped is not None:
            scratch.record("rmtree", path)
            if scratch._exists(mapped):
                return real_rmtree(mapped, *args, **kwargs)
            return None
        return real_rmtree(path, *args, **kwargs)
    return rmtree_


def _saving(scratch: Scratch, real_save):
    """torch.save: its C++ writer opens the path itself, so the path is redirected
    here; a save to an open file object is recorded under the file's name."""
    def save_(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)):
            if scratch.overlay(f) is not None:
                scratch.record("torch.save", f)
                f = scratch.for_write(f, copy_existing=False)
            else:
                scratch.record("torch.save", f, redirected=False)
        else:
            name = getattr(f, "name", None)
            if isinstance(name, str):
                scratch.record("torch.save", name, redirected=scratch.overlay(name)
                               is not None)
        return real_save(obj, f, *args, **kwargs)
    return save_
