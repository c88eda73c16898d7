"""The session store: one backend plus the cross-process lock, and the three ways to open a session.

- `create()`       a new session, locked, header durable.
- `open_for_resume()` an existing session, locked, torn tail cut, repair committed durably before returning.
- `inspect()`      read-only: the log as repair would leave it, computed without writing or locking.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from .backend import Backend, EncodedEvent, Writer
from .errors import InvalidSessionId, PersistenceError, SessionNotFound
from .events import AnyEvent, SessionHeader, TurnEnd, TurnStart, UserMessage, encode_event
from .jsonl import JsonlBackend
from .locks import SessionLock, lock_holder
from .repair import repair_interrupted_turn

BACKENDS = ("jsonl", "sqlite")
_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")


def check_session_id(session_id: str) -> str:
    if not _ID.fullmatch(session_id):
        raise InvalidSessionId(session_id)
    return session_id


def new_session_id() -> str:
    """Sortable by creation time, unique enough across processes: 20261202-155200-3fa9c1."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime()) + "-" + secrets.token_hex(3)


def make_backend(name: str, home: Path) -> Backend:
    if name == "jsonl":
        return JsonlBackend(home)
    if name == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(home)
    raise PersistenceError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


@dataclass
class OpenedSession:
    """A session opened for writing: locked, with its events loaded (repair included) and a writer at the end."""

    header: SessionHeader
    events: list[AnyEvent]
    writer: Writer
    lock: SessionLock
    repaired: list[AnyEvent]  # events repair appended at this open (already durable)
    torn_bytes: int = 0


@dataclass
class Inspection:
    header: SessionHeader
    events: list[AnyEvent]  # as stored
    repair: list[AnyEvent]  # what repair would append (empty for a live session: it is shown as it stands)
    live_pid: int | None  # holder's pid when the session is live in another process (0: unknown pid)
    torn_bytes: int = 0


@dataclass
class SessionSummary:
    id: str
    cwd: str
    created: int
    updated: int
    events: int
    status: str  # completed | interrupted | live
    first_prompt: str


class SessionStore:
    def __init__(self, home: Path | str, backend: Backend | str = "jsonl") -> None:
        self.home = Path(home)
        self.backend = make_backend(backend, self.home) if isinstance(backend, str) else backend
        self.lock_dir = self.home / "locks"

    def _lock(self, session_id: str) -> SessionLock:
        lock = SessionLock(self.lock_dir, session_id)
        lock.acquire()
        return lock

    def create(self, cwd: str, session_id: str | None = None, created: int | None = None) -> OpenedSession:
        self.backend.check_writable()
        session_id = check_session_id(session_id) if session_id is not None else new_session_id()
        header = SessionHeader(id=session_id, created=created or time.time_ns() // 1_000_000, cwd=cwd)
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
                repaired = repair_interrupted_turn(log.events)
                if repaired:
                    writer.append([(e.seq, encode_event(e)) for e in repaired], durable=True)
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
        holder = lock_holder(self.lock_dir, session_id)
        repair = [] if holder is not None else repair_interrupted_turn(log.events)
        return Inspection(log.header, log.events, repair, holder, log.torn_bytes)

    def exists(self, session_id: str) -> bool:
        return self.backend.exists(check_session_id(session_id))

    def list_sessions(self) -> list[SessionSummary]:
        """Every readable session, newest activity first. Unreadable ones are skipped, never fatal for a listing."""
        out = []
        for session_id in self.backend.list_ids():
            try:
                log = self.backend.load(session_id)
            except PersistenceError:
                continue
            out.append(summarize(log.header, log.events, lock_holder(self.lock_dir, session_id) is not None))
        out.sort(key=lambda s: (s.updated, s.id), reverse=True)
        return out

    def latest_in(self, cwd: str) -> str | None:
        for summary in self.list_sessions():
            if os.path.realpath(summary.cwd) == os.path.realpath(cwd):
                return summary.id
        return None


def summarize(header: SessionHeader, events: list[AnyEvent], live: bool) -> SessionSummary:
    return SessionSummary(
        id=header.id,
        cwd=header.cwd,
        created=header.created,
        updated=events[-1].time if events else header.created,
        events=len(events),
        status="live" if live else ending_status(events),
        first_prompt=next((e.text for e in events if isinstance(e, UserMessage)), ""),
    )


def ending_status(events: list[AnyEvent]) -> str:
    """`interrupted` when the log ends inside a turn or its last turn was closed by repair; else `completed`."""
    for e in reversed(events):
        if isinstance(e, TurnEnd):
            return "interrupted" if e.reason == "interrupted" else "completed"
        if isinstance(e, TurnStart):
            return "interrupted"
    return "completed"
