"""PostgreSQL backend (SPEC §5 rev 2): sessions that survive losing the machine, in a database a team shares.

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

The pieces: `postgres_schema` (the tables, their `last_seq` stamp, the statements), `postgres_connections` (who a
connection is, retrying a lost one), `postgres_writer` (the writer: durability, fencing, what a crash took),
`postgres_load` (a load's fetch and decode). psycopg is imported only by them, and they only when the backend is
chosen (`make_backend`).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any, Callable

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .backend import Backend, EncodedEvent, LiveWriter, LoadedLog, Writer
from .checks import verify_pieces
from .codec import decode_header, gc_paused
from .errors import (
    CorruptDatabase,
    PersistenceError,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    UnsupportedFormat,
)
from .events import SessionHeader, encoder
from .ids import valid_session_id
from .postgres_connections import (
    Connect,
    PostgresLocked,
    T,
    _close_quietly,
    _dead_here,
    application_name,
    client_keepalives,
    default_connect,
    describe_url,
    parse_holder,
    retry_lost_connection,
    set_server_keepalives,
)
from .postgres_fleet import live_writers
from .postgres_load import _end_transaction, _Fetch, _fetch_bodies, _parts, decode_parts
from .postgres_schema import (
    _HOLDER,
    _SCHEMA_LOCK,
    _TAIL,
    DDL,
    SCHEMA_VERSION,
    STATEMENTS,
    NewerSchema,
    Statements,
    _key_parts,
    lock_key,
)
from .postgres_follow import channel
from .postgres_writer import PostgresWriter

CONNECT_TIMEOUT = 10  # seconds, unless the URL says otherwise
# Adding `last_seq` to an older database waits at most this long for its `sessions` table (ALTER TABLE takes an
# exclusive lock): rather than queue every other Cairn behind it, the writer goes on without it and a later one adds it.
ADD_COLUMN_WAIT = "2s"
# A holder on this host whose process is gone is a lock the server has not yet noticed is free: wait this long for it.
DEAD_HOLDER_WAIT = 10.0
# A session spanning more seqs than this is fetched in two halves, on two connections in one snapshot: the two server
# backends then produce the rows side by side instead of one after the other (P4 in docs/benchmarks.md). Below it, the
# second connection would cost more than it saves.
SPLIT_SEQS = 20_000


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
        kwargs.update(client_keepalives(params))  # a vanished host is noticed within a bound (postgres_connections)
        try:
            conn = self._connect(self.url, role, **kwargs)
        except psycopg.Error as e:
            raise self.translate(e, "connect to") from None
        try:
            set_server_keepalives(conn)
        except psycopg.Error:
            pass  # best effort (a pooler may refuse them); a broken connection fails its first real use as before
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

    def channel(self) -> str:
        """What the writers NOTIFY at each commit and followers LISTEN to: one channel per schema (postgres_follow)."""
        return channel(self._schema_name or "")

    # -- locking ---------------------------------------------------------------------------------------------------

    def take_lock(self, session_id: str) -> Any:
        """A new connection holding the session's advisory lock, or PostgresLocked naming the holder.

        A holder that is a dead process of this machine (SIGKILLed a moment ago) is waited for: its server backend
        releases the lock as soon as it notices the closed socket."""
        conn = self.connect("lock")
        key = self.lock_key(session_id)
        deadline = time.monotonic() + DEAD_HOLDER_WAIT
        try:
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

    def load(self, session_id: str, holder_too: bool = True) -> LoadedLog:
        def query(conn: Any) -> LoadedLog:
            if not self._readable(conn):
                raise SessionNotFound(session_id)
            log, _ = self._load_with(conn, session_id)
            if not holder_too:
                return log
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

    def load_listed(self, session_id: str) -> LoadedLog:
        return self.load(session_id, holder_too=False)

    def live_writers(self, session_ids: list[str]) -> dict[str, LiveWriter] | None:
        """Every live writer among `session_ids`, in one query over the lock connections (postgres_fleet)."""
        return self._read("list the live sessions in", lambda c: live_writers(c, self._schema_name or "", session_ids))

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
