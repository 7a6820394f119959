"""What a worker's stderr log says about it (pure Python, no torch).

Crashed ranks: Python's fatal-error line and the innermost frame faulthandler
printed. Hung or stopped ranks: the stack faulthandler dumped on the
watchdog's SIGUSR1: the innermost frame of the user's code, and the
``torch.distributed`` collective it is blocked in, if any.
"""

from __future__ import annotations

import glob
import os
import re
import signal
from dataclasses import dataclass
from typing import Optional

_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_C10D_FILES = ("distributed_c10d.py",)
# script mode meets the other ranks over the store before every collective: a rank
# inside this file when its stack was dumped waits for its peers there
_LOCKSTEP_FILES = (f"{os.sep}ddpcheck{os.sep}preflight{os.sep}script{os.sep}observe.py",)
# frames that are not the user's code
_NOT_USER = ("site-packages", f"{os.sep}ddpcheck{os.sep}preflight{os.sep}", "<frozen",
             f"{os.sep}lib{os.sep}python")


def stderr_path(log_dir: str, local_rank: int) -> Optional[str]:
    paths = glob.glob(os.path.join(log_dir, "**", "attempt_*", str(local_rank), "stderr.log"),
                      recursive=True)
    return paths[0] if paths else None


def stderr_lines(log_dir: str, local_rank: int, offset: int = 0) -> list[str]:
    path = stderr_path(log_dir, local_rank)
    if not path:
        return []
    try:
        with open(path, errors="replace") as fh:
            fh.seek(offset)
            return [ln.rstrip() for ln in fh.read().splitlines() if ln.strip()]
    except OSError:
        return []


def log_size(log_dir: str, local_rank: int) -> int:
    path = stderr_path(log_dir, local_rank)
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{_short(self.file)}:{self.line} in {self.func}"

    @property
    def is_user(self) -> bool:
        return not any(part in self.file for part in _NOT_USER)


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _thread_stacks(text: list[str]) -> list[list[Frame]]:
    """Every thread's frames (innermost first) from faulthandler dumps."""
    stacks: list[list[Frame]] = []
    current: Optional[list[Frame]] = None
    for line in text:
        stripped = line.strip()
        if stripped.startswith(("Current thread", "Thread 0x")):
            current = []
            stacks.append(current)
            continue
        match = _FRAME_RE.search(stripped)
        if current is not None and match and stripped.startswith("File "):
            current.append(Frame(match["file"], int(match["line"]), match["func"]))
        elif current is not None and stripped and not stripped.startswith("File "):
            current = None
    return [s for s in stacks if s]


@dataclass(frozen=True)
class StackReading:
    frame: str  # innermost frame of the user's code, else the innermost frame
    collective: str = ""  # torch.distributed function the thread is blocked in
    lockstep: bool = False  # waiting for its peers before a collective (script mode)

    @property
    def waits_for_peers(self) -> bool:
        return bool(self.collective) or self.lockstep


def read_stack(text: list[str]) -> Optional[StackReading]:
    """The main thread of the last dump: its deepest stack (worker threads of torch
    have none or short ones)."""
    stacks = _thread_stacks(text)
    if not stacks:
        return None
    stack = max(stacks, key=len)
    user = next((f for f in stack if f.is_user), None)
    collective = ""
    c10d = [i for i, f in enumerate(stack) if f.file.endswith(_C10D_FILES)]
    if c10d:
        collective = stack[c10d[-1]].func  # the outermost c10d frame is the public call
        after = stack[c10d[-1] + 1:]
        caller = next((f for f in after if f.is_user), None) or \
            next((f for f in after if "c10d_logger" not in f.file), None)
        if caller is not None:
            user = caller
    lockstep = not collective and any(f.file.endswith(_LOCKSTEP_FILES) for f in stack)
    return StackReading(str(user or stack[0]), collective, lockstep)


def summarize_stderr(text: list[str], lines: int = 3) -> str:
    """What a dead rank said last, in one line: Python's fatal-error line and the
    innermost frame faulthandler printed, else its last lines."""
    for i, line in enumerate(text):
        if line.startswith("Fatal Python error"):
            frame = next((ln.strip() for ln in text[i + 1:] if ln.strip().startswith("File ")),
                         "")
            match = _FRAME_RE.search(frame)
            where = str(Frame(match["file"], int(match["line"]), match["func"])) if match else ""
            return f"{line.strip()}" + (f" at {where}" if where else "")
    kept = [ln for ln in text if not ln.startswith(("[W", "[I", "Extension modules"))] or text
    return " | ".join(ln.strip() for ln in kept[-lines:])


def describe_exit(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}" if exitcode is not None else "died"
