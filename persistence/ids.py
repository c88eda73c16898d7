"""Session ids: what a valid one looks like and how a new one is made.

Its own module because the store and every backend check ids (a backend builds file names and keys from them), and the
store imports the backends: they share this instead of importing each other.
"""

from __future__ import annotations

import os
import re
import time

from .errors import InvalidSessionId

_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")


def check_session_id(session_id: str) -> str:
    if not valid_session_id(session_id):
        raise InvalidSessionId(session_id)
    return session_id


def valid_session_id(session_id: str) -> bool:
    return bool(_ID.fullmatch(session_id))


def new_session_id() -> str:
    """Sortable by creation time, unique enough across processes: 20261202-155200-3fa9c1."""
    # os.urandom(3).hex() is what secrets.token_hex(3) returns, without importing hmac (start-up, P8)
    return time.strftime("%Y%m%d-%H%M%S", time.localtime()) + "-" + os.urandom(3).hex()
