"""The write coordinator: the one place that performs writes and barriers for a live session.

`append()` is synchronous and cheap: it stamps seq/time, encodes, and queues. A write-behind task hands queued events to
the OS within `window` seconds, without fsync, so a killed process loses at most that window. `flush()` is the barrier:
it writes everything queued and fdatasyncs. Concurrent `flush()` callers join the flush in flight (group commit), so N
parallel barriers cost one or two fsyncs. A failed write keeps every non-durable event queued, in order, and the next
write re-sends them all from the last durable point; nothing is dropped.

Blocking I/O runs in a worker thread (anyio) inside a shielded scope: a barrier that has started always finishes, and
its caller sees cancellation only after the log is in a known state.
"""

from __future__ import annotations

import asyncio
import time as _time
from dataclasses import dataclass

import anyio

from .backend import EncodedEvent, Writer
from .errors import CheckpointFailed, PersistenceError
from .events import AnyEvent, IgnorableEvent, check_event_finite, encode_event

DEFAULT_WINDOW = 0.02  # seconds; SPEC §1 allows at most 50 ms


class CoordinatorClosed(PersistenceError):
    def __init__(self) -> None:
        super().__init__("the session is closed; no more events or checkpoints can be written")


@dataclass
class Stats:
    writes: int = 0  # calls into the backend
    fsyncs: int = 0  # durable writes (one fdatasync or FULL commit each)
    bytes: int = 0
    failures: int = 0


class _Flush:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


def now_ms() -> int:
    return _time.time_ns() // 1_000_000


class Coordinator:
    def __init__(self, writer: Writer, next_seq: int = 0, last_time: int = 0, window: float = DEFAULT_WINDOW) -> None:
        self._writer = writer
        self.window = window
        self._pending: list[EncodedEvent] = []  # everything not yet durable, in seq order
        self._written = 0  # how many of _pending have reached the OS
        self._next_seq = next_seq
        self._last_time = last_time
        self.durable_seq = next_seq - 1
        self._io = anyio.Lock()
        self._wake = anyio.Event()
        self._inflight: _Flush | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = anyio.Event()
        self.closed = False
        self.stats = Stats()
        self.last_error: BaseException | None = None

    # -- appending -------------------------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def append(self, event: AnyEvent) -> AnyEvent:
        """Stamp seq and time, queue for write-behind. Raises NonFiniteNumber before anything is queued."""
        if self.closed:
            raise CoordinatorClosed()
        check_event_finite(event)
        event.seq = self._next_seq
        if not isinstance(event, IgnorableEvent) or event.time <= 0:
            t = now_ms()
            event.time = t if t > self._last_time else self._last_time
        self._last_time = event.time
        self._pending.append(EncodedEvent(event.seq, encode_event(event)))
        self._next_seq += 1
        self._wake.set()
        return event

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def __aenter__(self) -> "Coordinator":
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start write-behind. A plain task rather than a task group: the coordinator may be closed from anywhere
        (a UI handler, a test, shutdown) without the nesting rules of cancel scopes."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write_behind(), name="cairn-write-behind")

    async def aclose(self) -> None:
        """Final flush, stop write-behind, close the writer. Raises CheckpointFailed if the last events could not be
        made durable (they are reported, not silently dropped)."""
        if self.closed:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self.flush()
        finally:
            self.closed = True
            self._closing.set()
            self._wake.set()
            if self._task is not None:
                with anyio.CancelScope(shield=True):
                    await self._task
                self._task = None
            self._writer.close()

    async def _write_behind(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self.closed:
                return
            with anyio.move_on_after(self.window):
                await self._closing.wait()  # gather appends for one window; a close ends it early
            if self.closed:
                return
            try:
                await self._write(durable=False)
            except Exception:
                pass  # recorded in last_error; the events stay queued and the next write or barrier retries them

    # -- writing ---------------------------------------------------------------------------------------------------

    async def _write(self, durable: bool) -> None:
        with anyio.CancelScope(shield=True):
            async with self._io:
                batch = self._pending[self._written :]
                if not batch and (not durable or not self._pending):
                    return
                try:
                    n = await anyio.to_thread.run_sync(self._writer.append, batch, durable)
                except BaseException as e:
                    self._written = 0  # the backend rewinds to its last durable point; re-send from there
                    self.stats.failures += 1
                    self.last_error = e
                    raise
                self.stats.writes += 1
                self.stats.bytes += n
                self._written += len(batch)
                if durable:
                    self.stats.fsyncs += 1
                    self.durable_seq = self._pending[self._written - 1].seq
                    del self._pending[: self._written]
                    self._written = 0
                self.last_error = None

    async def flush(self) -> None:
        """Barrier: return once every event appended before the call is durable; raise CheckpointFailed otherwise."""
        if self.closed:
            raise CoordinatorClosed()
        target = self._next_seq - 1
        while self.durable_seq < target:
            flush = self._inflight
            if flush is None:
                flush = self._inflight = _Flush()
                try:
                    await self._write(durable=True)
                except Exception as e:
                    flush.error = e
                finally:
                    self._inflight = None
                    flush.done.set()
            else:
                await flush.done.wait()
            if flush.error is not None and self.durable_seq < target:
                raise CheckpointFailed(flush.error) from flush.error

    @property
    def queued(self) -> int:
        """Events not yet durable."""
        return len(self._pending)
