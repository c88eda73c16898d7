"""A PostgreSQL server that crashes or goes away under a live session (issue 39), against real servers, nothing mocked.

- A crash (`pg_ctl -m immediate stop`) loses the write-behind commits still in the server's WAL buffers (they were
  acknowledged with `synchronous_commit = off`). The writer reconnects, reads the stored tail and re-sends from memory
  what the crash took, so the session stays readable and whole: never seq N+1 without N. What a completed barrier
  covered survives. A stored tail that is not what this writer left (rows deleted below its last barrier, a row
  another hand wrote) is refused, one line, nothing written on top.
- The before-image store retries a lost connection like the log does.
- A deleted newest row is seen on load, as on SQLite (SPEC §5 rev 3): exit 4 naming the session, nothing written.

The crash trials run on a server of their own whose WAL writer waits 10 s (`wal_writer_delay`), so what a crash
loses is what came after the last durable commit, every time (at the default 200 ms, a crash loses it a third of the
time: bench/pg_crash_matrix.py measures that case).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import anyio
import psycopg
import pytest
from pg_helpers import (
    PrivateServer,
    connect_to,
    fresh_schema,
    private_server,
    run_crash_trial,
    stored_rows,
)
from waiting import wait_sync

from cairn.persistence.errors import CheckpointFailed, CorruptLog, StaleWriter
from cairn.persistence.events import StepEnd, StepStart, ToolProgress, TurnEnd, TurnStart, UserMessage
from cairn.persistence.postgres import application_name
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

CAIRN = str(Path(sys.executable).parent / "cairn")
QUIET = 3600.0  # a write-behind window no test waits out: only the barriers a test asks for write anything


@pytest.fixture(scope="module")
def crashing_server():
    """One private server for the module's crash trials (each trial its own session), WAL writer slowed down."""
    with private_server({"wal_writer_delay": "10s"}) as server:
        yield server


@pytest.fixture
def pg(monkeypatch):
    with fresh_schema("crash") as (schema, url):
        monkeypatch.setenv("CAIRN_DATABASE_URL", url)
        yield schema, url


def cli(root: Path, url: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "LANG": "C.UTF-8", "CAIRN_HOME": str(root / "home"),
           "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": url, "CAIRN_DEMO_DELAY_MS": "0"}
    return subprocess.run([CAIRN, *args], env=env, cwd=cwd or root, capture_output=True, text=True, timeout=60)


# -- a crash mid-turn: the session stays readable, whole, and keeps what its barriers covered -------------------------


def after_chunks(n: int):
    return lambda kinds, started: kinds.count("assistant/chunk") >= n


def after_tool_started():
    """Once the tool body runs and its (write-behind) tool/progress is stored."""
    return lambda kinds, started: started and "tool/progress" in kinds


@pytest.mark.slow
@pytest.mark.parametrize("sid, crash_when, tool_seconds", [
    ("stream-early", after_chunks(3), 1.5),
    ("stream-late", after_chunks(25), 1.5),
    ("tool-running", after_tool_started(), 1.5),
    # a short body: it ends while the server is down, and its result and the next barriers wait for the server
    ("tool-ends-while-down", after_tool_started(), 0.3),
])
def test_a_server_crash_mid_turn_leaves_the_session_readable_whole_and_its_barriers_kept(
        crashing_server: PrivateServer, tmp_path, sid, crash_when, tool_seconds):
    """`pg_ctl -m immediate stop` while an answer streams or a tool body runs, started again 1 s later: `cairn run`
    completes its turn (exit 0), `cairn show` reads the session (exit 0) with seqs contiguous from 0, both answers
    whole, and every row a barrier the child had completed covered is stored exactly as before the crash."""
    trial = run_crash_trial(crashing_server, tmp_path, sid, crash_when, sid, tool_seconds=tool_seconds)
    assert trial.durable >= 0 and any(seq > trial.durable for seq, _, _ in trial.before), (
        f"the crash must come after write-behind rows past the last barrier: {[k for _, k, _ in trial.before]}")
    assert trial.violations() == [], "\n".join(trial.violations())
    assert not trial.lost_barrier()
    assert trial.run_code == 0 and trial.show_code == 0


