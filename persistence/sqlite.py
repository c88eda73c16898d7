"""SQLite backend (SPEC §5): `$CAIRN_HOME/sessions.sqlite3`, WAL journal.

Background batches commit with `synchronous=NORMAL` (no fsync); a barrier commits with `synchronous=FULL`, which
fsyncs the WAL and so every earlier NORMAL commit with it. Writes use `BEGIN IMMEDIATE`. Each writer stamps the session
row with a random token (and its pid) when it opens and checks it inside every write transaction, so a writer that lost
its session to another (stale writer) fails instead of interleaving. Rows hold the exact JSON line the JSONL backend
would write.

One writer per session rests on what the live writer holds, not on a path (SPEC §5): besides the store's lock file, a
writer holds one byte of the database file for its session (`locks.ByteHold`, an open-file-description lock the kernel
drops when the process dies). Deleting or replacing the lock file therefore lets no second writer in, and `rm` is refused.

The database file is not trusted (SPEC §5): it is looked at with `lstat` before SQLite opens it (a FIFO would block),
a database holding tables that are not Cairn's is refused rather than extended, and every SQLite failure is translated
into a one-line persistence error: busy beyond the timeout -> DatabaseBusy (exit 3), not a database or damaged ->
CorruptDatabase (exit 4), anything else (disk full, I/O error, read-only) -> StoreUnavailable.

Busy waits: opening waits at most `OPEN_BUSY_TIMEOUT` for another process's write transaction (opens can run on an event
loop, e.g. ACP's). A live append waits only `INLINE_BUSY_WAIT` when it runs on the event loop; if that is not enough it
fails (the coordinator keeps the events queued) and the writer stops being inline-safe, so every later write runs in a
worker thread, where it may wait the full `BUSY_TIMEOUT`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import stat
import urllib.parse
from pathlib import Path
from typing import Callable

from .backend import Backend, EncodedEvent, LoadedLog, Writer
from .checks import RunningCheck, verify_checks
from .codec import decode_events
from .errors import (
    CorruptDatabase,
    DatabaseBusy,
    NotASessionFile,
    PersistenceError,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    StaleWriter,
    StoreUnavailable,
    UnsupportedFormat,
)
from .events import FORMAT, FORMAT_VERSION, SessionHeader
from .ids import valid_session_id
from .locks import ByteHold, byte_is_held, ensure_private_dir, hold_offset

BUSY_TIMEOUT = 10.0  # seconds a write from a worker thread waits for another process's write transaction
OPEN_BUSY_TIMEOUT = 2.0  # seconds create/resume wait before saying the database is locked (exit 3)
INLINE_BUSY_WAIT = 0.05  # seconds an append running on the event loop may wait

_CAIRN_TABLES = {"sessions": {"id", "format", "version", "created", "cwd", "writer"}, "events": {"session_id", "seq", "body"}}

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    format TEXT NOT NULL,
    version INTEGER NOT NULL,
    created INTEGER NOT NULL,
    cwd TEXT NOT NULL,
    writer TEXT,
    chk TEXT
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

Connect = Callable[[str], sqlite3.Connection]

# What an SQLite call can raise for a damaged file: its errors, and a UnicodeDecodeError when the message SQLite
# composed quotes damaged bytes ("malformed database schema (<not UTF-8>)") and Python cannot decode it.
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def default_connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT)


def _is_busy(e: sqlite3.Error | UnicodeDecodeError) -> bool:
    return getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(e)


def translate(e: sqlite3.Error | UnicodeDecodeError, path: Path, doing: str,
              busy_wait: float = OPEN_BUSY_TIMEOUT) -> PersistenceError:
    """One readable persistence error for an SQLite failure (the CLI maps it to an exit code).

    Damage is exit 4 (CorruptDatabase) whatever words SQLite found for it: "not a database", "malformed", a text value
    that is not UTF-8, a value larger than SQLite allows, or a header field no SQLite writes (a damaged write version
    reads as "attempt to write a readonly database", a damaged schema format as "unsupported file format"). Only what
    is left — a full disk, permissions, a read-only file system, an I/O error — is StoreUnavailable (exit 2), and its
    message names that cause rather than guessing between them."""
    code = getattr(e, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if _is_busy(e):
        return DatabaseBusy(str(path), busy_wait)
    if isinstance(e, UnicodeDecodeError):
        return CorruptDatabase(str(path), "not a usable SQLite database (malformed: SQLite reports bytes that are "
                                          "not UTF-8 in its schema or a stored text)")
    if (primary in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_TOOBIG) or "not a database" in str(e)
            or "malformed" in str(e) or isinstance(e, DamagedText)):
        return CorruptDatabase(str(path), f"not a usable SQLite database ({e})")
    damage = header_damage(path)
    if damage is not None:
        return CorruptDatabase(str(path), f"not a usable SQLite database: {damage} ({e})")
    if primary == sqlite3.SQLITE_FULL:
        advice = "the disk is full; free some space, or use --home"
    elif primary in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH):
        advice = f"fix the permissions of {path.parent} and its files (or mount it writable), or use --home"
    else:
        advice = "check the disk (free space, permissions), or use --home"
    return StoreUnavailable(f"cannot {doing} {path}: {e}; {advice}", e)


class DamagedText(sqlite3.DataError):
    """A stored text value that is not UTF-8: SQLite never writes one, so the page holding it is damaged."""


def _strict_text(data: bytes) -> str:
    """The text factory of Cairn's connections: a damaged text value is an sqlite3.Error (translated to exit 4 like
    any other damage), not a UnicodeDecodeError escaping every handler."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DamagedText("a stored text value is not valid UTF-8: database disk image is malformed") from None


_MAGIC = b"SQLite format 3\x00"


def header_damage(path: Path) -> str | None:
    """What is impossible in the database file's 100-byte header (None: nothing found, or the file cannot be read).

    Asked only after SQLite refused the file, to tell damage from an unusable disk: the fields checked are those every
    SQLite writes one way (https://sqlite.org/fileformat.html §1.3). An empty file is a database not yet written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.pread(fd, 100, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head:
        return None
    if len(head) < 100 or not head.startswith(_MAGIC):
        return "its first 100 bytes are not an SQLite header"
    page = int.from_bytes(head[16:18], "big")
    if page != 1 and not (512 <= page <= 32768 and page & (page - 1) == 0):
        return f"its header gives an impossible page size ({page})"
    if head[18] not in (1, 2) or head[19] not in (1, 2):
        return f"its header gives an unknown file format version ({head[18]}, {head[19]})"
    if head[21:24] != b"\x40\x20\x20":
        return "its header's payload fractions are not the ones SQLite writes"
    schema = int.from_bytes(head[44:48], "big")
    if schema > 4:
        return f"its header gives an unknown schema format ({schema})"
    if int.from_bytes(head[56:60], "big") > 3:
        return "its header gives an unknown text encoding"
    return None


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SqliteWriter(Writer):
    def __init__(self, conn: sqlite3.Connection, session_id: str, token: str, hold: ByteHold,
                 check: RunningCheck) -> None:
        self.inline_safe = getattr(conn, "inline_safe", True)  # a test connection may hold a commit on purpose
        self._conn = conn
        self._hold = hold
        self._check = check
        self._id = session_id
        self._token = token
        self._sync = "FULL"
        self._busy_ms = int(BUSY_TIMEOUT * 1000)

    def _begin(self) -> None:
        """BEGIN IMMEDIATE, waiting for another process's write lock only briefly when on the event loop."""
        inline = _on_event_loop()
        busy_ms = int((INLINE_BUSY_WAIT if inline else BUSY_TIMEOUT) * 1000)
        if busy_ms != self._busy_ms:
            self._conn.execute(f"PRAGMA busy_timeout={busy_ms}")
            self._busy_ms = busy_ms
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if inline and _is_busy(e):
                self.inline_safe = False  # the coordinator will write from a worker thread, where waiting is harmless
            raise

    def _set_sync(self, mode: str) -> None:
        if mode != self._sync:
            self._conn.execute(f"PRAGMA synchronous={mode}")
            self._sync = mode

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        conn = self._conn
        self._set_sync("FULL" if durable else "NORMAL")
        batch, at = self._check.stamp(batch, durable)
        checked = durable and at.last_check != self._check.at.last_check  # this batch carries a new check
        self._begin()
        try:
            row = conn.execute("SELECT writer FROM sessions WHERE id = ?", (self._id,)).fetchone()
            if row is None or row[0] != self._token:
                raise StaleWriter(f"session {self._id!r} was taken over by another writer; this one stops writing")
            # OR REPLACE: after a failed barrier the coordinator re-sends everything since the last durable one.
            conn.executemany(
                "INSERT OR REPLACE INTO events (session_id, seq, body) VALUES (?, ?, ?)",
                [(self._id, seq, data) for seq, data in batch],
            )
            if checked and self._check.last is not None:
                # the session row keeps the newest check, in the same transaction: events lost after it are damage
                conn.execute("UPDATE sessions SET chk = ? WHERE id = ?", ("%d:%08x" % self._check.last, self._id))
            elif durable:
                # Earlier NORMAL commits sit unsynced in the WAL; an empty transaction would not sync it, a write does.
                conn.execute("UPDATE sessions SET writer = writer WHERE id = ?", (self._id,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._check.advance(at)
        return sum(len(data) for _, data in batch)

    def close(self) -> None:
        try:
            self._conn.close()
        finally:
            self._hold.release()


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, home: Path, connect: Connect = default_connect, open_busy_timeout: float = OPEN_BUSY_TIMEOUT):
        self.home = Path(home)
        self.path = self.home / "sessions.sqlite3"
        self._connect = connect
        self._schema_ready = False
        self.open_busy_timeout = open_busy_timeout

    def check_writable(self) -> None:
        try:
            ensure_private_dir(self.home)
        except OSError as e:
            raise StoreUnavailable(f"cannot create {self.home}: {e.strerror}", e) from None
        if not os.path.isdir(self.home):
            raise StoreUnavailable(f"{self.home} is not a directory; use another --home")
        if not os.access(self.home, os.W_OK | os.X_OK):
            raise StoreUnavailable(f"{self.home} is not writable; fix its permissions or use --home")
        if self._present() and not os.access(self.path, os.W_OK):
            raise StoreUnavailable(f"{self.path} is not writable; fix its permissions or use --home")

    def _present(self) -> bool:
        """Whether the database file exists; refuses (never opens) anything that is not a regular file."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StoreUnavailable(f"cannot look at {self.path}: {e.strerror}", e) from None
        if not stat.S_ISREG(st.st_mode):
            kind = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symbolic link"}
            raise NotASessionFile(str(self.path), kind.get(stat.S_IFMT(st.st_mode), "not a regular file"))
        return True

    def _open_for_writing(self) -> sqlite3.Connection:
        self.check_writable()
        if not self._present():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    os.fchmod(fd, 0o600)  # whatever the umask; SQLite gives -wal and -shm the same mode
                finally:
                    os.close(fd)
            except OSError as e:
                raise StoreUnavailable(f"cannot create {self.path}: {e.strerror}; free some space or use --home", e) from None
        try:
            conn = self._connect(str(self.path))
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "open", self.open_busy_timeout) from None
        try:
            conn.text_factory = _strict_text
            conn.execute(f"PRAGMA busy_timeout={int(self.open_busy_timeout * 1000)}")
            self._check_schema(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            if not self._schema_ready:
                conn.executescript(SCHEMA)
                if not self._has_chk_column(conn):  # a database made before rev 3
                    conn.execute("ALTER TABLE sessions ADD COLUMN chk TEXT")
                self._schema_ready = True
        except SQLITE_ERRORS as e:
            conn.close()
            raise translate(e, self.path, "open", self.open_busy_timeout) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> bool:
        """True when the database holds Cairn's tables, False when it holds none; a foreign database is refused
        (Cairn must not add its tables to another program's file)."""
        tables = {
            name: {col[1] for col in conn.execute(f"PRAGMA table_info({_quote(name)})")}
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            return False
        if all(name in tables and columns <= tables[name] for name, columns in _CAIRN_TABLES.items()):
            return True
        names = ", ".join(sorted(tables)[:5])
        raise CorruptDatabase(str(self.path), f"not a Cairn session database (it holds the tables {names})")

    def _read_conn(self) -> sqlite3.Connection | None:
        """A read-only connection on Cairn's database; None when there is no database (or it holds no tables).

        Reading is always allowed (SPEC §5), also where nothing can be written: a database in WAL mode opened with
        `mode=ro` still wants to create its `-shm` file, which a read-only mount (or a directory this user may not
        write) refuses. When that is why it cannot be opened and there is no write-ahead log to read (a session that
        was closed cleanly checkpoints and removes it), the file alone is the whole database and is opened
        `immutable`; with a non-empty `-wal` beside it, reading the file alone would miss what the log holds, so that
        stays an error."""
        if not self._present():
            return None
        try:
            return self._read_conn_with("mode=ro")
        except SQLITE_ERRORS as e:
            if not (_cannot_open_read_only(e) and self._wal_is_empty()):
                raise translate(e, self.path, "read", self.open_busy_timeout) from None
        try:
            return self._read_conn_with("mode=ro&immutable=1")
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "read", self.open_busy_timeout) from None

    def _read_conn_with(self, query: str) -> sqlite3.Connection | None:
        uri = f"file:{urllib.parse.quote(str(self.path))}?{query}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self.open_busy_timeout)
        try:
            conn.text_factory = _strict_text
            if not self._check_schema(conn):
                conn.close()
                return None
        except BaseException:
            conn.close()
            raise
        return conn

    def _wal_is_empty(self) -> bool:
        try:
            return os.lstat(f"{self.path}-wal").st_size == 0
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def _hold(self, conn: sqlite3.Connection, session_id: str) -> ByteHold:
        """Take the session's byte of the database file, or raise SessionLocked naming the live writer."""
        hold = ByteHold(self.path, hold_offset(session_id))
        try:
            taken = hold.acquire()
        except OSError as e:
            raise StoreUnavailable(f"cannot lock session {session_id!r} in {self.path}: {e.strerror}", e) from None
        if not taken:
            raise SessionLocked(session_id, self._writer_pid(conn, session_id))
        return hold

    def _writer_pid(self, conn: sqlite3.Connection, session_id: str) -> int:
        """The pid the live writer stamped in its token (0 when it cannot be read)."""
        try:
            row = conn.execute("SELECT writer FROM sessions WHERE id = ?", (session_id,)).fetchone()
        except SQLITE_ERRORS:
            return 0
        pid = str(row[0] if row else "").rpartition(":")[2]
        return int(pid) if pid.isdigit() else 0

    def create(self, header: SessionHeader) -> Writer:
        conn = self._open_for_writing()
        token = _new_token()
        try:
            hold = self._hold(conn, header.id)
        except BaseException:
            _close_quietly(conn)
            raise
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
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        except SQLITE_ERRORS as e:
            _close_quietly(conn)
            hold.release()
            raise translate(e, self.path, "create a session in", self.open_busy_timeout) from None
        except BaseException:
            _close_quietly(conn)
            hold.release()
            raise
        return SqliteWriter(conn, header.id, token, hold, RunningCheck())

    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        conn = self._open_for_writing()
        token = _new_token()
        try:
            hold = self._hold(conn, session_id)
        except BaseException:
            _close_quietly(conn)
            raise
        try:
            # checked before anything is written: a damaged session (or database) is refused untouched
            conn.execute("BEGIN IMMEDIATE")
            log = self._load_with(conn, session_id)
            conn.execute("UPDATE sessions SET writer = ? WHERE id = ?", (token, session_id))
            conn.execute("COMMIT")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        except SQLITE_ERRORS as e:
            _close_quietly(conn)
            hold.release()
            raise translate(e, self.path, "open a session in", self.open_busy_timeout) from None
        except BaseException:
            _close_quietly(conn)
            hold.release()
            raise
        return SqliteWriter(conn, session_id, token, hold, RunningCheck(log.check)), log

    def load(self, session_id: str) -> LoadedLog:
        conn = self._read_conn()
        if conn is None:
            raise SessionNotFound(session_id)
        try:
            log = self._load_with(conn, session_id)
            if byte_is_held(self.path, hold_offset(session_id)):  # a live writer (even one whose lock file is gone)
                log.extra["live_pid"] = self._writer_pid(conn, session_id)
            return log
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "read", self.open_busy_timeout) from None
        finally:
            conn.close()

    def _load_with(self, conn: sqlite3.Connection, session_id: str) -> LoadedLog:
        location = f"{self.path}[{session_id}]"
        row = conn.execute("SELECT format, version, created, cwd FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        fmt, version, created, cwd = row
        if fmt != FORMAT or version != FORMAT_VERSION:
            raise UnsupportedFormat(location, version if fmt == FORMAT else fmt, FORMAT_VERSION)
        if not isinstance(created, int) or not isinstance(cwd, str):
            raise CorruptDatabase(location, f"the session row holds a bad created/cwd ({created!r:.30}, {cwd!r:.30})")
        header = SessionHeader(id=session_id, created=created, cwd=cwd)
        bodies = conn.execute("SELECT body FROM events WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
        if any(not isinstance(b, (bytes, str)) for (b,) in bodies):
            raise CorruptDatabase(location, "an event row holds no JSON body")
        raw = [b.encode("utf-8", "surrogatepass") if isinstance(b, str) else b for (b,) in bodies]
        body = b"\n".join(raw + [b""]) if raw else b""  # trailing newline without a copy
        # line numbers in errors count events from 1 (there is no header line in a table)
        try:
            events, _ = decode_events(body, location, first_line=1, tail_may_be_torn=False)
        except RecursionError:
            raise CorruptDatabase(location, "an event's JSON is nested too deeply") from None
        check, last = verify_checks(body, 0, len(body), location, first_line=0, unit="seq")
        check.next_seq = len(events)
        stamp = self._stamp(conn, session_id)
        if stamp is not None and stamp != last:
            raise CorruptDatabase(location, "stored events are missing or changed: the session row's record of the "
                                            "newest check does not match the events")
        return LoadedLog(header, events, location, check=check)

    def _stamp(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, int] | None:
        """The session row's record of its newest check, (offset in the body, value) (None: written before rev 3, or
        never durably)."""
        if not self._has_chk_column(conn):
            return None
        (raw,) = conn.execute("SELECT chk FROM sessions WHERE id = ?", (session_id,)).fetchone() or (None,)
        offset, _, value = str(raw or "").partition(":")
        try:
            return (int(offset), int(value, 16)) if raw is not None else None
        except ValueError:
            return (-1, -1)  # unreadable: never equal to a check found

    def _has_chk_column(self, conn: sqlite3.Connection) -> bool:
        return any(col[1] == "chk" for col in conn.execute("PRAGMA table_info(sessions)"))

    def exists(self, session_id: str) -> bool:
        conn = self._read_conn()
        if conn is None:
            return False
        try:
            return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "read", self.open_busy_timeout) from None
        finally:
            conn.close()

    def size(self, session_id: str) -> int | None:
        conn = self._read_conn()
        if conn is None:
            return None
        try:
            (total,) = conn.execute("SELECT SUM(LENGTH(body)) FROM events WHERE session_id = ?", (session_id,)).fetchone()
            return int(total or 0)
        except SQLITE_ERRORS:
            return None
        finally:
            conn.close()

    def delete(self, session_id: str) -> None:
        conn = self._open_for_writing()
        try:
            hold = self._hold(conn, session_id)  # a live writer keeps its session, lock file or not
        except BaseException:
            _close_quietly(conn)
            raise
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
                conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "delete a session from", self.open_busy_timeout) from None
        finally:
            conn.close()
            hold.release()

    def list_ids(self) -> list[str]:
        """Every session id. A database that cannot be read raises: a failing disk must not look like no sessions."""
        conn = self._read_conn()
        if conn is None:
            return []
        try:
            rows = conn.execute("SELECT id FROM sessions ORDER BY id").fetchall()
            return [r[0] for r in rows if isinstance(r[0], str) and valid_session_id(r[0])]
        except SQLITE_ERRORS as e:
            raise translate(e, self.path, "list the sessions in", self.open_busy_timeout) from None
        finally:
            conn.close()


def _cannot_open_read_only(e: sqlite3.Error | UnicodeDecodeError) -> bool:
    """SQLite could not open the database for reading because it could not create or write beside it."""
    code = getattr(e, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY)


def _new_token() -> str:
    """A writer's token: random, with its pid after the colon so a refused newcomer can name the live writer."""
    return f"{secrets.token_hex(8)}:{os.getpid()}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass
