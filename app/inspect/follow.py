"""Following a session another process is writing, read-only (`cairn inspect --follow`): never locks, never writes.

- JSONL: the file is tailed from the byte after the last complete line already shown. A last line without its newline
  is a write in progress: it is waited for (left unread until its newline arrives), never reported as torn.
- SQLite: rows with `seq` at or after the next expected one, on a read-only connection (WAL readers never block the
  writer).
- PostgreSQL: woken by the writer's notification (persistence/postgres_follow.py), then rows with `seq` at or after
  the next expected one and the lock's holder, in one round trip; with no notification, only the holder is looked at,
  once a second (HOLDER_EVERY).
- Any other backend: the session is read again and the new tail taken (correct, if not cheap).

Each poll also says who holds the session: the writer's pid, or None once no process holds it. `follow` is the
headless loop over a tail (`cairn show --follow`): each event once and in order until the writer ends.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import msgspec

from cairn.persistence.codec import ignorable_or_refuse
from cairn.persistence.errors import CorruptLog, StoreUnavailable
from cairn.persistence.events import AnyEvent, event_decoder
from cairn.persistence.locks import byte_is_held, hold_offset, lock_holder, probe_flock
from cairn.persistence.store import SessionStore

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ = 1 << 20
FILE_POLL = 0.05  # seconds between two looks at a file backend's session while following it headless
HOLDER_EVERY = 1.0  # seconds: how often a PostgreSQL tail with no notification asks who holds the lock


def decode_line(line: bytes, where: str, line_no: int) -> AnyEvent:
    """One complete event line, with the loader's rules: ignorable unknown types kept, anything else bad refused."""
    try:
        try:
            return event_decoder.decode(line)
        except msgspec.ValidationError as e:  # (the tag is read first: damage after it is a DecodeError in here)
            return ignorable_or_refuse(line, where, line_no, e)
    except msgspec.DecodeError:
        raise CorruptLog(where, line_no, "the line is not valid JSON") from None


class Tail:
    """New events since the last poll, and the writer's pid (None: no process holds the session)."""

    def __init__(self, store: SessionStore, session_id: str, known: int) -> None:
        self.store = store
        self.session_id = session_id
        self.next_seq = known

    def poll(self) -> tuple[list[AnyEvent], int | None]:
        inspection = self.store.inspect(self.session_id)
        new = inspection.events[self.next_seq:]
        self.next_seq += len(new)
        return new, inspection.live_pid

    def wait(self, timeout: float) -> None:
        """Block until there may be something new (a file backend: one short pause; at most `timeout` seconds)."""
        time.sleep(min(timeout, FILE_POLL))

    def _check(self, events: list[AnyEvent], where: str) -> list[AnyEvent]:
        for e in events:
            if e.seq != self.next_seq:
                raise CorruptLog(where, 0, f"seq {e.seq} where {self.next_seq} was expected (was the log replaced?)")
            self.next_seq += 1
        return events

    def last(self) -> list[AnyEvent]:
        """What was committed since the last poll, read after the holder was seen gone: the writer's last events."""
        return self.poll()[0]

    def close(self) -> None:
        pass


class JsonlTail(Tail):
    def __init__(self, store: SessionStore, session_id: str, known: int) -> None:
        super().__init__(store, session_id, known)
        self.path = str(store.backend.path(session_id))  # type: ignore[attr-defined]
        try:
            self.fd = os.open(self.path, _OPEN)
        except OSError as e:
            raise StoreUnavailable(f"cannot follow {self.path}: {e.strerror}", e) from None
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise StoreUnavailable(f"cannot follow {self.path}: not a regular file")
        self.offset: int | None = None  # byte after the last complete line consumed
        self.line_no = known + 1  # of that line (the header is line 1)

    def _start(self) -> int:
        """The byte after the header and the `next_seq` events already shown (the file may have grown since)."""
        offset, lines = 0, self.next_seq + 1
        while lines:
            chunk = os.pread(self.fd, _READ, offset)
            if not chunk:
                raise CorruptLog(self.path, 0, "the log is shorter than when it was opened (was it replaced?)")
            at = -1
            while lines and (at := chunk.find(b"\n", at + 1)) >= 0:
                lines -= 1
            offset += at + 1 if not lines else len(chunk)
        return offset

    def poll(self) -> tuple[list[AnyEvent], int | None]:
        if self.offset is None:
            self.offset = self._start()
        chunks: list[bytes] = []
        while chunk := os.pread(self.fd, _READ, self.offset + sum(map(len, chunks))):
            chunks.append(chunk)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1  # what follows is a line still being written: wait for its newline
        events = []
        for line in data[:end].split(b"\n")[:-1]:
            self.line_no += 1
            if line.strip():
                events.append(decode_line(line, self.path, self.line_no))
        self.offset += end
        holder = lock_holder(self.store.lock_dir, self.session_id)
        if holder is None:
            holder = probe_flock(self.fd, pid_in_file=False)
        return self._check(events, self.path), holder

    def close(self) -> None:
        os.close(self.fd)


