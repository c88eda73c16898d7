"""PostgreSQL backend (SPEC §5 rev 2): sessions that survive losing the machine, in a database a team shares.

Tables (created on first write, in the connection's current schema, versioned by a `cairn_schema` row; a newer schema is
refused like a newer file format): `sessions` (id, cwd, created, updated, header, writer, last_seq) and `events`
(session_id, seq, time, type, body), primary key (session_id, seq). `body` is the exact JSON line the JSONL backend
writes, `header` the exact JSONL header line, so a log reads back byte for byte whatever backend wrote it.

The newest seq (SPEC §5 rev 3, issue 39): every write stamps `sessions.last_seq` with the newest seq it stores, in the
statement that checks the writer, so in the same transaction as the rows. A crash takes a commit whole, rows and stamp
together, so the stored events always end at `last_seq`; when they end before it, rows were deleted behind Cairn's back,
and a load says so (exit 4), where a deleted newest row would otherwise read as an interrupted turn. The column came
after schema version 1 and is optional: a writer adds it when it is missing (an older Cairn ignores it and leaves it
behind, never ahead), a session without it (NULL) loads as before, and a user who may not alter the tables still works,
unchecked.

Durability: a write-behind batch commits with `synchronous_commit = off` (the server acknowledges before its WAL
reaches the disk); a barrier commits at the server's own level but never below `on` (a server set to `off` is raised to
`on`; `remote_write`/`remote_apply` on a replicated server are kept). The writer sets the level on its connection in the
write's own transaction, only when it differs from what that connection last committed with. WAL is sequential, so a
durable commit also makes every earlier asynchronous commit durable: the policy's barriers keep exactly their meaning.

Lock: `pg_try_advisory_lock` on a connection of its own, held for the session's life; the server drops it when that
connection dies (a killed process, a lost machine), so a crashed session is never left locked. The connection's
`application_name` says `cairn <host> <pid>`, which is how a second writer, on any machine, learns who holds it. The
writer also stamps a random token in the session's row, and every write transaction checks, in the same statement, that
the token is still its own and that its lock connection still holds the lock. A writer whose lock was lost (its
connection killed, the server restarted) re-takes the lock and re-checks the token before it writes again; a writer
whose token was replaced stops for good (StaleWriter).

Reads: a load reads the header and the events in one REPEATABLE READ snapshot, so a writer appending meanwhile is
either wholly in it or not at all. A large session (SPLIT_SEQS) is fetched in two halves on two connections, the
second importing the first's exported snapshot: the two server backends produce the rows side by side while the
client decodes. The reader and that helper connection are cached for the backend's life.

Faults are fail-closed: any failure of a write leaves the events queued in the coordinator, the broken connection is
dropped, and the next write reconnects and re-sends everything since the last durable barrier (ON CONFLICT makes a
re-sent row harmless). Every psycopg error becomes one readable persistence error; a database URL's credentials never
appear in one.

A server crash loses what it had acknowledged but not yet made durable: the write-behind commits after the last
barrier. So a writer keeps what it committed since its last durable commit, and after any lost connection it first
reads the stored tail (newest seq, its body, `last_seq`) and sends again, from memory, what is missing before what it
was about to write: seq N+1 is never stored without N. A tail it cannot account for (below its last barrier, beyond what
it wrote, or a row that is not the one it wrote) is not a crash's doing and is refused (CorruptDatabase, exit 4), with
nothing written on top. The same retry (`retry_lost_connection`) serves the before-image store (blobs.py).

psycopg is imported only here, and this module only when the backend is chosen (`make_backend`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import socket
import threading
import time
from operator import attrgetter, itemgetter
from typing import Any, Callable, Iterable, Iterator, NamedTuple, TypeVar

import msgspec
import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .backend import Backend, EncodedEvent, LoadedLog, Writer
from .checks import MARK, RunningCheck, verify_pieces
from .codec import decode_events, decode_header, gc_paused
from .errors import (
    CorruptDatabase,
    PersistenceError,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    StaleWriter,
    StoreUnavailable,
    UnsupportedFormat,
)
from .events import SessionHeader, encoder, event_decoder, raw_decoder
from .ids import valid_session_id

SCHEMA_VERSION = 1
CONNECT_TIMEOUT = 10  # seconds, unless the URL says otherwise
# The server ends a lock connection whose machine vanished (no FIN ever comes) after idle + interval * count seconds
# of silence, and so releases its lock: a session on a lost laptop can be resumed elsewhere about half a minute later.
LOCK_KEEPALIVE = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 3}
# psycopg logs (at warning level) errors it ignores while cleaning up after a lost connection ("error ignored
# terminating <psycopg.Pipeline [BAD]>: the connection is lost"): Cairn reports what matters itself, in one line.
_psycopg_log = logging.getLogger("psycopg")
_psycopg_log.addHandler(logging.NullHandler())
_psycopg_log.propagate = False

# A lost connection is retried for this long (SPEC §5 rev 3), waiting 0.1 s, 0.2 s, … up to 2 s between attempts.
RECONNECT_FOR = 30.0
RECONNECT_FIRST_DELAY = 0.1
RECONNECT_MAX_DELAY = 2.0
# Adding `last_seq` to an older database waits at most this long for its `sessions` table (ALTER TABLE takes an
# exclusive lock): rather than queue every other Cairn behind it, the writer goes on without it and a later one adds it.
ADD_COLUMN_WAIT = "2s"
# A holder on this host whose process is gone is a lock the server has not yet noticed is free: wait this long for it.
DEAD_HOLDER_WAIT = 10.0
# A load decodes and checks the bodies in pieces of this many rows (~0.5 MB for typical events): small enough to stay in
# the cache between the join and the decode, large enough that the per-piece work is nothing.
PIECE_ROWS = 1000
# A session spanning more seqs than this is fetched in two halves, on two connections in one snapshot: the two server
# backends then produce the rows side by side instead of one after the other (P4 in docs/benchmarks.md). Below it, the
# second connection would cost more than it saves.
SPLIT_SEQS = 20_000
_SCHEMA_LOCK = 0x636169726E5F7363  # transaction-level advisory lock serializing schema creation ("cairn_sc")

DDL = (
    "CREATE TABLE cairn_schema (version integer NOT NULL)",
    """CREATE TABLE sessions (
        id text PRIMARY KEY,
        cwd text NOT NULL,
        created bigint NOT NULL,
        updated bigint NOT NULL,
        header bytea NOT NULL,
        writer text,
        last_seq bigint
    )""",
    """CREATE TABLE events (
        session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq bigint NOT NULL,
        time bigint NOT NULL,
        type text NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (session_id, seq)
    )""",
    # Bodies are stored uncompressed (large ones out of line, as before): a load sends every body, and decompressing
    # pglz is a third of the server's work for it (P4 in docs/benchmarks.md); the price is disk: ~1.3x the JSONL
    # file's size instead of ~0.8x (71 MB instead of 44 MB for P4's 56 MB session). Physical only: the schema version
    # is unchanged, and a database made before keeps its compressed rows (the same ALTER changes later ones).
    "ALTER TABLE events ALTER COLUMN body SET STORAGE EXTERNAL",
)

# The database's oid is a parameter, read once per writer (`database_oid`), not looked up in pg_database at every
# write (5-10 us a write, P1 on PostgreSQL in docs/benchmarks.md).
_HOLDS_LOCK = """EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid = %(lock_pid)s AND objsubid = 1
      AND database = %(db)s::oid AND classid::bigint = %(hi)s AND objid::bigint = %(lo)s)"""

# The writer's check and its `updated` stamp in one statement: 0 rows means "not (or no longer) the writer". Where the
# tables have `last_seq`, the same statement stamps the newest seq the write stores (`top`; NULL: none, kept as it is).
_MARK_SEQ = ", last_seq = GREATEST(last_seq, %(top)s::bigint)"
_STAMP = """UPDATE sessions SET updated = GREATEST(updated, %(t)s){mark}
    WHERE id = %(id)s AND writer = %(token)s AND {holds}"""

# The batch goes in only if the stamp found this writer (the CTE), so the whole write is one statement and the COMMIT
# can go in the same round trip: a refused write commits nothing, and says so by inserting no row.
_INSERT = """WITH stamped AS ({stamp} RETURNING 1)
    INSERT INTO events (session_id, seq, time, type, body)
    SELECT %(id)s, u.s, u.t, u.y, u.b FROM {rows} AS u(s, t, y, b)
    WHERE EXISTS (SELECT 1 FROM stamped)
    ON CONFLICT (session_id, seq) DO UPDATE SET time = excluded.time, type = excluded.type, body = excluded.body"""
# A batch of up to VALUES_ROWS events (a barrier's few) goes as VALUES of plain parameters: as four lists (psycopg
# adapting them, the server unpacking them) it took 65-80 us longer, a fifth of a barrier on a fast local server. A
# larger one (write-behind while an answer streams) goes as four arrays, one statement whatever its size.
VALUES_ROWS = 16
_VALUE_KEYS = [(f"s{i}", f"t{i}", f"y{i}", f"b{i}") for i in range(VALUES_ROWS)]
_ARRAY_ROWS = "unnest(%(seqs)s::bigint[], %(times)s::bigint[], %(types)s::text[], %(bodies)s::bytea[])"


class Statements(NamedTuple):
    """A write's statements: the stamp alone (a barrier with nothing new), a batch as arrays, a batch as VALUES."""

    stamp: str
    arrays: str
    values: dict[int, str]


def _statements(mark: bool) -> Statements:
    stamp = _STAMP.format(mark=_MARK_SEQ if mark else "", holds=_HOLDS_LOCK)
    values = {
        n: _INSERT.format(stamp=stamp, rows="(VALUES " + ", ".join(
            f"(%({s})s::bigint, %({t})s::bigint, %({y})s::text, %({b})s::bytea)" for s, t, y, b in _VALUE_KEYS[:n]) + ")")
        for n in range(1, VALUES_ROWS + 1)
    }
    return Statements(stamp, _INSERT.format(stamp=stamp, rows=_ARRAY_ROWS), values)


STATEMENTS = {True: _statements(True), False: _statements(False)}  # by whether the tables have `last_seq`

# What a writer reads after a lost connection: the session's newest seq as stamped, and its newest stored row.
_TAIL = """SELECT {mark}, e.seq, e.body FROM sessions s
    LEFT JOIN LATERAL (SELECT seq, body FROM events WHERE session_id = s.id ORDER BY seq DESC LIMIT 1) e ON true
    WHERE s.id = %(id)s"""

_HOLDER = """SELECT a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = %(hi)s AND l.objid::bigint = %(lo)s
    LIMIT 1"""

# msgspec writes the tag first: {"type":"turn/start","seq":3,"time":…}. Anything else (an ignorable event) is decoded.
_PREFIX = re.compile(rb'\{"type":"([^"\\]*)","seq":-?\d+,"time":(-?\d+)[,}]')
_APP_NAME = re.compile(r"^cairn (\S+) (\d+)$")

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


