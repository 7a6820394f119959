"""The preflight's promise, tried as a hostile tester would: nothing the user owns
changes by any route, nothing is left running, every run ends in time.

The probe scripts live in tests/preflight/probes/ (written for these tests):
``write_routes.py`` takes 38 routes to change a file (open in the working folder,
beside it, under the temp folder and HOME, after chdir, through a symlink, torch /
numpy / tarfile / sqlite3 / shutil / os.* writers, a thread, subprocesses,
DataLoader workers forked and spawned); every route is first run under a real
torchrun to show it really writes. The others end badly in one way each. Every
process a test starts carries a marker in its environment, so what is left is
found by process id (and the ports those processes listen on), never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from ddpcheck.preflight import sandbox as sandboxing
from ddpcheck.preflight.sandbox import Level

from .conftest import REPO
from .probes.leftovers import kill_all, listening_ports, marked_pids
from .probes.tree import CHANGES, changed, make_tree, routes_that_changed, snapshot

pytest.importorskip("torch")

PROBES = Path(__file__).resolve().parent / "probes"
# routes whose write a rank sees itself (Python code in the rank's own process, or in
# a process it forked: a DataLoader worker); the others (a subprocess, a spawned
# worker, torch's C++ mmap) change files too, but only the sandbox sees which: their
# rank is unknown
ATTRIBUTED = set(CHANGES) - {"subprocess", "os_system", "dataloader_spawn",
                             "torch_from_file_shared"}
# where the write itself happens on another line than the route's (a thread's target,
# a Dataset's __getitem__)
ELSEWHERE = {"thread", "dataloader_fork"}


def _level_here() -> tuple[Level, str]:
    run_dir = sandboxing.make_run_dir()
    try:
        box = sandboxing.choose(run_dir, os.getcwd())
        return box.level, box.why
    finally:
        sandboxing.remove_tree(run_dir)


LEVEL, WHY = _level_here()
needs_overlay = pytest.mark.skipif(LEVEL != Level.OVERLAY,
                                   reason=f"no bwrap sandbox on this machine: {WHY}")


@pytest.fixture
def short_tmp():
    """A folder with a short path for a probe's tree: its temp folder holds the Unix
    sockets multiprocessing makes (DataLoader workers), whose paths may not pass 108
    bytes, and pytest's own temp paths are long."""
    base = tempfile.mkdtemp(prefix="ddp-", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield Path(base)
    sandboxing.remove_tree(base)


def _env(**extra) -> tuple[dict, str]:
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "MASTER_PORT")}
    env.update(extra, DDPCHECK_TEST_MARKER=marker, PYTHONPATH=str(REPO))
    return env, marker


def _factory_project(short_tmp, module: str, source: str | None = None):
    """``project/`` holding the factory module ``module.py`` (``source``, or the probe of
    that name), ``tmp/`` as TMPDIR, and the module importable: ``(project, env, marker)``."""
    project, tmp = short_tmp / "project", short_tmp / "tmp"
    project.mkdir()
    tmp.mkdir()
    if source is None:
        shutil.copy(PROBES / f"{module}.py", project)
    else:
        (project / f"{module}.py").write_text(source)
    env, marker = _env(TMPDIR=str(tmp))
    env["PYTHONPATH"] = f"{project}{os.pathsep}{REPO}"
    return project, env, marker


