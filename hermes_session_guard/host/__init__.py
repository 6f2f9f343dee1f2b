"""Every agent attribute, SessionDB call and gateway object the guard relies on."""

from .statedb import *  # noqa: F403
from .statedb import _OPEN_ATTEMPTS  # noqa: F401
