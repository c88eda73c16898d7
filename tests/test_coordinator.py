"""The write coordinator (SPEC §1, §3) over both real backends: write-behind, barriers, group commit, failures, close
and cancellation.

The backends are given their ordinary seams (JSONL: a `FileOps`; SQLite: a connection factory) wrapped so a test can
count real fdatasyncs, hold a barrier inside its I/O (a gate), or make the next durable write fail.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import threading
import time
from pathlib import Path

import anyio
import pytest
from waiting import wait_until

from cairn.persistence.coordinator import CoordinatorClosed
from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import AnyEvent, AssistantChunk, StepStart, TurnStart, encode_event
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.session import LiveSession
from cairn.persistence.sqlite import SqliteBackend
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

LONG = 3600.0  # a write-behind window so long that only barriers (and close) write


class Seam:
    """Test control over the one durable operation of a backend (fdatasync / a FULL commit)."""

    def __init__(self) -> None:
        self.syncs = 0  # real fdatasync calls (JSONL only)
        self.fail_next = 0  # how many coming durable operations raise
        self.hold = False  # the next durable operation waits at the gate
        self.entered = threading.Event()
        self.release = threading.Event()

    def durable_op(self, make_error) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(20), "the test never released the gate"
        if self.fail_next:
            self.fail_next -= 1
            raise make_error()


class SeamOps(FileOps):
    inline_safe = False  # the gate holds a durable operation: keep it off the event loop

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def fdatasync(self, fd: int) -> None:
        self.seam.durable_op(lambda: OSError(errno.EIO, "injected I/O error"))
        super().fdatasync(fd)
        self.seam.syncs += 1


def seam_connect(seam: Seam):
    class SeamConnection(sqlite3.Connection):
        durable = True  # tracks the writer's PRAGMA synchronous, so only FULL commits go through the seam
        inline_safe = False  # the gate holds a commit: keep it off the event loop

        def execute(self, sql, *args):
            if sql.startswith("PRAGMA synchronous="):
                self.durable = sql.endswith("FULL")
            elif sql == "COMMIT" and self.durable:
                seam.durable_op(lambda: sqlite3.OperationalError("disk I/O error"))
            return super().execute(sql, *args)

    def connect(path: str) -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0,
                               factory=SeamConnection)

    return connect


def make_store(home: Path, backend_name: str) -> tuple[SessionStore, Seam]:
    seam = Seam()
    if backend_name == "jsonl":
        backend = JsonlBackend(home, ops=SeamOps(seam))
    else:
        backend = SqliteBackend(home, connect=seam_connect(seam))
    return SessionStore(home, backend), seam


def chunks(n: int, start: int = 0) -> list[AnyEvent]:
    return [AssistantChunk(turn=1, step=1, delta=f"chunk {i}") for i in range(start, start + n)]


def stored(store: SessionStore, session_id: str = "s") -> list[bytes]:
    """What a separate reader finds on disk right now, event by event."""
    return [encode_event(e) for e in SessionStore(store.home, store.backend.name).backend.load(session_id).events]


async def test_concurrent_flushes_share_one_fsync(tmp_path, backend_name):
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s")) as live:
        syncs_before = seam.syncs
        appended = [live.append(e) for e in chunks(8)]
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(live.flush)

        assert live.coordinator.stats.fsyncs <= 2
        assert live.coordinator.stats.failures == 0
        if backend_name == "jsonl":
            assert seam.syncs - syncs_before <= 2
        assert live.coordinator.queued == 0
        assert live.coordinator.durable_seq == appended[-1].seq
        assert stored(store) == [encode_event(e) for e in appended]


async def test_parallel_barriers_each_after_its_own_append_group_commit(tmp_path, backend_name):
    """Like parallel read-only tool checkpoints: each task appends its tool/call, then asks for a barrier. The first
    barrier is held inside its I/O while the seven others arrive, the worst case for sharing."""
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        syncs_before = seam.syncs
        durable_when_returned = []

        async def tool(i: int) -> None:
            event = live.append(AssistantChunk(turn=1, step=1, delta=f"call {i}"))
            await live.flush()
            durable_when_returned.append(live.coordinator.durable_seq >= event.seq)

        seam.hold = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(tool, 0)
            await anyio.to_thread.run_sync(seam.entered.wait, 20)
            for i in range(1, 8):
                tg.start_soon(tool, i)
            await wait_until(lambda: len(live.events) == 8, "all eight tools to append")
            seam.release.set()

        assert durable_when_returned == [True] * 8
        assert live.coordinator.stats.fsyncs <= 2
        if backend_name == "jsonl":
            assert seam.syncs - syncs_before <= 2
        assert [e.seq for e in live.events] == list(range(8))
        assert stored(store) == [encode_event(e) for e in live.events]


async def test_write_behind_reaches_the_os_without_fsync(tmp_path, backend_name):
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=0.01) as live:
        syncs_before = seam.syncs
        appended = [live.append(e) for e in chunks(5)]

        # the rows can be visible a moment before the write call returns to the coordinator (worker thread)
        await wait_until(lambda: len(stored(store)) == 5 and live.coordinator.stats.writes >= 1,
                         "write-behind to reach the file")

        assert stored(store) == [encode_event(e) for e in appended]
        assert live.coordinator.stats.fsyncs == 0
        assert live.coordinator.stats.writes >= 1
        assert seam.syncs == syncs_before
        assert live.coordinator.queued == 5  # written, not yet durable: still held for the next barrier
        assert live.coordinator.durable_seq == -1


async def test_failed_barrier_keeps_order_and_the_next_one_retries(tmp_path, backend_name):
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        first = [live.append(e) for e in chunks(3)]
        seam.fail_next = 1
        with pytest.raises(CheckpointFailed):
            await live.flush()
        assert live.coordinator.queued == 3

        second = [live.append(e) for e in chunks(2, start=3)]
        seam.fail_next = 1
        with pytest.raises(CheckpointFailed):
            await live.flush()
        assert live.coordinator.queued == 5
        assert live.coordinator.durable_seq == -1

        third = [live.append(e) for e in chunks(1, start=5)]
        await live.flush()

        assert live.coordinator.queued == 0
        assert live.coordinator.stats.failures == 2
        assert stored(store) == [encode_event(e) for e in first + second + third]


async def test_events_appended_during_a_failing_barrier_are_not_dropped(tmp_path, backend_name):
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        before = [live.append(e) for e in chunks(2)]
        seam.hold, seam.fail_next = True, 1
        outcome = []

        async def barrier() -> None:
            try:
                await live.flush()
            except CheckpointFailed as e:
                outcome.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(barrier)
            await anyio.to_thread.run_sync(seam.entered.wait, 20)
            during = [live.append(e) for e in chunks(2, start=2)]  # while the failing write is in flight
            seam.release.set()

        assert len(outcome) == 1
        assert live.coordinator.queued == 4
        await live.flush()
        assert stored(store) == [encode_event(e) for e in before + during]


async def test_close_drains_unflushed_events(tmp_path, backend_name):
    store, _ = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        appended = [live.append(e) for e in chunks(5)]
        assert stored(store) == []  # nothing written yet: no barrier, and the window never ends

    assert stored(store) == [encode_event(e) for e in appended]
    assert live.coordinator.stats.fsyncs == 1


async def test_events_appended_while_closing_are_written_or_refused(tmp_path, backend_name):
    """An append racing with close must not be accepted and then lost."""
    store, seam = make_store(tmp_path, backend_name)
    live = LiveSession(store.create("/w", "s"), window=LONG)
    late: list[AnyEvent | Exception] = []

    async def owner() -> None:
        async with live:
            live.append(TurnStart(turn=1))
            seam.hold = True  # the final flush of close waits at the gate

    async def latecomer() -> None:
        await anyio.to_thread.run_sync(seam.entered.wait, 20)
        try:
            late.append(live.append(StepStart(turn=1, step=1)))
        except CoordinatorClosed as e:
            late.append(e)
        seam.release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(owner)
        tg.start_soon(latecomer)

    on_disk = stored(store)
    if isinstance(late[0], CoordinatorClosed):
        assert len(on_disk) == 1
    else:
        assert on_disk == [encode_event(e) for e in live.events] and len(on_disk) == 2


async def test_flush_and_append_after_close_raise(tmp_path, backend_name):
    store, _ = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s")) as live:
        live.append(TurnStart(turn=1))

    assert not live.live
    with pytest.raises(CoordinatorClosed):
        await live.flush()
    with pytest.raises(CoordinatorClosed):
        live.append(StepStart(turn=1, step=1))
    assert len(stored(store)) == 1 and len(live.events) == 1


async def test_cancelled_barrier_callers_leave_a_consistent_log(tmp_path, backend_name):
    """Cancel both the task performing a barrier (its I/O is in a thread) and a task that joined it. The write still
    completes exactly once, and the session keeps working."""
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        first = [live.append(e) for e in chunks(3)]
        seam.hold = True
        scopes: dict[str, anyio.CancelScope] = {}
        finished = []

        async def barrier(name: str) -> None:
            with anyio.CancelScope() as scope:
                scopes[name] = scope
                await live.flush()
                finished.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(barrier, "performer")
            await anyio.to_thread.run_sync(seam.entered.wait, 20)
            tg.start_soon(barrier, "joiner")
            await wait_until(lambda: "joiner" in scopes, "the joiner to start waiting")
            await anyio.sleep(0)
            scopes["joiner"].cancel()
            scopes["performer"].cancel()
            seam.release.set()

        assert "joiner" not in finished  # it was waiting, so it left at once
        # the barrier that had started finished its I/O: everything appended before it is durable
        assert live.coordinator.durable_seq == first[-1].seq
        assert live.coordinator.queued == 0
        assert live.coordinator.stats.failures == 0
        assert stored(store) == [encode_event(e) for e in first]

        more = [live.append(e) for e in chunks(2, start=3)]
        await live.flush()
        assert live.coordinator.stats.fsyncs == 2

    assert stored(store) == [encode_event(e) for e in first + more]
    assert [e.seq for e in live.events] == list(range(5))


async def test_natively_cancelled_barrier_still_records_its_write(tmp_path, backend_name):
    """An asyncio `task.cancel()` (what cancels a Textual worker) reaches the task even inside the barrier's shielded
    scope. The write goes on in its thread regardless; the coordinator waits for it and records it before the
    cancellation goes through, so the next write does not send the same events a second time."""
    store, seam = make_store(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s"), window=LONG) as live:
        first = [live.append(e) for e in chunks(3)]
        seam.hold = True
        task = asyncio.get_running_loop().create_task(live.flush())
        await anyio.to_thread.run_sync(seam.entered.wait, 20)
        task.cancel()
        await anyio.sleep(0.05)
        assert not task.done()  # it waits for the write in flight instead of leaving it behind
        seam.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

        assert live.coordinator.durable_seq == first[-1].seq
        assert live.coordinator.queued == 0 and live.coordinator.stats.failures == 0
        more = [live.append(e) for e in chunks(2, start=3)]
        await live.flush()

    assert stored(store) == [encode_event(e) for e in first + more]


async def test_close_now_drains_synchronously_and_releases_the_lock(tmp_path, backend_name):
    """The last-resort close without an event loop turn: queued events become durable and the session is free."""
    store, _ = make_store(tmp_path, backend_name)
    live = LiveSession(store.create("/w", "s"), window=LONG)  # never entered: no write-behind task to leave behind
    appended = [live.append(e) for e in chunks(4)]

    live.close_now()

    assert stored(store) == [encode_event(e) for e in appended]
    assert live.coordinator.queued == 0 and live.coordinator.durable_seq == appended[-1].seq
    with pytest.raises(CoordinatorClosed):
        await live.flush()
    opened = store.open_for_resume("s")  # the lock was released
    opened.writer.close()
    opened.lock.release()
    assert opened.events == appended
