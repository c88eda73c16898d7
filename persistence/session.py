"""A live session: the in-memory log (the source everything is derived from) plus its coordinator and lock.

Used as an async context manager: entering starts write-behind; leaving does a final flush, closes the writer and
releases the lock, in that order.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable

from .coordinator import CHUNKS, DEFAULT_WINDOW, Coordinator
from .errors import CheckpointFailed, NotDurableAtClose
from .events import AnyEvent, SessionHeader
from .store import OpenedSession

Listener = Callable[[AnyEvent], None]


class LiveSession:
    def __init__(self, opened: OpenedSession, window: float = DEFAULT_WINDOW) -> None:
        self.header: SessionHeader = opened.header
        self.events: list[AnyEvent] = opened.events
        self.repaired = opened.repaired
        self._lock = opened.lock
        self._writer = opened.writer
        last_time = self.events[-1].time if self.events else 0
        self.coordinator = Coordinator(opened.writer, next_seq=len(self.events), last_time=last_time, window=window)
        self._listeners: list[Listener] = []
        self._barrier: Callable[[], Awaitable[None]] = self.coordinator.flush

    @property
    def id(self) -> str:
        return self.header.id

    def append(self, event: AnyEvent) -> AnyEvent:
        """Stamp, queue for writing, record in memory, tell listeners. Synchronous and cheap."""
        if self.coordinator.holding and type(event) not in CHUNKS:
            for held in self.coordinator.release_held():  # the streams' last text, held back in case a secret began
                self._record(held, hold_back=False)
        return self._record(event)

    def _record(self, event: AnyEvent, hold_back: bool = True) -> AnyEvent:
        self.coordinator.append(event, hold_back)
        self.events.append(event)
        for listener in self._listeners:
            listener(event)
        return event

    def add_secrets(self, values: Iterable[str | None]) -> None:
        """Secret values (an API key, credentials in a base URL) replaced by `***` in every event appended from now."""
        self.coordinator.add_secrets(values)

    def holds_secret(self, data: bytes) -> bool:
        """Whether `data` contains a configured secret value (such content is never stored, SPEC §5)."""
        return any(secret.encode("utf-8", "replace") in data for secret in self.coordinator.secrets)

    async def flush(self) -> None:
        """A barrier: everything appended so far is durable when this returns (raises CheckpointFailed otherwise)."""
        await self._barrier()

    def route_barriers(self, barrier: Callable[[], Awaitable[None]]) -> None:
        """Send barriers through an owner (the TUI's persistence-service widget) instead of straight to the
        coordinator; the owner performs them with `coordinator.flush()`."""
        self._barrier = barrier

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @property
    def live(self) -> bool:
        return not self.coordinator.closed

    async def __aenter__(self) -> "LiveSession":
        try:
            await self.coordinator.__aenter__()
        except BaseException:
            self._writer.close()
            self._lock.release()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.coordinator.aclose()
        except CheckpointFailed as e:  # nothing retries after a close: say what is durable and what is not
            coordinator = self.coordinator
            raise NotDurableAtClose(self.id, e.cause, coordinator.durable_seq, coordinator.next_seq - 1) from e
        finally:
            self._lock.release()

    def close_now(self) -> None:
        """Synchronous close (see Coordinator.close_now); releases the lock whatever happens."""
        try:
            self.coordinator.close_now()
        finally:
            self._lock.release()
