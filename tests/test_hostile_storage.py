"""Storage that does not trust its directory (SPEC rev 2 §5), through the store and through the real `cairn` CLI.

A live session's lock cannot be defeated by deleting or replacing the lock file, a planted symlink is never followed,
directories are private whatever the umask, anything odd in `sessions/` is listed as `unreadable` without hiding the
good sessions, a torn tail is copied before it is cut, and SQLite faults end in one line with the SPEC exit code.
Permission cases run the CLI without root's permission override (tests/test_proofs.py `unprivileged`).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from cairn.persistence.errors import (
    CheckpointFailed,
    CorruptDatabase,
    CorruptLog,
    DatabaseBusy,
    NotASessionFile,
    SessionLocked,
    StaleWriter,
    StoreUnavailable,
)
from cairn.persistence.events import StepStart, TurnStart
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.session import LiveSession
from cairn.persistence.sqlite import INLINE_BUSY_WAIT, SqliteBackend, SqliteWriter
from cairn.persistence.store import SessionStore

from test_contract import complete_turn, open_turn, release, write_session
from waiting import wait_until

pytestmark = pytest.mark.anyio

CAIRN = str(Path(sys.executable).parent / "cairn")
CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = json.loads((CORPUS / "cases.json").read_text())


def cairn(home: Path, *args: str, prefix: list[str] | None = None, timeout: float = 30, **kwargs):
    env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CAIRN_HOME": str(home), "LANG": "C.UTF-8",
           "CAIRN_PROVIDER": "demo", "CAIRN_DEMO_DELAY_MS": "0"}
    return subprocess.run([*(prefix or []), CAIRN, *args], env=env, cwd=str(home.parent), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def unprivileged():
    from test_proofs import unprivileged as how  # (imported late: that module pulls in the whole agent)

    return how()


def assert_one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cairn: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def listed(home: Path, backend: str = "jsonl") -> dict[str, dict]:
    proc = cairn(home, "--backend", backend, "sessions", "--all", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return {row["id"]: row for row in map(json.loads, proc.stdout.splitlines())}


# -- 1. the lock rests on what the live writer holds ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_deleting_or_replacing_the_lock_file_of_a_live_jsonl_session_lets_no_second_writer_in(tmp_path, how):
    store = SessionStore(tmp_path, "jsonl")
    async with LiveSession(store.create("/w", "busy")) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        lock = tmp_path / "locks" / "busy.lock"
        lock.unlink()
        if how == "replaced":
            lock.write_text("")

        for attempt in (lambda: store.open_for_resume("busy"), lambda: SessionStore(tmp_path).open_for_resume("busy")):
            with pytest.raises(SessionLocked) as info:
                attempt()
            assert info.value.pid == os.getpid()  # named from the session file's own flock (/proc/locks)
        assert store.inspect("busy").live_pid == os.getpid()  # a reader still sees it live, and does not repair it
        assert store.inspect("busy").repair == []
        assert [s.status for s in store.list_sessions()] == ["live"]
        live.append(StepStart(turn=1, step=1))
        await live.flush()  # the rightful writer goes on undisturbed

    release(opened := store.open_for_resume("busy"))
    assert [e.seq for e in opened.events] == [0, 1, 2, 3]  # its two events, then repair's step/end and turn/end


async def test_deleting_the_lock_file_lets_no_second_sqlite_writer_in_and_a_stolen_token_still_stops_the_old_one(
        tmp_path):
    """The live SQLite writer holds a byte of the database file: with its lock file gone, a newcomer (in this process or
    another store) and `rm` are refused. The writer token stays as a second guard: rewritten behind its back, the old
    writer stops instead of interleaving."""
    store = SessionStore(tmp_path, "sqlite")
    first = store.create("/w", "s")
    first.writer.append([(0, b'{"seq":0,"time":1,"type":"turn/start","turn":1}')], durable=True)
    (tmp_path / "locks" / "s.lock").unlink()
    for attempt in (lambda: store.open_for_resume("s"), lambda: SessionStore(tmp_path, "sqlite").open_for_resume("s"),
                    lambda: store.delete("s")):
        with pytest.raises(SessionLocked) as info:
            attempt()
        assert info.value.pid == os.getpid()
    assert store.inspect("s").live_pid == os.getpid()

    with sqlite3.connect(tmp_path / "sessions.sqlite3") as db:
        db.execute("UPDATE sessions SET writer = 'someone-else:1' WHERE id = 's'")
    with pytest.raises(StaleWriter):
        first.writer.append([(1, b'{"seq":1,"time":1,"type":"step/start","turn":1,"step":1}')], durable=True)
    release(first)
    assert store.inspect("s").live_pid is None
    assert [type(e).__name__ for e in store.inspect("s").events] == ["TurnStart"]


class ReplacingOps(FileOps):
    """Replaces the lock file by a new inode right after Cairn opened it and before it locks it (a racing process)."""

    def __init__(self) -> None:
        self.replaced = 0

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if path.endswith(".lock") and not self.replaced:
            self.replaced += 1
            tmp = path + ".new"
            Path(tmp).write_text("")
            os.replace(tmp, path)
        return fd


async def test_lock_whose_path_was_replaced_before_the_flock_is_taken_again_on_the_new_file(tmp_path):
    ops = ReplacingOps()
    store = SessionStore(tmp_path, JsonlBackend(tmp_path, ops))
    opened = store.create("/w", "s")
    try:
        assert ops.replaced == 1
        lock_path = tmp_path / "locks" / "s.lock"
        st = os.stat(lock_path)
        held = os.fstat(opened.lock._fd)
        assert (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)  # the lock held is the one the path names
        assert lock_path.read_text() == f"{os.getpid()}\n"
    finally:
        release(opened)


# -- 2. symlinks and modes ------------------------------------------------------------------------------------------


async def test_planted_lock_symlink_is_never_followed(tmp_path, backend_name):
    home = tmp_path / "home"
    store = SessionStore(home, backend_name)
    await write_session(store, "s", complete_turn(1, "hi"))
    target = tmp_path / "precious.txt"
    target.write_text("do not touch\n")
    assert not (home / "locks" / "s.lock").exists()  # a closed session leaves no lock file behind
    (home / "locks" / "s.lock").symlink_to(target)
    (home / "locks" / "new.lock").symlink_to(tmp_path / "would-be-created")

    for attempt in (lambda: store.open_for_resume("s"), lambda: store.create("/w", "new")):
        with pytest.raises(StoreUnavailable) as info:
            attempt()
        assert "symbolic link" in str(info.value)
    assert target.read_text() == "do not touch\n"
    assert not (tmp_path / "would-be-created").exists()
    assert store.inspect("s").live_pid is None  # a reader neither follows it
    assert_one_line(cairn(home, "--backend", backend_name, "run", "--resume", "s", "hi"), 2, "s.lock")


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
async def test_a_key_chk_inside_model_arguments_is_never_read_as_a_check(tmp_path, backend):
    """A check rides on an event line as `,"chk":"…"`; a model's tool arguments can hold that key too (nested, not
    first). Written, the session must load clean with the arguments exactly as given, be resumable, and fork clean."""
    from contextlib import ExitStack

    from pg_helpers import fresh_schema

    with ExitStack() as stack:
        url = stack.enter_context(fresh_schema("chk"))[1] if backend == "postgres" else None
        store = SessionStore(tmp_path / "home", backend, **({"database_url": url} if url else {}))
        if url:
            stack.callback(store.backend.close)  # (its connections, before the schema is dropped)
        await written_and_read_back_clean(store)
        # a fork copies the events through the shared encoder: it must be as clean as the session it copies
        from cairn.app.cli import main

        where = ["--home", str(tmp_path / "home"), "--backend", backend] + (["--database-url", url] if url else [])
        assert main(["fork", *where, "--session-id", "f", "s"]) == 0
        forked = next(e for e in store.inspect("f").events if type(e).__name__ == "ToolCall")
        assert forked.arguments["chk"] == "0000abcd@0"


async def written_and_read_back_clean(store: SessionStore) -> None:
    from cairn.persistence.events import ToolCall, ToolResult

    arguments = {"path": "a.txt", "chk": "0000abcd@0", "nested": [{"x": 1, "chk": "ffffffff"}], "chk2": {"chk": ""}}
    events = complete_turn(1, "hi")[:4] + [
        ToolCall(turn=1, step=1, call_id="c1", name="read_file", arguments=arguments, safety="read_only",
                 parent_call_id=None),
        ToolResult(turn=1, step=1, call_id="c1", is_error=False, content=',"chk":"not a check"', error_code=None,
                   source_seq=None),
    ] + complete_turn(1, "hi")[5:]
    await write_session(store, "s", events)
    loaded = store.inspect("s").events
    call = next(e for e in loaded if isinstance(e, ToolCall))
    assert call.arguments == arguments
    assert [type(e) for e in loaded] == [type(e) for e in events]
    release(store.open_for_resume("s"))  # writable again: nothing reads as damage


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
async def test_store_directories_are_0700_and_session_files_0600_whatever_the_umask(tmp_path, backend_name, umask):
    home = tmp_path / "deep" / "home"
    old = os.umask(umask)
    try:
        store = SessionStore(home, backend_name)
        opened = store.create("/w", "s")
        lock_mode = stat.S_IMODE((home / "locks" / "s.lock").stat().st_mode)  # while the session is live
        release(opened)
    finally:
        os.umask(old)
    dirs = [home, home / "locks"] + ([home / "sessions"] if backend_name == "jsonl" else [])
    assert {str(d): stat.S_IMODE(d.stat().st_mode) for d in dirs} == {str(d): 0o700 for d in dirs}
    data = home / "sessions" / "s.jsonl" if backend_name == "jsonl" else home / "sessions.sqlite3"
    assert stat.S_IMODE(data.stat().st_mode) == 0o600
    assert lock_mode == 0o600


# -- 3. listing and opening never trust the directory ---------------------------------------------------------------


def plant_oddities(sessions: Path) -> dict[str, str]:
    """Things that are not session files, under session names; returns id -> the word the reason must contain."""
    (sessions / "a-dir.jsonl").mkdir()
    os.mkfifo(sessions / "a-fifo.jsonl")
    (sessions / "a-link.jsonl").symlink_to(sessions / "good.jsonl")
    expected = {"a-dir": "directory", "a-fifo": "FIFO", "a-link": "symbolic link"}
    try:
        os.mknod(sessions / "a-device.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        expected["a-device"] = "character device"
    except PermissionError:
        pass  # no CAP_MKNOD here: the other kinds still run
    return expected


async def test_non_regular_files_are_listed_unreadable_and_never_block(tmp_path):
    home = tmp_path / "home"
    store = SessionStore(home, "jsonl")
    await write_session(store, "good", complete_turn(1, "hello"))
    expected = plant_oddities(home / "sessions")

    rows = listed(home)  # a FIFO opened for reading would hang this (the subprocess has a timeout)
    assert rows["good"]["status"] == "completed"
    assert {i: (rows[i]["status"], expected[i] in rows[i]["reason"]) for i in expected} == {
        i: ("unreadable", True) for i in expected
    }
    for session_id, word in expected.items():
        with pytest.raises(NotASessionFile):
            store.inspect(session_id)
        assert_one_line(cairn(home, "show", session_id), 4, word)
        assert_one_line(cairn(home, "run", "--resume", session_id, "hi"), 4, word)
    assert cairn(home, "show", "good").returncode == 0
    # (its recorded workspace is fictitious: --workspace gives it a real one, SPEC §10)
    assert cairn(home, "run", "--resume", "good", "--workspace", str(tmp_path), "again").returncode == 0
    assert stat.S_ISFIFO(os.lstat(home / "sessions" / "a-fifo.jsonl").st_mode)  # left as it was


def test_unreadable_file_is_listed_and_a_read_only_one_cannot_be_resumed(tmp_path):
    """Permission cases need a child that permission bits apply to (root ignores them)."""
    prefix, kwargs = unprivileged()
    if "user" in kwargs:
        pytest.skip("needs setpriv (a uid-65534 child cannot enter pytest's tmp_path)")
    home = tmp_path / "home"
    for session_id in ("good", "secret", "frozen"):
        proc = cairn(home, "run", "--session-id", session_id, "hello")
        assert proc.returncode == 0, proc.stderr
    (home / "sessions" / "secret.jsonl").chmod(0o000)
    (home / "sessions" / "frozen.jsonl").chmod(0o400)

    rows = {r["id"]: r for r in map(json.loads, cairn(home, "sessions", "--all", "--json", prefix=prefix).stdout.splitlines())}
    assert (rows["secret"]["status"], "Permission denied" in rows["secret"]["reason"]) == ("unreadable", True)
    assert rows["good"]["status"] == rows["frozen"]["status"] == "completed"
    assert_one_line(cairn(home, "show", "secret", prefix=prefix), 2, "secret.jsonl")
    assert_one_line(cairn(home, "run", "--resume", "frozen", "more", prefix=prefix), 2, "frozen.jsonl", "show")
    assert cairn(home, "show", "frozen", prefix=prefix).returncode == 0
    refused = cairn(home, "run", "--resume", "secret", "more", prefix=prefix)  # unreadable: `show` is not offered
    assert_one_line(refused, 2, "secret.jsonl")
    assert "cairn show" not in refused.stderr
    (home / "sessions").chmod(0o300)  # a directory that cannot be listed must not look empty
    assert_one_line(cairn(home, "sessions", prefix=prefix), 2, "cannot list")


# -- 4. a torn tail is copied before it is cut ----------------------------------------------------------------------


@pytest.mark.parametrize("tail", [b'{"seq":8,"ti', b"\x00\x00bit rot\xff\n"], ids=["unterminated", "bit-rot"])
async def test_torn_tail_is_copied_beside_the_session_before_it_is_cut(tmp_path, tail):
    store = SessionStore(tmp_path, "jsonl")
    await write_session(store, "s", open_turn(1, "hi"))
    path = store.backend.path("s")
    intact = path.read_bytes()
    path.write_bytes(intact + tail)

    release(opened := store.open_for_resume("s"))

    (copy,) = path.parent.glob("s.jsonl.torn-*")
    assert copy.read_bytes() == tail
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert int(copy.name.rsplit("-", 1)[1]) <= time.time_ns() // 1_000_000
    assert opened.torn_bytes == len(tail)
    assert path.read_bytes().startswith(intact) and tail not in path.read_bytes()
    assert [s.id for s in store.list_sessions()] == ["s"]  # the copy is not a session


class FullDiskForTornCopies(FileOps):
    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        if ".torn-" in path:
            raise OSError(28, "No space left on device")
        return super().open(path, flags, mode)


async def test_torn_tail_is_not_cut_when_its_copy_cannot_be_made(tmp_path):
    store = SessionStore(tmp_path, JsonlBackend(tmp_path, FullDiskForTornCopies()))
    await write_session(store, "s", open_turn(1, "hi"))
    path = store.backend.path("s")
    path.write_bytes(before := path.read_bytes() + b'{"seq":6,"ti')

    with pytest.raises(StoreUnavailable) as info:
        store.open_for_resume("s")

    assert "No space left" in str(info.value)
    assert path.read_bytes() == before
    release(SessionStore(tmp_path, "jsonl").open_for_resume("s"))  # the lock was released; a healthy disk resumes


# -- 5. SQLite under faults -----------------------------------------------------------------------------------------


def hold_write_lock(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def test_sqlite_write_lock_held_elsewhere_is_exit_3_in_one_line(tmp_path):
    home = tmp_path / "home"
    store = SessionStore(home, "sqlite")
    await write_session(store, "s", complete_turn(1, "hi"))
    holder = hold_write_lock(home / "sessions.sqlite3")
    try:
        quick = SessionStore(home, SqliteBackend(home, open_busy_timeout=0.05))
        for attempt in (lambda: quick.open_for_resume("s"), lambda: quick.create("/w", "t")):
            with pytest.raises(DatabaseBusy):
                attempt()
        assert [s.id for s in quick.list_sessions()] == ["s"]  # readers are not blocked by a writer in WAL
        assert_one_line(cairn(home, "--backend", "sqlite", "run", "--resume", "s", "hi"), 3, "locked")
    finally:
        holder.close()
    resumed = cairn(home, "--backend", "sqlite", "run", "--resume", "s", "--workspace", str(tmp_path), "hi")
    assert resumed.returncode == 0, resumed.stderr


async def test_sqlite_busy_wait_on_the_event_loop_stays_short(tmp_path, monkeypatch):
    """A live append that finds the database locked waits only briefly on the event loop, fails the barrier (the
    events stay queued), and later writes move to a worker thread where waiting does not stall the loop."""
    waits: list[tuple[bool, int]] = []  # each write's (on the event loop?, how long it may wait for the lock in ms)
    begin = SqliteWriter._begin

    def recorded_begin(self: SqliteWriter) -> None:
        try:
            begin(self)
        finally:
            waits.append((threading.current_thread() is threading.main_thread(), self._busy_ms))

    monkeypatch.setattr(SqliteWriter, "_begin", recorded_begin)
    store = SessionStore(tmp_path, "sqlite")
    async with LiveSession(store.create("/w", "s"), window=3600) as live:
        live.append(TurnStart(turn=1))
        await live.flush()
        holder = hold_write_lock(tmp_path / "sessions.sqlite3")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            # The case under test is a write made on the event loop, which the coordinator chooses while writes cost
            # little; a loaded machine can make the first write slow enough to send this one to the thread at once.
            live.coordinator._io_cost = 0.0
            live.append(StepStart(turn=1, step=1))
            with pytest.raises(CheckpointFailed):
                await live.flush()
            assert live.coordinator.queued == 1
            # on the event loop it allowed itself INLINE_BUSY_WAIT for the lock, never the full busy timeout (10 s)
            assert waits[-1] == (True, int(INLINE_BUSY_WAIT * 1000)), waits
            assert {ms for on_loop, ms in waits if on_loop} == {int(INLINE_BUSY_WAIT * 1000)}, waits
            assert live.coordinator._writer.inline_safe is False  # from now on: a worker thread
            flushed: list[bool] = []

            async def flush() -> None:
                await live.flush()
                flushed.append(True)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as waiting:
                    waiting.start_soon(flush)  # waits for the lock in a thread...
                    seen = ticks
                    await wait_until(lambda: ticks >= seen + 10, "the event loop to keep running")
                    assert not flushed  # ...while the loop runs on: the lock is still held, the flush still waiting
                    holder.close()
            assert flushed
            tg.cancel_scope.cancel()
    assert [e.seq for e in store.inspect("s").events] == [0, 1]


@pytest.mark.parametrize("kind", ["foreign", "not-a-database"])
async def test_foreign_or_corrupt_sqlite_file_is_one_line_and_left_untouched(tmp_path, kind):
    home = tmp_path / "home"
    home.mkdir()
    db = home / "sessions.sqlite3"
    if kind == "foreign":
        shutil.copy(CORPUS / "foreign.sqlite3", db)
    else:
        db.write_bytes(b"this is not a database, just text " * 200)
    before = db.read_bytes()
    store = SessionStore(home, "sqlite")

    for attempt in (store.list_sessions, lambda: store.inspect("s"), lambda: store.open_for_resume("s"),
                    lambda: store.create("/w", "s")):
        with pytest.raises(CorruptDatabase):
            attempt()
    for args in (["sessions", "--all"], ["show", "s"], ["run", "--resume", "s", "hi"], ["run", "hi"]):
        assert_one_line(cairn(home, "--backend", "sqlite", *args), 4, "sessions.sqlite3")
    assert db.read_bytes() == before


async def test_sqlite_store_in_a_read_only_directory_is_read_or_refused_never_empty(tmp_path):
    """Reading is always allowed (SPEC §5): a WAL database in a directory this user may not write (its `-shm` cannot
    be created) is read from the file alone when no write-ahead log is beside it. When a log holding events is there
    and its `-shm` cannot be made, the file alone would be an older, wrong answer: `cairn sessions` says it cannot read
    the store (exit 2), never "no sessions yet" and never that stale list."""
    prefix, kwargs = unprivileged()
    if "user" in kwargs:
        pytest.skip("needs setpriv (a uid-65534 child cannot enter pytest's tmp_path)")
    home = tmp_path / "home"
    store = SessionStore(home, "sqlite")
    await write_session(store, "s", complete_turn(1, "hi"))
    for leftover in home.glob("sessions.sqlite3-*"):
        leftover.unlink()
    home.chmod(0o500)
    try:
        listing = cairn(home, "--backend", "sqlite", "sessions", "--all", "--json", prefix=prefix)
        show = cairn(home, "--backend", "sqlite", "show", "s", prefix=prefix)
    finally:
        home.chmod(0o700)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    assert [json.loads(line)["id"] for line in listing.stdout.splitlines()] == ["s"]
    assert show.returncode == 0 and "hi" in show.stdout, show.stderr

    killed = ("import os, sqlite3, sys\n"
              "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "c.execute('PRAGMA journal_mode=WAL')\n"
              "c.execute(\"INSERT INTO sessions (id, format, version, created, cwd) "
              "VALUES ('w', 'cairn-session', 1, 1, '/w')\")\n"
              "os._exit(0)\n")  # a writer that died: its events are in the -wal only
    subprocess.run([sys.executable, "-c", killed, str(home / "sessions.sqlite3")], check=True)
    assert (home / "sessions.sqlite3-wal").stat().st_size > 0
    (home / "sessions.sqlite3-shm").unlink()
    home.chmod(0o500)
    try:
        proc = cairn(home, "--backend", "sqlite", "sessions", "--all", prefix=prefix)
    finally:
        home.chmod(0o700)
    assert "no sessions yet" not in proc.stderr
    assert_one_line(proc, 2, "sessions.sqlite3")


async def test_bad_row_in_sqlite_is_listed_unreadable_beside_good_sessions(tmp_path):
    home = tmp_path / "home"
    store = SessionStore(home, "sqlite")
    await write_session(store, "good", complete_turn(1, "hi"))
    await write_session(store, "bad", complete_turn(1, "hi"))
    with sqlite3.connect(home / "sessions.sqlite3") as conn:
        conn.execute("UPDATE events SET body = X'7B22736571223A' WHERE session_id = 'bad' AND seq = 3")
    rows = listed(home, "sqlite")
    assert (rows["good"]["status"], rows["bad"]["status"]) == ("completed", "unreadable")
    assert rows["bad"]["reason"].startswith("line 4: ")
    assert_one_line(cairn(home, "--backend", "sqlite", "show", "bad"), 4, "[bad]:4:")
    assert cairn(home, "--backend", "sqlite", "show", "good").returncode == 0


# -- the corpus -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_corpus_case_gives_its_exit_code_in_one_line_and_the_good_session_still_lists(tmp_path, case):
    expect = CASES[case]
    home = tmp_path / "home"
    sessions = home / "sessions"
    sessions.mkdir(parents=True)
    shutil.copy(CORPUS / "good.jsonl", sessions / "good.jsonl")
    shutil.copy(CORPUS / f"{case}.jsonl", sessions / f"{case}.jsonl")

    rows = listed(home)
    assert rows["good"]["status"] == "completed"
    assert (rows[case]["status"] == "unreadable") == expect["unreadable"], rows[case]
    if expect["unreadable"]:
        assert rows[case]["reason"]

    show = cairn(home, "show", case)
    resume = cairn(home, "run", "--resume", case, "--workspace", str(tmp_path), "go on")  # (/corpus is fictitious)
    for proc, code in ((show, expect["show"]), (resume, expect["resume"])):
        if code:
            assert_one_line(proc, code, f"{case}.jsonl")
        else:
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    if expect["resume"]:
        assert (sessions / f"{case}.jsonl").read_bytes() == (CORPUS / f"{case}.jsonl").read_bytes()
    assert cairn(home, "show", "good").returncode == 0
    assert cairn(home, "run", "--resume", "good", "--workspace", str(tmp_path), "still fine").returncode == 0


async def test_an_unreadable_session_is_never_the_latest_one_in_a_directory(tmp_path, monkeypatch):
    store = SessionStore(tmp_path, "jsonl")
    await write_session(store, "good", complete_turn(1, "hi"))  # cwd /work/project
    (tmp_path / "sessions" / "newer.jsonl").write_bytes(b"garbage from the first byte\n")
    monkeypatch.chdir(tmp_path)
    assert store.latest_in(str(tmp_path)) is None  # not "newer", whose unknown cwd must not match the current one
    assert store.latest_in("/work/project") == "good"
