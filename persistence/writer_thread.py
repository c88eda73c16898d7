"""One long-lived thread for the backend calls a coordinator must keep off the event loop.

A network round trip (PostgreSQL) or a slow disk must not stall the event loop, and so the TUI, for long, so those
calls run in a thread. `anyio.to_thread` pays for a general-purpose pool at every call: ~60-90 us here, a quarter of a
whole durable commit on a fast local server (P1 on PostgreSQL in docs/benchmarks.md). A coordinator's calls are already
serialized, so one thread of its own is enough.

The caller may first wait for the answer synchronously, for a bounded time (`Call.wait`): the event loop stalls no
longer than that, and a quick call comes back without a trip through the event loop (no self-pipe wake-up, no extra
task switch, no interpreter-lock contention with the loop while the thread works). A call still running then is
awaited (`Call.settled`), and answers through `call_soon_threadsafe`.

The thread ends after IDLE_EXIT seconds without work, or at `stop()`, so a coordinator that is never closed leaves
nothing running for long; the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

IDLE_EXIT = 10.0  # seconds


class Call:
    """One call handed to the thread: its outcome, and the two ways to wait for it."""

    __slots__ = ("_fn", "_args", "_value", "_error", "_done", "_finished", "_future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn = fn
        self._args = args
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = False
        self._finished = threading.Lock()
        self._finished.acquire()  # released by the thread when the call has ended
        self._future: asyncio.Future[None] | None = None  # set when someone awaits the call

    def wait(self, timeout: float) -> bool:
        """Block this thread until the call ends, at most `timeout` seconds; True if it has ended."""
        return self._done or self._finished.acquire(timeout=timeout)

    def result(self) -> Any:
        """The call's value, or its exception raised (only once it has ended)."""
        if self._error is not None:
            raise self._error
        return self._value


class WriterThread:
    def __init__(self, name: str = "cairn-writer") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        # guards `_running` against a thread deciding to exit as a call arrives, and a call's end against an awaiter
        # arriving at that moment
        self._lock = threading.Lock()
        self._running = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Call:
        """Start `fn(*args)` in the thread."""
        call = Call(fn, args)
        with self._lock:
            self._queue.put(call)
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        return call

    def settled(self, call: Call) -> "asyncio.Future[None]":
        """A future of the running loop, done when `call` has ended (at once if it has)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if call._done:
                future.set_result(None)
            else:
                call._future = future
        return future

    def stop(self) -> None:
        """Let the thread end once the calls already queued are done."""
        with self._lock:
            if self._running:
                self._queue.put(None)

    def _serve(self) -> None:
        while True:
            try:
                call = self._queue.get(timeout=IDLE_EXIT)
            except queue.Empty:
                call = None
            if call is None:
                with self._lock:
                    if self._queue.empty():  # nothing arrived while we decided: end (a later call starts a new one)
                        self._running = False
                        return
                continue
            try:
                call._value = call._fn(*call._args)
            except BaseException as e:  # handed to the caller, which re-raises it
                call._error = e
            with self._lock:
                call._done = True
                future = call._future
            call._finished.release()
            if future is not None:
                try:
                    future.get_loop().call_soon_threadsafe(_settle, future)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass


def _settle(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
