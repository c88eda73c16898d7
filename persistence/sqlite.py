"""SQLite backend (SPEC §5): `$CAIRN_HOME/sessions.sqlite3`, WAL journal.

Background batches commit with `synchronous=NORMAL` (no fsync); a barrier commits with `synchronous=FULL`, which
fsyncs the WAL and so every earlier NORMAL commit with it. Writes use `BEGIN IMMEDIATE`. Each writer stamps the session
row with a random token when it opens and checks it inside every write transaction, so a writer that lost its session to
another (stale writer) fails instead of interleaving. Rows hold the exact JSON line the JSONL backend would write.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from pathlib import Path
from typing import Callable

from .backend import Backend, EncodedEvent, LoadedLog, Writer
from .codec import decode_events
from .errors import CorruptLog, SessionExists, SessionNotFound, StaleWriter, StoreUnavailable, UnsupportedFormat
from .events import FORMAT, FORMAT_VERSION, SessionHeader

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    format TEXT NOT NULL,
    version INTEGER NOT NULL,
    created INTEGER NOT NULL,
    cwd TEXT NOT NULL,
    writer TEXT
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

Connect = Callable[[str], sqlite3.Connection]


def default_connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)


class SqliteWriter(Writer):
    def __init__(self, conn: sqlite3.Connection, session_id: str, token: str) -> None:
        self.inline_safe = getattr(conn, "inline_safe", True)  # a test connection may hold a commit on purpose
        self._conn = conn
        self._id = session_id
        self._token = token
        self._sync = "FULL"

    def _set_sync(self, mode: str) -> None:
        if mode != self._sync:
            self._conn.execute(f"PRAGMA synchronous={mode}")
            self._sync = mode

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        conn = self._conn
        self._set_sync("FULL" if durable else "NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT writer FROM sessions WHERE id = ?", (self._id,)).fetchone()
            if row is None or row[0] != self._token:
                raise StaleWriter(f"session {self._id!r} was taken over by another writer; this one stops writing")
            # OR REPLACE: after a failed barrier the coordinator re-sends everything since the last durable one.
            conn.executemany(
                "INSERT OR REPLACE INTO events (session_id, seq, body) VALUES (?, ?, ?)",
                [(self._id, seq, data) for seq, data in batch],
            )
            if durable and not batch:
                # Earlier NORMAL commits sit unsynced in the WAL; an empty transaction would not sync it, a write does.
                conn.execute("UPDATE sessions SET writer = writer WHERE id = ?", (self._id,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return sum(len(data) for _, data in batch)

    def close(self) -> None:
        self._conn.close()


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, home: Path, connect: Connect = default_connect) -> None:
        self.home = Path(home)
        self.path = self.home / "sessions.sqlite3"
        self._connect = connect
        self._schema_ready = False

    def check_writable(self) -> None:
        try:
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StoreUnavailable(f"cannot create {self.home}: {e.strerror}") from None
        if not os.access(self.home, os.W_OK | os.X_OK):
            raise StoreUnavailable(f"{self.home} is not writable; fix its permissions or use --home")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise StoreUnavailable(f"{self.path} is not writable; fix its permissions or use --home")

    def _open_for_writing(self) -> sqlite3.Connection:
        self.check_writable()
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        conn = self._connect(str(self.path))
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            if not self._schema_ready:
                conn.executescript(SCHEMA)
                self._schema_ready = True
        except BaseException:
            conn.close()
            raise
        return conn

    def _read_conn(self) -> sqlite3.Connection | None:
        if not self.path.exists():
            return None
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)

    def create(self, header: SessionHeader) -> Writer:
        conn = self._open_for_writing()
        token = secrets.token_hex(8)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO sessions (id, format, version, created, cwd, writer) VALUES (?, ?, ?, ?, ?, ?)",
                    (header.id, header.format, header.version, header.created, header.cwd, token),
                )
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK")
                raise SessionExists(header.id) from None
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return SqliteWriter(conn, header.id, token)

    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        conn = self._open_for_writing()
        token = secrets.token_hex(8)
        try:
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute("UPDATE sessions SET writer = ? WHERE id = ?", (token, session_id))
            conn.execute("COMMIT")
            if cur.rowcount == 0:
                raise SessionNotFound(session_id)
            log = self._load_with(conn, session_id)
        except BaseException:
            conn.close()
            raise
        return SqliteWriter(conn, session_id, token), log

    def load(self, session_id: str) -> LoadedLog:
        conn = self._read_conn()
        if conn is None:
            raise SessionNotFound(session_id)
        try:
            return self._load_with(conn, session_id)
        finally:
            conn.close()

    def _load_with(self, conn: sqlite3.Connection, session_id: str) -> LoadedLog:
        location = f"{self.path}[{session_id}]"
        try:
            row = conn.execute(
                "SELECT format, version, created, cwd FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        except sqlite3.DatabaseError as e:
            raise CorruptLog(str(self.path), 0, f"cannot read the database: {e}") from None
        if row is None:
            raise SessionNotFound(session_id)
        fmt, version, created, cwd = row
        if fmt != FORMAT or version != FORMAT_VERSION:
            raise UnsupportedFormat(location, version if fmt == FORMAT else fmt, FORMAT_VERSION)
        header = SessionHeader(id=session_id, created=created, cwd=cwd)
        bodies = conn.execute("SELECT body FROM events WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
        body = b"\n".join([b for (b,) in bodies] + [b""]) if bodies else b""  # trailing newline without a copy
        # line numbers in errors count events from 1 (there is no header line in a table)
        events, _ = decode_events(body, location, first_line=1, tail_may_be_torn=False)
        return LoadedLog(header, events, location)

    def exists(self, session_id: str) -> bool:
        conn = self._read_conn()
        if conn is None:
            return False
        try:
            return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def list_ids(self) -> list[str]:
        conn = self._read_conn()
        if conn is None:
            return []
        try:
            return [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")]
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()
