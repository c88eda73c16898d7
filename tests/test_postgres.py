"""The PostgreSQL backend beyond the shared contract (issue 18): locks across processes and hosts, writer tokens, and
faults in the middle of a barrier, all against a real server over real connections.

The shared contract suite (tests/test_contract.py) and the SIGKILL crash matrix (tests/test_crash_matrix.py) run on this
backend too. Each test here gets a private schema (`pg` fixture); nothing is mocked except where a real server cannot be
made to produce the case on demand.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote

import anyio
import psycopg
import pytest
from crash_harness import CAIRN
from pg_helpers import connect_to, fresh_schema, private_server, schema_url

from cairn.persistence.errors import (
    CheckpointFailed,
    CorruptLog,
    SessionLocked,
    StaleWriter,
    StoreUnavailable,
    UnsupportedFormat,
)
from cairn.persistence.events import AssistantChunk, StepEnd, StepStart, TurnEnd, TurnStart, UserMessage, encode_event
from cairn.persistence.postgres import PostgresBackend
from cairn.persistence.postgres_schema import VALUES_ROWS, lock_key
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
QUIET = 3600.0  # a write-behind window no test waits out: only the barriers a test asks for write anything


@pytest.fixture
def pg(monkeypatch):
    """(schema, url) of a private schema; also CAIRN_DATABASE_URL, for child processes."""
    with fresh_schema() as (schema, url):
        monkeypatch.setenv("CAIRN_DATABASE_URL", url)
        yield schema, url


def store_on(home: Path, url: str) -> SessionStore:
    """One "machine": its own CAIRN_HOME (so its own lock files), the shared database."""
    return SessionStore(home, "postgres", database_url=url)


def stored_types(url: str, session_id: str) -> list[str]:
    with connect_to(url) as conn:
        rows = conn.execute("SELECT type FROM events WHERE session_id = %s ORDER BY seq", (session_id,)).fetchall()
    return [r[0] for r in rows]


def cli(home: Path, *args: str, url: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "CAIRN_HOME": str(home),
           "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": url, "CAIRN_DEMO_DELAY_MS": "0"}
    return subprocess.run([CAIRN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


async def write_turn(store: SessionStore, session_id: str, prompt: str = "hello") -> None:
    async with LiveSession(store.create("/far/away/project", session_id)) as live:
        for event in (TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text=prompt)):
            live.append(event)
        await live.flush()


async def poll(condition, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.01)
    return value


def advisory_holder_pid(url: str, schema: str, session_id: str) -> int | None:
    key = lock_key(schema, session_id) & 0xFFFFFFFFFFFFFFFF
    with connect_to(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
            "AND classid::bigint = %s AND objid::bigint = %s", (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
    return row[0] if row else None


# -- two writers -------------------------------------------------------------------------------------------------------


HOLDER = r"""
import sys, time
from cairn.persistence.store import SessionStore
home, url, session_id, marker = sys.argv[1:5]
opened = SessionStore(home, "postgres", database_url=url).open_for_resume(session_id)
with open(marker, "w") as f:
    f.write("locked\n")
