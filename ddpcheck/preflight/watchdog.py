"""The launcher's watchdog: stops ranks that can no longer finish, and says why.

It reads only the progress files (:mod:`ddpcheck.preflight.progress`) and the
workers' stderr logs, never the process group, so nothing a rank does can
block it. It stops the run:

* when a rank posted a failure at meeting point ``k`` (or finished) and a peer
  has not reached ``k`` within ``grace`` seconds: that peer is stuck where the
  failed rank will never join it (typically DDP's gradient all_reduce);
* when a rank has waited at a meeting point for ``probe_after`` seconds while
  a peer is still before it, and the peer's stack (dumped on SIGUSR1) shows it
  blocked in a ``torch.distributed`` collective: a collective only that rank
  calls, which can never complete;
* when a rank's process ended without a final record (``os._exit``, killed
  by a signal) and a peer has not finished within ``grace`` seconds;
* at the deadline (``--timeout``).

Before killing, every unfinished rank gets SIGUSR1 so its faulthandler writes
its stack to its log; the report names each rank's frame. A rank that was
waiting for its peers then (at a meeting point, or blocked in a collective
while another rank was elsewhere) is told apart from the one it waited for.

torch's elastic agent waits for a return value from every worker, so a worker
that leaves with ``os._exit`` would keep it polling forever: once every rank's
process is gone (finished, ended or killed) and the agent has not returned
within a moment, the watchdog interrupts it (``agent_interrupted``), so the
launcher owns the end of the run, not the ranks.
"""

from __future__ import annotations

import enum
import multiprocessing
import os
import signal
import threading
import time
from typing import Optional

from ddpcheck.preflight import forensics
from ddpcheck.preflight.progress import read_records


class StopReason(str, enum.Enum):
    NONE = "none"
    DEADLINE = "deadline"
    PEER_FAILED = "peer_failed"  # a rank failed or finished; the others could not follow
    ALONE_IN_COLLECTIVE = "alone_in_collective"
    PEER_ENDED = "peer_ended"  # a rank's process ended without a result; the others waited


AGENT_PATIENCE = 2.0  # seconds the agent gets to return once every worker is gone
LINGER = 3.0  # seconds a rank's process may take to exit after its final record