def _preflight(args, cwd, env, timeout=180, python=sys.executable):
    """The real command, as a user runs it; ``(process, seconds)``."""
    start = time.monotonic()
    proc = subprocess.run([python, "-m", "ddpcheck", "preflight", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def _assert_nothing_left(marker: str, tmp: Path) -> None:
    left = marked_pids(marker)
    ports = listening_ports(left)
    kill_all(left)
    assert left == [], f"processes left behind: {left}, listening on {ports}"
    kept = [p.name for p in tmp.iterdir() if p.name.startswith("ddpcheck-")]
    assert kept == [], f"temp folders left behind: {kept}"


def _route_lines() -> dict:
    text = (PROBES / "write_routes.py").read_text().splitlines()
    return {name: i + 1 for name in CHANGES for i, line in enumerate(text)
            if line.lstrip().startswith(f'("{name}",')}


# -- every write route ------------------------------------------------------------------------


def test_every_probe_route_really_writes_under_torchrun(short_tmp):
    """The comparison run: without the preflight, each route changes the tree."""
    env, marker = _env(**make_tree(short_tmp))
    before = snapshot(short_tmp)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "write_routes.py"], cwd=short_tmp / "project",
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    time.sleep(2.5)  # the thread route goes on writing for 2 s after the script returns
    hit = routes_that_changed(before, snapshot(short_tmp))
    assert set(hit) == set(CHANGES), f"routes that did not write: {set(CHANGES) - set(hit)}"
    kill_all(marked_pids(marker))


def _check_write_probe(tmp_path: Path, python: str = sys.executable, user=None) -> dict:
    extra = make_tree(tmp_path)
    if user is not None:
        subprocess.run(["chown", "-R", f"{user}:", str(tmp_path)], check=True)
    env, marker = _env(**extra)
    before = snapshot(tmp_path)
    args = ["--gpus", "2", "--timeout", "120", "--format", "json", "--", "write_routes.py"]
    if user is None:
        proc, seconds = _preflight(args, tmp_path / "project", env, python=python)
    else:
        start = time.monotonic()
        proc = subprocess.run(["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in
                                                                   env.items()],
                               python, "-m", "ddpcheck", "preflight", *args],
                              cwd=tmp_path / "project", capture_output=True, text=True,
                              timeout=180)
        seconds = time.monotonic() - start
    time.sleep(2.5)  # long enough for the thread route to have written into the real tree
    after = snapshot(tmp_path)
    assert changed(before, after) == set(), "the preflight changed the user's files"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    # no false failure: every route ran as it does under torchrun
    assert [v for v in data["checks"] if v["status"] == "FAIL"] == []
    _assert_nothing_left(marker, Path(extra["TMPDIR"]))
    data["_seconds"] = seconds
    return data


def _check_report_lists_each_write(data: dict, base: Path) -> None:
    rows = {}
    for w in data["writes"]:
        rows.setdefault(os.path.relpath(w["path"], os.path.realpath(base)), []).append(w)
    missing = {route: entries for route, entries in CHANGES.items()
               if not all(e in rows for e in entries)}
    assert missing == {}, f"changes the report does not list: {missing}"
    lines = _route_lines()
    for index, route in enumerate(CHANGES):
        if route not in ATTRIBUTED:
            continue
        for entry in CHANGES[route]:
            ranks = {w["rank"] for w in rows[entry]}
            assert ranks == {index % 2}, (route, entry, rows[entry])
            if route not in ELSEWHERE:
                assert any(w["where"].endswith(f"write_routes.py:{lines[route]}")
                           for w in rows[entry]), (route, rows[entry])
    created = {w["change"] for w in rows["project/torch_save.pt"]}
    assert created == {"created"} and rows["project/torch_save.pt"][0]["bytes"] > 0
    assert {w["change"] for w in rows["project/chmod_me.txt"]} == {"mode"}
    assert {w["change"] for w in rows["project/remove_me.txt"]} == {"removed"}


@needs_overlay
def test_no_route_reaches_the_users_files_and_the_report_lists_each(short_tmp):
    data = _check_write_probe(short_tmp)
    assert data["sandbox"].startswith("sandbox: ")
    _check_report_lists_each_write(data, short_tmp)


def _ordinary_user() -> tuple[str, str] | None:
    """A non-root account that can run this checkout with a Python of its own
    (DDPCHECK_TEST_USER / DDPCHECK_TEST_USER_PYTHON), when the tests run as root."""
    user, python = os.environ.get("DDPCHECK_TEST_USER"), os.environ.get("DDPCHECK_TEST_USER_PYTHON")
    if os.geteuid() != 0 or not user or not python or not shutil.which("runuser"):
        return None
    probe = subprocess.run(["runuser", "-u", user, "--", python, "-c", "import torch"],
                           capture_output=True, timeout=120)
    return (user, python) if probe.returncode == 0 else None


@needs_overlay
def test_as_an_ordinary_user_too(short_tmp):
    """Unprivileged: the overlays sit on folders the user owns (an overlay cannot copy
    up what belongs to an account the user namespace does not map)."""
    found = _ordinary_user()
    if found is None:
        pytest.skip("needs root and DDPCHECK_TEST_USER / DDPCHECK_TEST_USER_PYTHON naming an "
                    "ordinary account and a Python with torch it can run")
    user, python = found
    os.chmod(short_tmp, 0o755)
    data = _check_write_probe(short_tmp, python=python, user=user)
    _check_report_lists_each_write(data, short_tmp)


def _force_level(monkeypatch, level: Level) -> None:
    monkeypatch.setattr(sandboxing, "bwrap_candidates", lambda: [])
    if level == Level.NONE:
        from ddpcheck.preflight import landlock

        monkeypatch.setattr(landlock, "abi_version", lambda: 0)


def _invoke(args, cwd, monkeypatch, env: dict):
    from click.testing import CliRunner

    from ddpcheck.preflight.command import preflight

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "MASTER_PORT",
                "DDPCHECK_ALLOW_UNSANDBOXED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", None)
    return CliRunner().invoke(preflight, list(args), catch_exceptions=False)


def test_landlock_keeps_every_route_out_where_bwrap_cannot_run(short_tmp, monkeypatch):
    """Clusters without user namespaces: the kernel refuses writes outside the run's own
    folder; the Python-level redirection keeps the script's own writes working."""
    from ddpcheck.preflight import landlock

    if landlock.abi_version() < 1:
        pytest.skip(f"no Landlock here: {landlock.unavailable_reason()}")
    _force_level(monkeypatch, Level.LANDLOCK)
    extra = make_tree(short_tmp)
    env, marker = _env(**extra)
    before = snapshot(short_tmp)
    result = _invoke(["--gpus", "2", "--timeout", "120", "--format", "json", "--",
                      "write_routes.py"], short_tmp / "project", monkeypatch, env)
    time.sleep(2.5)
    data = json.loads(result.stdout)
    logs = data["worker_logs"]  # kept (a route failed), named, under the temp folder
    kept = os.path.relpath(Path(logs).parents[2], short_tmp)
    assert {e for e in changed(before, snapshot(short_tmp))
            if not (e == kept or e.startswith(kept + os.sep))} == set()
    sandboxing.remove_tree(str(short_tmp / kept))
    assert data["sandbox"].startswith("sandbox: Landlock")
    assert not [v for v in data["checks"] if v["id"] in ("hang", "run_deadline")]
    # routes the redirection cannot follow (C++ writers, other processes) are refused
    # by the kernel: the run says so instead of writing
    crashes = " ".join((r.get("crash") or {}).get("message", "") for r in data["ranks"])
    assert "Permission denied" in crashes
    _assert_nothing_left(marker, Path(extra["TMPDIR"]))


def test_without_any_sandbox_it_refuses_unless_told(tmp_path, monkeypatch):
    _force_level(monkeypatch, Level.NONE)
    (tmp_path / "train.py").write_text("print('hello')\n")
    env, marker = _env(TMPDIR=str(tmp_path))
    result = _invoke(["--gpus", "2", "--", "train.py"], tmp_path, monkeypatch, env)
    assert result.exit_code == 2
    err = result.stderr
    assert err.startswith("ddpcheck: error: no sandbox can be set up here (")
    assert "--allow-unsandboxed" in err and len(err.strip().splitlines()) == 1
    result = _invoke(["--gpus", "2", "--allow-unsandboxed", "--", "train.py"], tmp_path,
                     monkeypatch, env)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.startswith("NO SANDBOX (")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ddpcheck-")] == []
    assert marked_pids(marker) == []


@needs_overlay
def test_factory_mode_runs_in_the_sandbox_too(short_tmp):
    """A model factory that saves a checkpoint (and a module that writes when imported)
    changes nothing of the user's; the report lists both."""
    project, env, marker = _factory_project(short_tmp, "ckptfactory", (
        "import torch\n"
        "torch.save({'at': 'import'}, 'imported.pt')\n"
        "def build():\n"
        "    model = torch.nn.Linear(3, 2)\n"
        "    torch.save(model.state_dict(), 'factory.pt')\n"
        "    return model\n"))
    before = snapshot(short_tmp)
    proc, _ = _preflight(["--gpus", "2", "--model", "ckptfactory:build", "--input-shape", "3",
                          "--format", "json"], project, env)
    assert changed(before, snapshot(short_tmp)) == set()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for w in json.loads(proc.stdout)["writes"]:
        rows.setdefault(os.path.basename(w["path"]), []).append(w)
    assert {w["rank"] for w in rows["factory.pt"]} == {0, 1}
    assert {w["where"] for w in rows["factory.pt"]} == {"ckptfactory.py:5"}
    assert {w["kind"] for w in rows["factory.pt"]} == {"torch.save"}
    # imported once, by the launcher, before the ranks were forked: no rank wrote it
    assert [w["rank"] for w in rows["imported.pt"]] == [None]
    _assert_nothing_left(marker, short_tmp / "tmp")


# -- every run ends in time, with the right rank named ------------------------------------------


def _script_run(tmp_path, script: str, timeout: int, *extra):
    project, tmp = tmp_path / "project", tmp_path / "tmp"
    project.mkdir()
    tmp.mkdir()
    shutil.copy(PROBES / script, project / script)
    env, marker = _env(TMPDIR=str(tmp))
    proc, seconds = _preflight(["--gpus", "2", "--timeout", str(timeout), "--format", "json",
                                *extra, "--", script], project, env)
    assert seconds < timeout + 10, f"ran {seconds:.0f} s with --timeout {timeout}"
    left = marked_pids(marker)
    kill_all(left)
    assert left == [], "processes left behind"
    data = json.loads(proc.stdout)
    kept = [p for p in tmp.iterdir() if p.name.startswith("ddpcheck-")]
    if data.get("worker_logs"):  # kept for the logs, and named
        assert [str(p) for p in kept] == [str(Path(data["worker_logs"]).parents[2])]
        assert stat.S_IMODE(kept[0].stat().st_mode) == 0o700
        shutil.rmtree(kept[0])
    else:
        assert kept == []
    return proc, data


@needs_overlay
def test_os_exit_at_the_end_of_every_rank_ends_at_once(short_tmp):
    proc, data = _script_run(short_tmp, "exit_at_end.py", 60)
    assert proc.returncode == 0, proc.stdout
    assert {r["ending"] for r in data["ranks"]} == {"exited"}
    assert data["timing"]["total_seconds"] < 40  # not the deadline


@needs_overlay
def test_os_exit_on_rank_1_is_named_not_the_rank_that_waited(short_tmp):
    proc, data = _script_run(short_tmp, "exit_on_one_rank.py", 60)
    assert proc.returncode == 1
    alarms = [v for v in data["checks"] if v["status"] == "FAIL"]
    assert len(alarms) == 1, alarms
    assert "rank 1 exited the script" in alarms[0]["name"]
    assert "exit_on_one_rank.py:11" in alarms[0]["name"]
    assert data["ranks"][1]["ending"] == "exited"
    assert data["ranks"][0]["ending"] != "crashed"
    assert not [v for v in data["checks"] if v["id"] in ("crash", "hang", "run_deadline")]


