"""The guard's own storage (see :mod:`.snapshots`)."""

from .snapshots import *  # noqa: F403
from .snapshots import _row_message  # noqa: F401
