"""The write coordinator: the one place that performs writes and barriers for a live session.

`append()` is synchronous and cheap: it stamps seq/time, encodes, and queues. A write-behind task hands queued events to
the OS within `window` seconds, without fsync, so a killed process loses at most that window. `flush()` is the barrier:
it writes everything queued and fdatasyncs. Concurrent `flush()` callers join the flush in flight (group commit), so N
parallel barriers cost one or two fsyncs. A failed write keeps every non-durable event queued, in order, and the next
write re-sends them all from the last durable point; nothing is dropped.

Blocking I/O runs on the event loop while it is quick (INLINE_IO_BUDGET), otherwise in the coordinator's own thread
(writer_thread), inside a shielded scope: a barrier that has started always finishes, and its caller sees cancellation
only after the log is in a known state.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import Any, Iterable

import anyio
import msgspec

from .backend import EncodedEvent, Writer
from .errors import CheckpointFailed, PersistenceError
from .events import (
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    IgnorableEvent,
    InvalidEvent,
    ReasoningChunk,
    RequestHeader,
    ToolCall,
    check_event_finite,
    encode_event,
    unmarked,
    encoder,
    event_decoder,
)
from .sanitize import MIN_SECRET_CHARS, REDACTED, clean_struct
from .writer_thread import WriterThread

DEFAULT_WINDOW = 0.02  # seconds; SPEC §1 allows at most 50 ms

# A backend call (write, or write + fdatasync) that has recently been this quick runs inline on the event loop: on a
# fast disk the hop to a worker thread and back costs more than the fsync itself (P1 in docs/benchmarks.md). As soon as
# calls get slower (a busy or slow disk) they move to a worker thread, so the event loop (and the TUI) never stalls
# for longer than about this.
INLINE_IO_BUDGET = 0.001
# A call that must not run on the event loop (a network round trip) goes to the coordinator's thread. For a barrier,
# whose caller waits for it anyway, and while such calls have recently been quick, the event loop waits for the answer
# synchronously for up to this long, then awaits it. On a fast local server the answer is there well before, and comes
# back without a trip through the event loop (P1 on PostgreSQL); a slow or stuck server stalls the loop no longer than
# this. Write-behind, which nobody waits for, always awaits: it never holds the loop while an answer streams.
BLOCKING_WAIT = 0.002

FREE_FORM = frozenset({RequestHeader, ToolCall, AssistantMessage, IgnorableEvent})
CHUNKS = frozenset({AssistantChunk, ReasoningChunk})  # the hot path: one text field, type-checked without a decode


class CoordinatorClosed(PersistenceError):
    def __init__(self) -> None:
        super().__init__("the session is closed; no more events or checkpoints can be written")


class Stats(msgspec.Struct):
    writes: int = 0  # calls into the backend
    fsyncs: int = 0  # durable writes (one fdatasync or FULL commit each)
    bytes: int = 0
    failures: int = 0


class _Flush:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


async def _outlast(settled: "asyncio.Future[None]") -> asyncio.CancelledError | None:
    """Wait for a backend call that has started, even through a cancellation of the waiting task (an asyncio
    `task.cancel()`, which anyio's shielded scope does not stop): the call goes on in its thread either way, and the
    coordinator must learn how it ended before the next write, or it would send the same events twice. Returns the
    cancellation, for the caller to raise once it has recorded the outcome."""
    cancelled = None
    while not settled.done():
        try:
            await asyncio.shield(settled)
        except asyncio.CancelledError as e:
            cancelled = e
    return cancelled


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
        # anyio's lock (its acquire yields once, so appends made meanwhile join that write) is made at the first write:
        # its module costs ~5 ms to import, before the TUI's first frame otherwise (P8). The two wake-ups signal the
        # write-behind task, a plain asyncio task, so they are asyncio's own
        self._io: anyio.Lock | None = None
        self._wake = asyncio.Event()
        self._armed = False  # write-behind has been woken and will pick up whatever is appended meanwhile
        self._io_cost = 0.0  # smoothed seconds per backend call: decides inline vs worker thread
        self._inflight: _Flush | None = None
        self._thread: WriterThread | None = None  # made at the first call that must not run on the event loop
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.closed = False
        self.stats = Stats()
        self.last_error: BaseException | None = None
        self._secrets: tuple[str, ...] = ()  # longest first, so a secret containing another is replaced whole
        self._secret_json: tuple[bytes, ...] = ()  # the same, as they appear inside encoded JSON strings
        self._carry: dict[tuple[type, int, int], str] = {}  # per chunk stream: text held back (a secret may start there)

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def add_secrets(self, values: "Iterable[str | None]") -> None:
        """Values replaced by `***` in every event appended from now on (SPEC §5: nothing secret is written)."""
        found = {v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_CHARS} | set(self._secrets)
        self._secrets = tuple(sorted(found, key=len, reverse=True))
        self._secret_json = tuple(encoder.encode(s)[1:-1] for s in self._secrets)

    # -- appending -------------------------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def append(self, event: AnyEvent, hold_back: bool = True) -> AnyEvent:
        """Stamp seq and time, queue for write-behind. Raises NonFiniteNumber or InvalidEvent before anything is
        queued: the writer never stores what the reader would refuse (SPEC §2 rev 2).

        This is the streaming hot path (one call per chunk), so it does only what it must: the finiteness check for
        the few types with free-form fields, one encode (text that cannot be encoded, or that holds a secret, is
        cleaned in place and encoded again), a validating decode for everything but chunks, and a wake-up only when
        write-behind is not already armed.
        """
        if self.closed:
            raise CoordinatorClosed()
        cls = type(event)
        if cls in FREE_FORM:
            check_event_finite(event)
        elif cls in CHUNKS:
            if type(event.delta) is not str:  # type: ignore[union-attr]
                raise InvalidEvent(f"{cls.__struct_config__.tag}: delta must be text")
            if self._secrets and hold_back:
                event.delta = self._hold_back(event)  # type: ignore[union-attr]
        seq = self._next_seq
        event.seq = seq
        if cls is not IgnorableEvent or event.time <= 0:
            t = _time.time_ns() // 1_000_000  # (now_ms inline: a call fewer per event)
            event.time = t if t > self._last_time else self._last_time
        if cls is IgnorableEvent or self._secrets:
            data = self._encode(event)
        else:  # _encode's common case inline: text that cannot be encoded still goes through it
            try:
                data = encoder.encode(event)
            except UnicodeEncodeError:
                data = self._encode(event)
        data = unmarked(data)  # (encode_event's own step, for the inline encode and _encode's)
        if cls not in CHUNKS and cls is not IgnorableEvent:
            try:
                event_decoder.decode(data)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                raise InvalidEvent(f"{cls.__struct_config__.tag} would not be readable: {e}") from None
        self._last_time = event.time
        self._pending.append((seq, data))
        self._next_seq = seq + 1
        if not self._armed:
            self._armed = True
            self._wake.set()
        return event

    def _hold_back(self, chunk: Any) -> str:
        """A chunk's text without any secret, even one split across chunks (SPEC §5 rev 3): the end of the stream's
        text that could be the start of a secret is held back and put in front of the next chunk of the same stream;
        once the next chunk completes the secret it is replaced like any other. What is still held back when the stream
        ends goes out through `release_held()`."""
        key = (type(chunk), chunk.turn, chunk.step)
        text = self._carry.pop(key, "") + chunk.delta
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        longest = min(len(self._secrets[0]) - 1, len(text))
        for start in range(len(text) - longest, len(text)):
            tail = text[start:]
            if any(secret.startswith(tail) for secret in self._secrets):
                self._carry[key] = tail
                return text[:start]
        return text

    @property
    def holding(self) -> bool:
        return bool(self._carry)

    def release_held(self) -> list[AnyEvent]:
        """The text held back at the end of each chunk stream, as chunk events; the session appends them (with
        `hold_back=False`) before the event that ends the streams, so the chunks still add up to the whole text. What
        is held is shorter than any secret and no secret was completed after it: it is not one."""
        held = [kind(turn=turn, step=step, delta=text) for (kind, turn, step), text in self._carry.items() if text]
        self._carry.clear()
        return held

    def _encode(self, event: AnyEvent) -> bytes:
        encode = encode_event if type(event) is IgnorableEvent else encoder.encode
        try:
            data = encode(event)
        except UnicodeEncodeError:  # a lone surrogate from outside: store U+FFFD in its place
            clean_struct(event, self._secrets)
            return encode(event)
        if self._secrets and any(s in data for s in self._secret_json):
            clean_struct(event, self._secrets)
            data = encode(event)
        return data

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
                # Appends made while the final flush runs are accepted too: flush again until none is left (no await
                # between the last check and `closed`), so nothing accepted is silently dropped.
                while self.durable_seq < self._next_seq - 1:
                    await self.flush()
        finally:
            self.closed = True
            self._closing.set()
            self._wake.set()
            if self._task is not None:
                with anyio.CancelScope(shield=True):
                    await self._task
                self._task = None
            if self._thread is not None:
                self._thread.stop()
            self._writer.close()

    def close_now(self) -> None:
        """Synchronous last resort when no event loop is left (a UI that exited without its ordered shutdown):
        write and sync what is queued, close the writer."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._pending:
                self._writer.append(self._pending[self._written :], durable=True)
                self.durable_seq = self._pending[-1][0]
                self._pending.clear()
                self._written = 0
        finally:
            self._writer.close()

    async def _write_behind(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = asyncio.Event()
            if self.closed:
                return
            with anyio.move_on_after(self.window):
                await self._closing.wait()  # gather appends for one window; a close ends it early
            if self.closed:
                return
            self._armed = False  # appends from here on wake the next round
            try:
                await self._write(durable=False)
            except Exception:
                pass  # recorded in last_error; the events stay queued and the next write or barrier retries them

    # -- writing ---------------------------------------------------------------------------------------------------

    def _inline(self) -> bool:
        return self._io_cost < INLINE_IO_BUDGET and self._writer.inline_safe

    async def _write(self, durable: bool) -> None:
        with anyio.CancelScope(shield=True):
            if self._io is None:
                self._io = anyio.Lock()
            async with self._io:
                if self._inline():
                    self._write_now(durable)
                    return
                batch = self._pending[self._written :]
                if not batch and (not durable or not self._pending):
                    return
                if self._thread is None:
                    self._thread = WriterThread()
                call = self._thread.submit(self._timed_append, batch, durable)
                cancelled = None
                if not (durable and self._io_cost < INLINE_IO_BUDGET and call.wait(BLOCKING_WAIT)):
                    cancelled = await _outlast(self._thread.settled(call))
                try:
                    n = call.result()
                except BaseException as e:
                    self._failed(e)
                    if cancelled is not None:
                        raise cancelled from e
                    raise
                self._written_ok(len(batch), n, durable)
                if cancelled is not None:
                    raise cancelled

    def _write_now(self, durable: bool) -> None:
        """The whole write on the event loop, with no await: nothing can interleave with it."""
        batch = self._pending[self._written :]
        if not batch and (not durable or not self._pending):
            return
        try:
            n = self._timed_append(batch, durable)
        except BaseException as e:
            self._failed(e)
            raise
        self._written_ok(len(batch), n, durable)

    def _failed(self, error: BaseException) -> None:
        self._written = 0  # the backend rewinds to its last durable point; re-send from there
        self.stats.failures += 1
        self.last_error = error

    def _written_ok(self, count: int, nbytes: int, durable: bool) -> None:
        self.stats.writes += 1
        self.stats.bytes += nbytes
        self._written += count
        if durable:
            self.stats.fsyncs += 1
            self.durable_seq = self._pending[self._written - 1][0]
            del self._pending[: self._written]
            self._written = 0
        self.last_error = None

    def _timed_append(self, batch: list[EncodedEvent], durable: bool) -> int:
        start = _time.perf_counter()
        try:
            return self._writer.append(batch, durable)
        finally:
            self._io_cost = 0.7 * self._io_cost + 0.3 * (_time.perf_counter() - start)

    async def flush(self) -> None:
        """Barrier: return once every event appended before the call is durable; raise CheckpointFailed otherwise."""
        if self.closed:
            raise CoordinatorClosed()
        target = self._next_seq - 1
        if self.durable_seq >= target:
            return
        if self._inflight is None and not (self._io is not None and self._io.locked()) and self._inline():
            # fast path: nobody to share with and nothing to wait for, so no bookkeeping for joiners either
            try:
                self._write_now(durable=True)
            except Exception as e:
                raise CheckpointFailed(e) from e
            return
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
