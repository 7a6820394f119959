"""The process that owns a preflight run: it starts the run in the sandbox, holds
its deadline, and cleans up on every way out (pure Python, no torch).

``ddpcheck preflight`` checks its options here, in the user's own process, and
then runs everything that imports torch or the user's code (the launcher, the
ranks, whatever they start) as one inner process tree inside the sandbox
(:mod:`ddpcheck.preflight.sandbox`; its entry point is
:mod:`ddpcheck.preflight.inside`). This process never runs user code, so
nothing the user's code does can stop it from ending the run:

* at ``--timeout`` the inner launcher's watchdog stops the ranks and reports
  who had not finished; :data:`GRACE` seconds later this process kills the
  whole sandbox whatever happened inside and reports from the ranks' progress
  files itself;
* SIGINT, SIGTERM or SIGHUP here kill the sandbox at once; if this process is
  killed outright (SIGKILL), bwrap's ``--die-with-parent`` takes the sandbox
  down with it (with the Landlock or no sandbox, the inner processes die with
  their parents, but a process the script started on its own could survive);
* the run's private folder is removed on the way out, or kept (with only the
  workers' logs) when the report names it; folders of earlier runs that were
  killed are removed at the next start (:func:`sandbox.sweep_stale`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from ddpcheck.preflight import sandbox as sandboxing
from ddpcheck.preflight.progress import read_records
from ddpcheck.preflight.sandbox import Level, Sandbox

GRACE = 8.0  # after --timeout: time the inner launcher has to stop its ranks and report
REQUEST = "request.json"
STATUS = "status.json"
LAUNCH = "launch"  # the inner launcher's folder in the box: results/ (progress), logs/


@dataclass(frozen=True)
class Request:
    """What the inner process runs (json in the box)."""

    mode: str  # "factory" or "script"
    options: dict  # PreflightOptions, as plain values
    cwd: str
    deadline: float  # time.time() by which every rank must have finished
    sandbox: dict  # Sandbox.to_dict()
    steps: Optional[int] = None
    script_args: list = field(default_factory=list)
    environ: dict = field(default_factory=dict)  # set in the inner process (TMPDIR, ...)
    nodes: Optional[int] = None  # script mode's --nodes


@dataclass
class Outcome:
    code: int
    out: str = ""  # a report of the supervisor's own (the run could not write one)
    err: str = ""


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, default=str)
    os.replace(tmp, path)


def read_status(box: str) -> dict:
    try:
        with open(os.path.join(box, STATUS)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def write_status(box: str, **status) -> None:
    """Add ``status`` to what the run's status file holds (only the inner process writes it)."""
    _write_json(os.path.join(box, STATUS), {**read_status(box), **status})


# -- killing a process tree ---------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    kids, out, todo = _children_map(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def kill_tree(proc: subprocess.Popen, patience: float = 10.0) -> None:
    """SIGKILL a process, its process group and everything below it (stopped first,
    so none of them can start another on the way), and wait until they are gone: when
    this returns, no process of the run holds a file, a port or a GPU."""
    doomed: set[int] = set()
    for _ in range(5):
        below = descendants(proc.pid)
        doomed.update(below)
        for pid in below:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        for pid in [proc.pid] + below:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if not below:
            break
    try:
        proc.wait(patience)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.time() + patience
    while any(_alive(pid) for pid in doomed) and time.time() < deadline:
        time.sleep(0.02)


# -- the run ---------------------------------------------------------------------------------


