"""Shared test setup.

``HERMES_HOME`` must point at a throw-away directory before any Hermes module is
imported (importing ``run_agent`` otherwise creates ``~/.hermes``), so it is set
here, at collection time, for the whole run. Each host test then gets its own
home through the ``home`` fixture.
"""

from __future__ import annotations

import os
import tempfile

_SESSION_HOME = tempfile.mkdtemp(prefix="session-guard-tests-")
os.environ["HERMES_HOME"] = _SESSION_HOME
os.environ.pop("HERMES_SESSION_ID", None)
os.environ.setdefault("GATEWAY_ALLOW_ALL_USERS", "true")
