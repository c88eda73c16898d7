"""Connections to the PostgreSQL server: who one says it is (`cairn <host> <pid>` as its `application_name`, which is
how a second writer, on any machine, learns who holds a session), the error naming that holder, closing one quietly,
and retrying through a lost one (SPEC §5 rev 3).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from typing import Any, Callable, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import PersistenceError, SessionLocked, StoreUnavailable

# psycopg logs (at warning level) errors it ignores while cleaning up after a lost connection ("error ignored
# terminating <psycopg.Pipeline [BAD]>: the connection is lost"): Cairn reports what matters itself, in one line.
_psycopg_log = logging.getLogger("psycopg")
_psycopg_log.addHandler(logging.NullHandler())
_psycopg_log.propagate = False

# A lost connection is retried for this long (SPEC §5 rev 3), waiting 0.1 s, 0.2 s, … up to 2 s between attempts.
RECONNECT_FOR = 30.0
RECONNECT_FIRST_DELAY = 0.1
RECONNECT_MAX_DELAY = 2.0

_APP_NAME = re.compile(r"^cairn (\S+) (\d+)$")

# TCP keepalives on every Cairn connection, on both ends (SPEC §13 rev 4). A host that vanishes (powered off, cut off:
# no FIN ever comes) is noticed by the SERVER after KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT = 19 s of
# silence on an idle connection, and after USER_TIMEOUT_MS of unacknowledged data on a busy one; its backend then exits
# and the session's advisory lock goes with it: another host can resume the session about 20 s after the cut (P13).
# The client sets the same, so a cut-off Cairn's own sockets fail as quickly instead of hanging for minutes.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 3, 3
USER_TIMEOUT_MS = (KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT) * 1000
_CLIENT_KEEPALIVE = {"keepalives": "1", "keepalives_idle": str(KEEPALIVE_IDLE),
                     "keepalives_interval": str(KEEPALIVE_INTERVAL), "keepalives_count": str(KEEPALIVE_COUNT),
                     "tcp_user_timeout": str(USER_TIMEOUT_MS)}
_SERVER_KEEPALIVE = {"tcp_keepalives_idle": KEEPALIVE_IDLE, "tcp_keepalives_interval": KEEPALIVE_INTERVAL,
                     "tcp_keepalives_count": KEEPALIVE_COUNT, "tcp_user_timeout": USER_TIMEOUT_MS}


def client_keepalives(params: dict[str, Any]) -> dict[str, str]:
    """The libpq keepalive parameters the URL does not set itself (the user's own choice wins); `tcp_user_timeout`
    only with a libpq that knows it (12+)."""
    chosen = {k: v for k, v in _CLIENT_KEEPALIVE.items() if k not in params}
    if psycopg.pq.version() < 120000:
        chosen.pop("tcp_user_timeout", None)
    return chosen


def set_server_keepalives(conn: Any) -> None:
    """The server side of the keepalives, in one round trip: the server then drops a vanished host's connection (and
    its locks) within the bound above. `tcp_user_timeout` only on a server that has it (12+); on a Unix socket the
    server ignores them all."""
    settings = {k: v for k, v in _SERVER_KEEPALIVE.items()
                if k != "tcp_user_timeout" or conn.info.server_version >= 120000}
    conn.execute("SELECT " + ", ".join(f"set_config('{k}', '{int(v)}', false)" for k, v in settings.items()))


Connect = Callable[..., "psycopg.Connection[Any]"]
T = TypeVar("T")


def retry_lost_connection(attempt: Callable[[], T]) -> T:
    """`attempt()`, again and again while it fails because the connection was lost (a StoreUnavailable whose cause is
    a psycopg OperationalError: a server restart, a failover, a refused connect), with backoff, for up to
    RECONNECT_FOR seconds (SPEC §5 rev 3); then its error, saying how long it was tried. Any other error is raised at
    once. For the log's writes and the before-image store alike; runs in a worker thread, so it sleeps."""
    deadline = None
    delay = RECONNECT_FIRST_DELAY
    while True:
        try:
            return attempt()
        except StoreUnavailable as e:
            if not isinstance(e.cause, psycopg.OperationalError):
                raise
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + RECONNECT_FOR
            if now >= deadline:
                raise StoreUnavailable(f"{e} (still unreachable after {RECONNECT_FOR:g} s of retries)", e.cause) from None
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, RECONNECT_MAX_DELAY)


def default_connect(url: str, role: str, **kwargs: Any) -> "psycopg.Connection[Any]":
    """`role` (`write`, `lock` or `read`) lets a fault-injecting test wrap only some connections."""
    return psycopg.connect(url, **kwargs)


class PostgresLocked(SessionLocked):
    """The session's advisory lock is held, possibly by a process on another machine (exit 3)."""

    def __init__(self, session_id: str, pid: int | None, host: str | None) -> None:
        SessionLocked.__init__(self, session_id, pid)
        self.host = host
        if host and host != _hostname():
            holder = f"process {pid} on host {host}" if pid else f"a process on host {host}"
            PersistenceError.__init__(
                self,
                f"session {session_id!r} is live in {holder}; close it there first (reading it with `cairn show` works)",
            )


def _hostname() -> str:
    return socket.gethostname() or "localhost"


def application_name() -> str:
    """`cairn <host> <pid>`, within PostgreSQL's 63-byte limit (the host is cut, never the pid)."""
    pid = str(os.getpid())
    host = re.sub(r"\s", "_", _hostname())[: 63 - len("cairn  ") - len(pid)]
    return f"cairn {host} {pid}"


def parse_holder(app_name: str | None) -> tuple[str | None, int | None]:
    match = _APP_NAME.match(app_name or "")
    return (match.group(1), int(match.group(2))) if match else (None, None)


def describe_url(url: str) -> str:
    """The database as it may be shown: host, port and name, never the user's password or any other parameter."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return "the configured PostgreSQL database"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"postgresql://{host}:{port}/{params.get('dbname') or ''}"


def _dead_here(host: str | None, pid: int | None) -> bool:
    """Whether the holder is a process of this machine that no longer exists."""
    if not pid or host != _hostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _unlock_and_close(lock_conn: Any) -> None:
    """Release the session's lock before closing its connection: the server would drop it with the connection too,
    but only once its backend has noticed the close, and until then the session still looks live to everyone (a
    `cairn sessions` or the next `cairn resume` a moment after this one ended)."""
    try:
        lock_conn.execute("SELECT pg_advisory_unlock_all()")
    except psycopg.Error:
        pass  # a broken connection: closing it is all that is left, and the server drops the lock with it
    _close_quietly(lock_conn)


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass
