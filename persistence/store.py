"""The session store: one backend plus the cross-process lock, and the three ways to open a session.

- `create()`       a new session, locked, header durable.
- `open_for_resume()` an existing session, locked, torn tail cut, repair committed durably before returning.
- `inspect()`      read-only: the log as repair would leave it, computed without writing or locking.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import msgspec

from .backend import Backend, EncodedEvent, LiveWriter, Writer
from .errors import (
    CorruptLog,
    PersistenceError,
    SessionNotFound,
    SessionUnreadable,
    StoreUnavailable,
)
from .events import (
    AnyEvent,
    RewindEnd,
    RewindPlan,
    SessionHeader,
    TurnEnd,
    TurnStart,
    UserMessage,
    WorkspaceMoved,
    encode_event,
    usage_totals,
)
from .ids import check_session_id, new_session_id
from .jsonl import JsonlBackend
from .locks import SessionLock, lock_holder
from .evidence import gather_evidence
from .repair import repair_interrupted_turn

BACKENDS = ("jsonl", "sqlite", "postgres")
def make_backend(name: str, home: Path, database_url: str | None = None) -> Backend:
    """`database_url` is for `postgres` only (default: CAIRN_DATABASE_URL, so every composition and child process that
    was given the variable reaches the same database); psycopg is imported only when that backend is chosen."""
    if name == "jsonl":
        return JsonlBackend(home)
    if name == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(home)
    if name == "postgres":
        url = database_url or os.environ.get("CAIRN_DATABASE_URL")
        if not url:
            raise StoreUnavailable(
                "the postgres backend needs a database: pass --database-url or set CAIRN_DATABASE_URL "
                "(e.g. postgresql://cairn@db.example/cairn)"
            )
        from .postgres import PostgresBackend

        return PostgresBackend(url)
    raise PersistenceError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


class OpenedSession(msgspec.Struct):
    """A session opened for writing: locked, with its events loaded (repair included) and a writer at the end."""

    header: SessionHeader
    events: list[AnyEvent]
    writer: Writer
    lock: SessionLock
    repaired: list[AnyEvent]  # events repair appended at this open (already durable)
    torn_bytes: int = 0


class Inspection(msgspec.Struct):
    header: SessionHeader
    events: list[AnyEvent]  # as stored
    repair: list[AnyEvent]  # what repair would append (empty for a live session: it is shown as it stands)
    live_pid: int | None  # holder's pid when the session is live in another process (0: unknown pid)
    torn_bytes: int = 0


class SessionSummary(msgspec.Struct):
    id: str
    cwd: str
    created: int
    updated: int
    events: int
    status: str  # completed | cancelled | error | interrupted | live | unreadable
    first_prompt: str
    reason: str | None = None  # why an `unreadable` session cannot be read (None for every other status)
    usage: dict[str, int | None] | None = None  # input/output tokens summed over its answers (null: never reported)
    size: int | None = None  # bytes the session takes in its backend (None: unknown)
    rewind_pending: bool = False  # (rev 4 §10) a rewind was interrupted: nothing else runs until it is settled
    # (rev 4 §13) a live session's writer: its host and pid, and since when it holds the session (ms); None otherwise
    # or when not known (local backends know no `since`; a pid their lock file does not give is None)
    host: str | None = None
    pid: int | None = None
    since: int | None = None


class DeferredWriter(Writer):
    """Creates its session on the first append, so a session nobody wrote to leaves nothing on disk — not even a lock
    file: its lock is taken right before the session is created (no one can open a session that does not exist, and a
    second creator of the same id is refused by the lock or by `create`)."""

    def __init__(self, backend: Backend, header: SessionHeader, lock: SessionLock | None = None) -> None:
        self._backend, self._header, self._lock = backend, header, lock
        self._writer: Writer | None = None

    @property
    def inline_safe(self) -> bool:  # type: ignore[override]
        return self._writer.inline_safe if self._writer is not None else False

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        if self._writer is None:
            if not batch:
                return 0  # a barrier with nothing to write creates nothing
            if self._lock is not None and not self._lock.held:
                self._lock.acquire()
            try:
                self._writer = self._backend.create(self._header)  # refuses an id that exists meanwhile
            except BaseException:
                if self._lock is not None:
                    self._lock.release()
                raise
        return self._writer.append(batch, durable)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def sqlite_error() -> type[BaseException]:
    """sqlite3's error once the SQLite backend has loaded it; a JSONL or PostgreSQL session never imports sqlite3
    (~1 ms before the TUI's first frame, P8)."""
    sqlite3 = sys.modules.get("sqlite3")
    return sqlite3.Error if sqlite3 is not None else OSError


class SessionStore:
    def __init__(self, home: Path | str, backend: Backend | str = "jsonl", database_url: str | None = None) -> None:
        self.home = Path(home)
        self.backend = make_backend(backend, self.home, database_url) if isinstance(backend, str) else backend
        self.lock_dir = self.home / "locks"

    def _lock(self, session_id: str) -> SessionLock:
        lock = SessionLock(self.lock_dir, session_id, getattr(self.backend, "ops", None))
        lock.acquire()
        return lock

    def create(self, cwd: str, session_id: str | None = None, created: int | None = None,
               deferred: bool = False) -> OpenedSession:
        """A new session, locked. `deferred`: nothing is written until its first event is (SPEC §6 rev 2: a session
        with no turn yet is not created on disk until its first prompt) — the TUI opens one per launch."""
        self.backend.check_writable()
        session_id = check_session_id(session_id) if session_id is not None else new_session_id()
        header = SessionHeader(id=session_id, created=created or time.time_ns() // 1_000_000, cwd=cwd)
        if deferred:  # locked with its first append, when it is created (SPEC §6 rev 2: nothing on disk before)
            lock = SessionLock(self.lock_dir, session_id, getattr(self.backend, "ops", None))
            return OpenedSession(header, [], DeferredWriter(self.backend, header, lock), lock, [])
        lock = self._lock(session_id)
        try:
            writer = self.backend.create(header)
        except BaseException:
            lock.release()
            raise
        return OpenedSession(header, [], writer, lock, [])

    def open_for_resume(self, session_id: str) -> OpenedSession:
        check_session_id(session_id)
        self.backend.check_writable()
        if not self.backend.exists(session_id):
            raise SessionNotFound(session_id)
        lock = self._lock(session_id)
        try:
            writer, log = self.backend.open_writer(session_id)
            try:
                repaired = repair_with_evidence(log.events, str(session_workspace(log.header, log.events)))
                if repaired:
                    writer.append([(e.seq, encode_event(e)) for e in repaired], durable=True)
            except (OSError, sqlite_error()) as e:
                writer.close()
                raise StoreUnavailable(
                    f"cannot commit the repair of session {session_id!r}: {e}; nothing was changed, try again", e
                ) from None
            except BaseException:
                writer.close()
                raise
        except BaseException:
            lock.release()
            raise
        return OpenedSession(log.header, log.events + repaired, writer, lock, repaired, log.torn_bytes)

    def inspect(self, session_id: str) -> Inspection:
        check_session_id(session_id)
        log = self.backend.load(session_id)
        holder = self._holder(session_id, log)
        repair = [] if holder is not None else repair_with_evidence(log.events,
                                                                    str(session_workspace(log.header, log.events)))
        return Inspection(log.header, log.events, repair, holder, log.torn_bytes)

    def _holder(self, session_id: str, log) -> int | None:
        """The live writer's pid (0: unknown) from the lock file or, when that was deleted or replaced, from what the
        backend itself knows (the JSONL writer's flock on the session file)."""
        holder = lock_holder(self.lock_dir, session_id)
        if holder is None:
            holder = log.extra.get("live_pid")
        return holder

    def exists(self, session_id: str) -> bool:
        return self.backend.exists(check_session_id(session_id))

    def delete(self, session_id: str) -> None:
        """Delete a finished session: refused with SessionLocked while another process has it open."""
        check_session_id(session_id)
        if not self.backend.exists(session_id):
            raise SessionNotFound(session_id)
        lock = self._lock(session_id)
        try:
            self.backend.delete(session_id)
        finally:
            lock.release()  # (and its lock file goes with it)

    def list_sessions(self) -> list[SessionSummary]:
        """Every session, newest activity first. One that cannot be read is listed as `unreadable` with the reason;
        it never hides the others. A store that cannot be listed at all raises (it must not look empty). A live
        session names its writer (SPEC §13): the backend finds every writer in one look where it can (PostgreSQL's lock
        connections, before the logs are read, so a writer ending meanwhile errs towards `live`), else each session's
        lock says."""
        out = []
        ids = self.backend.list_ids()
        writers = self.backend.live_writers(ids)
        for session_id in ids:
            try:
                log = self.backend.load(session_id) if writers is None else self.backend.load_listed(session_id)
            except (PersistenceError, RecursionError) as e:
                if isinstance(e, StoreUnavailable) and not isinstance(e, SessionUnreadable):
                    raise
                out.append(self._unreadable(session_id, e))
                continue
            writer = writers.get(session_id) if writers is not None else self._local_writer(session_id, log)
            summary = summarize(log.header, log.events, writer)
            summary.size = getattr(self.backend, "size", lambda _id: None)(session_id)
            out.append(summary)
        out.sort(key=lambda s: (s.updated, s.id), reverse=True)
        return out

    def _local_writer(self, session_id: str, log) -> LiveWriter | None:
        """A live session's writer as its lock file tells: the pid when it is known, no host (a JSONL or SQLite home
        is one machine's, and its listing names none: `-`, as for a session nobody writes), no `since`."""
        holder = self._holder(session_id, log)
        return None if holder is None else LiveWriter(None, holder or None)

    def _unreadable(self, session_id: str, error: BaseException) -> SessionSummary:
        modified = getattr(self.backend, "modified_ms", lambda _id: 0)(session_id)
        return SessionSummary(
            id=session_id, cwd="", created=0, updated=modified, events=0, status="unreadable", first_prompt="",
            reason=unreadable_reason(error),
        )

    def latest_in(self, cwd: str) -> str | None:
        for summary in self.list_sessions():
            if summary.status == "unreadable":  # its cwd is unknown ("" would resolve to the current directory)
                continue
            if os.path.realpath(summary.cwd) == os.path.realpath(cwd):
                return summary.id
        return None


def session_workspace(header: SessionHeader, events: list[AnyEvent]) -> Path:
    """The directory a session works in (SPEC §10): the `cwd` it was created in, or where its last `workspace/moved`
    took it. Every face resumes, snapshots and rewinds there, never in the directory it happens to be started from."""
    for event in reversed(events):
        if isinstance(event, WorkspaceMoved):
            return Path(event.to)
    return Path(header.cwd)


def move_workspace(opened: OpenedSession, to: Path) -> WorkspaceMoved | None:
    """Record that `opened` works in `to` from now on (`--workspace DIR` on a resume), durably and before the session
    goes live, so no turn can run in the new place without the log saying so. None when it already works there."""
    current = session_workspace(opened.header, opened.events)
    if os.path.realpath(current) == os.path.realpath(to):
        return None
    moved = WorkspaceMoved(from_=str(current), to=str(to))
    moved.seq = len(opened.events)
    moved.time = max(time.time_ns() // 1_000_000, opened.events[-1].time if opened.events else 0)
    try:
        opened.writer.append([(moved.seq, encode_event(moved))], durable=True)
    except (OSError, sqlite_error()) as e:
        raise StoreUnavailable(
            f"cannot record the move of session {opened.header.id!r} to {to}: {e}; nothing was changed, try again", e
        ) from None
    opened.events.append(moved)
    return moved


def repair_with_evidence(events: list[AnyEvent], workspace: str) -> list[AnyEvent]:
    """Repair's closing events (SPEC §4), then the `recovery/evidence` Cairn can gather about its OUTCOME_UNKNOWN calls
    by looking at the workspace now (§9), numbered after them: both are committed together on resume."""
    repaired = repair_interrupted_turn(events)
    if not repaired:
        return repaired
    last = repaired[-1]
    found = gather_evidence(events, repaired, Path(workspace))
    for offset, evidence in enumerate(found, 1):
        evidence.seq, evidence.time = last.seq + offset, last.time
    return [*repaired, *found]


def unreadable_reason(error: BaseException) -> str:
    """A short reason for a listing: the error without the path every listed row already implies."""
    if isinstance(error, RecursionError):
        return "JSON nested too deeply"
    if isinstance(error, CorruptLog):
        where = f"line {error.line}: " if error.line else ""
        return f"{where}{error.reason}"
    return getattr(error, "reason", None) or str(error)


def summarize(header: SessionHeader, events: list[AnyEvent], writer: LiveWriter | None) -> SessionSummary:
    """A session's listing; `writer` (None: nobody holds it) makes it `live`, whatever its log says."""
    return SessionSummary(
        id=header.id,
        cwd=str(session_workspace(header, events)),
        created=header.created,
        updated=events[-1].time if events else header.created,
        events=len(events),
        status="live" if writer is not None else ending_status(events),
        first_prompt=next((e.text for e in events if isinstance(e, UserMessage)), ""),
        usage=usage_totals(events),
        rewind_pending=rewind_pending(events),
        host=writer.host if writer is not None else None,
        pid=writer.pid if writer is not None else None,
        since=writer.since if writer is not None else None,
    )


def rewind_pending(events: list[AnyEvent]) -> bool:
    """Whether a rewind plan has no end: a rewind a crash interrupted, to be finished or abandoned (SPEC §10)."""
    open_plans: set[str] = set()
    for e in events:
        if isinstance(e, RewindPlan):
            open_plans.add(e.rewind_id)
        elif isinstance(e, RewindEnd):
            open_plans.discard(e.rewind_id)
    return bool(open_plans)


def ending_status(events: list[AnyEvent]) -> str:
    """The last turn's reason (`completed`, `cancelled`, `error`, `interrupted`); `interrupted` when the log ends
    inside a turn; `completed` for a session with no turn yet."""
    for e in reversed(events):
        if isinstance(e, TurnEnd):
            return e.reason
        if isinstance(e, TurnStart):
            return "interrupted"
    return "completed"