# -- the writer's side of a lost connection, on the shared server (no restart needed) ---------------------------------


def kill_connections(url: str) -> None:
    """Terminate this process's Cairn connections (the writer's data and lock connections among them): to the writer
    it is a server that went away and came back."""
    with connect_to(url) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = %s AND pid <> pg_backend_pid()", (application_name(),))


async def written_behind(live: LiveSession, url: str, session_id: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(stored_rows(url, session_id)) < count:
        assert time.monotonic() < deadline, "write-behind never stored the events"
        await anyio.sleep(0.01)


def set_last_seq(conn: psycopg.Connection, session_id: str, seq: int) -> None:
    """The session's record of its newest seq, where the tables have one (a build from before it has none)."""
    if conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('sessions') "
                    "AND attname = 'last_seq' AND NOT attisdropped").fetchone()[0]:
        conn.execute("UPDATE sessions SET last_seq = %s WHERE id = %s", (seq, session_id))


def as_crash_left_it(url: str, session_id: str, keep_through: int) -> None:
    """What a crash leaves when it takes the commits after `keep_through`: their rows, and their stamp of the session's
    newest seq, which went in the same transactions."""
    with connect_to(url) as conn, conn.transaction():
        conn.execute("DELETE FROM events WHERE session_id = %s AND seq > %s", (session_id, keep_through))
        set_last_seq(conn, session_id, keep_through)


async def test_write_behind_lost_by_the_server_is_sent_again_from_memory(tmp_path, pg):
    schema, url = pg
    store = SessionStore(tmp_path, "postgres", database_url=url)
    async with LiveSession(store.create("/w", "s"), window=0.005) as live:
        live.append(TurnStart(turn=1))
        live.append(StepStart(turn=1, step=1))
        await live.flush()  # seq 1 durable
        for i in range(3):
            live.append(UserMessage(turn=1, step=1, text=f"behind {i}"))
        await written_behind(live, url, "s", 5)
        written = stored_rows(url, "s")
        as_crash_left_it(url, "s", 2)
        kill_connections(url)
        live.append(ToolProgress(turn=1, step=1, call_id="c", pid=1, started=1))
        await live.flush()
        assert live.coordinator.queued == 0
    rows = stored_rows(url, "s")
    assert [seq for seq, _, _ in rows] == list(range(6))
    assert rows[:5] == written  # the lost rows went in again exactly as they were
    assert [e.seq for e in store.inspect("s").events] == list(range(6))


async def test_a_resumed_writer_checks_the_tail_it_loaded_and_writes_on(tmp_path, pg):
    """A writer that opened an existing session knows its stored tail from the load: after a lost connection the tail
    it finds is that one, and it writes on."""
    schema, url = pg
    store = SessionStore(tmp_path, "postgres", database_url=url)
    async with LiveSession(store.create("/w", "r"), window=QUIET) as live:
        for event in (TurnStart(turn=1), StepStart(turn=1, step=1), StepEnd(turn=1, step=1),
                      TurnEnd(turn=1, reason="completed", error=None)):
            live.append(event)
    opened = store.open_for_resume("r")
    assert opened.repaired == []  # nothing written at open: the writer's durable tail is the one it loaded
    async with LiveSession(opened, window=QUIET) as live:
        kill_connections(url)
        live.append(TurnStart(turn=2))
        await live.flush()
    rows = stored_rows(url, "r")
    assert [kind for _, kind, _ in rows] == ["turn/start", "step/start", "step/end", "turn/end", "turn/start"]