def process_gone(pid: Optional[int]) -> bool:
    """The process has exited (a zombie not yet reaped counts as gone)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


class Watchdog(threading.Thread):
    def __init__(self, results_dir: str, log_dir: str, nproc: int, deadline: float,
                 grace: float = 3.0, probe_after: float = 2.0, probe_every: float = 5.0):
        super().__init__(name="ddpcheck-preflight-watchdog", daemon=True)
        self.results_dir = results_dir
        self.log_dir = log_dir
        self.nproc = nproc
        self.deadline = deadline
        self.grace = grace
        self.probe_after = probe_after
        self.probe_every = probe_every
        self.stop = threading.Event()
        self.killed: dict[int, int] = {}  # rank -> pid
        self.reason = StopReason.NONE
        self.trigger_rank: Optional[int] = None  # the rank whose failure (or wait) stopped the run
        self.alone: dict[int, forensics.StackReading] = {}  # rank -> where it waits alone
        self._seen: dict[tuple, float] = {}  # (rank, seq, final) -> first seen
        self._probed: dict[tuple, float] = {}  # (rank, seq) -> last probe time
        self.gone: dict[int, float] = {}  # rank -> when its process was seen ended, no result
        self.waiting: set[int] = set()  # killed while waiting for a peer (not hung)
        self.agent_interrupted = False
        self.lingered: set[int] = set()  # finished, then killed: their process did not exit
        self._all_gone_since: Optional[float] = None
        self._done_since: Optional[float] = None
        self._stopped = False

    def run(self) -> None:
        while not self.stop.wait(0.05):
            records = read_records(self.results_dir)
            finals = {r for r, rec in records.items() if rec.final}
            now = time.time()
            self._note_gone(records, finals, now)
            if self._stopped or len(finals) + len(self.gone) >= self.nproc:
                if self._stopped:
                    self._kill_stragglers(records, finals)
                if self._everyone_gone(records, finals):
                    self._all_gone_since = self._all_gone_since or now
                    if now - self._all_gone_since >= AGENT_PATIENCE:
                        self._interrupt_agent()
                        return
                else:
                    self._done_since = self._done_since or now
                    if now - self._done_since >= LINGER:
                        self._kill_lingering(records, finals)
                if not self._stopped and now >= self.deadline:
                    self._stop_all(records, finals, StopReason.DEADLINE, None)
                continue
            if now >= self.deadline:
                self._stop_all(records, finals, StopReason.DEADLINE, None)
                continue
            trigger = self._failed_and_left_behind(records, finals, now)
            if trigger is not None:
                self._stop_all(records, finals, StopReason.PEER_FAILED, trigger)
                continue
            ended = self._ended_and_left_behind(finals, now)
            if ended is not None:
                self._stop_all(records, finals, StopReason.PEER_ENDED, ended)
                continue
            alone = self._alone_in_collective(records, finals, now)
            if alone is not None:
                self._stop_all(records, finals, StopReason.ALONE_IN_COLLECTIVE, alone)
                continue

    # -- processes that ended without a result ----------------------------------------

    def _note_gone(self, records, finals, now) -> None:
        for rank, rec in records.items():
            if rank in finals or rank in self.gone or rank in self.killed:
                continue
            if process_gone(rec.pid):
                self.gone[rank] = now

    def _everyone_gone(self, records, finals) -> bool:
        for rank in range(self.nproc):
            rec = records.get(rank)
            if rec is None or not process_gone(rec.pid):
                return False
        return True

    def _ended_and_left_behind(self, finals, now) -> Optional[int]:
        for rank, when in sorted(self.gone.items(), key=lambda kv: kv[1]):
            if now - when < self.grace:
                continue
            if any(r not in finals and r not in self.gone for r in range(self.nproc)):
                return rank
        return None

    def _kill_stragglers(self, records, finals) -> None:
        """After the stop, nothing unfinished may go on: a rank that started (or
        wrote its first record) only after the stop is killed too."""
        for rank, rec in records.items():
            if rank not in finals and rank not in self.killed and rank not in self.gone \
                    and not process_gone(rec.pid) and self._signal(rec.pid, signal.SIGKILL):
                self.killed[rank] = rec.pid
        final_pids = {records[r].pid for r in finals}
        for child in multiprocessing.active_children():
            if child.pid not in final_pids:
                self._signal(child.pid, signal.SIGKILL)

    def _kill_lingering(self, records, finals) -> None:
        """A rank that wrote its final record but whose process does not exit (stuck
        in a library's teardown, e.g. a process group whose peer is gone): its result
        is in; the process goes."""
        for rank in finals:
            rec = records.get(rank)
            if rec is not None and not process_gone(rec.pid) and \
                    self._signal(rec.pid, signal.SIGKILL):
                self.lingered.add(rank)

    def _interrupt_agent(self) -> None:
        """Every worker is gone but the agent still waits for a return value: stop it
        the way torchrun stops it (its SIGTERM handler raises in the main thread)."""
        self.agent_interrupted = True
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except OSError:
            pass

    # -- the triggers ------------------------------------------------------------------

    def _failed_and_left_behind(self, records, finals, now) -> Optional[int]:
        for rank, rec in records.items():
            if not (rec.final or rec.failure is not None):
                continue
            key = (rank, rec.seq, rec.final)
            first = self._seen.setdefault(key, now)
            if now - first < self.grace:
                continue
            for other in range(self.nproc):
                if other == rank or other in finals:
                    continue
                peer = records.get(other)
                if rec.final or peer is None or peer.seq < rec.seq:
                    return rank
        return None

    def _alone_in_collective(self, records, finals, now) -> Optional[int]:
        waiting = [rec for rec in records.values() if rec.waiting and not rec.final]
        if not waiting:
            return None
        ahead = max(waiting, key=lambda rec: rec.seq)
        if now - ahead.since < self.probe_after:
            return None
        for rank in range(self.nproc):
            peer = records.get(rank)
            if rank in finals or peer is None or peer.seq >= ahead.seq or peer.waiting:
                continue
            key = (rank, peer.seq)
            last = self._probed.get(key)
            if last is not None and now - last < self.probe_every:
                continue
            self._probed[key] = now
            reading = self._probe(rank, peer.pid)
            if reading is not None and reading.collective:
                self.alone[rank] = reading
                self.trigger_rank = ahead.rank
                return rank
        return None

    def _probe(self, rank: int, pid: int) -> Optional[forensics.StackReading]:
        offset = forensics.log_size(self.log_dir, rank)
        if not self._signal(pid, signal.SIGUSR1):
            return None
        for _ in range(20):  # the dump is written from a signal handler: give it a moment
            time.sleep(0.05)
            reading = forensics.read_stack(forensics.stderr_lines(self.log_dir, rank, offset))
            if reading is not None:
                return reading
        return None

    # -- stopping ----------------------------------------------------------------------

    def _stop_all(self, records, finals, reason: StopReason, trigger: Optional[int]) -> None:
        self._stopped = True
        self.reason = reason
        if self.trigger_rank is None:
            self.trigger_rank = trigger
        doomed = {rank: (records.get(rank).pid if records.get(rank) else None)
                  for rank in range(self.nproc) if rank not in finals and rank not in self.gone}
        # at a meeting point of the tool's own: waiting for the others, not stuck
        self.waiting |= {rank for rank in doomed if records.get(rank) is not None
                         and records[rank].waiting}
        # SIGUSR1 first: the worker's faulthandler writes every thread's stack to
        # its log, so the report can say where each rank was
        dumped = [self._signal(pid, signal.SIGUSR1) for rank, pid in doomed.items()
                  if pid and rank not in self.alone]
        if any(dumped):
            time.sleep(0.5)  # faulthandler writes from a signal handler: give it a moment
        for rank, pid in doomed.items():
            if pid and self._signal(pid, signal.SIGKILL):
                self.killed[rank] = pid
        if reason == StopReason.DEADLINE or \
                len(self.killed) + len(finals) + len(self.gone) < self.nproc:
            # a rank that never wrote its pid, or (at the deadline, whatever the records
            # and /proc say) any worker still alive: kill every unfinished worker child
            final_pids = {records[r].pid for r in finals}
            for child in multiprocessing.active_children():
                if child.pid not in final_pids:
                    self._signal(child.pid, signal.SIGKILL)

    @staticmethod
    def _signal(pid: Optional[int], sig: int) -> bool:
        if not pid:
            return False
        try:
            os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
