"""Before-images (SPEC §9 rev 3): file contents a rewind can restore, stored once per content, by sha256.

`put` returns only when the content is durable, and the loop calls it before the pre-tool barrier of the call that
will change the file, so a `tool/call` on disk never names a before-image that is not. Each backend keeps them where its
sessions are: JSONL in `CAIRN_HOME/blobs/<aa>/<sha256>` (file and directory fsync'd), SQLite in a `blobs` table of
`sessions.sqlite3` (its own `synchronous=FULL` commit), PostgreSQL in a `cairn_blobs` table (a commit with
`synchronous_commit = on`). `collect` removes what no remaining session names (`cairn rm`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import sqlite3
import stat
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from .errors import StoreUnavailable
from .events import AnyEvent, RewindPlan, ToolCall
from .locks import ensure_private_dir

MAX_BEFORE_IMAGE = 10 * 1024 * 1024  # bytes; a larger file is recorded as not restorable
SHA256 = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def names_needed(events: list[AnyEvent]) -> set[str]:
    """The before-images a session's log names (its fingerprinted calls' `before_sha256`, its rewind plans)."""
    needed: set[str] = set()
    for e in events:
        if isinstance(e, ToolCall) and e.before_sha256:
            needed.add(e.before_sha256)
        elif isinstance(e, RewindPlan):
            # what a rewind restored, and what it replaced (an undo puts that back); git: ids live in the shadow repo
            needed.update(x for f in e.files for x in (f.restore_sha256, f.expected_sha256)
                          if x and not x.startswith("git:"))
    return needed


class BlobStore(ABC):
    @abstractmethod
    def put(self, data: bytes) -> str:
        """Store `data` durably (once per content); its sha256."""

    @abstractmethod
    def get(self, sha256: str) -> bytes | None:
        """The content stored under `sha256` (checked against it), or None."""

    @abstractmethod
    def names(self) -> set[str]: ...

    @abstractmethod
    def remove(self, names: set[str]) -> None: ...

    def collect(self, needed: set[str]) -> int:
        """Remove every stored content no session needs; how many went."""
        unneeded = self.names() - needed
        if unneeded:
            self.remove(unneeded)
        return len(unneeded)

    def close(self) -> None:
        pass


class FileBlobs(BlobStore):
    """JSONL's store: one file per content under `home/blobs`, 0600 in 0700 directories."""

    def __init__(self, home: Path) -> None:
        self.root = Path(home) / "blobs"

    def _path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def put(self, data: bytes) -> str:
        sha = sha256_hex(data)
        path = self._path(sha)
        if self.get(sha) is not None:
            return sha
        try:
            ensure_private_dir(path.parent)  # each directory it makes is synced into its parent (a fresh home too)
            tmp = path.with_name(f".{sha}.{secrets.token_hex(4)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            for directory in (path.parent, self.root):
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            raise StoreUnavailable(f"cannot store a before-image in {self.root}: {e.strerror or e}", e) from None
        return sha

    def get(self, sha256: str) -> bytes | None:
        if not SHA256.fullmatch(sha256):
            return None
        try:
            fd = os.open(self._path(sha256), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_BEFORE_IMAGE + 1)
        finally:
            os.close(fd)
        return data if sha256_hex(data) == sha256 else None  # damaged or replaced: not restorable

    def names(self) -> set[str]:
        if not self.root.is_dir():
            return set()
        return {p.name for p in self.root.glob("??/*") if SHA256.fullmatch(p.name)}

    def remove(self, names: set[str]) -> None:
        for sha in names:
            with contextlib.suppress(OSError):
                os.unlink(self._path(sha))


class SqliteBlobs(BlobStore):
    """SQLite's store: a `blobs` table beside the sessions, written with its own durable commit."""

    SCHEMA = "CREATE TABLE IF NOT EXISTS blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL)"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(self.SCHEMA)
            self._conn = conn
        return self._conn

    def put(self, data: bytes) -> str:
        sha = sha256_hex(data)
        try:
            self._db().execute("INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?, ?)", (sha, data))
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot store a before-image in {self.path}: {e}", e) from None
        return sha

    def get(self, sha256: str) -> bytes | None:
        try:
            row = self._db().execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
        except sqlite3.Error:
            return None
        return bytes(row[0]) if row and sha256_hex(bytes(row[0])) == sha256 else None

    def names(self) -> set[str]:
        return {row[0] for row in self._db().execute("SELECT sha256 FROM blobs")}

    def remove(self, names: set[str]) -> None:
        self._db().executemany("DELETE FROM blobs WHERE sha256 = ?", [(n,) for n in names])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresBlobs(BlobStore):
    """PostgreSQL's store: a `cairn_blobs` table, each insert its own commit with `synchronous_commit = on`.

    A lost connection (a server restart, a failover) is retried exactly as the log's writes are (the backend's
    `retrying`: backoff, up to 30 s, SPEC §5 rev 3), so a short outage while a before-image is stored delays the tool
    call instead of ending the turn. An insert re-sent after a commit whose answer was lost is harmless (same
    content, same name)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._conn: Any = None

    def _db(self) -> Any:
        if self._conn is None:
            conn = self.backend.connect("blobs")
            try:
                conn.execute("CREATE TABLE IF NOT EXISTS cairn_blobs (sha256 text PRIMARY KEY, data bytea NOT NULL)")
                conn.execute("SET synchronous_commit = on")
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.close()
                raise
            self._conn = conn
        return self._conn

    def _attempt(self, doing: str, query: Any) -> Any:
        """`query(connection)` once; any failure drops the connection (the next attempt makes a new one) and becomes
        the backend's one-line error, which `retrying` retries when the connection was lost."""
        try:
            return query(self._db())
        except Exception as e:  # psycopg's errors: one line, no credentials
            self.close()
            raise self.backend.translate(e, doing) from None

    def put(self, data: bytes) -> str:
        sha = sha256_hex(data)
        self.backend.retrying(lambda: self._attempt("store a before-image in", lambda db: db.execute(
            "INSERT INTO cairn_blobs (sha256, data) VALUES (%s, %s) ON CONFLICT DO NOTHING", (sha, data))))
        return sha

    def get(self, sha256: str) -> bytes | None:
        try:
            row = self.backend.retrying(lambda: self._attempt("read a before-image from", lambda db: db.execute(
                "SELECT data FROM cairn_blobs WHERE sha256 = %s", (sha256,)).fetchone()))
        except Exception:
            return None
        return bytes(row[0]) if row and sha256_hex(bytes(row[0])) == sha256 else None

    def names(self) -> set[str]:
        return {row[0] for row in self._db().execute("SELECT sha256 FROM cairn_blobs").fetchall()}

    def remove(self, names: set[str]) -> None:
        self._db().execute("DELETE FROM cairn_blobs WHERE sha256 = ANY(%s)", (list(names),))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def blob_store_for(backend: Any) -> BlobStore:
    """The before-image store that lives beside `backend`'s sessions."""
    if backend.name == "sqlite":
        return SqliteBlobs(backend.path)
    if backend.name == "postgres":
        return PostgresBlobs(backend)
    return FileBlobs(backend.dir.parent)
