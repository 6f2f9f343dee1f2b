"""The holder strings the guard writes name what Hermes needs to tell a dead holder."""

from __future__ import annotations

import os
import re

import pytest

from hermes_session_guard.locks.session_lock import holder_id


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="no PID namespaces on this platform")
def test_a_holder_names_its_pid_namespace_so_hermes_may_probe_its_pid() -> None:
    """Hermes 0.22+ reclaims a dead holder's turn lease at once only when the holder names its
    PID namespace (``pidns=``); unstamped, the lease of a crashed guard process waited for its
    expiry (a restarted gateway stalled behind it: test_crash_recovery's replay tests)."""
    inode = os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]")
    assert re.search(rf"(?:^|:)pidns={inode}(?::|$)", holder_id("op"))
