"""The gateway's API server (``gateway.platforms.api_server.APIServerAdapter``): which
state.db a request of it reads.

How the adapter finds its SessionDB differs by release: 0.15-0.17 open one on first use and
keep it as ``_session_db``; 0.19+ keep ``_session_db`` only as an explicit override (None
in a running gateway) and open one per profile home, cached in ``_session_dbs`` under
``str(get_hermes_home())`` (the home of the request's profile scope on the loop thread)."""

from __future__ import annotations

from typing import Any


def request_db_path(adapter: Any) -> Any:
    """The state.db path of the SessionDB the adapter's request handlers use in the current
    (request's) profile scope; None when it has opened none."""
    db = getattr(adapter, "_session_db", None)
    if db is None:
        cache = getattr(adapter, "_session_dbs", None)
        if isinstance(cache, dict) and cache:
            from hermes_constants import get_hermes_home

            db = cache.get(str(get_hermes_home()))
    return getattr(db, "db_path", None)
