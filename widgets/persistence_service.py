"""The persistence-service widget: owner of a live session's write queue inside the TUI.

Every barrier the policy asks for becomes a `Barrier` message carrying a future; this widget handles its messages one at
a time (its message queue *is* the serialized write queue), performs the flush through the coordinator, and resolves
the future. Concurrent barriers arrive as several messages: the first flush makes them all durable, the rest find
nothing left to sync, so N barriers cost one fsync. A closed service refuses barriers with an error, never a hang.
"""

from __future__ import annotations

import asyncio

from textual.message import Message
from textual.widget import Widget

from cairn.persistence.coordinator import CoordinatorClosed
from cairn.persistence.errors import CheckpointFailed, StaleWriter
from cairn.persistence.session import LiveSession

WRITE_BEHIND_DELAY = 0.2  # seconds after the first frame before write-behind starts (see on_mount)


class PersistenceService(Widget):
    DEFAULT_CSS = "PersistenceService { display: none; }"

    class Barrier(Message, bubble=False):
        def __init__(self, future: asyncio.Future[None]) -> None:
            super().__init__()
            self.future = future

    class DurabilityChanged(Message):
        """Posted to the parent after every barrier (and when one starts): for the status bar."""

        def __init__(self, state: str, durable_seq: int, error: str | None = None, fenced: bool = False) -> None:
            super().__init__()
            self.state = state  # "writing", "durable", "failed", "closed"
            self.durable_seq = durable_seq
            self.error = error
            self.fenced = fenced  # failed for good: another writer took the session over (StaleWriter)

    def __init__(self, session: LiveSession) -> None:
        super().__init__()
        self.session = session
        self.closed = False
        self.barriers_handled = 0
        self.fenced: str | None = None  # why the close wrote nothing: another writer took the session over

    def on_mount(self) -> None:
        # write-behind a moment after the first frame: its first wait loads anyio's asyncio backend (~20-30 ms in one
        # block, start-up P8); appends made before then are queued and written when it starts, and a barrier flushes
        # without it
        self.call_after_refresh(self.set_timer, WRITE_BEHIND_DELAY, self.session.coordinator.start)
        self.session.route_barriers(self.request_barrier)

    async def request_barrier(self) -> None:
        """Called by the policy (from the agent worker): post a barrier and wait until it is durable."""
        if self.closed:
            raise CheckpointFailed(CoordinatorClosed())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # "writing" goes into this widget's queue *ahead of* the barrier, so it reaches the status bar while the flush
        # runs (posted after it, it would wait behind the flush and be overwritten at once by "durable").
        self.post_message(self.DurabilityChanged("writing", self.session.coordinator.durable_seq))
        if not self.post_message(self.Barrier(future)):
            raise CheckpointFailed(CoordinatorClosed())
        await future

    async def on_persistence_service_barrier(self, message: Barrier) -> None:
        future = message.future
        self.barriers_handled += 1
        try:
            if self.closed:
                raise CheckpointFailed(CoordinatorClosed())
            await self.session.coordinator.flush()
        except Exception as e:
            if not future.done():
                future.set_exception(e)
            fenced = isinstance(getattr(e, "cause", e), StaleWriter)
            self.post_message(self.DurabilityChanged("failed", self.session.coordinator.durable_seq, str(e), fenced))
        else:
            if not future.done():
                future.set_result(None)
            self.post_message(self.DurabilityChanged("durable", self.session.coordinator.durable_seq))

    async def close(self) -> None:
        """Final flush, close the store, release the lock. Later barriers are refused."""
        if self.closed:
            return
        self.closed = True
        try:
            await self.session.__aexit__(None, None, None)
        except CheckpointFailed as e:
            if not isinstance(e.cause, StaleWriter):
                raise
            self.fenced = str(e)  # by design: the screen said so; `cairn` says it again once the TUI is gone (exit 3)
        finally:
            self.post_message(self.DurabilityChanged("closed", self.session.coordinator.durable_seq))
