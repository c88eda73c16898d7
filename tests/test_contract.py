"""The storage contract (SPEC §2, §4, §5), one suite run against every backend through `SessionStore` and `LiveSession`.

Everything here goes through real files, a real SQLite database and a real PostgreSQL server (a private schema per
test). Where a test needs a log that Cairn itself would never write (an unknown event type, a newer format), it edits
storage directly: raw lines for JSONL, SQL for SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from cairn.persistence.errors import (
    CorruptLog,
    InvalidSessionId,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    UnsupportedFormat,
)
from cairn.persistence.events import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    IgnorableEvent,
    NonFiniteNumber,
    RecoveryVerdict,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnError,
    TurnStart,
    UserMessage,
    encode_event,
    raw_decoder,
    to_builtins,
)
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend_name(request):
    """Every backend; `postgres` gets a private schema through CAIRN_DATABASE_URL (child processes inherit it)."""
    if request.param == "postgres":
        request.getfixturevalue("pg_database_url")
    return request.param


def pg(store: SessionStore):
    """A plain psycopg connection to the store's PostgreSQL schema (to look at or tamper with rows)."""
    from pg_helpers import connect_to

    return connect_to(store.backend.url)


# -- helpers -----------------------------------------------------------------------------------------------------------


def complete_turn(turn: int, prompt: str) -> list[AnyEvent]:
    return [
        TurnStart(turn=turn),
        StepStart(turn=turn, step=1),
        UserMessage(turn=turn, step=1, text=prompt),
        RequestHeader(
            turn=turn, step=1, provider="demo", model="demo-1", params={"temperature": 0.2}, tools=["read_file"],
            message_count=1,
        ),
        AssistantChunk(turn=turn, step=1, delta="Hi"),
        AssistantMessage(turn=turn, step=1, text="Hi", tool_calls=[], interrupted=False),
        StepEnd(turn=turn, step=1),
        TurnEnd(turn=turn, reason="completed", error=None),
    ]


def open_turn(turn: int, prompt: str) -> list[AnyEvent]:
    """A turn cut short by a crash after the model answered, before any tool ran."""
    return complete_turn(turn, prompt)[:6]


async def write_session(store: SessionStore, session_id: str, events: list[AnyEvent], **create_args) -> list[AnyEvent]:
    async with LiveSession(store.create("/work/project", session_id, **create_args)) as live:
        for event in events:
            live.append(event)
        await live.flush()
    return live.events


async def resume_and_append(store: SessionStore, session_id: str, events: list[AnyEvent]) -> LiveSession:
    async with LiveSession(store.open_for_resume(session_id)) as live:
        for event in events:
            live.append(event)
        await live.flush()
    return live


def release(opened) -> None:
    opened.writer.close()
    opened.lock.release()


def db_path(store: SessionStore) -> Path:
    return store.home / "sessions.sqlite3"


def stored_bytes(store: SessionStore, session_id: str) -> tuple[bytes, ...]:
    """What the backend holds on disk for the session. For SQLite the main file plus committed WAL frames (absent and
    empty WAL are the same state; a read-only connection may leave an empty one)."""
    if store.backend.name == "jsonl":
        return (store.backend.path(session_id).read_bytes(),)
    if store.backend.name == "postgres":
        with pg(store) as conn:
            session = conn.execute("SELECT id, cwd, created, updated, header FROM sessions WHERE id = %s",
                                   (session_id,)).fetchall()
            rows = conn.execute("SELECT seq, time, type, body FROM events WHERE session_id = %s ORDER BY seq",
                                (session_id,)).fetchall()
        return tuple(session), tuple(rows)
    db = db_path(store)
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes(), wal.read_bytes() if wal.exists() else b""


def unchecked(bodies: list[bytes]) -> list[bytes]:
    """Stored bodies without the damage check the last event of a durable batch carries (persistence/checks.py)."""
    return [re.sub(rb',"chk":"[0-9a-f]{8}(?:@[0-9]+)?"}$', b"}", b) for b in bodies]


def stored_bodies(store: SessionStore, session_id: str) -> list[bytes]:
    """Each event exactly as stored: a JSONL line without its newline, or an SQLite `body`."""
    if store.backend.name == "jsonl":
        data = store.backend.path(session_id).read_bytes()
        assert data.endswith(b"\n")
        return data.split(b"\n")[1:-1]
    if store.backend.name == "postgres":
        with pg(store) as conn:
            rows = conn.execute("SELECT body FROM events WHERE session_id = %s ORDER BY seq", (session_id,)).fetchall()
        return [bytes(b) for (b,) in rows]
    with sqlite3.connect(db_path(store)) as conn:
        rows = conn.execute("SELECT body FROM events WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()
    return [bytes(b) for (b,) in rows]


def add_raw_event(store: SessionStore, session_id: str, raw: dict) -> None:
    """Append an event Cairn would not write itself, straight into storage."""
    data = encode_raw(raw)
    if store.backend.name == "jsonl":
        with open(store.backend.path(session_id), "ab") as f:
            f.write(data + b"\n")
    elif store.backend.name == "postgres":
        with pg(store) as conn:
            conn.execute("INSERT INTO events (session_id, seq, time, type, body) VALUES (%s, %s, %s, %s, %s)",
                         (session_id, raw["seq"], raw["time"], raw["type"], data))
    else:
        conn = sqlite3.connect(db_path(store), isolation_level=None)
        conn.execute("INSERT INTO events (session_id, seq, body) VALUES (?, ?, ?)", (session_id, raw["seq"], data))
        conn.close()


def encode_raw(obj: dict) -> bytes:
    return msgspec.json.encode(obj)


def set_header_version(store: SessionStore, session_id: str, version: int) -> None:
    if store.backend.name == "jsonl":
        path = store.backend.path(session_id)
        data = path.read_bytes()
        nl = data.index(b"\n")
        header = raw_decoder.decode(data[:nl])
        header["version"] = version
        path.write_bytes(encode_raw(header) + data[nl:])
    elif store.backend.name == "postgres":
        with pg(store) as conn:
            (raw,) = conn.execute("SELECT header FROM sessions WHERE id = %s", (session_id,)).fetchone()
            header = raw_decoder.decode(raw)
            header["version"] = version
            conn.execute("UPDATE sessions SET header = %s WHERE id = %s", (encode_raw(header), session_id))
    else:
        conn = sqlite3.connect(db_path(store), isolation_level=None)
        conn.execute("UPDATE sessions SET version = ? WHERE id = ?", (version, session_id))
        conn.close()


def event_line(store: SessionStore, seq: int) -> int:
    """The line number an error names for the event with this seq (JSONL: the header is line 1)."""
    return seq + 2 if store.backend.name == "jsonl" else seq + 1


def wait_for_contents(path: Path, expected: str, proc: subprocess.Popen, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while path.read_text() != expected:
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"child did not write {expected!r} to {path} within {limit} s")
        time.sleep(0.01)


# -- round trip --------------------------------------------------------------------------------------------------------


def every_kind_of_event() -> list[AnyEvent]:
    """One of each event type, with the values most likely to be mangled: newlines, quotes, NUL, non-BMP characters,
    U+2028, floats, big ints, nested containers, a raw-string `arguments` and nulls."""
    tricky = 'héllo "wörld" 🌍\nsecond line\ttab \\ back \u2028 sep \x00 nul'
    return [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        UserMessage(turn=1, step=1, text=tricky),
        RequestHeader(
            turn=1, step=1, provider="openai", model="gpt-x",
            params={
                "temperature": 0.1, "top_p": 1e-300, "big": 1.7976931348623157e308, "max_tokens": 2**53 + 1,
                "stop": ["\n", "END"], "nested": {"a": [1, 2.5, None, True, False], "empty": {}, "list": []},
            },
            tools=["read_file", "run_command", "write_file"], message_count=3,
        ),
        AssistantChunk(turn=1, step=1, delta="par"),
        AssistantChunk(turn=1, step=1, delta="t 🌍"),
        AssistantMessage(
            turn=1, step=1, text="part 🌍",
            tool_calls=[
                ToolCallRequest("call_1", "read_file", {"path": "a.txt"}),
                ToolCallRequest("call_2", "run_command", '{"command": "ls'),
                ToolCallRequest("call_3", "write_file", {"path": "b", "content": tricky}),
            ],
            interrupted=False,
        ),
        ToolCall(
            turn=1, step=1, call_id="call_1", name="read_file", arguments={"path": "a.txt"}, safety="read_only",
            parent_call_id=None,
        ),
        ToolResult(
            turn=1, step=1, call_id="call_1", is_error=False, content=tricky, error_code=None, source_seq=7,
        ),
        ApprovalAsked(turn=1, step=1, call_id="call_2"),
        ApprovalDecided(turn=1, step=1, call_id="call_2", decision="denied"),
        ToolResult(
            turn=1, step=1, call_id="call_2", is_error=True, content="denied by the user", error_code="DENIED",
            source_seq=None,
        ),
        ApprovalAsked(turn=1, step=1, call_id="call_3"),
        ApprovalDecided(turn=1, step=1, call_id="call_3", decision="allowed_session"),
        ToolCall(
            turn=1, step=1, call_id="call_3", name="write_file", arguments={"path": "b", "content": tricky},
            safety="idempotent", parent_call_id=None,
        ),
        ToolCall(
            turn=1, step=1, call_id="call_3.1", name="read_file", arguments={"path": "b"}, safety="read_only",
            parent_call_id="call_3",
        ),
        ToolResult(
            turn=1, step=1, call_id="call_3.1", is_error=False, content="", error_code=None, source_seq=15,
        ),
        ToolResult(
            turn=1, step=1, call_id="call_3", is_error=False, content="wrote 1 file", error_code=None, source_seq=14,
        ),
        StepEnd(turn=1, step=1),
        TurnEnd(turn=1, reason="error", error=TurnError("PROVIDER_ERROR", "HTTP 500: upstream \"bad\"")),
        RecoveryVerdict(call_id="call_9", verdict="did_not_happen", note="checked the disk: 🌍 absent"),
    ]


async def test_round_trip_is_exact(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    appended = await write_session(store, "rt", every_kind_of_event())

    loaded = store.inspect("rt").events

    assert [e.seq for e in appended] == list(range(len(every_kind_of_event())))
    assert len(loaded) == len(appended)
    for mine, theirs in zip(appended, loaded):
        assert type(theirs) is type(mine)
        assert to_builtins(theirs) == to_builtins(mine)
        for name in mine.__struct_fields__:
            assert getattr(theirs, name) == getattr(mine, name), (mine, name)
    # the stored bytes are exactly the canonical encoding, identical on every backend, plus the damage check that the
    # last event of a durable batch carries (SPEC §5 rev 3: a running crc32, checks.py)
    stored = stored_bodies(store, "rt")
    assert unchecked(stored) == [encode_event(e) for e in appended]
    assert re.search(rb',"chk":"[0-9a-f]{8}(?:@[0-9]+)?"}$', stored[-1])  # the final flush is durable: checked
    times = [e.time for e in loaded]
    assert times == sorted(times) and all(isinstance(t, int) and t > 0 for t in times)


async def test_seq_continues_across_resumes(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    await write_session(store, "s", complete_turn(1, "first"))

    second = await resume_and_append(store, "s", open_turn(2, "second"))  # then "crash" inside turn 2
    assert second.repaired == []
    third = await resume_and_append(store, "s", complete_turn(3, "third"))
    assert [type(e) for e in third.repaired] == [StepEnd, TurnEnd]
    await resume_and_append(store, "s", complete_turn(4, "fourth"))

    events = store.inspect("s").events
    seqs = [e.seq for e in events]
    assert seqs == list(range(8 + 6 + 2 + 8 + 8))
    assert len(set(seqs)) == len(seqs)
    times = [e.time for e in events]
    assert times == sorted(times)
    assert [e.turn for e in events if isinstance(e, TurnStart)] == [1, 2, 3, 4]
    assert [(e.turn, e.reason) for e in events if isinstance(e, TurnEnd)] == [
        (1, "completed"), (2, "interrupted"), (3, "completed"), (4, "completed"),
    ]


# -- repair ------------------------------------------------------------------------------------------------------------


def crashed_turn() -> list[AnyEvent]:
    """The model asked for three calls; the first finished, the second was running, the third never started."""
    return [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        UserMessage(turn=1, step=1, text="tidy up"),
        RequestHeader(
            turn=1, step=1, provider="demo", model="demo-1", params={}, tools=["read_file", "run_command"],
            message_count=1,
        ),
        AssistantMessage(
            turn=1, step=1, text="",
            tool_calls=[
                ToolCallRequest("c_done", "read_file", {"path": "x"}),
                ToolCallRequest("c_running", "run_command", {"command": "rm -rf build"}),
                ToolCallRequest("c_waiting", "run_command", {"command": "make"}),
            ],
            interrupted=False,
        ),
        ToolCall(
            turn=1, step=1, call_id="c_done", name="read_file", arguments={"path": "x"}, safety="read_only",
            parent_call_id=None,
        ),
        ToolResult(turn=1, step=1, call_id="c_done", is_error=False, content="x", error_code=None, source_seq=5),
        ApprovalAsked(turn=1, step=1, call_id="c_running"),
        ApprovalDecided(turn=1, step=1, call_id="c_running", decision="allowed_once"),
        ToolCall(
            turn=1, step=1, call_id="c_running", name="run_command", arguments={"command": "rm -rf build"},
            safety="side_effecting", parent_call_id=None,
        ),
    ]


async def test_repair_classifies_calls_and_closes_the_turn(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    written = await write_session(store, "crash", crashed_turn())
    last = written[-1]
    running_call_seq = written[9].seq
    assert isinstance(written[9], ToolCall) and written[9].call_id == "c_running"

    repair = store.inspect("crash").repair

    assert [type(e) for e in repair] == [ToolResult, ToolResult, StepEnd, TurnEnd]
    unknown, not_started, step_end, turn_end = repair
    assert (unknown.call_id, unknown.is_error, unknown.error_code, unknown.source_seq) == (
        "c_running", True, TOOL_OUTCOME_UNKNOWN, running_call_seq,
    )
    assert "run_command" in unknown.content and "side-effecting" in unknown.content
    assert "do NOT retry" in unknown.content
    assert (not_started.call_id, not_started.is_error, not_started.error_code, not_started.source_seq) == (
        "c_waiting", True, TOOL_NOT_STARTED, None,
    )
    assert (unknown.turn, unknown.step, not_started.turn, not_started.step) == (1, 1, 1, 1)
    assert (step_end.turn, step_end.step) == (1, 1)
    assert (turn_end.turn, turn_end.reason, turn_end.error) == (1, "interrupted", None)
    assert [e.seq for e in repair] == list(range(last.seq + 1, last.seq + 5))
    assert [e.time for e in repair] == [last.time] * 4


async def test_repair_orders_results_as_the_model_asked(tmp_path, backend_name):
    """Model order B, A where only A was recorded: results come B (NOT_STARTED) then A (OUTCOME_UNKNOWN)."""
    store = SessionStore(tmp_path, backend_name)
    written = await write_session(store, "order", [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        AssistantMessage(
            turn=1, step=1, text="",
            tool_calls=[ToolCallRequest("B", "read_file", {}), ToolCallRequest("A", "write_file", {})],
            interrupted=False,
        ),
        ToolCall(turn=1, step=1, call_id="A", name="write_file", arguments={}, safety="idempotent",
                 parent_call_id=None),
    ])

    repair = store.inspect("order").repair

    assert [(e.call_id, e.error_code, e.source_seq) for e in repair if isinstance(e, ToolResult)] == [
        ("B", TOOL_NOT_STARTED, None), ("A", TOOL_OUTCOME_UNKNOWN, written[-1].seq),
    ]
    assert "idempotent" in repair[1].content


async def test_repair_is_deterministic_and_inspect_writes_nothing(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    await write_session(store, "crash", crashed_turn())
    before = stored_bytes(store, "crash")

    first = store.inspect("crash")
    second = SessionStore(tmp_path, backend_name).inspect("crash")

    first_bytes = [encode_event(e) for e in first.repair]
    assert first_bytes == [encode_event(e) for e in second.repair]
    assert len(first_bytes) == 4
    assert stored_bytes(store, "crash") == before  # inspecting wrote nothing
    assert len(store.inspect("crash").events) == len(crashed_turn())


async def test_open_for_resume_commits_the_repair_once(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    await write_session(store, "crash", crashed_turn())
    stored_before = stored_bodies(store, "crash")
    expected_repair = [encode_event(e) for e in store.inspect("crash").repair]

    opened = store.open_for_resume("crash")
    try:
        # committed before open_for_resume returned: another reader sees it while the writer is still open
        assert [encode_event(e) for e in opened.repaired] == expected_repair
        assert unchecked(stored_bodies(store, "crash")) == unchecked(stored_before) + expected_repair
        fresh = SessionStore(tmp_path, backend_name).backend.load("crash")
        assert [encode_event(e) for e in fresh.events] == unchecked(stored_before) + expected_repair
        assert opened.events == fresh.events
    finally:
        release(opened)
    after_first = stored_bodies(store, "crash")
    file_after_first = stored_bytes(store, "crash")

    again = store.open_for_resume("crash")
    release(again)

    assert again.repaired == []
    assert stored_bodies(store, "crash") == after_first
    if backend_name == "jsonl":  # (SQLite and PostgreSQL stamp a writer token in the sessions row on every open)
        assert stored_bytes(store, "crash") == file_after_first
    assert store.inspect("crash").repair == []


# -- listing -----------------------------------------------------------------------------------------------------------


async def test_list_sessions_summarizes_each_session(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    done = await write_session(store, "done", complete_turn(1, "first question") + complete_turn(2, "later"),
                               created=1_000)
    await write_session(store, "crashed", open_turn(1, "crash me"), created=2_000)
    await write_session(store, "repaired", open_turn(1, "was repaired"), created=3_000)
    release(store.open_for_resume("repaired"))
    await write_session(store, "empty", [], created=4_000)

    async with LiveSession(store.create("/elsewhere", "live", created=5_000)) as live:
        for event in open_turn(1, "still going"):
            live.append(event)
        await live.flush()
        summaries = {s.id: s for s in store.list_sessions()}

    assert set(summaries) == {"done", "crashed", "repaired", "empty", "live"}
    got = {
        sid: (s.events, s.status, s.first_prompt, s.cwd, s.created) for sid, s in summaries.items()
    }
    assert got == {
        "done": (16, "completed", "first question", "/work/project", 1_000),
        "crashed": (6, "interrupted", "crash me", "/work/project", 2_000),
        "repaired": (8, "interrupted", "was repaired", "/work/project", 3_000),
        "empty": (0, "completed", "", "/work/project", 4_000),
        "live": (6, "live", "still going", "/elsewhere", 5_000),
    }
    assert summaries["done"].updated == done[-1].time
    assert summaries["empty"].updated == 4_000
    # once the live session is closed it is listed by how it ended
    assert {s.id: s.status for s in store.list_sessions()}["live"] == "interrupted"


# -- locking -----------------------------------------------------------------------------------------------------------


async def test_live_session_is_locked_against_a_second_writer(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    other_store = SessionStore(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "busy")) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        for attempt in (
            lambda: store.create("/w", "busy"),
            lambda: store.open_for_resume("busy"),
            lambda: other_store.open_for_resume("busy"),
        ):
            with pytest.raises(SessionLocked) as info:
                attempt()
            assert info.value.pid == os.getpid()
            assert "'busy'" in str(info.value) and str(os.getpid()) in str(info.value)
        seen = store.inspect("busy")  # reading is always allowed; a live session is shown as it stands
        assert (seen.live_pid, seen.repair, len(seen.events)) == (os.getpid(), [], 1)

    opened = store.open_for_resume("busy")  # released on close
    release(opened)
    assert [type(e) for e in opened.repaired] == [TurnEnd]
    with pytest.raises(SessionExists):
        store.create("/w", "busy")


CHILD = r"""
import sys, time
from cairn.persistence.store import SessionStore
home, backend, session_id, marker = sys.argv[1:5]
opened = SessionStore(home, backend).open_for_resume(session_id)
with open(marker, "w") as f:
    f.write("locked\n")
time.sleep(120)
"""


async def test_lock_held_by_another_process_names_it_and_dies_with_it(tmp_path, backend_name):
    home = tmp_path / "home"
    store = SessionStore(home, backend_name)
    await write_session(store, "shared", complete_turn(1, "hello"))
    marker = tmp_path / "marker"
    marker.write_text("")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(home), backend_name, "shared", str(marker)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_for_contents(marker, "locked\n", child)

        with pytest.raises(SessionLocked) as info:
            store.open_for_resume("shared")
        assert info.value.pid == child.pid
        assert str(child.pid) in str(info.value)
        with pytest.raises(SessionLocked) as info:
            store.create("/w", "shared")
        assert info.value.pid == child.pid
        assert store.inspect("shared").live_pid == child.pid
        assert [s.status for s in store.list_sessions()] == ["live"]

        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=20) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()

    opened = store.open_for_resume("shared")
    release(opened)
    assert opened.repaired == [] and len(opened.events) == 8
    assert store.inspect("shared").live_pid is None


# -- refusals ----------------------------------------------------------------------------------------------------------


async def test_unknown_session_is_not_found(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    for attempt in (lambda: store.open_for_resume("nope"), lambda: store.inspect("nope")):
        with pytest.raises(SessionNotFound):  # nothing stored at all yet
            attempt()
    await write_session(store, "other", [])
    for attempt in (lambda: store.open_for_resume("nope"), lambda: store.inspect("nope")):
        with pytest.raises(SessionNotFound) as info:
            attempt()
        assert "'nope'" in str(info.value)
    assert store.exists("nope") is False


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "/abs", ".hidden", "", "x" * 65, "sp ace", "é", "a\nb", "abc\n"])
async def test_bad_session_id_is_refused_before_touching_storage(tmp_path, backend_name, bad_id):
    store = SessionStore(tmp_path / "home", backend_name)
    for attempt in (
        lambda: store.create("/w", bad_id),
        lambda: store.open_for_resume(bad_id),
        lambda: store.inspect(bad_id),
        lambda: store.exists(bad_id),
    ):
        with pytest.raises(InvalidSessionId):
            attempt()
    created = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_dir())
    assert created == []


async def test_create_of_existing_session_is_refused(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    await write_session(store, "taken", complete_turn(1, "mine"))
    before = stored_bytes(store, "taken")

    with pytest.raises(SessionExists) as info:
        store.create("/w", "taken")

    assert "'taken'" in str(info.value)
    assert stored_bytes(store, "taken") == before
    release(store.open_for_resume("taken"))  # the failed create left no lock behind


@pytest.mark.parametrize(
    "bad_event",
    [
        RequestHeader(turn=1, step=1, provider="p", model="m", params={"temperature": float("nan")}, tools=[],
                      message_count=0),
        RequestHeader(turn=1, step=1, provider="p", model="m", params={"a": {"b": [1.0, float("inf")]}}, tools=[],
                      message_count=0),
        ToolCall(turn=1, step=1, call_id="c", name="t", arguments={"x": -float("inf")}, safety="read_only",
                 parent_call_id=None),
        AssistantMessage(turn=1, step=1, text="", tool_calls=[ToolCallRequest("c", "t", [float("nan")])],
                         interrupted=False),
    ],
    ids=["params-nan", "params-nested-inf", "tool-call-arguments", "assistant-tool-call-arguments"],
)
async def test_non_finite_number_is_refused_and_nothing_is_queued(tmp_path, backend_name, bad_event):
    store = SessionStore(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "nan")) as live:
        live.append(TurnStart(turn=1))
        queued, next_seq, in_memory = live.coordinator.queued, live.coordinator.next_seq, len(live.events)

        with pytest.raises(NonFiniteNumber):
            live.append(bad_event)

        assert (live.coordinator.queued, live.coordinator.next_seq, len(live.events)) == (queued, next_seq, in_memory)
        live.append(StepStart(turn=1, step=1))
        await live.flush()

    events = store.inspect("nan").events
    assert [(type(e), e.seq) for e in events] == [(TurnStart, 0), (StepStart, 1)]


async def test_unknown_event_type_is_corruption_unless_ignorable(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    written = await write_session(store, "future", complete_turn(1, "hi"))
    add_raw_event(store, "future", {"seq": 8, "time": written[-1].time, "type": "future/thing", "x": 1})
    before = stored_bodies(store, "future")

    for attempt in (lambda: store.inspect("future"), lambda: store.open_for_resume("future")):
        with pytest.raises(CorruptLog) as info:
            attempt()
        assert info.value.line == event_line(store, 8)
        assert "unknown event type 'future/thing'" in str(info.value)
        assert f":{event_line(store, 8)}:" in str(info.value)
    assert stored_bodies(store, "future") == before  # the log was left untouched
    # SPEC rev 2 §5: listed as unreadable with the reason (rev 1 skipped it), never hiding it
    (listed,) = [s for s in store.list_sessions() if s.id == "future"]
    assert listed.status == "unreadable"
    assert listed.reason == f"line {event_line(store, 8)}: unknown event type 'future/thing' not marked ignorable " \
                            "(written by a newer Cairn?)"


async def test_ignorable_unknown_event_is_kept_and_seq_stays_contiguous(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    written = await write_session(store, "future", complete_turn(1, "hi"))
    raw = {"seq": 8, "time": written[-1].time, "type": "future/thing", "ignorable": True, "data": {"k": [1, "two"]}}
    add_raw_event(store, "future", raw)

    loaded = store.inspect("future")
    ignorable = loaded.events[-1]
    assert isinstance(ignorable, IgnorableEvent)
    assert (ignorable.seq, ignorable.type, ignorable.fields) == (8, "future/thing", {"ignorable": True,
                                                                                     "data": {"k": [1, "two"]}})
    assert to_builtins(ignorable) == raw
    assert loaded.repair == []

    live = await resume_and_append(store, "future", complete_turn(2, "again"))

    assert live.repaired == []
    events = store.inspect("future").events
    assert [e.seq for e in events] == list(range(17))
    assert to_builtins(events[8]) == raw
    assert stored_bodies(store, "future")[8] == encode_raw(raw)  # round-trips byte for byte


@pytest.mark.parametrize("version, word", [(2, "newer"), (0, "older")])
async def test_other_format_version_is_refused_distinctly(tmp_path, backend_name, version, word):
    store = SessionStore(tmp_path, backend_name)
    await write_session(store, "v", complete_turn(1, "hi"))
    set_header_version(store, "v", version)

    for attempt in (lambda: store.inspect("v"), lambda: store.open_for_resume("v")):
        with pytest.raises(UnsupportedFormat) as info:
            attempt()
        assert not isinstance(info.value, CorruptLog)
        assert word in str(info.value)
        assert f"format version {version}" in str(info.value)


# -- file modes --------------------------------------------------------------------------------------------------------


async def test_session_files_are_private(tmp_path, backend_name):
    store = SessionStore(tmp_path, backend_name)
    old = os.umask(0)  # the most permissive umask: the mode must come from Cairn, not from the environment
    try:
        async with LiveSession(store.create("/w", "secret")) as live:
            live.append(TurnStart(turn=1))
            await live.flush()
            if backend_name == "jsonl":
                files = [store.backend.path("secret")]
            elif backend_name == "postgres":  # nothing of the session is on this machine; the lock file is private
                assert not (store.home / "sessions").exists() and not db_path(store).exists()
                files = [store.home / "locks" / "secret.lock"]
            else:
                db = db_path(store)
                files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
            modes = {f.name: f.stat().st_mode & 0o777 for f in files}
    finally:
        os.umask(old)
    assert modes == {f.name: 0o600 for f in files}