class NewerSchema(UnsupportedFormat):
    def __init__(self, where: str, version: int) -> None:
        PersistenceError.__init__(
            self,
            f"{where}: the Cairn tables have schema version {version}, made by a newer Cairn (this build knows "
            f"{SCHEMA_VERSION}); upgrade Cairn",
        )
        self.path = where
        self.version = version
        self.reason = f"schema version {version} is newer than this build's {SCHEMA_VERSION}"


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


def lock_key(schema: str, session_id: str) -> int:
    """A signed 64-bit advisory-lock key for one session of one schema (the database is part of the lock already)."""
    digest = hashlib.blake2b(f"cairn\0{schema}\0{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _key_parts(key: int) -> dict[str, int]:
    """How pg_locks shows a bigint advisory key: classid = high 32 bits, objid = low 32 bits (both unsigned)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}


def event_columns(data: bytes) -> tuple[str, int]:
    """(type, time) of an encoded event, for the table's columns; the body stays the source of truth."""
    match = _PREFIX.match(data)
    if match:
        return match.group(1).decode("utf-8", "replace"), int(match.group(2))
    try:
        raw = raw_decoder.decode(data)
    except Exception:
        return "", 0
    kind, time = (raw.get("type"), raw.get("time")) if isinstance(raw, dict) else (None, None)
    return (kind if isinstance(kind, str) else ""), (time if type(time) is int and -(2**63) <= time < 2**63 else 0)


class PostgresWriter(Writer):
    # Every call is a network round trip that can block for as long as a TCP timeout: never on the event loop.
    inline_safe = False

    def __init__(self, backend: "PostgresBackend", session_id: str, token: str, conn: Any, lock_conn: Any,
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
        self.check = RunningCheck()  # open_writer continues it from the loaded log
        # What a server crash may still take: the events committed since the last durable commit (write-behind,
        # `synchronous_commit = off`), as stored, in seq order, kept until a durable commit covers them; and the newest
        # event a durable commit covered, as stored. After a lost connection `_resume_tail` compares the stored tail
        # with them and sends again what is missing.
        self._durable: EncodedEvent | None = tail
        self._since: list[EncodedEvent] = []
        self._next = tail[0] + 1 if tail is not None else 0  # the seq after the newest this writer has committed
        self._reconnected = False  # a connection was lost since the last write: check the stored tail before writing

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        """Write the batch; a lost connection (a server restart, a failover) is retried with backoff for up to
        RECONNECT_FOR seconds before the write fails (SPEC §5 rev 3). Runs in a worker thread: sleeping is fine."""
        return retry_lost_connection(lambda: self._append_once(batch, durable))

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
        stored. Anything else is not a crash's doing: CorruptDatabase (exit 4), and nothing is written on top."""
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
        self._lock_conn = backend.take_lock(self._id)
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


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str, connect: Connect = default_connect) -> None:
        self.url = url
        self.where = describe_url(url)
        self._connect = connect
        self._schema_ready = False
        self._schema_name: str | None = None
        self._reader: Any | None = None
        self._helper: Any | None = None  # the second connection of a split load (_fetch_split)
        self._mark = False  # whether `sessions` has `last_seq` (known once the schema was looked at)
        self._read_lock = threading.RLock()  # a load's transaction on the cached connections is never interleaved

    # -- connections and errors ----------------------------------------------------------------------------------

    def connect(self, role: str) -> Any:
        """A new autocommit connection (`role` is `write`, `lock` or `read`: a seam for fault-injecting tests)."""
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": application_name()}
        try:
            params = conninfo_to_dict(self.url)
        except psycopg.Error:
            raise StoreUnavailable(
                "the database URL is not a valid libpq URL (postgresql://[user@]host[:port]/dbname); "
                "fix --database-url or CAIRN_DATABASE_URL"
            ) from None
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT
        try:
            conn = self._connect(self.url, role, **kwargs)
        except psycopg.Error as e:
            raise self.translate(e, "connect to") from None
        if self._schema_name is None:
            try:
                row = conn.execute("SELECT current_schema()").fetchone()
                self._schema_name = (row[0] if row else None) or ""
            except psycopg.Error as e:
                _close_quietly(conn)
                raise self.translate(e, "connect to") from None
        return conn

    def translate(self, e: BaseException, doing: str) -> PersistenceError:
        """One readable line for a psycopg error, with no credentials in it."""
        if isinstance(e, PersistenceError):
            return e
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        first = self._scrub(first)
        if isinstance(e, pgerrors.DiskFull):
            return StoreUnavailable(f"cannot {doing} {self.where}: the database server's disk is full ({first}); "
                                    "free space on the server, then try again", e)
        if isinstance(e, pgerrors.InsufficientPrivilege):
            return StoreUnavailable(f"cannot {doing} {self.where}: {first}; grant this user the rights Cairn needs, "
                                    "or use another database or schema", e)
        if isinstance(e, psycopg.OperationalError):
            return StoreUnavailable(f"cannot {doing} {self.where}: {first}; check that the server is running and "
                                    "--database-url / CAIRN_DATABASE_URL", e)
        return StoreUnavailable(f"cannot {doing} {self.where}: {first}", e)

    def _scrub(self, text: str) -> str:
        """Remove the URL and any password from a server or driver message."""
        text = text.replace(self.url, self.where)
        try:
            password = conninfo_to_dict(self.url).get("password")
        except psycopg.Error:
            password = None
        if password:
            text = text.replace(str(password), "***")
        return text

    def _read(self, doing: str, query: Callable[[Any], Any]) -> Any:
        """Run a read on the cached reader connection; one reconnect when the connection turned out to be dead."""
        with self._read_lock:
            for attempt in range(2):
                if self._reader is None or self._reader.closed:
                    self._reader = self.connect("read")
                try:
                    return query(self._reader)
                except psycopg.OperationalError as e:
                    _close_quietly(self._reader)
                    self._reader = None
                    self._drop_helper()
                    if attempt:
                        raise self.translate(e, doing) from None
                except psycopg.Error as e:
                    raise self.translate(e, doing) from None

    def retrying(self, attempt: Callable[[], T]) -> T:
        """`attempt()` through a lost connection, like every write of the log (`retry_lost_connection`): for the
        before-image store beside the sessions (blobs.py), which imports nothing of psycopg."""
        return retry_lost_connection(attempt)

    def close(self) -> None:
        if self._reader is not None:
            _close_quietly(self._reader)
            self._reader = None
        self._drop_helper()

    # -- schema ----------------------------------------------------------------------------------------------------

    def _schema_state(self, conn: Any) -> int | None:
        """The schema version of Cairn's tables; None when there are none. A schema holding a `sessions` or `events`
        table that is not Cairn's is refused, not extended. Also notes whether `sessions` has `last_seq`."""
        ours, sessions, events, mark = conn.execute(
            "SELECT to_regclass('cairn_schema') IS NOT NULL, to_regclass('sessions') IS NOT NULL, "
            "to_regclass('events') IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
            "to_regclass('sessions') AND attname = 'last_seq' AND NOT attisdropped)"
        ).fetchone()
        self._mark = bool(mark)
        if not ours:
            if sessions or events:
                raise CorruptDatabase(self.where, "not a Cairn database: it has a sessions or events table of its "
                                                  "own (point Cairn at another database or schema)")
            return None
        version = conn.execute("SELECT max(version) FROM cairn_schema").fetchone()[0]
        if not isinstance(version, int):
            raise CorruptDatabase(self.where, "its cairn_schema table holds no version")
        if version > SCHEMA_VERSION:
            raise NewerSchema(self.where, version)
        if version < SCHEMA_VERSION:
            raise UnsupportedFormat(self.where, version, SCHEMA_VERSION)
        return version

    def _ensure_schema(self, conn: Any) -> None:
        if self._schema_ready:
            return
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))  # two first writers: one creates
                if self._schema_state(conn) is None:
                    for statement in DDL:
                        conn.execute(statement)
                    conn.execute("INSERT INTO cairn_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
                    self._mark = True
            if not self._mark:
                self._add_mark(conn)
        except psycopg.Error as e:
            raise self.translate(e, "create Cairn's tables in") from None
        self._schema_ready = True

    def _add_mark(self, conn: Any) -> None:
        """Add `sessions.last_seq` to tables an older Cairn made (a nullable column: nothing else changes for it).
        Without it everything works but a deleted newest row goes unseen, so a user who may not alter the tables, or
        a table busy for longer than ADD_COLUMN_WAIT, is left as it is."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(f"SET LOCAL lock_timeout = '{ADD_COLUMN_WAIT}'")
                conn.execute("ALTER TABLE sessions ADD COLUMN IF NOT EXISTS last_seq bigint")
        except (pgerrors.InsufficientPrivilege, pgerrors.LockNotAvailable):
            return
        self._mark = True

    def statements(self) -> Statements:
        """A writer's statements, stamping `last_seq` where the tables have it."""
        return STATEMENTS[self._mark]

    def tail_query(self) -> str:
        """What a writer reads after a lost connection: `last_seq` (NULL without the column), newest seq and body."""
        return _TAIL.format(mark="s.last_seq" if self._mark else "NULL::bigint")

    def _readable(self, conn: Any) -> bool:
        """Whether Cairn's tables exist (never creates them: reading writes nothing)."""
        return self._schema_ready or self._schema_state(conn) is not None

    def durable_level(self, conn: Any) -> str:
        """The synchronous_commit a barrier uses: the server's own setting, raised to `on` when it is weaker."""
        try:
            level = conn.execute("SHOW synchronous_commit").fetchone()[0]
        except psycopg.Error as e:
            raise self.translate(e, "read the settings of") from None
        return level if level in ("on", "remote_write", "remote_apply") else "on"

    def database_oid(self, conn: Any) -> int:
        """The oid of the connection's database, which pg_locks names the database by."""
        try:
            return conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        except psycopg.Error as e:
            raise self.translate(e, "read the settings of") from None

    def lock_key(self, session_id: str) -> int:
        return lock_key(self._schema_name or "", session_id)

    # -- locking ---------------------------------------------------------------------------------------------------

    def take_lock(self, session_id: str) -> Any:
        """A new connection holding the session's advisory lock, or PostgresLocked naming the holder.

        A holder that is a dead process of this machine (SIGKILLed a moment ago) is waited for: its server backend
        releases the lock as soon as it notices the closed socket."""
        conn = self.connect("lock")
        key = self.lock_key(session_id)
        deadline = time.monotonic() + DEAD_HOLDER_WAIT
        try:
            for name, value in LOCK_KEEPALIVE.items():
                conn.execute(f"SET {name} = {int(value)}")
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                holder = self._holder(conn, key)
                if holder is None:
                    continue  # released between the two queries: try again
                host, pid = holder
                if not _dead_here(host, pid) or time.monotonic() > deadline:
                    raise PostgresLocked(session_id, pid, host)
                time.sleep(0.02)
        except psycopg.Error as e:
            _close_quietly(conn)
            raise self.translate(e, f"lock session {session_id!r} in") from None
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _holder(self, conn: Any, key: int) -> tuple[str | None, int | None] | None:
        """(host, pid) of whoever holds the session's lock, None when nobody does ((None, None): unknown)."""
        row = conn.execute(_HOLDER, _key_parts(key)).fetchone()
        if row is None:
            return None
        return parse_holder(row[0])

    # -- the Backend interface -------------------------------------------------------------------------------------

    def check_writable(self) -> None:
        if self._schema_ready:
            return
        conn = self.connect("write")
        try:
            self._ensure_schema(conn)
        finally:
            _close_quietly(conn)

    def create(self, header: SessionHeader) -> Writer:
        conn = self.connect("write")
        lock_conn = None
        try:
            self._ensure_schema(conn)
            lock_conn = self.take_lock(header.id)
            token = secrets.token_hex(8)
            level = self.durable_level(conn)
            try:
                with conn.transaction():
                    conn.execute(f"SET LOCAL synchronous_commit = {level}")
                    conn.execute(
                        "INSERT INTO sessions (id, cwd, created, updated, header, writer) VALUES (%s, %s, %s, %s, %s, %s)",
                        (header.id, header.cwd, header.created, header.created, encoder.encode(header), token),
                    )
            except pgerrors.UniqueViolation:
                raise SessionExists(header.id) from None
            except psycopg.Error as e:
                raise self.translate(e, "create a session in") from None
        except BaseException:
            _close_quietly(conn)
            if lock_conn is not None:
                _close_quietly(lock_conn)
            raise
        return PostgresWriter(self, header.id, token, conn, lock_conn)

    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        conn = self.connect("write")
        lock_conn = None
        try:
            self._ensure_schema(conn)
            lock_conn = self.take_lock(session_id)
            token = secrets.token_hex(8)
            try:
                with self._read_lock:  # a split load uses the helper connection
                    log, tail = self._load_with(conn, session_id)  # checked before anything is written (locked)
                with conn.transaction():
                    conn.execute(f"SET LOCAL synchronous_commit = {self.durable_level(conn)}")
                    cur = conn.execute("UPDATE sessions SET writer = %s WHERE id = %s", (token, session_id))
                if cur.rowcount == 0:
                    raise SessionNotFound(session_id)
            except psycopg.Error as e:
                raise self.translate(e, f"open session {session_id!r} in") from None
        except BaseException:
            _close_quietly(conn)
            if lock_conn is not None:
                _close_quietly(lock_conn)
            raise
        writer = PostgresWriter(self, session_id, token, conn, lock_conn, tail)
        writer.check.advance(log.check)
        return writer, log

    def load(self, session_id: str) -> LoadedLog:
        def query(conn: Any) -> LoadedLog:
            if not self._readable(conn):
                raise SessionNotFound(session_id)
            log, _ = self._load_with(conn, session_id)
            holder = self._holder(conn, self.lock_key(session_id))
            if holder is not None and _dead_here(*holder):
                holder = None  # its process is gone; the server just has not dropped the lock yet
            log.extra["live_pid"] = None if holder is None else (holder[1] or 0)
            log.extra["live_host"] = None if holder is None else holder[0]
            return log

        return self._read(f"read session {session_id!r} from", query)

    def _load_with(self, conn: Any, session_id: str) -> tuple[LoadedLog, EncodedEvent | None]:
        """The session's header and events, read in one REPEATABLE READ snapshot (a writer may be appending), and its
        newest event as stored, (seq, body) (None: no events). Events missing at the end (the stored events end before
        the `last_seq` the writers stamped) are damage, named like any other (exit 4)."""
        location = f"{self.where}[{session_id}]"
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        try:
            row = conn.execute(
                "SELECT header, (SELECT min(seq) FROM events WHERE session_id = %(id)s), "
                "(SELECT max(seq) FROM events WHERE session_id = %(id)s), "
                f"{'last_seq' if self._mark else 'NULL::bigint'} FROM sessions WHERE id = %(id)s",
                {"id": session_id},
            ).fetchone()
            if row is None:
                raise SessionNotFound(session_id)
            try:
                header = decode_header(bytes(row[0]), location)
            except RecursionError:
                raise CorruptDatabase(location, "the session's header is nested too deeply") from None
            if header.id != session_id:
                raise CorruptDatabase(location, f"the session row's header names session {header.id[:70]!r}")
            lo, hi, mark = row[1], row[2], row[3]
            if mark is not None and mark > (-1 if hi is None else hi):
                raise CorruptDatabase(location, f"stored events are missing: the session records seq {mark} as "
                                                f"written, its events end at seq {-1 if hi is None else hi} (deleted?)")
            with gc_paused():  # 100k row tuples, then the events: nothing for the cyclic GC to find
                if lo is None or hi - lo < SPLIT_SEQS:
                    first, rest = _fetch_bodies(conn, session_id, None), None
                else:
                    first, rest = self._fetch_split(conn, session_id, lo + (hi - lo + 1) // 2)
                _end_transaction(conn)  # the snapshot is no longer needed (the helper has imported it)
                try:
                    events, pieces = decode_parts(_parts(first, rest), location)
                except RecursionError:
                    raise CorruptDatabase(location, "an event's JSON is nested too deeply") from None
                finally:
                    if rest is not None:
                        rest.join()  # never leave the helper's fetch running (done already unless decoding failed)
                    del first, rest  # (emptied by decode_parts) freed while the GC is paused
        finally:
            _end_transaction(conn)
        check, _ = verify_pieces(pieces, location, first_line=0, unit="seq")
        check.next_seq = len(events)
        tail = (len(events) - 1, pieces[-1][:-1].rpartition(b"\n")[2]) if events else None
        return LoadedLog(header, events, location, check=check), tail

    def _fetch_split(self, conn: Any, session_id: str, mid: int) -> tuple[list[tuple[bytes]], "_Fetch | None"]:
        """The bodies of seqs below `mid`, fetched on `conn`, and a thread fetching those from `mid` on, on the helper
        connection, in `conn`'s snapshot (exported): together exactly what one `ORDER BY seq` returns. The two server
        backends work side by side, and the second half keeps arriving while the first is decoded (psycopg waits and
        reads without the GIL). Returns once the helper has imported the snapshot: `conn`'s transaction may end.
        When no second connection can be had (the server's connection limit, say), `conn` fetches the rest itself:
        a large session loads wherever a small one does."""
        snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]

        def fetch_second(imported: threading.Event) -> list[tuple[bytes]] | None:
            helper = self._helper
            if helper is None or helper.closed:
                try:
                    helper = self._helper = self.connect("read")
                except StoreUnavailable:
                    return None
            try:
                helper.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                try:
                    helper.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                    imported.set()
                    return _fetch_bodies(helper, session_id, mid)
                finally:
                    _end_transaction(helper)
            except psycopg.OperationalError:
                self._drop_helper()
                raise

        rest = _Fetch(fetch_second)
        try:
            first = _fetch_bodies(conn, session_id, None, mid)
            rest.imported.wait()
        except BaseException:
            rest.join()
            raise
        if rest.declined():  # no helper: the snapshot is still this transaction's own
            rest.join()
            return first + _fetch_bodies(conn, session_id, mid), None
        return first, rest

    def _drop_helper(self) -> None:
        if self._helper is not None:
            _close_quietly(self._helper)
            self._helper = None

    def exists(self, session_id: str) -> bool:
        def query(conn: Any) -> bool:
            if not self._readable(conn):
                return False
            return conn.execute("SELECT 1 FROM sessions WHERE id = %s", (session_id,)).fetchone() is not None

        return self._read("read", query)

    def list_ids(self) -> list[str]:
        def query(conn: Any) -> list[str]:
            if not self._readable(conn):
                return []
            return [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id").fetchall()]

        return [i for i in self._read("list the sessions in", query) if valid_session_id(i)]

    def delete(self, session_id: str) -> None:
        """Delete a session and its events, durably; refused (exit 3) while a writer on any machine holds it."""
        lock_conn = self.take_lock(session_id)
        conn = self.connect("write")
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL synchronous_commit = {self.durable_level(conn)}")
                cur = conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))  # events go with it (CASCADE)
            if cur.rowcount == 0:
                raise SessionNotFound(session_id)
        except psycopg.Error as e:
            raise self.translate(e, f"delete session {session_id!r} from") from None
        finally:
            _close_quietly(conn)
            _close_quietly(lock_conn)

    def size(self, session_id: str) -> int | None:
        """Bytes of the session's events as stored (the JSON bodies)."""
        try:
            row = self._read("read", lambda c: c.execute(
                "SELECT coalesce(sum(length(body) + 1), 0) FROM events WHERE session_id = %s", (session_id,)).fetchone())
        except PersistenceError:
            return None
        return int(row[0]) if row else None

    def modified_ms(self, session_id: str) -> int:
        try:
            row = self._read("read", lambda c: c.execute("SELECT updated FROM sessions WHERE id = %s",
                                                         (session_id,)).fetchone())
        except PersistenceError:
            return 0
        return row[0] if row else 0


