"""What a run left behind, found by process id, never by name.

Every process a test starts carries ``DDPCHECK_TEST_MARKER=<uuid>`` in its
environment, and so does everything those processes start (an environment is
inherited): :func:`marked_pids` lists them from /proc. :func:`listening_ports`
reads the TCP sockets those very processes hold open in LISTEN state.
"""

from __future__ import annotations

import os
import signal


def marked_pids(marker: str) -> list[int]:
    """Live, non-zombie processes whose environment carries ``marker``."""
    needle = f"DDPCHECK_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def listening_ports(pids: list[int]) -> list[int]:
    """TCP ports in LISTEN state held by these processes."""
    inodes = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed check (the test's own processes only)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