time.sleep(120)
"""


async def test_a_writer_in_another_process_with_its_own_home_is_refused_by_the_database_lock(tmp_path, pg):
    """Two machines share nothing but the database: the second writer is refused by the advisory lock (exit 3, naming
    the holder's pid), reads still work, and once the first is killed the second resumes at once."""
    schema, url = pg
    await write_turn(store_on(tmp_path / "a", url), "shared")
    marker = tmp_path / "marker"
    marker.write_text("")
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "a"), url, "shared", str(marker)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    other = store_on(tmp_path / "b", url)
    try:
        await poll(lambda: marker.read_text() == "locked\n" or child.poll() is not None, "the holder to lock")
        assert child.poll() is None, child.stderr.read().decode()

        for attempt in (lambda: other.open_for_resume("shared"), lambda: other.create("/w", "shared")):
            with pytest.raises(SessionLocked) as info:
                attempt()
            assert info.value.pid == child.pid and f"process {child.pid}" in str(info.value)
        assert other.inspect("shared").live_pid == child.pid
        assert [(s.id, s.status) for s in other.list_sessions()] == [("shared", "live")]

        refused = cli(tmp_path / "b", "run", "--resume", "shared", "--provider", "demo", "hi", url=url, cwd=tmp_path)
        assert refused.returncode == 3, refused.stderr
        assert refused.stderr.count("\n") == 1 and f"process {child.pid}" in refused.stderr
        assert "Traceback" not in refused.stderr and refused.stdout == ""
        shown = cli(tmp_path / "b", "show", "shared", url=url, cwd=tmp_path)
        assert shown.returncode == 0 and "live" in shown.stderr
        repaired_by_holder = ["turn/start", "step/start", "user/message", "step/end", "turn/end"]
        assert stored_types(url, "shared") == repaired_by_holder  # and the refused writers wrote nothing

        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=20) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()

    # no wait here: a holder that is a dead process of this machine is waited for until the server drops its lock
    resumed = cli(tmp_path / "b", "run", "--resume", "shared", "--provider", "demo", "--workspace", str(tmp_path),
                  "carry on", url=url, cwd=tmp_path)  # (--workspace: its recorded one is fictitious, SPEC §10)
    assert resumed.returncode == 0, resumed.stderr
    types = stored_types(url, "shared")
    assert types[:5] == repaired_by_holder
    assert types[5:7] == ["workspace/moved", "turn/start"] and types[-1] == "turn/end"


async def test_a_holder_on_another_host_is_named_with_its_host(tmp_path, pg):
    """The holder is whoever holds the advisory lock, wherever it runs: its `application_name` names host and pid."""
    schema, url = pg
    await write_turn(store_on(tmp_path / "a", url), "remote")
    with connect_to(schema_url(schema) + "&application_name=cairn%20build-box-7%204242") as far:
        far.execute("SELECT pg_advisory_lock(%s)", (lock_key(schema, "remote"),))

        with pytest.raises(SessionLocked) as info:
            store_on(tmp_path / "b", url).open_for_resume("remote")
        assert "live in process 4242 on host build-box-7" in str(info.value)
        refused = cli(tmp_path / "b", "run", "--resume", "remote", "--provider", "demo", "x", url=url, cwd=tmp_path)
        assert refused.returncode == 3 and "process 4242 on host build-box-7" in refused.stderr, refused.stderr
        listed = cli(tmp_path / "b", "sessions", "--all", url=url, cwd=tmp_path)
        assert listed.returncode == 0 and "live" in listed.stdout and "/far/away/project" in listed.stdout, listed

    opened = store_on(tmp_path / "b", url).open_for_resume("remote")  # released with its connection
    opened.writer.close()
    opened.lock.release()
    assert [type(e) for e in opened.repaired] == [StepEnd, TurnEnd]


# -- the lock and the writer token -------------------------------------------------------------------------------------


async def test_a_writer_that_lost_its_lock_takes_it_back_before_writing_again(tmp_path, pg):
    schema, url = pg
    store = store_on(tmp_path / "a", url)
    async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        first_holder = advisory_holder_pid(url, schema, "s")
        with connect_to(url) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (first_holder,)).fetchone()[0]
        await poll(lambda: advisory_holder_pid(url, schema, "s") is None, "the server to drop the lock")

        live.append(StepStart(turn=1, step=1))
        await live.flush()

        again = advisory_holder_pid(url, schema, "s")
        assert again is not None and again != first_holder
    assert stored_types(url, "s") == ["turn/start", "step/start"]


async def test_a_writer_whose_session_was_taken_over_never_writes_again(tmp_path, pg):
    """A's lock connection dies; B (another machine) takes the session. A's next barrier fails with StaleWriter and
    writes nothing; B's log is intact."""
    schema, url = pg
    a = store_on(tmp_path / "a", url)
    with pytest.raises(CheckpointFailed) as closing:  # A's close cannot make its last event durable either: reported
        async with LiveSession(a.create("/w", "s"), window=QUIET) as live_a:
            live_a.append(TurnStart(turn=1))
            await live_a.flush()
            with connect_to(url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (advisory_holder_pid(url, schema, "s"),))
            await poll(lambda: advisory_holder_pid(url, schema, "s") is None, "the server to drop the lock")

            async with LiveSession(store_on(tmp_path / "b", url).open_for_resume("s"), window=QUIET) as live_b:
                live_b.append(TurnStart(turn=2))
                await live_b.flush()

                live_a.append(StepStart(turn=1, step=1))
                with pytest.raises(CheckpointFailed) as info:
                    await live_a.flush()
                assert isinstance(info.value.cause, StaleWriter)
                assert "taken over by another writer" in str(info.value)
    assert isinstance(closing.value.cause, StaleWriter)
    assert stored_types(url, "s") == ["turn/start", "turn/end", "turn/start"]  # A: 1, repair by B: 1, B: 1