class SqliteTail(Tail):
    def __init__(self, store: SessionStore, session_id: str, known: int) -> None:
        super().__init__(store, session_id, known)
        self.where = f"{store.backend.path}[{session_id}]"  # type: ignore[attr-defined]
        uri = f"file:{urllib.parse.quote(str(store.backend.path))}?mode=ro"  # type: ignore[attr-defined]
        try:
            self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=2.0, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot follow {self.where}: {e}", e) from None
        self.version: int | None = None  # PRAGMA data_version at the last read: unchanged, nobody committed since

    def poll(self) -> tuple[list[AnyEvent], int | None]:
        try:
            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
            rows = [] if version == self.version else self.conn.execute(
                "SELECT seq, body FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq",
                (self.session_id, self.next_seq),
            ).fetchall()
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot read {self.where}: {e}", e) from None
        self.version = version
        events = [decode_line(body if isinstance(body, bytes) else body.encode(), self.where, seq + 1)
                  for seq, body in rows]
        holder = lock_holder(self.store.lock_dir, self.session_id)
        path: Path = self.store.backend.path  # type: ignore[attr-defined]
        if holder is None and byte_is_held(path, hold_offset(self.session_id)):
            holder = 0  # a live writer whose lock file was deleted: its byte of the database still says so
        return self._check(events, self.where), holder

    def close(self) -> None:
        self.conn.close()


class PostgresTail(Tail):
    """Woken by the writer's notifications rather than re-reading the session (persistence/postgres_follow.py)."""

    def __init__(self, store: SessionStore, session_id: str, known: int) -> None:
        from cairn.persistence.postgres_follow import PostgresFollower  # psycopg: only on this backend

        super().__init__(store, session_id, known)
        backend: Any = store.backend
        self.where = f"{backend.where}[{session_id}]"
        self.follower = PostgresFollower(backend, session_id, known)
        self.holder: int | None = None
        self.host: str | None = None  # the writer's host, as its lock connection names it
        self.asked = float("-inf")  # when the holder was last looked at (time.monotonic)

    def poll(self) -> tuple[list[AnyEvent], int | None]:
        """New events when a notification came (or at the first poll); with none, the holder once a second."""
        if not self.follower.wait(0) and time.monotonic() - self.asked < HOLDER_EVERY:
            return [], self.holder
        return self._fetch()

    def _fetch(self) -> tuple[list[AnyEvent], int | None]:
        rows, held = self.follower.fetch()
        self.asked = time.monotonic()
        self.host, self.holder = (None, None) if held is None else (held[0], held[1] or 0)
        events = [decode_line(body, self.where, seq + 1) for seq, body in rows]
        return self._check(events, self.where), self.holder

    def wait(self, timeout: float) -> None:
        self.follower.wait(timeout)

    def last(self) -> list[AnyEvent]:
        return self._fetch()[0]

    def close(self) -> None:
        self.follower.close()


def open_tail(store: SessionStore, session_id: str, known: int) -> Tail:
    """A tail starting after the `known` events already shown."""
    name = getattr(store.backend, "name", "")
    if name == "jsonl":
        return JsonlTail(store, session_id, known)
    if name == "postgres":
        return PostgresTail(store, session_id, known)
    if name == "sqlite" and isinstance(getattr(store.backend, "path", None), Path):
        return SqliteTail(store, session_id, known)
    return Tail(store, session_id, known)


def follow(store: SessionStore, session_id: str, known: int, idle: float = HOLDER_EVERY) -> Iterator[AnyEvent]:
    """Each event from seq `known` on, once and in order, as it is committed, until nobody holds the session (its
    writer ended or died); then what it committed last, read after its lock was seen free, and the generator returns.
    Read-only: never locks, never writes. `idle`: the longest wait between two looks at who holds the session."""
    tail = open_tail(store, session_id, known)
    try:
        while True:
            new, holder = tail.poll()
            yield from new
            if holder is None:
                yield from tail.last()
                return
            tail.wait(idle)
    finally:
        tail.close()
