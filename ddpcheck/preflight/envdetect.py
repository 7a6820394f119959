"""Is this process already a rank of a launched job? And the exported
MASTER_ADDR / MASTER_PORT (pure Python, no torch).

Inside a launched job (torchrun's RANK / WORLD_SIZE / LOCAL_RANK, or srun's
SLURM_PROCID with MASTER_ADDR/PORT set) the command runs the worker in this
very process, so multi-node runs use the user's own launcher.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping, Optional


class LaunchEnvError(ValueError):
    """The environment looks half-launched (a usage error)."""


@dataclass(frozen=True)
class LaunchedEnv:
    launcher: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    agent_store: bool = False  # torchelastic's agent already serves MASTER_PORT

    def export(self, environ=None) -> None:
        """Make the env:// variables torch reads agree with the launcher's."""
        env = os.environ if environ is None else environ
        env["RANK"] = str(self.rank)
        env["WORLD_SIZE"] = str(self.world_size)
        env["LOCAL_RANK"] = str(self.local_rank)
        env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)


def _int_env(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchEnvError(f"{key}={env[key]!r} is not an integer") from None


def _first_int(text: Optional[str]) -> Optional[int]:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def detect_launched(environ: Optional[Mapping[str, str]] = None) -> Optional[LaunchedEnv]:
    """The launcher's view of this process, or None when nothing launched it."""
    env = os.environ if environ is None else environ
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    present = [k for k in keys if k in env]
    if present:
        missing = [k for k in keys if k not in env]
        if missing:
            raise LaunchEnvError(
                f"{', '.join(present)} set but {', '.join(missing)} not: start with torchrun "
                f"(which sets all three) or unset them to let ddpcheck launch the workers")
        rank, world, local = (_int_env(env, k) for k in keys)
        local_world = _int_env(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        if not 0 <= rank < world:
            raise LaunchEnvError(f"RANK={rank} is outside WORLD_SIZE={world}")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise LaunchEnvError(f"RANK/WORLD_SIZE are set but {key} is not: env:// "
                                     f"initialisation needs MASTER_ADDR and MASTER_PORT")
        master_port(env)  # a malformed port is a usage error here, not a traceback later
        agent = str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() == "true"
        return LaunchedEnv("torchrun", rank, world, local, local_world, agent)
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        world = _first_int(env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")) or 1
        if world <= 1:
            return None
        rank = _int_env(env, "SLURM_PROCID")
        local = _first_int(env.get("SLURM_LOCALID")) or 0
        local_world = (_first_int(env.get("SLURM_NTASKS_PER_NODE"))
                       or _first_int(env.get("SLURM_TASKS_PER_NODE")) or world)
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise LaunchEnvError(
                    f"running as SLURM task {rank} of {world} but {key} is not set: export "
                    f"MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) "
                    f"and MASTER_PORT=29500 before srun")
        master_port(env)
        return LaunchedEnv("slurm", rank, world, local, local_world)
    return None


# -- MASTER_PORT --------------------------------------------------------------------------


def master_port(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The exported MASTER_PORT, or None; :class:`LaunchEnvError` when it is not a port."""
    env = os.environ if environ is None else environ
    text = env.get("MASTER_PORT")
    if text is None or text == "":
        return None
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise LaunchEnvError(f"MASTER_PORT={text!r} is not a TCP port (1-65535)")
    return int(text)


def port_in_use(port: int, host: str = "") -> bool:
    """Whether a TCP server could not listen on ``port`` here right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def is_local_address(addr: str) -> bool:
    if addr in ("localhost", "127.0.0.1", "::1", "0.0.0.0", ""):
        return True
    try:
        return socket.gethostbyname(addr) in ("127.0.0.1", socket.gethostbyname(socket.gethostname()))
    except OSError:
        return False
