"""The inner process of a preflight run: ``python -m ddpcheck.preflight.inside BOX``.

Started by :mod:`ddpcheck.preflight.supervisor` inside the sandbox, with the
run's request in ``BOX/request.json``. It is where torch and the user's code
are imported: it runs the factory or the script mode exactly as the command
would, prints the report on its stdout (a file the supervisor prints), and
leaves in ``BOX/status.json`` what the supervisor must keep.

With the Landlock level it first restricts itself (and so everything it
starts) to writing in the run's own folder; without bwrap's PID namespace it
becomes the subreaper of everything below it and kills what is left before
it exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from ddpcheck.errors import UsageError, error_line
from ddpcheck.preflight import supervisor
from ddpcheck.preflight.sandbox import Level, Sandbox

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_descendants() -> None:
    for pid in supervisor.descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _options(data: dict):
    from ddpcheck.preflight.options import PreflightOptions

    if data.get("input_shape") is not None:
        data["input_shape"] = tuple(data["input_shape"])
    return PreflightOptions(**data)


def main(box_dir: str) -> int:
    with open(os.path.join(box_dir, supervisor.REQUEST)) as fh:
        request = supervisor.Request(**json.load(fh))
    box = Sandbox.from_dict(request.sandbox)
    os.environ.update(request.environ)
    if box.level != Level.OVERLAY:
        # no PID namespace: die with the supervisor, and adopt what our children orphan
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if box.level == Level.LANDLOCK:
        from ddpcheck.preflight import landlock

        landlock.allow_writes_only_under([box.box, "/dev"])
    os.chdir(request.cwd)
    opts = _options(dict(request.options))
    code = 1
    answered = False  # a report or an error line is out (not an unexpected traceback)
    try:
        if request.mode == "script":
            from ddpcheck.preflight.script.command import run_script_preflight

            code = run_script_preflight(opts, request.steps, list(request.script_args),
                                        nodes=request.nodes, box=box, deadline=request.deadline)
        else:
            from ddpcheck.preflight.command import run_preflight

            code = run_preflight(opts, box=box, deadline=request.deadline)
        answered = True
    except UsageError as exc:
        print(error_line(exc.format_message()), file=sys.stderr)
        code, answered = exc.exit_code, True
    except SystemExit as exc:
        code, answered = (exc.code if isinstance(exc.code, int) else 1), True
    finally:
        sys.stdout.flush()
        if answered:
            # past this point a kill at the hard deadline loses nothing of the answer
            supervisor.write_status(box.box, reported=True, exit_code=code)
        if box.level != Level.OVERLAY:
            _kill_descendants()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
