"""Following a session on PostgreSQL by notification (SPEC §13 rev 4): the writer NOTIFYs at every commit that stores
events; a follower LISTENs on a connection of its own and, woken, fetches the rows by seq.

- When: just after the write's commit, in the same round trip (one pipeline), as a transaction of its own that is never
  flushed. Not inside the write's transaction: PostgreSQL holds a cluster-wide lock on its notification queue from a
  notifying transaction's pre-commit until its commit is flushed, so a NOTIFY inside every barrier would make every
  session's durable commit wait for every other's flush (8 concurrent writers, a slowly flushing disk: ~3000 durable
  commits/s without NOTIFY, 530-770 with it inside each commit). A notification never comes before its rows are
  committed; only a writer whose token stands sends one (a writer taken over wakes nobody).

- Channel: `cairn_events:<schema>`, one per schema of Cairn tables (NOTIFY is per database already), so a follower of
  one schema is never woken by the writers of another sharing the database. A schema name too long for PostgreSQL's
  63-byte channel names gives `cairn_events:#<40 hex digits of its BLAKE2b digest>`.
- Payload: `<session id> <newest seq>` (a session id holds no space): never anything of an event's content, which a
  bare `LISTEN` on the database would otherwise see whatever the tables' privileges say.
- A notification is only a wake-up: the follower fetches `seq >= the next it expects`, so nothing is missed or shown
  twice, a lost notification (a reconnect, a payload it cannot read) costs at most one idle interval, and a commit made
  before the LISTEN is found by the first fetch, which comes after it.
- The writer ended when nobody holds the session's advisory lock (a holder that is a dead process of this host is
  nobody: the server has only not yet noticed its closed socket).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Protocol

import psycopg
from psycopg import sql

from .errors import PersistenceError
from .postgres_connections import _close_quietly, _dead_here, parse_holder, retry_lost_connection
from .postgres_schema import _HOLDER, _key_parts

CHANNEL_PREFIX = "cairn_events:"
_CHANNEL_BYTES = 63  # NAMEDATALEN - 1

# Sent right after the write's COMMIT in the same pipeline: its own (implicit) transaction, committed without waiting
# for a flush (nothing of it needs to be durable). Only a writer whose token stands notifies: a writer that was taken
# over wakes nobody; one whose lock alone was lost is refused and writes again (a spurious wake-up at most).
NOTIFY = ("SELECT set_config('synchronous_commit', 'off', true), pg_notify(%(channel)s, %(payload)s) "
          "FROM sessions WHERE id = %(id)s AND writer = %(token)s")
_ROWS = "SELECT seq, body FROM events WHERE session_id = %(id)s AND seq >= %(next)s ORDER BY seq"

Holder = tuple[str | None, int | None]  # (host, pid) of the lock's connection; (None, None): not a Cairn connection


def channel(schema: str) -> str:
    name = CHANNEL_PREFIX + schema
    if len(name.encode()) <= _CHANNEL_BYTES:
        return name
    return CHANNEL_PREFIX + "#" + hashlib.blake2b(schema.encode(), digest_size=20).hexdigest()


def payload(session_id: str, seq: int) -> str:
    return f"{session_id} {seq}"


def parse_payload(text: str) -> tuple[str, int] | None:
    """(session id, seq) of a notification; None for anything else (another program may notify the channel)."""
    session_id, _, seq = text.rpartition(" ")
    return (session_id, int(seq)) if session_id and seq.isdigit() else None


class FollowedBackend(Protocol):
    def connect(self, role: str) -> Any: ...

    def translate(self, e: BaseException, doing: str) -> PersistenceError: ...

    def lock_key(self, session_id: str) -> int: ...

    def channel(self) -> str: ...


class PostgresFollower:
    """One session's notifications and new rows, on a LISTEN connection of its own. Read-only: never locks."""

    def __init__(self, backend: FollowedBackend, session_id: str, next_seq: int) -> None:
        self.backend = backend
        self.session_id = session_id
        self.next_seq = next_seq
        self._conn: Any | None = None
        self.woken = True  # fetch at once: what was committed before the LISTEN
        retry_lost_connection(self._listening)

    def _listening(self) -> Any:
        """The LISTEN connection; a new one after a lost one, and then a fetch is due (notifications were missed)."""
        if self._conn is None or self._conn.closed:
            conn = self.backend.connect("follow")
            try:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.backend.channel())))
            except psycopg.Error as e:
                _close_quietly(conn)
                raise self.backend.translate(e, "listen for new events in") from None
            self._conn = conn
            self.woken = True
        return self._conn

    def _lost(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None
        self.woken = True

    def wait(self, timeout: float) -> bool:
        """Whether a notification names this session with a seq not fetched yet, waiting up to `timeout` seconds for
        one (0: only those already received). Other sessions' notifications are read and passed over."""
        deadline = time.monotonic() + timeout
        while not self.woken:
            try:
                conn = retry_lost_connection(self._listening)
                for notice in conn.notifies(timeout=max(0.0, deadline - time.monotonic()), stop_after=1):
                    named = parse_payload(notice.payload)
                    if named is None or (named[0] == self.session_id and named[1] >= self.next_seq):
                        self.woken = True
            except psycopg.OperationalError:
                self._lost()
            if time.monotonic() >= deadline:
                break
        return self.woken

    def fetch(self) -> tuple[list[tuple[int, bytes]], Holder | None]:
        """The rows (seq, body) from the next expected seq on, in order, then who holds the session's lock (None:
        nobody, the writer ended), in one round trip; through a lost connection as every Cairn read is."""
        return retry_lost_connection(self._fetch_once)

    def _fetch_once(self) -> tuple[list[tuple[int, bytes]], Holder | None]:
        conn = self._listening()
        self.woken = False  # a notification arriving from here on wakes the next wait
        try:
            with conn.pipeline():
                rows = conn.execute(_ROWS, {"id": self.session_id, "next": self.next_seq})
                holder = conn.execute(_HOLDER, _key_parts(self.backend.lock_key(self.session_id)))
            found = [(seq, bytes(body)) for seq, body in rows.fetchall()]
            row = holder.fetchone()
        except psycopg.Error as e:
            self._lost()
            raise self.backend.translate(e, f"follow session {self.session_id!r} in") from None
        if found:
            self.next_seq = found[-1][0] + 1
        held = None if row is None else parse_holder(row[0])
        if held is not None and _dead_here(*held):
            held = None
        return found, held

    def close(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None