async def test_batches_of_every_size_store_each_event_exactly(tmp_path, pg):
    """A barrier's few events are sent as VALUES, a larger batch as arrays (VALUES_ROWS): either way each event's
    exact line is stored, with its seq, time and type in their columns."""
    schema, url = pg
    store = store_on(tmp_path / "a", url)
    sizes = [1, 2, VALUES_ROWS, VALUES_ROWS + 1, 3 * VALUES_ROWS]
    appended = []
    async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
        for n in sizes:
            appended += [live.append(AssistantChunk(turn=1, step=1, delta=f"{n}/{k} ✓ \u2028 '\"")) for k in range(n)]
            await live.flush()
        assert live.coordinator.stats.writes == len(sizes)  # each batch in one write
    assert [encode_event(e) for e in store.backend.load("s").events] == [encode_event(e) for e in appended]
    with connect_to(url) as conn:
        columns = conn.execute("SELECT seq, time, type FROM events WHERE session_id = 's' ORDER BY seq").fetchall()
    assert columns == [(e.seq, e.time, "assistant/chunk") for e in appended]


# -- faults in the middle of a barrier ---------------------------------------------------------------------------------


@contextmanager
def session_row_held(url: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection, Callable[[], list[int]]]]:
    """Session 's''s row locked by another transaction, so a barrier's transaction waits on it. Yields that
    transaction's connection, an admin connection, and a function listing this process's connections waiting on a
    lock."""
    app_name = f"cairn {os.uname().nodename} {os.getpid()}"
    with connect_to(url) as blocker, connect_to(url) as admin:
        blocker.execute("BEGIN")
        blocker.execute("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE")

        def waiting_pids() -> list[int]:
            return [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (app_name,)).fetchall()]

        yield blocker, admin, waiting_pids


