"""The small interface every storage backend implements.

A backend knows how to create a session, append a batch (durably or not), read a log back and list sessions. It does not
choose *when* to be durable (the checkpoint policy does) nor batch writes (the coordinator does). Locking is done by the
store around it, identically for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import msgspec

from .events import AnyEvent, SessionHeader


# (seq, the event's JSON line without newline): a plain tuple, built once per event on the streaming hot path.
EncodedEvent = tuple[int, bytes]


class LoadedLog(msgspec.Struct):
    header: SessionHeader
    events: list[AnyEvent]
    location: str  # a path (and for SQLite the session id) for messages
    torn_bytes: int = 0  # bytes of a torn tail that were dropped (JSONL only)
    check: Any = None  # checks.Position: where a resuming writer continues the running crc (None: a new log)
    extra: dict = msgspec.field(default_factory=dict)


class LiveWriter(msgspec.Struct):
    """Who writes a live session (SPEC §13): its host, its pid, since when (ms; None: not known)."""

    host: str | None
    pid: int | None
    since: int | None = None


class Writer(ABC):
    """Appends to one session. Used from one thread at a time (the coordinator serializes it)."""

    # False when calls may block for long on purpose (test seams that hold a write): always use a worker thread.
    inline_safe = True

    @abstractmethod
    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        """Write the batch; with `durable`, also make everything written so far reach the disk. Returns bytes written.

        On failure the writer must be left so that re-appending every event after the last durable one is correct.
        """

    @abstractmethod
    def close(self) -> None: ...


class Backend(ABC):
    name: str

    @abstractmethod
    def create(self, header: SessionHeader) -> Writer:
        """Create the session durably (it must not exist) and return its writer."""

    @abstractmethod
    def open_writer(self, session_id: str) -> tuple[Writer, LoadedLog]:
        """Load an existing session for appending; a torn tail is cut away durably."""

    @abstractmethod
    def load(self, session_id: str) -> LoadedLog:
        """Read-only load: never writes, never locks."""

    @abstractmethod
    def exists(self, session_id: str) -> bool: ...

    def live_writers(self, session_ids: list[str]) -> dict[str, LiveWriter] | None:
        """The writer of each live session among `session_ids`, found in one look for all of them (PostgreSQL: its
        lock connections); None when the backend cannot, and the store asks each session's lock instead."""
        return None

    def load_listed(self, session_id: str) -> LoadedLog:
        """A load for a listing that has its `live_writers` already: a backend may skip finding the holder again."""
        return self.load(session_id)

    @abstractmethod
    def list_ids(self) -> list[str]: ...

    def delete(self, session_id: str) -> None:
        """Remove a session for good. The store calls it holding the session's lock (so never on a live session)."""
        from .errors import StoreUnavailable

        raise StoreUnavailable(f"the {self.name} backend cannot delete sessions")

    def check_writable(self) -> None:
        """Raise StoreUnavailable early (at start, not mid-turn) when sessions cannot be written."""
