"""Landlock (Linux 5.13+): let a process write only beneath given folders.

The sandbox's second level (:mod:`ddpcheck.preflight.sandbox`), for machines
where bubblewrap cannot create its namespaces (unprivileged user namespaces
disabled, as on many clusters): Landlock needs no privileges and no
namespaces. :func:`allow_writes_only_under` restricts the calling process and
everything it starts afterwards: creating, writing, truncating, removing,
renaming and linking files anywhere else fails with EACCES. Reading stays
allowed everywhere. Landlock does not cover changes of mode, owner, times or
extended attributes (``chmod``, ``utime``): the Python-level redirection and
the report's limits say so.

The kernel interface is three system calls (the same numbers on every
architecture); there is no Python binding in the standard library, and the
packages that wrap it are young, so the few calls are made with ctypes here.
"""

from __future__ import annotations

import ctypes
import os

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE = 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3


class LandlockError(OSError):
    """The kernel refused to set up the restriction."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI (0: not available: an old kernel, or not enabled)."""
    try:
        value = _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                                ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(value))


def unavailable_reason() -> str:
    try:
        libc = _libc()
        value = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                             ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError) as exc:
        return str(exc)
    if value >= 0:
        return f"available (ABI {value})"
    code = ctypes.get_errno()
    if code == 38:  # ENOSYS
        return "this kernel has no Landlock (Linux 5.13 or later, built with it)"
    if code == 95:  # EOPNOTSUPP
        return "Landlock is built in but not enabled (the lsm= boot option)"
    return os.strerror(code)


def write_rights(abi: int) -> int:
    rights = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG
              | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM)
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


def allow_writes_only_under(folders: list[str]) -> None:
    """From now on this process and its children write only beneath ``folders``."""
    abi = abi_version()
    if abi < 1:
        raise LandlockError(unavailable_reason())
    libc = _libc()
    rights = write_rights(abi)
    attr = _RulesetAttr(rights)
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr),
                           ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for folder in folders:
            fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            try:
                beneath = _PathBeneath(rights, fd)
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(beneath),
                                ctypes.c_uint32(0)) < 0:
                    raise LandlockError(ctypes.get_errno(), f"landlock_add_rule {folder}")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