@pytest.mark.parametrize("damage", ["a durable row deleted", "a row written by someone else", "the tail changed"])
async def test_a_stored_tail_this_writer_did_not_leave_is_refused_and_nothing_is_written_on_top(tmp_path, pg, damage):
    """After a reconnect the writer compares the stored tail with what it wrote: rows missing below its last barrier
    (even with the session's record of its newest seq made to agree), a row it never wrote, or a tail row that is not
    the one it wrote are not a crash's loss, and nothing is written on top of them."""
    schema, url = pg
    store = SessionStore(tmp_path, "postgres", database_url=url)
    with pytest.raises(CheckpointFailed):  # the final flush too: what is queued cannot be written
        async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
            live.append(TurnStart(turn=1))
            live.append(StepStart(turn=1, step=1))
            live.append(UserMessage(turn=1, step=1, text="one"))
            await live.flush()
            with connect_to(url) as conn, conn.transaction():
                if damage == "a durable row deleted":
                    conn.execute("DELETE FROM events WHERE session_id = 's' AND seq = 2")
                    set_last_seq(conn, "s", 1)
                elif damage == "a row written by someone else":
                    conn.execute("INSERT INTO events SELECT session_id, 3, time, type, body FROM events "
                                 "WHERE session_id = 's' AND seq = 2")
                    set_last_seq(conn, "s", 3)
                else:
                    conn.execute("UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), 'one', "
                                 "'two'), 'UTF8') WHERE session_id = 's' AND seq = 2")
            before = stored_rows(url, "s")
            kill_connections(url)
            live.append(UserMessage(turn=1, step=1, text="after"))
            with pytest.raises(CheckpointFailed) as info:
                await live.flush()
            assert isinstance(info.value.cause, (CorruptLog, StaleWriter)), info.value.cause
            assert "[s]" in str(info.value) or "'s'" in str(info.value), info.value
            assert "\n" not in str(info.value)
            with pytest.raises(CheckpointFailed):  # and again: it never writes on top
                await live.flush()
            assert stored_rows(url, "s") == before
    assert stored_rows(url, "s") == before


# -- the before-image store rides out a short outage ------------------------------------------------------------------


@contextmanager
def stand_in(server) -> Iterator[Callable[[], int]]:
    """While `server` is halted, a socket where its own was: every attempt to reach it is counted and dropped (a lost
    connection, as the server being away looks). Gives how many attempts came; the socket is gone on leaving."""
    path = server.dir / f".s.PGSQL.{server.port}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    attempts = 0
    stop = threading.Event()

    def refuse() -> None:
        nonlocal attempts
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            attempts += 1
            conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        yield lambda: attempts
    finally:
        stop.set()
        thread.join(10)
        listener.close()
        path.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_short_outage_while_a_before_image_is_stored_is_retried_and_the_turn_completes(tmp_path):
    from openai_server import OpenAIServer, text, tool_calls

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("the original notes\n")
    call = {"id": "call_w", "name": "write_file", "arguments": {"path": "notes.txt", "content": "new notes\n"}}
    with private_server() as server, OpenAIServer([tool_calls([call], hold_after=1), text("written")]) as model:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
               "CAIRN_HOME": str(tmp_path / "home"), "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": server.url,
               "CAIRN_BASE_URL": model.base_url, "CAIRN_API_KEY": "blob-outage-test-key"}
        child = subprocess.Popen([CAIRN, "run", "--session-id", "b", "--provider", "openai", "--model", "m", "--yes",
                                  "rewrite the notes"], env=env, cwd=ws, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            model.wait_for_hold(1, timeout=30)  # the model is answering; the write_file call is still to come
            server.halt()
            with stand_in(server) as knocks:
                before = knocks()
                model.release()  # the call arrives: its before-image is stored while the server is away
                wait_sync(lambda: knocks() > before, "cairn to try the server after the call came", timeout=30)
                assert (ws / "notes.txt").read_text() == "the original notes\n"  # the write waits for its image
            server.start()
            out, err = child.communicate(timeout=90)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        shown = subprocess.run([CAIRN, "show", "b", "--json"], env=env, cwd=ws, capture_output=True, text=True,
                               timeout=60)
        with connect_to(server.url) as conn:
            blobs = {sha: bytes(data) for sha, data in conn.execute(
                "SELECT sha256, data FROM cairn_blobs") } if conn.execute(
                "SELECT to_regclass('cairn_blobs') IS NOT NULL").fetchone()[0] else {}
    assert child.returncode == 0, err
    assert "Traceback" not in err, err
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    (called,) = [e for e in events if e["type"] == "tool/call"]
    assert blobs.get(called["before_sha256"]) == b"the original notes\n"
    assert events[-1]["type"] == "turn/end" and events[-1]["reason"] == "completed"
    assert (ws / "notes.txt").read_text() == "new notes\n"


# -- a deleted newest row is damage, on PostgreSQL too ---------------------------------------------------------------


def test_a_deleted_newest_row_is_refused_by_show_and_resume_and_nothing_is_written(tmp_path, pg):
    schema, url = pg
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "first answer"}, {"text": "second answer"}]}))
    done = cli(tmp_path, url, "run", "--session-id", "gone", "--provider", "script", "--script", str(script), "hi")
    assert done.returncode == 0, done.stderr
    with connect_to(url) as conn:
        newest = conn.execute("DELETE FROM events WHERE session_id = 'gone' AND seq = "
                              "(SELECT max(seq) FROM events WHERE session_id = 'gone') RETURNING type").fetchone()
    assert newest == ("turn/end",)
    before = stored_rows(url, "gone")
    shown = cli(tmp_path, url, "show", "gone")
    resumed = cli(tmp_path, url, "run", "--resume", "gone", "--provider", "script", "--script", str(script), "again")
    for proc in (shown, resumed):
        assert proc.returncode == 4, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "gone" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert stored_rows(url, "gone") == before