@needs_overlay
def test_a_deadlocked_dataloader_is_killed_at_the_timeout_with_its_workers(short_tmp):
    # 20 s, not less: on a loaded 2-core machine a rank can still be importing torch
    # or joining the group after 8 s, and is then (rightly) not reported at the loader.
    proc, data = _script_run(short_tmp, "loader_deadlock.py", 20)
    assert proc.returncode == 1
    hung = [v for v in data["checks"] if v["id"] == "hang"]
    assert sorted(r for v in hung for r in v["ranks"]) == [0, 1]
    assert all("loader_deadlock.py:20" in v["detail"] for v in hung), hung


@needs_overlay
def test_a_launcher_stuck_outside_the_ranks_is_killed_by_the_supervisor(short_tmp):
    """The model's module never finishes importing in the sandbox's launcher process:
    no watchdog of its own can end that; the supervisor kills the whole sandbox."""
    project, env, marker = _factory_project(short_tmp, "stuck_import", (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(3600)\n"
        "def build():\n    pass\n"))
    proc, seconds = _preflight(["--gpus", "2", "--timeout", "6", "--format", "json",
                                "--model", "stuck_import:build", "--input-shape", "3"],
                               project, env)
    assert seconds < 16
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert [c["id"] for c in data["checks"]] == ["run_deadline"]
    assert "did not end within --timeout 6 s" in data["checks"][0]["detail"]
    _assert_nothing_left(marker, short_tmp / "tmp")


def test_a_timeout_shorter_than_the_start_stops_every_rank(short_tmp):
    """A rank that starts after the deadline fired is stopped too: no rank runs on to a
    PASS past --timeout."""
    env, marker = _env(TMPDIR=str(short_tmp))
    proc, seconds = _preflight(["--gpus", "2", "--dataset-size", "100", "--timeout", "0.5",
                                "--format", "json"], short_tmp, env)
    assert seconds < 10.5 and proc.returncode == 1, proc.stdout + proc.stderr
    checks = json.loads(proc.stdout)["checks"]
    assert not [c for c in checks if c["id"] in ("collectives", "bandwidth")
                and c["status"] == "PASS" and len(json.loads(proc.stdout)["ranks"]) == 2
                and all(r["ok"] for r in json.loads(proc.stdout)["ranks"])]
    assert [c for c in checks if c["status"] == "FAIL"]
    left = marked_pids(marker)
    kill_all(left)
    assert left == []


@needs_overlay
def test_a_factory_raising_keyboardinterrupt_is_reported_in_time(short_tmp):
    project, env, marker = _factory_project(short_tmp, "factory_interrupt")
    proc, seconds = _preflight(["--gpus", "2", "--timeout", "30", "--format", "json",
                                "--model", "factory_interrupt:build", "--input-shape", "3"],
                               project, env)
    assert seconds < 40 and proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    factory = [c for c in data["checks"] if c["status"] == "FAIL"]
    assert factory and "KeyboardInterrupt" in json.dumps(factory)
    left = marked_pids(marker)
    kill_all(left)
    assert left == []


# -- signals: nothing left, checked by pid --------------------------------------------------------


def _until_ready(server: socket.socket, count: int, timeout: float) -> list[int]:
    """The probe's ranks connect when they are running; each says its listening port."""
    server.settimeout(timeout)
    ports = []
    for _ in range(count):
        conn, _ = server.accept()
        with conn:
            ports.append(int(conn.recv(64).decode().split()[1]))
    return ports


def _still_listening(ports: list[int]) -> list[int]:
    out = []
    for port in ports:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                out.append(port)
    return out