def decode_rows(rows: list[tuple[bytes]], location: str) -> tuple[list[Any], list[bytes]]:
    """The events of the fetched bodies (in seq order), and the bodies as pieces of PIECE_ROWS newline-terminated
    lines, for the checks. Exactly what `decode_events` returns for all the bodies joined (or what it raises), but
    without joining them: each piece is decoded while it is still in the cache, and no copy of the whole session is
    made in fresh memory (both were a fifth of a cold load: P4 in docs/benchmarks.md). Only a clean log is decoded
    here; anything else (a line that does not decode, a seq out of place, an ignorable event, a blank last body) is
    left to `decode_events` over the joined bodies, which decides and names it as for every backend."""
    return decode_parts([list(rows)], location)


def decode_parts(parts: Iterable[list[Any]], location: str) -> tuple[list[Any], list[bytes]]:
    """`decode_rows` of the parts' rows one after the other, each part decoded as soon as it is there (a split load
    decodes the first half while the second is still arriving). Where the pieces are cut changes nothing: the outcome
    is that of the joined bodies either way. The parts are emptied as they are read: each row is freed, and each
    piece's seqs are checked, right after the piece is made, while all of it is still in the cache (the same work on
    the whole session afterwards was ~30 ms more CPU for P4's 100k rows)."""
    pieces: list[bytes] = []
    events: list[Any] = []
    clean = True
    last = b""
    with gc_paused():
        for rows in parts:
            if not rows:
                continue
            last = rows[-1][0]
            for i in range(0, len(rows), PIECE_ROWS):
                part = rows[i : i + PIECE_ROWS]
                rows[i : i + PIECE_ROWS] = [None] * len(part)
                part.append((b"",))
                piece = b"\n".join(map(itemgetter(0), part))
                del part
                pieces.append(piece)
                if clean:
                    try:
                        new = event_decoder.decode_lines(piece)
                    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                        clean = False
                        continue
                    clean = list(map(attrgetter("seq"), new)) == list(range(len(events), len(events) + len(new)))
                    events += new
    if not pieces:
        return [], []
    if clean and last:  # a blank last line is cut like a torn tail: decode_events' slow path
        return events, pieces
    events, _ = decode_events(b"".join(pieces), location, first_line=1, tail_may_be_torn=False)
    return events, pieces