def test_a_deleted_newest_write_behind_row_is_seen_too(tmp_path, pg):
    """The session's record of its newest seq goes in with every commit, write-behind ones too."""
    schema, url = pg
    store = SessionStore(tmp_path, "postgres", database_url=url)

    async def write() -> None:
        async with LiveSession(store.create("/w", "wb"), window=0.005) as live:
            live.append(TurnStart(turn=1))
            await live.flush()
            live.append(StepStart(turn=1, step=1))
            await written_behind(live, url, "wb", 2)
            with connect_to(url) as conn:
                conn.execute("DELETE FROM events WHERE session_id = 'wb' AND seq = 1")

    anyio.run(write)
    with pytest.raises(CorruptLog) as info:
        store.inspect("wb")
    assert "[wb]" in str(info.value) and "missing" in str(info.value)


def test_a_database_from_before_the_newest_seq_record_still_opens_and_gains_it(tmp_path, pg):
    """An older Cairn's tables have no `last_seq` column: its sessions load, resume, and the column is added."""
    schema, url = pg
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "first answer"}, {"text": "second answer"}]}))
    assert cli(tmp_path, url, "run", "--session-id", "old", "--provider", "script", "--script", str(script),
               "hi").returncode == 0
    with connect_to(url) as conn:
        conn.execute("ALTER TABLE sessions DROP COLUMN last_seq")
    shown = cli(tmp_path, url, "show", "old")
    assert shown.returncode == 0, shown.stderr
    resumed = cli(tmp_path, url, "run", "--resume", "old", "--provider", "script", "--script", str(script), "again")
    assert resumed.returncode == 0, resumed.stderr
    with connect_to(url) as conn:
        mark, top = conn.execute("SELECT last_seq, (SELECT max(seq) FROM events WHERE session_id = 'old') "
                                 "FROM sessions WHERE id = 'old'").fetchone()
    assert mark == top


def test_reading_never_adds_the_column(tmp_path, pg):
    schema, url = pg
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "first answer"}]}))
    assert cli(tmp_path, url, "run", "--session-id", "r", "--provider", "script", "--script", str(script),
               "hi").returncode == 0
    with connect_to(url) as conn:
        conn.execute("ALTER TABLE sessions DROP COLUMN last_seq")
    assert cli(tmp_path, url, "show", "r").returncode == 0
    with connect_to(url) as conn:
        has = conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = %s "
                           "AND table_name = 'sessions' AND column_name = 'last_seq'", (schema,)).fetchone()[0]
    assert has == 0