@needs_overlay
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_the_preflight_leaves_nothing_behind(short_tmp, sig):
    project, tmp = short_tmp / "project", short_tmp / "tmp"
    project.mkdir()
    tmp.mkdir()
    shutil.copy(PROBES / "traps_sigint.py", project)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        env, marker = _env(TMPDIR=str(tmp), PROBE_READY_PORT=str(server.getsockname()[1]))
        proc = subprocess.Popen([sys.executable, "-m", "ddpcheck", "preflight", "--gpus", "2",
                                 "--timeout", "120", "--", "traps_sigint.py"], cwd=project,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            ports = _until_ready(server, 2, 90)
        except socket.timeout:
            proc.kill()
            pytest.fail("the probe's ranks never started: " + proc.communicate()[1][-2000:])
    assert len(marked_pids(marker)) > 4  # the command, bwrap, the launcher, 2 ranks, sleeps
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    # after SIGINT/SIGTERM the command waits until every process of the run is gone;
    # after SIGKILL nobody waits: the kernel takes the sandbox down, give it a moment
    patience = 5 if sig == signal.SIGKILL else 0
    deadline = time.monotonic() + patience
    while (marked_pids(marker) or _still_listening(ports)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = marked_pids(marker)
    open_ports = listening_ports(left)
    kill_all(left)
    assert left == [] and open_ports == []
    assert _still_listening(ports) == []  # the ranks' own listening sockets are closed
    runs = [p for p in tmp.iterdir() if p.name.startswith("ddpcheck-")]
    if sig == signal.SIGKILL:
        # nothing could clean up here: the next run does (its owner is gone)
        assert proc.returncode == -signal.SIGKILL and len(runs) == 1
        assert sandboxing.sweep_stale(str(tmp)) == [str(runs[0])]
        assert not runs[0].exists()
    else:
        assert proc.returncode == 128 + sig
        assert "every process of the run was stopped" in err
        assert runs == []


# -- the run's own folder -------------------------------------------------------------------------


def test_run_folders_are_private_unpredictable_and_swept_when_their_owner_is_gone(tmp_path):
    first, second = (sandboxing.make_run_dir(str(tmp_path)) for _ in range(2))
    assert first != second
    for run in (first, second):
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
        assert os.stat(run).st_uid == os.geteuid()
    # an owner still running keeps its folder; a dead owner's is removed
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    with open(os.path.join(second, sandboxing.RUN_MARK), "w") as fh:
        json.dump({"pid": int(dead), "start": "0"}, fh)
    work = os.path.join(second, "layers", "0", "work", "work")
    os.makedirs(work)
    os.chmod(work, 0)  # what overlayfs leaves behind
    stranger = tmp_path / "ddpcheck-not-a-run"
    stranger.mkdir()
    assert sandboxing.sweep_stale(str(tmp_path)) == [second]
    assert os.path.isdir(first) and not os.path.exists(second) and stranger.is_dir()
    # a folder kept for its logs holds only them, and stays
    logs = os.path.join(first, "box", "launch", "logs")
    os.makedirs(logs)
    sandboxing.keep_for_logs(first, logs)
    assert sorted(os.listdir(first)) == [sandboxing.RUN_MARK, "box"]
    assert sandboxing.sweep_stale(str(tmp_path)) == [] and os.path.isdir(logs)
    # ... until more recent failed runs have kept theirs
    newer = []
    for age in range(sandboxing.KEPT_LOGS):
        run = sandboxing.make_run_dir(str(tmp_path))
        sandboxing.keep_for_logs(run, run)
        os.utime(run, (time.time() + age + 1, time.time() + age + 1))
        newer.append(run)
    os.utime(first, (time.time() - 60, time.time() - 60))
    assert sandboxing.sweep_stale(str(tmp_path)) == [first]
    assert all(os.path.isdir(run) for run in newer)


def test_worker_mode_uses_a_private_folder_not_a_guessable_one(tmp_path, monkeypatch):
    """Under torchrun the rank once used a fixed name in the temp folder (another user
    could plant files there first); now it is a fresh 0700 folder."""
    from ddpcheck.preflight.script import launch as script_launch

    made = []
    real = tempfile.mkdtemp

    def spy(*args, **kwargs):
        path = real(*args, **kwargs)
        made.append(path)
        return path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    monkeypatch.setattr(script_launch, "run_script_rank",
                        lambda spec: {"rank": 0, "facts": {"rank": 0, "world_size": 1}})

    class Launched:
        launcher, rank, world_size = "torchrun", 0, 1

        def export(self):
            pass

    monkeypatch.setenv("MASTER_PORT", "29500")
    target = script_launch.ScriptTarget(str(tmp_path / "x.py"), None)
    script_launch.run_in_launcher(target, 1, False, 5.0, Launched())
    assert len(made) == 1 and "29500" not in made[0]
    assert not os.path.exists(made[0])  # removed after


# -- which places are overlaid -----------------------------------------------------------------


def test_writable_places_are_the_known_folders_and_every_writable_data_mount(tmp_path):
    home, work, data = (tmp_path / n for n in ("home", "work", "data"))
    for folder in (home, work, data, work / "sub"):
        folder.mkdir()
    table = [sandboxing.Mount("/", "ext4", True), sandboxing.Mount("/proc", "proc", True),
             sandboxing.Mount(str(data), "nfs4", True),
             sandboxing.Mount(str(work / "sub"), "squashfs", False),
             sandboxing.Mount("/sys/fs/cgroup", "cgroup2", True)]
    trees, beneath = sandboxing.writable_places([str(home), str(work), "/", ""], table)
    assert trees == sorted([str(home), str(work), str(data)], key=lambda p: (p.count("/"), p))
    # a read-only mount inside an overlaid folder is shown again on top, read-only
    assert beneath == [str(work / "sub")]


def test_mountinfo_is_read_with_its_escapes(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:5 / /mnt/my\\040data rw,nosuid - nfs4 srv:/x rw\n"
        "41 22 0:6 / /mnt/ro ro,relatime - ext4 /dev/sdb1 ro\n")
    assert sandboxing.mounts(str(info)) == [
        sandboxing.Mount("/", "ext4", True), sandboxing.Mount("/mnt/my data", "nfs4", True),
        sandboxing.Mount("/mnt/ro", "ext4", False)]


def test_the_upper_layer_says_what_changed(tmp_path):
    real, upper = tmp_path / "real", tmp_path / "upper"
    for folder in (real, upper):
        folder.mkdir()
    for name, text in (("same.txt", "a"), ("edited.txt", "a"), ("moded.txt", "a"),
                       ("timed.txt", "a")):
        (real / name).write_text(text)
        shutil.copy2(real / name, upper / name)
    (upper / "edited.txt").write_text("b")
    os.chmod(upper / "moded.txt", 0o600)
    os.utime(upper / "timed.txt", (1, 1))
    (upper / "new").mkdir()
    (upper / "new" / "ckpt.pt").write_bytes(b"x" * 10)
    tree = sandboxing.Tree(str(real), str(upper), str(tmp_path / "work"))
    found = {os.path.relpath(c.path, real): (c.change, c.kind, c.bytes)
             for c in sandboxing.changes((tree,))}
    assert found == {"edited.txt": ("modified", "file", 1), "moded.txt": ("mode", "file", 1),
                     "timed.txt": ("times", "file", 1), "new": ("created", "folder", None),
                     "new/ckpt.pt": ("created", "file", 10)}
    before = sandboxing.snapshot((tree,))
    (upper / "later.txt").write_text("c")
    assert [os.path.basename(c.path) for c in sandboxing.changes((tree,), before)] == \
        ["later.txt"]


# -- usage, through the real command -----------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--gpus", "2", "--model", "no_such_pkg.models:build", "--input-shape", "3"],
     "cannot import no_such_pkg.models"),
    (["--gpus", "2", "--"], "nothing to run after --"),
    (["--gpus", "100000", "--", "x.py"], "--gpus 100000: this machine can run at most"),
    (["--gpus", "2", "--timeout", "nan", "--", "x.py"], "'nan' is not a finite number"),
])
def test_usage_errors_through_the_sandboxed_command_are_one_line(tmp_path, args, message):
    (tmp_path / "x.py").write_text("print(1)\n")
    env, marker = _env(TMPDIR=str(tmp_path))
    proc, _ = _preflight(args, tmp_path, env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    _assert_nothing_left(marker, tmp_path)
