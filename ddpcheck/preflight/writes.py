"""Who wrote what: the ranks' own record of their writes, joined with what the
sandbox's upper layers say changed (pure Python; torch only when given).

Inside a rank, :class:`WriteRecorder` listens to Python's audit events
(``sys.addaudithook``: ``open`` for writing, ``os.remove``, ``os.rename``,
``os.mkdir``, ``os.chmod``, ``os.utime``, ``os.truncate``, ``os.link``,
``os.symlink``, ``shutil.*``, ``sqlite3.connect``) and wraps ``torch.save``
and ``torch.jit.save`` (whose C++ writers open the file themselves), recording
the path and the user's script line. It never changes what a call does: the
sandbox keeps the writes away from the user's files; this only says which rank
and line made them. After the run, :func:`join` lays those records over the
sandbox's list of what really changed (:class:`~ddpcheck.preflight.sandbox.ChangedPath`):
every change is reported, with its size, and with the rank(s) and line(s)
that wrote it where a rank saw it (a subprocess or native code that writes
leaves a change no rank recorded: its rank is unknown).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

MAX_RECORDS = 500
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass
class Write:
    """One write: what changed, by whom, where in the script."""

    path: str  # absolute; links in the folders on the way resolved
    kind: str  # the call: open, torch.save, remove, rename, mkdir, chmod, ...; "" unknown
    rank: Optional[int] = None  # None: no rank's own record has it (a subprocess, native code)
    where: str = ""  # the script line, where known
    bytes: Optional[int] = None  # a file's size after the run (from the sandbox)
    change: str = ""  # created / modified / removed / mode / times / replaced ("" unknown)
    count: int = 1  # calls of this kind on this path by this rank
    node: Optional[int] = None  # the (emulated) node of the rank


# -- inside a rank ---------------------------------------------------------------------------


def _text(path) -> Optional[str]:
    if isinstance(path, int) or path is None:
        return None
    try:
        text = os.fspath(path)
    except TypeError:
        return None
    return os.fsdecode(text) if isinstance(text, bytes) else text


def _resolved(path: str, follow: bool) -> str:
    full = os.path.abspath(path)
    if follow:
        return os.path.realpath(full)
    return os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))


def _open_writes(args) -> bool:
    mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
    if isinstance(mode, str):
        return any(ch in mode for ch in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


# event -> (kind, indexes of the path arguments, follow links of the last part)
_EVENTS = {
    "os.remove": ("remove", (0,), False), "os.rmdir": ("rmdir", (0,), False),
    "os.rename": ("rename", (0, 1), False), "os.mkdir": ("mkdir", (0,), False),
    "os.chmod": ("chmod", (0,), True), "os.chown": ("chown", (0,), True),
    "os.utime": ("utime", (0,), True), "os.truncate": ("truncate", (0,), True),
    "os.link": ("link", (1,), False), "os.symlink": ("symlink", (1,), False),
    "shutil.copyfile": ("copy", (1,), True), "shutil.copytree": ("copytree", (1,), False),
    "shutil.move": ("move", (0, 1), False), "shutil.rmtree": ("rmtree", (0,), False),
    "sqlite3.connect": ("sqlite3", (0,), True),
}

_FOLDER_KINDS = ("copytree", "move", "rename")

_active: Optional["WriteRecorder"] = None
_installed = False
_local = threading.local()


def _audit(event: str, args) -> None:
    recorder = _active
    if recorder is None or getattr(_local, "busy", False):
        return
    if event == "open":
        if not _open_writes(args):
            return
        spec = ("open", (0,), True)
    else:
        spec = _EVENTS.get(event)
        if spec is None:
            return
    _local.busy = True
    try:
        kind, indexes, follow = spec
        for index in indexes:
            if index < len(args):
                recorder.record(kind, args[index], follow)
    except Exception:  # recording must never break the script
        pass
    finally:
        _local.busy = False


class WriteRecorder:
    """The writes this process (and the threads it runs) makes while active, and those of
    the processes it forks (DataLoader workers): they inherit the hook and append what
    they record to ``spill``, a file in the run's own folder read back by :meth:`collect`."""

    def __init__(self, where: Callable[[], str], own: tuple = (), spill: Optional[str] = None):
        self.where = where  # the user's script line of the current call ("" if none)
        self.own = tuple(os.path.realpath(p) for p in own if p)  # the preflight's folders
        self.spill = spill
        self.writes: list[Write] = []
        self._index: dict = {}
        self._saved: list = []
        self._pid = os.getpid()

    def record(self, kind: str, path, follow: bool = True) -> None:
        text = _text(path)
        if text is None or text == ":memory:":
            return
        full = _resolved(text, follow)
        if any(full == p or full.startswith(p + os.sep) for p in self.own):
            return
        if full.startswith(("/dev/", "/proc/", "/sys/")):
            return
        where = self.where()
        if not where:
            return  # not the user's code: the preflight's own machinery, or torch's
        if os.getpid() != self._pid:
            self._spill(kind, full, where)
            return
        key = (kind, full)
        found = self._index.get(key)
        if found is not None:
            found.count += 1
            return
        if len(self.writes) >= MAX_RECORDS:
            return
        write = Write(full, kind, where=where)
        self._index[key] = write
        self.writes.append(write)

    def _spill(self, kind: str, full: str, where: str) -> None:
        """In a forked child: one json line, appended in one write (atomic for a line)."""
        if not self.spill:
            return
        busy, _local.busy = getattr(_local, "busy", False), True
        try:
            fd = os.open(self.spill, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps({"kind": kind, "path": full, "where": where})
                              + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass
        finally:
            _local.busy = busy

    def collect(self) -> list[Write]:
        """This process's records and its forked children's."""
        if self.spill:
            try:
                with open(self.spill) as fh:
                    lines = fh.read().splitlines()
            except OSError:
                lines = []
            for line in lines:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                key = (data["kind"], data["path"])
                if key in self._index:
                    self._index[key].count += 1
                elif len(self.writes) < MAX_RECORDS:
                    self._index[key] = Write(data["path"], data["kind"], where=data["where"])
                    self.writes.append(self._index[key])
            self.spill = None
        return list(self.writes)

    def install(self, torch_module=None) -> None:
        global _active, _installed
        if not _installed:
            sys.addaudithook(_audit)  # cannot be removed: it idles while no recorder is active
            _installed = True
        _active = self
        if torch_module is not None:
            self._wrap_saves(torch_module)

    def _wrap_saves(self, torch) -> None:
        recorder = self

        def wrap(owner, name: str, kind: str):
            real = getattr(owner, name, None)
            if real is None:
                return

            def save(obj, f, *args, **kwargs):
                target = f if isinstance(f, (str, bytes, os.PathLike)) \
                    else getattr(f, "name", None)
                if target is not None:
                    recorder.record(kind, target)
                return real(obj, f, *args, **kwargs)

            self._saved.append((owner, name, real))
            setattr(owner, name, save)

        wrap(torch, "save", "torch.save")
        wrap(torch.serialization, "save", "torch.save")
        wrap(torch.jit, "save", "torch.jit.save")

    def uninstall(self) -> None:
        global _active
        if _active is self:
            _active = None
        while self._saved:
            owner, name, real = self._saved.pop()
            setattr(owner, name, real)


# -- after the run: the report's list -------------------------------------------------------


def join(changes: list, by_rank: dict, limit: int = 1000) -> list[Write]:
    """Every change the sandbox saw, with the rank records that match it.

    ``changes``: :class:`~ddpcheck.preflight.sandbox.ChangedPath` (all of them, or
    None when there was no sandbox to read: then the ranks' records are the list);
    ``by_rank``: ``rank -> [(Write, node)]`` as each rank recorded them. A change several
    ranks wrote appears once per rank; a change inside a folder a rank copied or
    moved goes to that rank; a change no rank recorded appears with rank None. A
    record without a change (written, then removed again) is not a change: it is
    left out (the ranks' own records still feed the verdicts).
    """
    rows: list[Write] = []
    if changes is None:
        for rank, records in sorted(by_rank.items()):
            for write, node in records:
                rows.append(Write(write.path, write.kind, rank, write.where,
                                  getattr(write, "bytes", None), getattr(write, "change", ""),
                                  write.count, node))
        return rows[:limit]
    for change in changes:
        hits = []
        for rank, records in sorted(by_rank.items()):
            for write, node in records:
                if write.path == change.path:
                    hits.append((rank, write, node))
        if not hits:
            hits = [(rank, write, node) for rank, records in sorted(by_rank.items())
                    for write, node in records if write.kind in _FOLDER_KINDS
                    and change.path.startswith(write.path + os.sep)]
        if not hits:
            rows.append(Write(change.path, "", None, "", change.bytes, change.change))
            continue
        seen = set()
        for rank, write, node in hits:
            if rank in seen:
                continue
            seen.add(rank)
            rows.append(Write(change.path, write.kind, rank, write.where, change.bytes,
                              change.change, write.count, node))
    return rows[:limit]


def rows(writes: list[Write]) -> list[dict]:
    """The report's json rows."""
    from dataclasses import asdict

    return [asdict(w) for w in writes]


def writes_table(writes: list, limit: int = 20) -> list[str]:
    """Text lines listing what the user's code changed (:class:`Write` or json rows)."""
    from tabulate import tabulate

    from ddpcheck.preflight.units import format_bytes, relative_path

    if not writes:
        return []
    get = (lambda w, k: w.get(k)) if isinstance(writes[0], dict) else getattr
    rows = []
    for w in writes[:limit]:
        rank, size = get(w, "rank"), get(w, "bytes")
        rows.append(("?" if rank is None else rank, get(w, "kind"), get(w, "change") or "",
                     relative_path(get(w, "path")), "" if size is None else format_bytes(size),
                     get(w, "where") or ""))
    out = ["", "Files the run changed, kept out of your folders (then discarded):",
           tabulate(rows, headers=("rank", "call", "change", "path", "size", "line"),
                    tablefmt="simple", disable_numparse=True)]
    if len(writes) > limit:
        out.append(f"... and {len(writes) - limit} more (--format json lists them all)")
    return out
