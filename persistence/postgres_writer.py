"""The PostgreSQL backend's writer (SPEC §5 rev 2, rev 3): one session's appends, each one transaction in one round trip
that checks, in the same statement, that this process is still the session's writer and still holds its lock.

Durability: a write-behind batch commits with `synchronous_commit = off` (the server acknowledges before its WAL
reaches the disk); a barrier commits at the server's own level but never below `on` (a server set to `off` is raised to
`on`; `remote_write`/`remote_apply` on a replicated server are kept). The writer sets the level on its connection in the
write's own transaction, only when it differs from what that connection last committed with. WAL is sequential, so a
durable commit also makes every earlier asynchronous commit durable: the policy's barriers keep exactly their meaning.

A server crash loses what it had acknowledged but not yet made durable: the write-behind commits after the last
barrier. So a writer keeps what it committed since its last durable commit, and after any lost connection it first
reads the stored tail (newest seq, its body, `last_seq`) and sends again, from memory, what is missing before what it
was about to write: seq N+1 is never stored without N. A tail it cannot account for (below its last barrier, beyond what
it wrote, or a row that is not the one it wrote) is not a crash's doing and is refused (CorruptDatabase, exit 4), with
nothing written on top. The same retry (`retry_lost_connection`) serves the before-image store (blobs.py).

Followers (SPEC §13 rev 4): every write that stores events also NOTIFYs the schema's channel with the session id and
the newest seq it stores, nothing else, in the same round trip, just after its commit (postgres_follow says why).
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from .backend import EncodedEvent, Writer
from .checks import MARK, RunningCheck
from .errors import CorruptDatabase, PersistenceError, SessionLocked, StaleWriter
from .postgres_connections import _close_quietly, _unlock_and_close, retry_lost_connection
from .postgres_follow import NOTIFY, payload
from .postgres_schema import _VALUE_KEYS, VALUES_ROWS, Statements, _key_parts, event_columns


class WritingBackend(Protocol):
    """What a writer asks of its backend (PostgresBackend): connections, the lock, the settings and the statements."""

    where: str

    def connect(self, role: str) -> Any: ...

    def translate(self, e: BaseException, doing: str) -> PersistenceError: ...

    def take_lock(self, session_id: str) -> Any: ...

    def lock_key(self, session_id: str) -> int: ...

    def database_oid(self, conn: Any) -> int: ...

    def durable_level(self, conn: Any) -> str: ...

    def statements(self) -> Statements: ...

    def tail_query(self) -> str: ...

    def channel(self) -> str: ...


class PostgresWriter(Writer):
    # Every call is a network round trip that can block for as long as a TCP timeout: never on the event loop.
    inline_safe = False

    def __init__(self, backend: WritingBackend, session_id: str, token: str, conn: Any, lock_conn: Any,
                 tail: EncodedEvent | None = None) -> None:
        """`tail` is the session's newest event as stored, (seq, body), when an existing session is opened: all that is
        stored then is durable (opening commits durably, and WAL is sequential)."""
        self._backend = backend
        self._id = session_id
        self._token = token
        self._conn: Any | None = conn
        self._lock_conn: Any | None = lock_conn
        self._key = {**_key_parts(backend.lock_key(session_id)), "db": backend.database_oid(conn)}
        self._durable_level = backend.durable_level(conn)
        self._level: str | None = None  # the data connection's synchronous_commit, as this writer last committed it
        self._sql = backend.statements()
        self._tail_sql = backend.tail_query()
        self._channel = backend.channel()
        self.check = RunningCheck()  # open_writer continues it from the loaded log
        # What a server crash may still take: the events committed since the last durable commit (write-behind,
        # `synchronous_commit = off`), as stored, in seq order, kept until a durable commit covers them; and the newest
        # event a durable commit covered, as stored. After a lost connection `_resume_tail` compares the stored tail
        # with them and sends again what is missing.
        self._durable: EncodedEvent | None = tail
        self._since: list[EncodedEvent] = []
        self._next = tail[0] + 1 if tail is not None else 0  # the seq after the newest this writer has committed
        self._reconnected = False  # a connection was lost since the last write: check the stored tail before writing
        self._fenced: StaleWriter | None = None  # set once another writer took the session (a takeover)

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        """Write the batch; a lost connection (a server restart, a failover) is retried with backoff for up to
        RECONNECT_FOR seconds before the write fails (SPEC §5 rev 3). Runs in a worker thread: sleeping is fine."""
        if self._fenced is not None:
            raise self._fenced  # another writer took the session: this one never touches it again
        try:
            return retry_lost_connection(lambda: self._append_once(batch, durable))
        except StaleWriter as e:
            self._fenced = e
            raise

    def _append_once(self, batch: list[EncodedEvent], durable: bool) -> int:
        for _ in range(2):
            if self._write(batch, durable):
                return sum(len(data) for _, data in batch)
            self._retake_lock()  # our lock was lost while our token stands: take it back, then write again
        raise StaleWriter(f"session {self._id!r} could not be re-locked for writing; this writer stops")

    def _write(self, batch: list[EncodedEvent], durable: bool) -> bool:
        """One transaction in one round trip: check writer + lock and stamp `updated` (and `last_seq`), insert the
        batch, commit (durably or not). False when this process is not (or no longer) the writer; nothing was changed
        then. After a lost connection, the stored tail is read first and what a crash took is put in front."""
        backend = self._backend
        batch, at = self.check.stamp(batch, durable)
        try:
            conn = self._data_connection()
            if self._reconnected:
                batch = self._resume_tail(conn, batch)
            columns = [event_columns(data) for _, data in batch]
            params: dict[str, Any] = {
                "id": self._id, "token": self._token, "lock_pid": self._lock_pid(),
                "t": max((t for _, t in columns), default=0), "top": batch[-1][0] if batch else None, **self._key,
            }
            if not batch:
                statement = self._sql.stamp  # nothing new: the stamp alone, so that a durable commit still flushes
            elif len(batch) > VALUES_ROWS:
                statement = self._sql.arrays
                params.update(seqs=[seq for seq, _ in batch], times=[t for _, t in columns],
                              types=[kind for kind, _ in columns], bodies=[data for _, data in batch])
            else:
                statement = self._sql.values[len(batch)]
                for (s, t, y, b), (seq, data), (kind, time_ms) in zip(_VALUE_KEYS, batch, columns):
                    params[s], params[t], params[y], params[b] = seq, time_ms, kind, data
            level = self._durable_level if durable else "off"
            with conn.pipeline():  # one round trip
                conn.execute("BEGIN")
                if level != self._level:  # a session-level SET, sent only when it changes; it lasts once committed
                    conn.execute(f"SET synchronous_commit = {level}")
                written = conn.execute(statement, params)
                conn.execute("COMMIT")
                if batch:  # followers are woken, by session and newest seq only, just after the commit (postgres_follow)
                    conn.execute(NOTIFY, {"channel": self._channel, "payload": payload(self._id, batch[-1][0]),
                                          "id": self._id, "token": self._token})
            self._level = level
            if written.rowcount != max(len(batch), 1):
                return False  # not (or no longer) the writer: what was committed changed nothing
            self.check.advance(at)
            self._committed(batch, durable)
            return True
        except psycopg.Error as e:
            self._drop_data_connection()
            raise backend.translate(e, f"write session {self._id!r} to") from None

    def _committed(self, batch: list[EncodedEvent], durable: bool) -> None:
        """Keep what a crash may still take. A batch always ends at the newest event (a re-send re-sends everything
        since the last durable point); a durable commit makes every earlier commit durable too (WAL is sequential)."""
        if durable:
            if batch:
                self._durable = batch[-1]
            elif self._since:
                self._durable = self._since[-1]
            self._since = []
        elif batch:
            if batch[0][0] >= self._next:
                self._since += batch
            else:  # a re-send: what this writer committed before is kept once
                self._since += [event for event in batch if event[0] >= self._next]
        if batch and batch[-1][0] >= self._next:
            self._next = batch[-1][0] + 1
        self._reconnected = False

    def _resume_tail(self, conn: Any, batch: list[EncodedEvent]) -> list[EncodedEvent]:
        """The batch to write after a lost connection: what the server lost of this writer's commits (write-behind a
        crash took: it acknowledged them before they were durable), from memory, then the batch. The stored tail must
        be one this writer left: at or after its last durable event, at or before the newest it wrote, the very event
        it wrote there, and the newest seq the session's row records (stamped in the same transactions) must be
        stored. Anything else is not a crash's doing: CorruptDatabase (exit 4), and nothing is written on top. A
        token that is no longer ours comes first: another writer took the session (a takeover), StaleWriter (exit 3)."""
        taken = conn.execute("SELECT writer FROM sessions WHERE id = %s", (self._id,)).fetchone()
        if taken is not None and taken[0] != self._token:  # fenced: another host took the session while we were away
            raise StaleWriter(f"session {self._id!r} was taken over by another writer; this one stops writing")
        row = conn.execute(self._tail_sql, {"id": self._id}).fetchone()
        if row is None:
            return batch  # the session's row is gone: the write's own check refuses it (StaleWriter)
        mark, top, body = row
        top = -1 if top is None else top
        where = f"{self._backend.where}[{self._id}]"
        stops = "this writer stops (nothing is written on top)"
        durable = self._durable[0] if self._durable is not None else -1
        newest = max(self._next - 1, batch[-1][0] if batch else -1)
        if mark is not None and mark > top:
            raise CorruptDatabase(where, f"stored events are missing: the session records seq {mark} as written, its "
                                         f"events end at seq {top}; {stops}")
        if top < durable:
            raise CorruptDatabase(where, f"stored events are missing: seq {durable} was made durable, the events end at "
                                         f"seq {top}; {stops}")
        if top > newest:
            raise CorruptDatabase(where, f"seq {top} is stored, and this writer wrote only up to seq {newest} (another "
                                         f"program wrote to the session); {stops}")
        mine = self._as_written(top, batch)
        if mine is not None and not _same_event(bytes(body), mine):
            raise CorruptDatabase(where, f"the stored event at seq {top} is not the one this writer wrote; {stops}")
        first = batch[0][0] if batch else self._next
        lost = [event for event in self._since if top < event[0] < first]
        resumed = lost + batch
        if resumed and resumed[0][0] > top + 1:  # never seq N+1 without N
            raise CorruptDatabase(where, f"stored events are missing from seq {top + 1} and this writer no longer "
                                         f"holds them; {stops}")
        return resumed

    def _as_written(self, seq: int, batch: list[EncodedEvent]) -> bytes | None:
        """The body this writer stored (or is storing) at `seq`, if it still holds it."""
        for events in (batch, self._since, [self._durable] if self._durable is not None else []):
            for event in reversed(events):
                if event[0] == seq:
                    return event[1]
        return None

    def _lock_pid(self) -> int:
        conn = self._lock_conn
        if conn is None or conn.closed:
            return 0  # matches no lock: the write is refused and the lock re-taken
        return conn.info.backend_pid

    def _retake_lock(self) -> None:
        """Our write was refused. If our token was replaced, another writer owns the session: stop. Otherwise our lock
        connection died (and the lock with it): take the lock again, then check the token once more, since another
        writer may have come and gone in between."""
        backend = self._backend
        if self._current_writer() != self._token:
            raise StaleWriter(f"session {self._id!r} was taken over by another writer; this one stops writing")
        if self._lock_conn is not None:
            _close_quietly(self._lock_conn)
            self._lock_conn = None
        try:
            self._lock_conn = backend.take_lock(self._id)
        except SessionLocked as e:  # another writer holds it now (a takeover that has not stamped its token yet)
            raise StaleWriter(f"session {self._id!r} was taken over by another writer ({e}); this one stops "
                              "writing") from None
        if self._current_writer() != self._token:
            _close_quietly(self._lock_conn)
            self._lock_conn = None
            raise StaleWriter(f"session {self._id!r} was taken over by another writer; this one stops writing")

    def _current_writer(self) -> str | None:
        try:
            row = self._data_connection().execute("SELECT writer FROM sessions WHERE id = %s", (self._id,)).fetchone()
        except psycopg.Error as e:
            self._drop_data_connection()
            raise self._backend.translate(e, f"check the writer of session {self._id!r} in") from None
        return row[0] if row else None

    def _data_connection(self) -> Any:
        """The writer's connection; a new one (with the server's own settings) when it is gone. A connection that was
        lost may have taken a server's crash with it: the next write checks the stored tail first."""
        if self._conn is None or self._conn.closed:
            self._conn = self._backend.connect("write")
            self._level = None
            self._reconnected = True
        return self._conn

    def _drop_data_connection(self) -> None:
        self._level = None
        self._reconnected = True
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None

    def close(self) -> None:
        self._drop_data_connection()
        if self._lock_conn is not None:
            _unlock_and_close(self._lock_conn)
            self._lock_conn = None


def _same_event(stored: bytes, written: bytes) -> bool:
    """Whether a stored body is the event this writer wrote: the same bytes, or the same but for a check field one of
    them carries (a durable batch that failed and is re-sent with more events carries its check further on)."""
    return stored == written or _unchecked(stored) == _unchecked(written)


def _unchecked(body: bytes) -> bytes:
    at = body.rfind(MARK)
    return body[:at] + b"}" if at >= 0 and body.endswith(b'"}') else body
