"""The progress protocol between a worker and the launcher's watchdog (no torch).

Every rank keeps one json file up to date (atomically replaced): the stage it
is in and since when, its pid, how many meeting points it has entered
(``seq``), the failure it posted before meeting the others, and at the end its
:class:`~ddpcheck.preflight.results.RankResult`. This is the tool's own
control channel on the launcher's side: it never touches the process group the
user's model uses, so a rank stuck in a collective cannot block it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Optional

from ddpcheck.preflight.results import (
    RankFailure,
    RankResult,
    from_json_dict,
    to_json_dict,
)

PROGRESS_NAME = "rank{rank}.json"
WAITING_PREFIX = "waiting for every rank at "


@dataclass
class ProgressRecord:
    rank: int
    pid: int
    stage: str
    since: float
    seq: int = 0  # meeting points this rank has entered
    waiting: bool = False  # inside a meeting point right now
    failure: Optional[RankFailure] = None  # posted on the way into the meeting point
    final: bool = False
    result: Optional[RankResult] = None


def write_record(results_dir: Optional[str], record: ProgressRecord) -> None:
    """Atomically replace this rank's progress file (a no-op without a directory)."""
    if not results_dir:
        return
    path = os.path.join(results_dir, PROGRESS_NAME.format(rank=record.rank))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(to_json_dict(record), fh, default=str)
    os.replace(tmp, path)


def read_records(results_dir: str) -> dict[int, ProgressRecord]:
    out = {}
    for path in glob.glob(os.path.join(results_dir, "rank*.json")):
        match = re.search(r"rank(\d+)\.json$", path)
        if not match:
            continue
        try:
            with open(path) as fh:
                out[int(match.group(1))] = from_json_dict(ProgressRecord, json.load(fh))
        except (OSError, ValueError):  # being replaced right now: next poll
            continue
    return out


class Progress:
    """This rank's side of the protocol."""

    def __init__(self, results_dir: Optional[str], rank: int):
        self.results_dir = results_dir
        self.rank = rank
        self.current = "starting the worker process"
        self.seq = 0

    def _write(self, **fields) -> None:
        write_record(self.results_dir, ProgressRecord(
            rank=self.rank, pid=os.getpid(), since=time.time(), seq=self.seq, **fields))

    def stage(self, name: str) -> None:
        self.current = name
        self._write(stage=name)

    def meet(self, what: str, failure: Optional[RankFailure] = None) -> None:
        """Entering a meeting point; a failure is posted first, so the watchdog
        can stop ranks that will never get there (stuck in the model's collective)."""
        self.seq += 1
        self._write(stage=WAITING_PREFIX + repr(what), waiting=True, failure=failure)

    def final(self, result: RankResult) -> None:
        self._write(stage="done", final=True, result=result)
