"""Storage faults injected through the backends' own seams (GUIDE §5): a `FileOps` for JSONL, a connection factory for
SQLite. No internals are patched.

Whatever fails (ENOSPC or EIO at write or at fdatasync, a failed SQLite commit), the barrier raises CheckpointFailed, the
events stay queued, the next barrier succeeds, and the log holds every event exactly once, in order.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import anyio
import pytest
from waiting import wait_until

from cairn.persistence.errors import CheckpointFailed, StoreUnavailable
from cairn.persistence.events import (
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    StepStart,
    ToolCall,
    ToolCallRequest,
    TurnStart,
    encode_event,
    raw_decoder,
)
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.session import LiveSession
from cairn.persistence.sqlite import BUSY_TIMEOUT, SqliteBackend
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

LONG = 3600.0  # a write-behind window so long that only barriers write


class FaultyOps(FileOps):
    """Raises `OSError(code)` once on the armed operation. A `partial` write fault first makes a short write (as a
    filling disk does) of one whole line and the first byte of the next, so a complete but non-durable line and a torn
    one are really on disk when the error comes."""

    def __init__(self) -> None:
        self.armed: tuple[str, int, bool] | None = None
        self.fired = 0

    def arm(self, op: str, code: int, partial: bool = False) -> None:
        self.armed = (op, code, partial)

    def _maybe_fail(self, op: str) -> None:
        if self.armed and self.armed[0] == op:
            code = self.armed[1]
            self.armed = None
            self.fired += 1
            raise OSError(code, f"injected {errno.errorcode[code]} at {op}")

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        if path.endswith(".lock"):
            self._maybe_fail("open-lock")
        return super().open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        cut = bytes(data).find(b"\n") + 2
        if self.armed and self.armed[0] == "write" and self.armed[2] and 1 < cut < len(data):
            self.armed = ("write", self.armed[1], False)  # the next call fails
            return super().write(fd, data[:cut])
        self._maybe_fail("write")
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync")
        super().fdatasync(fd)


class FaultyCommit:
    def __init__(self) -> None:
        self.armed = False
        self.fired = 0
        self.inline_safe = True

        self.sql = "COMMIT"
        self.message = "disk I/O error"

    def arm(self, sql: str = "COMMIT", message: str = "disk I/O error") -> None:
        self.armed, self.sql, self.message = True, sql, message

    def connect(self, path: str) -> sqlite3.Connection:
        fault = self

        class FaultyConnection(sqlite3.Connection):
            inline_safe = fault.inline_safe

            def execute(self, sql, *args):
                if sql == fault.sql and fault.armed:
                    fault.armed = False
                    fault.fired += 1
                    raise sqlite3.OperationalError(fault.message)
                return super().execute(sql, *args)

        # the same arguments as persistence.sqlite.default_connect
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT,
                               factory=FaultyConnection)


FAULTS = {
    # name: (backend, op, errno, partial)
    "jsonl-write-ENOSPC": ("jsonl", "write", errno.ENOSPC, False),
    "jsonl-write-EIO": ("jsonl", "write", errno.EIO, False),
    "jsonl-short-write-then-ENOSPC": ("jsonl", "write", errno.ENOSPC, True),
    "jsonl-fdatasync-ENOSPC": ("jsonl", "fdatasync", errno.ENOSPC, False),
    "jsonl-fdatasync-EIO": ("jsonl", "fdatasync", errno.EIO, False),
    "sqlite-commit": ("sqlite", "commit", None, False),
}


class Rig:
    """A store whose backend has a fault seam, plus the knob to fire it."""

    def __init__(self, home: Path, fault: str, io: str = "inline") -> None:
        """`io`: "inline" lets the coordinator write on the event loop while the disk is fast (its default);
        "thread" makes the seam inline-unsafe, so every write goes through a worker thread."""
        self.backend_name, self.op, self.code, self.partial = FAULTS[fault]
        if self.backend_name == "jsonl":
            self.ops = FaultyOps()
            self.ops.inline_safe = io == "inline"
            self.store = SessionStore(home, JsonlBackend(home, ops=self.ops))
        else:
            self.commit = FaultyCommit()
            self.commit.inline_safe = io == "inline"
            self.store = SessionStore(home, SqliteBackend(home, connect=self.commit.connect))

    def arm(self) -> None:
        if self.backend_name == "jsonl":
            self.ops.arm(self.op, self.code, self.partial)
        else:
            self.commit.arm()

    @property
    def fired(self) -> int:
        return self.ops.fired if self.backend_name == "jsonl" else self.commit.fired

    def check_cause(self, error: BaseException) -> None:
        if self.backend_name == "jsonl":
            assert isinstance(error, OSError) and error.errno == self.code
        else:
            assert isinstance(error, sqlite3.OperationalError) and "disk I/O error" in str(error)

    def stored(self, session_id: str = "s") -> list[bytes]:
        """What a separate, fault-free reader finds on disk."""
        fresh = SessionStore(self.store.home, self.backend_name)
        return [encode_event(e) for e in fresh.backend.load(session_id).events]

    def assert_exactly(self, events: list[AnyEvent], session_id: str = "s") -> None:
        assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
        assert self.stored(session_id) == [encode_event(e) for e in events]
        if self.backend_name == "jsonl":  # no partial or garbage line anywhere
            data = self.store.backend.path(session_id).read_bytes()
            assert data.endswith(b"\n")
            lines = data.split(b"\n")[:-1]
            assert len(lines) == 1 + len(events)
            assert [raw_decoder.decode(line)["seq"] for line in lines[1:]] == [e.seq for e in events]


def chunks(n: int, start: int = 0) -> list[AnyEvent]:
    return [AssistantChunk(turn=1, step=1, delta=f"chunk {i} " + "x" * 40) for i in range(start, start + n)]


IO_PATHS = ["inline", "thread"]


@pytest.mark.parametrize("io", IO_PATHS)
@pytest.mark.parametrize("prewritten", [False, True], ids=["queued", "written-not-durable"])
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_failed_barrier_keeps_events_and_the_next_one_succeeds(tmp_path, fault, prewritten, io):
    rig = Rig(tmp_path, fault, io)
    async with LiveSession(rig.store.create("/w", "s"), window=0.005 if prewritten else LONG) as live:
        first = [live.append(e) for e in chunks(3)]
        if prewritten:  # let write-behind hand them to the OS (no fsync) before the failing barrier
            await wait_until(lambda: len(rig.stored()) == 3, "write-behind")
            assert live.coordinator.stats.fsyncs == 0
            live.coordinator.window = LONG
        second = [live.append(e) for e in chunks(3, start=3)]
        rig.arm()

        with pytest.raises(CheckpointFailed) as info:
            await live.flush()

        assert rig.fired == 1
        rig.check_cause(info.value.cause)
        if rig.partial:  # the failed write really left a torn line behind
            assert rig.store.backend.load("s").torn_bytes == 1
        assert live.coordinator.queued == 6  # retained, in order
        assert live.coordinator.durable_seq == -1

        await live.flush()

        assert live.coordinator.queued == 0
        rig.assert_exactly(first + second)
        third = [live.append(e) for e in chunks(2, start=6)]
        await live.flush()

    rig.assert_exactly(first + second + third)


@pytest.mark.parametrize("io", IO_PATHS)
@pytest.mark.parametrize("fault", ["jsonl-short-write-then-ENOSPC", "jsonl-write-EIO", "sqlite-commit"])
async def test_failed_write_behind_is_retried_by_the_next_barrier(tmp_path, fault, io):
    rig = Rig(tmp_path, fault, io)
    async with LiveSession(rig.store.create("/w", "s"), window=0.005) as live:
        rig.arm()
        appended = [live.append(e) for e in chunks(4)]
        await wait_until(lambda: live.coordinator.stats.failures == 1, "the write-behind attempt to fail")

        assert rig.fired == 1
        rig.check_cause(live.coordinator.last_error)
        if rig.partial:
            assert rig.store.backend.load("s").torn_bytes == 1
        assert live.coordinator.queued == 4

        await live.flush()

        assert live.coordinator.queued == 0
        rig.assert_exactly(appended)


@pytest.mark.parametrize("fault", ["jsonl-fdatasync-EIO", "jsonl-short-write-then-ENOSPC", "sqlite-commit"])
async def test_failed_create_leaves_no_session_and_no_lock(tmp_path, fault):
    rig = Rig(tmp_path, fault)
    rig.arm()

    with pytest.raises(StoreUnavailable) as info:  # one readable line for the CLI (exit 2), the cause kept
        rig.store.create("/w", "s")

    assert rig.fired == 1
    rig.check_cause(info.value.cause)
    assert not rig.store.exists("s")
    async with LiveSession(rig.store.create("/w", "s")) as live:  # neither a half session nor a lock in the way
        live.append(TurnStart(turn=1))
    rig.assert_exactly(live.events)


@pytest.mark.parametrize("fault", ["jsonl-fdatasync-ENOSPC", "jsonl-short-write-then-ENOSPC", "sqlite-commit"])
async def test_failed_repair_commit_can_be_retried(tmp_path, fault):
    """open_for_resume could not commit the repair: it raises, releases the session, and the next open repairs it
    exactly once."""
    rig = Rig(tmp_path, fault)
    async with LiveSession(rig.store.create("/w", "s")) as live:
        for event in [
            TurnStart(turn=1),
            StepStart(turn=1, step=1),
            AssistantMessage(turn=1, step=1, text="", tool_calls=[ToolCallRequest("c", "run_command", {})],
                             interrupted=False),
            ToolCall(turn=1, step=1, call_id="c", name="run_command", arguments={}, safety="side_effecting",
                     parent_call_id=None),
        ]:
            live.append(event)
    crashed = list(live.events)
    expected_repair = [encode_event(e) for e in rig.store.inspect("s").repair]
    assert len(expected_repair) == 3  # tool/result OUTCOME_UNKNOWN, step/end, turn/end
    rig.arm()

    with pytest.raises(StoreUnavailable) as info:
        rig.store.open_for_resume("s")

    assert rig.fired == 1
    rig.check_cause(info.value.cause)
    assert "\n" not in str(info.value)
    opened = rig.store.open_for_resume("s")
    opened.writer.close()
    opened.lock.release()
    events = rig.store.inspect("s").events
    assert [encode_event(e) for e in events] == [encode_event(e) for e in crashed] + expected_repair
    rig.assert_exactly(events)


async def test_unwritable_store_is_refused_up_front(tmp_path, backend_name):
    """A home that cannot hold a directory (it lies under a regular file: mkdir fails with ENOTDIR, even for root,
    unlike permission bits) is reported as StoreUnavailable before anything is opened."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    home = blocker / "home"
    store = SessionStore(home, backend_name)

    with pytest.raises(StoreUnavailable) as info:
        store.backend.check_writable()
    assert str(home) in str(info.value)
    for attempt in (lambda: store.create("/w", "s"), lambda: store.open_for_resume("s")):
        with pytest.raises(StoreUnavailable):
            attempt()
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_failure_creating_the_lock_file_is_store_unavailable(tmp_path, code):
    """The lock file is created through the backend's FileOps seam: a full or failing disk there is one line (exit 2),
    and leaves neither a session nor a lock behind."""
    rig = Rig(tmp_path, "jsonl-write-ENOSPC")
    rig.ops.arm("open-lock", code)

    with pytest.raises(StoreUnavailable) as info:
        rig.store.create("/w", "s")

    assert rig.fired == 1 and info.value.cause.errno == code
    assert "s.lock" in str(info.value) and "\n" not in str(info.value)
    assert not rig.store.exists("s")
    release_all = rig.store.create("/w", "s")
    release_all.writer.close()
    release_all.lock.release()


@pytest.mark.parametrize("message", ["database or disk is full", "disk I/O error"])
@pytest.mark.parametrize("opening", ["create", "resume"])
async def test_failure_at_the_wal_pragma_is_store_unavailable(tmp_path, message, opening):
    rig = Rig(tmp_path, "sqlite-commit")
    if opening == "resume":
        opened = rig.store.create("/w", "s")
        opened.writer.close()
        opened.lock.release()
    rig.commit.arm("PRAGMA journal_mode=WAL", message)

    with pytest.raises(StoreUnavailable) as info:
        rig.store.create("/w", "s") if opening == "create" else rig.store.open_for_resume("s")

    assert rig.commit.fired == 1 and message in str(info.value)
    assert isinstance(info.value.cause, sqlite3.OperationalError)
    opened = rig.store.open_for_resume("s") if opening == "resume" else rig.store.create("/w", "s")  # lock released
    opened.writer.close()
    opened.lock.release()