class _Fetch:
    """A fetch running in a thread of its own; `result()` waits for it and returns its rows or raises its error."""

    def __init__(self, fetch: Callable[[threading.Event], list[tuple[bytes]] | None]) -> None:
        self.imported = threading.Event()  # set once the fetch has its snapshot (or has failed)
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(fetch,), name="cairn-pg-load", daemon=True)
        self._thread.start()

    def _run(self, fetch: Callable[[threading.Event], list[tuple[bytes]] | None]) -> None:
        try:
            self._outcome.append(fetch(self.imported))
        except BaseException as e:  # re-raised in the loading thread, which translates it as any read error
            self._outcome.append(e)
        finally:
            self.imported.set()

    def join(self) -> None:
        self._thread.join()

    def declined(self) -> bool:
        """Whether the fetch ended without fetching (it returned None); known once `imported` is set."""
        return self._outcome == [None]

    def result(self) -> list[tuple[bytes]]:
        self._thread.join()
        if isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]
        return self._outcome[0]


def _parts(first: list[tuple[bytes]], rest: _Fetch | None) -> Iterator[list[tuple[bytes]]]:
    yield first
    if rest is not None:
        yield rest.result()


def _fetch_bodies(conn: Any, session_id: str, start: int | None, stop: int | None = None) -> list[tuple[bytes]]:
    """The bodies of the session's seqs in [start, stop) (None: unbounded), in seq order."""
    where = (" AND seq >= %(start)s" if start is not None else "") + (" AND seq < %(stop)s" if stop is not None else "")
    cur = conn.cursor(binary=True)
    cur.execute(f"SELECT body FROM events WHERE session_id = %(id)s{where} ORDER BY seq",
                {"id": session_id, "start": start, "stop": stop})
    rows = cur.fetchall()
    cur.close()
    return rows


def _end_transaction(conn: Any) -> None:
    """Roll back a read's transaction; a connection that broke meanwhile is left as it is (its error is raised)."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.rollback()
        except psycopg.Error:
            pass


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
