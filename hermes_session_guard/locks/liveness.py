"""Who holds a lock, and whether that process is provably dead.

A holder string the guard writes carries the identity of its process as
``key=value`` fields separated by ``:`` (``pid=…:tid=…:guard-op=…:nonce=…:host=…:boot=…:start=…``,
and on Linux ``pidns=…``, the PID namespace Hermes 0.22+ needs before it probes a pid):
the host name, the machine's boot time, the pid and the process start time
(``psutil``; Hermes depends on it on every release, and it works the same on
Windows, Linux and macOS). Any process on the same machine can then tell a
crashed holder from a live one:

* same host and same boot, and the pid is gone or now belongs to a process that
  started at another time (a reused pid) -> **dead**: the lock is taken over at once;
* same host and boot, same pid and start time -> **alive**;
* another host, or another boot of an unknown machine -> **unknown**: the lease
  (its expiry) decides, as before.

A holder with a pid and none of the other fields (Hermes's own ``pid=…:tid=…:agent=…``,
written by a Hermes process without the guard) is judged on this machine, where the
state.db it was written to lives: its pid gone -> **dead**; this very process ->
**alive**; a running pid -> **unknown** (without a start time a reused pid cannot be
told from the holder). Processes in other PID namespaces sharing one state.db (two
containers mounting one Hermes home) write holders of this form too, and one of them is
then taken for dead: give such processes the guard, whose holders name their host.

Only psutil, socket and the standard library are used: no signals, no fcntl.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import quote, unquote

import psutil

from ..fail_open import failing_open

ALIVE = "alive"
DEAD = "dead"
UNKNOWN = "unknown"

# psutil derives both times from the kernel's clock; a reading of the same boot or
# process differs by far less than this (Windows' boot time drifts by a fraction of a
# second), while a reused pid belongs to a process started later.
_BOOT_TOLERANCE = 2.0
_START_TOLERANCE = 0.5


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    boot: float
    pid: int
    start: float

    def fields(self) -> str:
        return (f"host={quote(self.host, safe='')}:boot={self.boot:.3f}:pid={self.pid}:start={self.start:.3f}"
                f"{_pid_namespace()}")


@functools.lru_cache(maxsize=1)
def _pid_namespace() -> str:
    """``:pidns=<inode>`` of this process's PID namespace where the platform has one (Linux),
    else ``""``. Hermes 0.22+ probes a lease holder's pid only when the holder names the
    namespace it was written in (``hermes_state_pidns``): without it, a lease of a process that
    died waits for its expiry instead of being taken over at once."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except (OSError, NotImplementedError):
        return ""
    inode = link[link.find("[") + 1:link.rfind("]")] if "[" in link else ""
    return f":pidns={inode}" if inode.isdigit() else ""


@functools.lru_cache(maxsize=1)
def _host() -> str:
    return socket.gethostname() or "localhost"


@functools.lru_cache(maxsize=1)
def _boot() -> float:
    return float(psutil.boot_time())


_own: dict[int, ProcessIdentity] = {}
_own_lock = threading.Lock()


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (None if there is no such process or it cannot be read)."""
    with failing_open(f"reading the start time of pid {pid}", "the start time is taken as unknown", advice=None,
                      level=logging.DEBUG):
        try:
            return float(psutil.Process(pid).create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
    return None


def this_process() -> ProcessIdentity:
    """The identity of the running process (cached per pid: a fork gets its own)."""
    pid = os.getpid()
    with _own_lock:
        ident = _own.get(pid)
        if ident is None:
            # 0.0 when psutil cannot read it: others then never judge this process by start time
            ident = _own[pid] = ProcessIdentity(_host(), _boot(), pid, process_start(pid) or 0.0)
        return ident


def _fields(holder: str) -> dict[str, str]:
    """A holder's ``key=value`` fields (``:``-separated; the first of a repeated key)."""
    fields: dict[str, str] = {}
    for part in holder.split(":"):
        key, sep, value = part.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse(holder: str | None) -> ProcessIdentity | None:
    """The identity fields of a holder string, or None when it has not all of them."""
    if not holder:
        return None
    parts = _fields(holder)
    try:
        return ProcessIdentity(unquote(parts["host"]), float(parts["boot"]), int(parts["pid"]),
                               float(parts["start"]))
    except (KeyError, ValueError):
        return None


def pid_only(holder: str | None) -> int | None:
    """The pid of a holder that names a pid and no host, boot or start time (Hermes's format)."""
    if not holder:
        return None
    keys = _fields(holder)
    if "pid" not in keys or any(k in keys for k in ("host", "boot", "start")):
        return None
    try:
        pid = int(keys["pid"])
    except ValueError:
        return None
    return pid if pid > 0 else None


def pid_running(pid: int) -> bool:
    with failing_open(f"looking up pid {pid}", "the process is taken for running", advice=None,
                      level=logging.DEBUG):  # cannot tell: never call a process dead on a failed look-up
        return psutil.pid_exists(pid)
    return True


def liveness(ident: ProcessIdentity | None) -> str:
    """``alive``, ``dead`` or ``unknown`` for a holder's identity (see the module docstring)."""
    if ident is None:
        return UNKNOWN
    me = this_process()
    if ident.host != me.host or abs(ident.boot - me.boot) > _BOOT_TOLERANCE:
        return UNKNOWN
    if ident.pid == me.pid:
        if ident.start <= 0 or me.start <= 0:
            return UNKNOWN
        return ALIVE if abs(ident.start - me.start) <= _START_TOLERANCE else DEAD
    if not pid_running(ident.pid):
        return DEAD
    if ident.start <= 0:
        return UNKNOWN  # the holder could not read its own start time: a live pid may be it
    started = process_start(ident.pid)
    if started is None:
        # The pid exists but cannot be read (access denied on Windows services): it may be the holder.
        return UNKNOWN if pid_running(ident.pid) else DEAD
    return ALIVE if abs(started - ident.start) <= _START_TOLERANCE else DEAD


def holder_liveness(holder: str | None) -> str:
    ident = parse(holder)
    if ident is not None:
        return liveness(ident)
    pid = pid_only(holder)
    if pid is None:
        return UNKNOWN
    if pid == os.getpid():
        return ALIVE
    return UNKNOWN if pid_running(pid) else DEAD


def holder_dead(holder: str | None) -> bool:
    """True only when the holder's process is provably gone (never for unknown holders)."""
    return holder_liveness(holder) == DEAD