class _Signals:
    """SIGINT / SIGTERM / SIGHUP while the run is on: remembered, acted on by the loop."""

    WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.received: Optional[int] = None
        self.saved: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.WATCHED:
                self.saved[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False


def _inner_command(box: Sandbox) -> list[str]:
    """This interpreter, inside the sandbox, running :func:`inside.main`. ddpcheck is
    found where this process found it, appended to the path (the user's own modules
    come first, and nothing is added to the environment the script's processes see)."""
    import ddpcheck

    root = os.path.dirname(os.path.dirname(os.path.abspath(ddpcheck.__file__)))
    code = (f"import sys; sys.path.append({root!r}); "
            f"from ddpcheck.preflight.inside import main; sys.exit(main({box.box!r}))")
    return list(box.command) + [sys.executable, "-c", code]


def _inner_env(box: Sandbox, request: Request) -> dict:
    env = dict(os.environ)
    env.update(request.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class _Relay(threading.Thread):
    """Passes what the inner process prints on as it comes (under torchrun or srun the
    rank's script prints to the user's terminal), remembering whether there was any."""

    def __init__(self, stream, echo: Callable[[str], None]):
        super().__init__(name="ddpcheck-relay", daemon=True)
        self.stream, self.echo = stream, echo
        self.printed = False
        self.bwrap: list[str] = []  # bwrap's own complaints, kept for the report

    def run(self) -> None:
        for line in iter(self.stream.readline, ""):
            if line.startswith("bwrap:"):
                self.bwrap.append(line.strip())
                continue
            self.printed = True
            try:
                self.echo(line)
            except (OSError, ValueError):  # the terminal went away: keep draining
                pass


def run(box: Sandbox, request: Request, timeout: float,
        on_deadline: Callable[[dict, float], str], on_lost: Callable[[str], str],
        echo_out: Callable[[str], None], echo_err: Callable[[str], None]) -> Outcome:
    """Run ``request`` in ``box``, passing on what it prints; its exit code, and the
    report this process writes itself when the run could not (``Outcome.out``).

    ``on_deadline(records, timeout)``: the report when the sandbox had to be killed at
    the hard deadline (``records``: the ranks' last progress); ``on_lost(why)``: the
    report when the inner process died without one.
    """
    _write_json(os.path.join(box.box, REQUEST), asdict(request))
    hard_deadline = request.deadline + GRACE
    with _Signals() as signals:
        proc = subprocess.Popen(_inner_command(box), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=_inner_env(box, request),
                                cwd=request.cwd, start_new_session=True)
        out, err = _Relay(proc.stdout, echo_out), _Relay(proc.stderr, echo_err)
        out.start()
        err.start()
        reason = ""
        try:
            while proc.poll() is None:
                if signals.received is not None:
                    reason = "signal"
                    break
                if time.time() >= hard_deadline:
                    reason = "deadline"
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None or reason:
                kill_tree(proc)
            for relay in (out, err):
                relay.join(5)  # a process the run started may still hold the pipe
    if reason == "signal":
        name = signal.Signals(signals.received).name
        return Outcome(128 + signals.received, "",
                       f"ddpcheck: interrupted ({name}); every process of the run was "
                       f"stopped\n")
    if reason == "deadline":
        reported = read_status(box.box)
        if reported.get("reported"):
            # the run ended and its report is out; only the process's exit came too late
            # (a slow interpreter shutdown): a second report would contradict it
            return Outcome(int(reported.get("exit_code", 1)))
        records = read_records(os.path.join(box.box, LAUNCH, "results"))
        return Outcome(1, on_deadline(records, timeout))
    code = proc.returncode
    if code is None or code < 0 or (not out.printed and code not in (0, 2, 130)):
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit {code}")
        if err.bwrap:
            how = err.bwrap[-1]
        return Outcome(1, on_lost(how))
    return Outcome(code)


def kept_logs(box: Sandbox) -> Optional[str]:
    """The workers' logs the inner report names, if it kept them."""
    kept = read_status(box.box).get("kept_logs")
    return kept if isinstance(kept, str) and kept.startswith(box.run_dir + os.sep) else None


def finish(box: Sandbox) -> None:
    """Remove the run's folder, or keep only the logs the report names."""
    kept = kept_logs(box)
    if kept and os.path.isdir(kept):
        sandboxing.keep_for_logs(box.run_dir, kept)
    else:
        sandboxing.remove_tree(box.run_dir)