async def test_connection_killed_mid_barrier_is_reconnected_and_the_barrier_writes_everything_once(tmp_path, pg):
    """The barrier's transaction is held up by a row lock, then its connection is terminated by the server: nothing
    half-written is visible, the writer reconnects (SPEC §5 rev 3: a lost connection is retried, not abandoned) and,
    once the row is free, the same barrier writes the events, contiguous, once."""
    schema, url = pg
    store = store_on(tmp_path / "a", url)
    async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        with session_row_held(url) as (blocker, admin, waiting_pids):
            live.append(StepStart(turn=1, step=1))
            live.append(UserMessage(turn=1, step=1, text="precious"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(live.flush)
                (first,) = await poll(waiting_pids, "the barrier to wait on the row lock")
                admin.execute("SELECT pg_terminate_backend(%s)", (first,))
                assert stored_types(url, "s") == ["turn/start"]  # the killed transaction wrote nothing
                await poll(lambda: [p for p in waiting_pids() if p != first], "the barrier to wait again, reconnected")
                blocker.execute("ROLLBACK")
        assert live.coordinator.queued == 0
    assert stored_types(url, "s") == ["turn/start", "step/start", "user/message"]
    assert [e.seq for e in store.inspect("s").events] == [0, 1, 2]


async def test_a_natively_cancelled_barrier_waits_for_its_commit_and_records_it(tmp_path, pg):
    """The barrier's transaction waits on a row lock when its task gets an asyncio `task.cancel()`: the task waits
    for the commit still in flight in the writer's thread, records it, and only then ends cancelled; the session goes
    on writing, each event once."""
    schema, url = pg
    store = store_on(tmp_path / "a", url)
    async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        with session_row_held(url) as (blocker, _admin, waiting_pids):
            live.append(StepStart(turn=1, step=1))
            task = asyncio.get_running_loop().create_task(live.flush())
            await poll(waiting_pids, "the barrier to wait on the row lock")
            task.cancel()
            await anyio.sleep(0.05)
            assert not task.done()
            blocker.execute("ROLLBACK")
            with pytest.raises(asyncio.CancelledError):
                await task
        assert live.coordinator.durable_seq == 1 and live.coordinator.queued == 0
        live.append(UserMessage(turn=1, step=1, text="after"))
        await live.flush()
    assert stored_types(url, "s") == ["turn/start", "step/start", "user/message"]


async def test_unreachable_server_is_one_line_without_credentials(tmp_path, pg):
    url = "postgresql://cairn:s3cret-pw@127.0.0.1:1/nodb"
    with pytest.raises(StoreUnavailable) as info:
        store_on(tmp_path, url).create("/w", "x")
    assert "s3cret-pw" not in str(info.value) and "postgresql://127.0.0.1:1/nodb" in str(info.value)
    proc = cli(tmp_path, "sessions", url=url, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "s3cret-pw" not in proc.stderr and "Traceback" not in proc.stderr
    bad = cli(tmp_path, "sessions", url="postgresql://u:s3cret-pw@host:notaport/x", cwd=tmp_path)
    assert bad.returncode == 2 and "s3cret-pw" not in bad.stderr, bad.stderr


# -- the schema --------------------------------------------------------------------------------------------------------


async def test_schema_is_versioned_and_a_newer_one_is_refused(tmp_path, pg):
    schema, url = pg
    await write_turn(store_on(tmp_path, url), "s")
    with connect_to(url) as conn:
        assert conn.execute("SELECT version FROM cairn_schema").fetchall() == [(1,)]
        conn.execute("UPDATE cairn_schema SET version = 2")

    for attempt in (lambda: store_on(tmp_path, url).create("/w", "t"),
                    lambda: store_on(tmp_path, url).inspect("s")):
        with pytest.raises(UnsupportedFormat) as info:
            attempt()
        assert "schema version 2" in str(info.value) and "newer Cairn" in str(info.value)
    proc = cli(tmp_path, "sessions", url=url, cwd=tmp_path)
    assert proc.returncode == 4 and "upgrade Cairn" in proc.stderr, proc.stderr


async def test_a_schema_with_tables_of_its_own_is_refused_not_extended(tmp_path, pg):
    schema, url = pg
    with connect_to(url) as conn:
        conn.execute("CREATE TABLE sessions (who text)")
    with pytest.raises(CorruptLog) as info:
        store_on(tmp_path, url).create("/w", "s")
    assert "not a Cairn database" in str(info.value)
    with connect_to(url) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
    assert tables == [("sessions",)]


async def test_reading_an_empty_database_creates_nothing(tmp_path, pg):
    schema, url = pg
    store = store_on(tmp_path, url)
    assert store.list_sessions() == [] and store.exists("nope") is False
    with connect_to(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)).fetchone() == (0,)


async def test_a_barrier_is_durable_even_when_the_server_default_is_asynchronous(tmp_path, pg):
    """A server (or role) set to `synchronous_commit = off` must not make barriers asynchronous."""
    schema, url = pg
    backend = PostgresBackend(url.split("?")[0] + "?options=" + quote(f"-csearch_path={schema} -csynchronous_commit=off"))
    conn = backend.connect("write")
    try:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert backend.durable_level(conn) == "on"
        conn.execute("SET synchronous_commit = remote_apply")
        assert backend.durable_level(conn) == "remote_apply"  # a replicated server's stronger level is kept
    finally:
        conn.close()


async def test_each_commit_runs_at_the_level_its_write_asks_for(tmp_path, pg):
    """On a server whose default is `synchronous_commit = off`, write-behind commits asynchronously and every barrier
    durably, whatever the order, also on the new connection made after the old one died. The level is read off the
    server in the writer's own transaction, just before each COMMIT (the writer sends it only when it changes, so a
    new connection must not be taken for one that already has it)."""
    schema, url = pg
    async_url = url.split("?")[0] + "?options=" + quote(f"-csearch_path={schema} -csynchronous_commit=off")
    seen: list[str] = []  # the server's synchronous_commit at each of the writer's commits
    writers: list[psycopg.Connection] = []

    class Observed(psycopg.Connection):
        def execute(self, query, *args, **kwargs):
            if query == "COMMIT" and self._pipeline is not None:
                level = super().execute("SHOW synchronous_commit")
                self._pipeline.sync()
                seen.append(level.fetchone()[0])
            return super().execute(query, *args, **kwargs)

    def connect(conn_url, role, **kwargs):
        if role != "write":
            return psycopg.connect(conn_url, **kwargs)
        writers.append(Observed.connect(conn_url, **kwargs))
        return writers[-1]

    store = SessionStore(tmp_path / "a", PostgresBackend(async_url, connect=connect))
    async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
        expected = []
        for durable in (True, False, False, True, True, False, True):
            if len(expected) == 4:  # after a barrier, the writer's connection dies: the next barrier makes a new one
                with connect_to(url) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (writers[-1].info.backend_pid,))
            live.append(StepStart(turn=1, step=len(expected)))
            if durable:
                await live.flush()
            else:
                await live.coordinator._write(durable=False)  # what write-behind does once its window is over
            expected.append("on" if durable else "off")
        assert seen[-len(expected):] == expected
        assert len(writers) >= 2  # the last writes went over a new connection
    assert len(stored_types(url, "s")) == len(expected)


# -- a server of the test's own: restarted, or out of disk -------------------------------------------------------------


async def test_server_restarted_mid_session_is_reconnected_to_and_the_barrier_writes_everything(tmp_path):
    """A restart terminates every connection, the lock's included. The barrier that meets the dead connection
    reconnects (with backoff), re-takes the lock, checks the token and writes everything (SPEC §5 rev 3)."""
    with private_server() as server:
        store = store_on(tmp_path, server.url)
        async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
            live.append(TurnStart(turn=1))
            await live.flush()
            live.append(StepStart(turn=1, step=1))
            await anyio.to_thread.run_sync(server.restart)
            live.append(UserMessage(turn=1, step=1, text="after the restart"))
            await live.flush()
            assert live.coordinator.queued == 0
            assert stored_types(server.url, "s") == ["turn/start", "step/start", "user/message"]
            with pytest.raises(SessionLocked):  # the lock is held again, by this writer
                store_on(tmp_path / "other", server.url).open_for_resume("s")


async def test_a_server_gone_longer_than_the_retries_fails_the_barrier_truthfully_and_loses_nothing(
        tmp_path, monkeypatch):
    import cairn.persistence.postgres_connections as pg

    monkeypatch.setattr(pg, "RECONNECT_FOR", 1.0)
    with private_server() as server:
        store = store_on(tmp_path, server.url)
        async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
            live.append(TurnStart(turn=1))
            await live.flush()
            await anyio.to_thread.run_sync(server.halt)
            live.append(StepStart(turn=1, step=1))
            with pytest.raises(CheckpointFailed) as info:
                await live.flush()
            assert "still unreachable after 1 s of retries" in str(info.value) and "\n" not in str(info.value)
            assert live.coordinator.queued == 1
            await anyio.to_thread.run_sync(server.start)
            await live.flush()
        assert stored_types(server.url, "s") == ["turn/start", "step/start"]


def test_a_restart_during_a_tool_body_never_makes_the_completed_call_outcome_unknown(tmp_path):
    """SPEC §5 rev 3 and §8: the body completed while the server restarted; its result is written once the connection
    is back, the turn completes, and nothing but Cairn's own lines reaches stderr."""
    from agent_helpers import write_script

    ws = tmp_path / "ws"
    ws.mkdir()
    command = "echo started > started.txt; while [ ! -f go.txt ]; do sleep 0.05; done; echo finished"
    script = write_script(tmp_path / "s.json", [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}, {"text": "done"}])
    with private_server() as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "LANG": "C.UTF-8", "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": server.url}
        cairn = [str(Path(sys.executable).parent / "cairn")]
        child = subprocess.Popen([*cairn, "run", "--yes", "--provider", "script", "--script", str(script),
                                  "--session-id", "s", "go"], env=env, cwd=ws, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not (ws / "started.txt").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        server.restart()
        (ws / "go.txt").write_text("")
        out, err = child.communicate(timeout=60)
        shown = subprocess.run([*cairn, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, err
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    (result,) = [e for e in events if e["type"] == "tool/result"]
    assert not result["is_error"] and "finished" in result["content"], result
    assert events[-1]["type"] == "turn/end" and events[-1]["reason"] == "completed"
    assert all(line.startswith(("cairn: ", "→ ", "← ")) for line in err.splitlines()), err


@contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cairn-full-", dir="/tmp"))
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"cannot mount a small tmpfs to fill (the test needs root): {proc.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def fill(directory: Path) -> Path:
    """Take every free byte of the file system `directory` is on."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    return filler


async def test_full_disk_during_a_barrier_fails_closed_and_loses_nothing(tmp_path):
    """The session's tables live in a tablespace on a full file system: the barrier fails with `disk is full`, the
    durable events stay, the failed batch is kept queued, and once space is freed the next barrier writes it all."""
    with small_tmpfs("8m") as small, private_server() as server:
        space = small / "ts"
        space.mkdir()
        server.chown(space)
        with connect_to(server.url) as admin:
            admin.execute(f"CREATE TABLESPACE small LOCATION '{space}'")
        url = server.url + "&options=" + quote("-cdefault_tablespace=small")
        store = store_on(tmp_path, url)
        async with LiveSession(store.create("/w", "s"), window=QUIET) as live:
            live.append(TurnStart(turn=1))
            await live.flush()
            filler = fill(small)
            for i in range(40):
                live.append(UserMessage(turn=1, step=1, text=os.urandom(60_000).hex()))

            with pytest.raises(CheckpointFailed) as info:
                await live.flush()
            assert "disk is full" in str(info.value) and "\n" not in str(info.value)
            assert live.coordinator.queued == 40
            assert stored_types(url, "s") == ["turn/start"]

            filler.unlink()
            await live.flush()
        assert stored_types(url, "s") == ["turn/start"] + ["user/message"] * 40
        assert [e.seq for e in store.inspect("s").events] == list(range(41))


async def test_rm_deletes_a_finished_session_and_refuses_one_live_on_another_machine(tmp_path, pg):
    schema, url = pg
    await write_turn(store_on(tmp_path / "a", url), "done")
    await write_turn(store_on(tmp_path / "a", url), "busy")
    with connect_to(url) as far:
        far.execute("SELECT pg_advisory_lock(%s)", (lock_key(schema, "busy"),))
        with pytest.raises(SessionLocked):
            store_on(tmp_path / "b", url).delete("busy")
        store_on(tmp_path / "b", url).delete("done")
    assert store_on(tmp_path / "b", url).backend.list_ids() == ["busy"]
    assert stored_types(url, "done") == [] and len(stored_types(url, "busy")) == 3


# -- a profile's database (SPEC §7 rev 2 config file) ------------------------------------------------------------------


def team_config(path: Path, url: str, extra: str = "") -> Path:
    """A config file whose default profile keeps sessions in `url` and talks to a hosted model whose key is not set."""
    path.write_text(
        'default_profile = "team"\n\n[profiles.team]\nprovider = "openai"\napi_key_env = "TEAM_KEY_NOT_SET"\n'
        f'backend = "postgres"\ndatabase_url = "{url}"\n{extra}'
    )
    return path


def plain_cli(home: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`cairn` with no backend or database in its environment: whatever chooses them comes from `env` or the file."""
    full = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "CAIRN_HOME": str(home),
            "CAIRN_DEMO_DELAY_MS": "0", **env}
    return subprocess.run([CAIRN, *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=60)


async def test_a_profiles_database_is_used_by_run_show_and_sessions_without_a_provider(tmp_path, pg, monkeypatch):
    """The profile alone points every command at the team database; `show` and `sessions` use it even though the
    profile's provider has no key (they never need one), and `run` writes there."""
    schema, url = pg
    monkeypatch.delenv("CAIRN_DATABASE_URL")
    config = team_config(tmp_path / "config.toml", url)
    ran = plain_cli(tmp_path, "run", "--session-id", "team-1", "--provider", "demo", "hi", cwd=tmp_path,
                    CAIRN_CONFIG=str(config))
    assert ran.returncode == 0, ran.stderr
    assert stored_types(url, "team-1")[0] == "turn/start" and stored_types(url, "team-1")[-1] == "turn/end"
    assert not (tmp_path / "sessions").exists() and not list(tmp_path.glob("**/*.jsonl"))

    listed = plain_cli(tmp_path, "sessions", "--all", cwd=tmp_path, CAIRN_CONFIG=str(config))
    assert listed.returncode == 0 and "team-1" in listed.stdout, listed.stderr
    shown = plain_cli(tmp_path, "show", "team-1", cwd=tmp_path, CAIRN_CONFIG=str(config))
    assert shown.returncode == 0 and "hi" in shown.stdout, shown.stderr
    elsewhere = plain_cli(tmp_path, "sessions", "--all", "--backend", "jsonl", cwd=tmp_path, CAIRN_CONFIG=str(config))
    assert elsewhere.returncode == 0 and "team-1" not in elsewhere.stdout  # a flag still beats the profile


async def test_database_url_precedence_is_flag_then_env_then_profile(tmp_path):
    from cairn.app.config.resolver import resolve_config

    config = team_config(tmp_path / "config.toml", "postgresql://cairn@profile.example:5432/team")
    for runs_model in (True, False):
        env = {"CAIRN_CONFIG": str(config), "TEAM_KEY_NOT_SET": "sk-x"}
        got = resolve_config(workspace=str(tmp_path), env=env, runs_model=runs_model)
        assert (got.backend, got.sources["backend"]) == ("postgres", "profile team")
        assert (got.database_url, got.sources["database_url"]) == ("postgresql://cairn@profile.example:5432/team",
                                                                   "profile team")
        env["CAIRN_DATABASE_URL"] = "postgresql://cairn@env.example/team"
        got = resolve_config(workspace=str(tmp_path), env=env, runs_model=runs_model)
        assert (got.database_url, got.sources["database_url"]) == (env["CAIRN_DATABASE_URL"], "env CAIRN_DATABASE_URL")
        got = resolve_config(workspace=str(tmp_path), env=env, runs_model=runs_model,
                             database_url="postgresql://cairn@flag.example/team", backend="sqlite")
        assert (got.database_url, got.sources["database_url"]) == ("postgresql://cairn@flag.example/team",
                                                                   "flag --database-url")
        assert (got.backend, got.sources["backend"]) == ("sqlite", "flag --backend")


async def test_cairn_config_shows_the_database_without_its_password(tmp_path):
    config = team_config(tmp_path / "config.toml", "postgresql://cairn@db.example:6543/team?sslmode=require")
    shown = plain_cli(tmp_path, "config", "--json", cwd=tmp_path, CAIRN_CONFIG=str(config))
    assert shown.returncode == 0, shown.stderr
    import json

    rows = json.loads(shown.stdout)
    assert rows["backend"] == {"value": "postgres", "source": "profile team"}
    assert rows["database_url"] == {"value": "postgresql://db.example:6543/team", "source": "profile team"}
    secret = "postgresql://cairn:s3cret-pw@db.example/team"
    for args in (("config",), ("config", "--json"), ("config", "--database-url", secret)):
        out = plain_cli(tmp_path, *args, cwd=tmp_path, CAIRN_CONFIG=str(config), CAIRN_DATABASE_URL=secret)
        assert out.returncode == 0 and "s3cret-pw" not in out.stdout + out.stderr, out.stdout
        assert "postgresql://db.example/team" in out.stdout


async def test_a_password_in_the_profiles_database_url_is_refused_without_repeating_it(tmp_path):
    """The config file gets shared and committed, like a key: the password goes to ~/.pgpass or the environment."""
    for url in ("postgresql://cairn:s3cret-pw@db.example/team", "postgresql://cairn@db.example/team?password=s3cret-pw",
                "host=db.example password=s3cret-pw dbname=team"):
        config = team_config(tmp_path / "config.toml", url)
        for command in (("run", "--provider", "demo", "hi"), ("config",)):
            proc = plain_cli(tmp_path, *command, cwd=tmp_path, CAIRN_CONFIG=str(config))
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
            assert "config.toml:7: profiles.team.database_url: must not carry a password" in proc.stderr, proc.stderr
            assert "s3cret-pw" not in proc.stderr and "Traceback" not in proc.stderr
    wrong = team_config(tmp_path / "config.toml", "mysql://db.example/team")
    proc = plain_cli(tmp_path, "config", cwd=tmp_path, CAIRN_CONFIG=str(wrong))
    assert proc.returncode == 2 and "must be a postgresql:// URL" in proc.stderr, proc.stderr
