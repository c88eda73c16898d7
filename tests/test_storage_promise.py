"""One promise on every backend (SPEC rev 3 §5): the same suite over JSONL, SQLite and PostgreSQL, through the real CLI.

The lock: while a writer lives, deleting or replacing its lock file, or coming from another host name, lets no second
writer in and `cairn rm` deletes nothing (exit 3, one line naming the live process); the check rests on what the live
writer holds (JSONL: a flock on the session file; SQLite: a byte of the database file; PostgreSQL: an advisory lock).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_contract import CHILD, ROOT, complete_turn, write_session
from test_hostile_storage import assert_one_line

from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio

CAIRN = str(Path(sys.executable).parent / "cairn")
OTHER_HOST = ["unshare", "--uts", "sh", "-c", 'hostname other-host && exec "$0" "$@"']


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend_name(request):
    if request.param == "postgres":
        request.getfixturevalue("pg_database_url")  # CAIRN_DATABASE_URL: a private schema, inherited by children
    return request.param


def cairn(home: Path, backend: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, CAIRN, *args], env=env_for(home, backend), cwd=str(home.parent),
                          capture_output=True, text=True, timeout=60)


def wait_for_marker(marker: Path, child: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 30
    while marker.read_text() != "locked\n":
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the holder never took the session"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["lock file deleted", "lock file replaced", "another host name"])
async def test_a_live_writer_keeps_its_session_whatever_happens_to_its_lock_file(tmp_path, backend_name, how):
    home = tmp_path / "home"
    await write_session(SessionStore(home, backend_name), "s", complete_turn(1, "hello"))
    marker = tmp_path / "marker"
    marker.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", CHILD, str(home), backend_name, "s", str(marker)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_marker(marker, holder)
        lock = home / "locks" / "s.lock"
        prefix: tuple[str, ...] = ()
        if how == "lock file deleted":
            lock.unlink()
        elif how == "lock file replaced":
            lock.unlink()
            lock.write_text("1\n")  # a new inode that no one holds, naming another process
        else:
            lock.unlink()
            prefix = tuple(OTHER_HOST)

        resumed = cairn(home, backend_name, "run", "--resume", "s", "second writer", prefix=prefix)
        assert_one_line(resumed, 3, "'s'", str(holder.pid))
        removed = cairn(home, backend_name, "rm", "s", prefix=prefix)
        assert_one_line(removed, 3, "'s'")
        listed = [json.loads(line) for line in cairn(home, backend_name, "sessions", "--all", "--json").stdout.splitlines()]
        assert [(row["id"], row["status"]) for row in listed] == [("s", "live")]
        shown = cairn(home, backend_name, "show", "s", "--json")
        assert shown.returncode == 0 and len(shown.stdout.splitlines()) == 8  # nothing deleted, nothing repaired
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=20)
        holder.stderr.close()

    # the holder is gone: resumable (--workspace: the session's recorded one is fictitious, SPEC §10)
    resumed = cairn(home, backend_name, "run", "--resume", "s", "--workspace", str(tmp_path), "now it is free")
    assert resumed.returncode == 0, resumed.stderr
    assert cairn(home, backend_name, "rm", "s").returncode == 0
    assert cairn(home, backend_name, "sessions", "--all", "--json").stdout == ""


# -- secrets split across streamed chunks -----------------------------------------------------------------------------

KEY = "sk-live-0123456789abcdefghijkl"  # 30 characters, as configured (an API key)


def split_everywhere(text: str) -> list[list[str]]:
    """The text cut into chunks at every pair of places around the key: one cut inside it, or two."""
    start = text.index(KEY)
    inside = range(start + 1, start + len(KEY))
    cuts = [[i] for i in inside] + [[i, j] for i in inside for j in inside if i < j][::7]
    return [[text[a:b] for a, b in zip([0, *c], [*c, len(text)])] for c in cuts]


async def test_a_secret_split_across_chunks_is_never_stored(tmp_path, backend_name):
    from cairn.persistence.events import AssistantChunk, AssistantMessage, ReasoningChunk, StepStart, TurnStart
    from cairn.persistence.session import LiveSession

    answer = f"The key is {KEY}, and again {KEY[:12]}… then {KEY}."
    splits = split_everywhere(answer)
    store = SessionStore(tmp_path, backend_name)
    async with LiveSession(store.create("/w", "s")) as live:
        live.add_secrets([KEY])
        for turn, chunks in enumerate(splits, 1):
            live.append(TurnStart(turn=turn))
            live.append(StepStart(turn=turn, step=1))
            for i, chunk in enumerate(chunks):  # reasoning and answer interleaved, as some servers stream them
                live.append(ReasoningChunk(turn=turn, step=1, delta=chunk))
                live.append(AssistantChunk(turn=turn, step=1, delta=chunk))
            live.append(AssistantMessage(turn=turn, step=1, text=answer, tool_calls=[], interrupted=False))
        await live.flush()

    events = store.inspect("s").events
    for kind in (AssistantChunk, ReasoningChunk):
        for turn in range(1, len(splits) + 1):
            streamed = "".join(e.delta for e in events if type(e) is kind and e.turn == turn)
            # the chunks still add up to the whole (cleaned) text: what was held back is released before the message
            assert streamed == f"The key is ***, and again {KEY[:12]}… then ***.", streamed
    stored = "\n".join(e.delta for e in events if type(e) in (AssistantChunk, ReasoningChunk))
    assert KEY[:14] not in stored and KEY[-14:] not in stored  # no chunk holds the key's start or its end
    (message, *_) = [e for e in events if isinstance(e, AssistantMessage)]
    assert message.text == f"The key is ***, and again {KEY[:12]}… then ***."
    exported = cairn(tmp_path, backend_name, "export", "s", "--format", "json")
    assert exported.returncode == 0 and KEY[:14] not in exported.stdout and KEY[-14:] not in exported.stdout


def test_a_key_a_real_server_streams_in_pieces_is_neither_stored_nor_printed(tmp_path, backend_name):
    from openai_server import OpenAIServer, text

    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    deltas = ["Your key: sk-live-01234", "56789abcdefg", "hijkl — keep it", " safe."]
    with OpenAIServer([text("", deltas=deltas)]) as server:
        env = {**env_for(home, backend_name), "CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url,
               "CAIRN_API_KEY": KEY, "CAIRN_MODEL": "m"}
        ran = subprocess.run([CAIRN, "run", "--session-id", "s", "what is my key?"], env=env, cwd=ws,
                             capture_output=True, text=True, timeout=60)
        shown = subprocess.run([CAIRN, "show", "s", "--json"], env=env, cwd=ws, capture_output=True, text=True,
                               timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "Your key: *** — keep it safe."
    chunks = [e["delta"] for e in map(json.loads, shown.stdout.splitlines()) if e["type"] == "assistant/chunk"]
    assert "".join(chunks) == "Your key: *** — keep it safe."
    for fragment in (KEY[:12], KEY[10:22], KEY[-12:]):
        assert fragment not in shown.stdout and fragment not in ran.stdout + ran.stderr


# -- sizes ------------------------------------------------------------------------------------------------------------


def test_arguments_over_one_megabyte_are_refused_and_stored_cut(tmp_path, backend_name):
    from openai_server import OpenAIServer, text, tool_calls

    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    big = "x" * 1_500_000
    script = [tool_calls([{"id": "call_big", "name": "write_file", "arguments": {"path": "big.txt", "content": big}}],
                         arg_chunks=40),
              text("I will write it in parts.")]
    with OpenAIServer(script) as server:
        env = {**env_for(home, backend_name), "CAIRN_PROVIDER": "openai", "CAIRN_BASE_URL": server.base_url,
               "CAIRN_API_KEY": "sk-test-key", "CAIRN_MODEL": "m"}
        ran = subprocess.run([CAIRN, "run", "--yes", "--session-id", "s", "write a big file"], env=env, cwd=ws,
                             capture_output=True, text=True, timeout=120)
        second = server.requests[1].body["messages"]
        shown = subprocess.run([CAIRN, "show", "s", "--json"], env=env, cwd=ws, capture_output=True, text=True)
        listed = subprocess.run([CAIRN, "sessions", "--all", "--json"], env=env, cwd=ws, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert not (ws / "big.txt").exists()  # not run
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    (call,) = [e for e in events if e["type"] == "tool/call"]
    (result,) = [e for e in events if e["type"] == "tool/result"]
    cut = call["arguments"]["cairn_cut"]
    assert cut["bytes"] > 1_500_000 and len(cut["sha256"]) == 64 and cut["head"].startswith('{"path": "big.txt"')
    assert result["error_code"] == "BAD_ARGUMENTS" and "over the 1,000,000-byte limit" in result["content"]
    assert json.loads(listed.stdout)["size"] < 100_000  # stored cut, not 1.5 MB twice
    assert len(json.dumps(second)) < 100_000  # and the model is not sent the megabytes back either


# -- damage -----------------------------------------------------------------------------------------------------------


def change_one_stored_byte(home: Path, backend: str, needle: bytes, replacement: bytes) -> None:
    """Behind Cairn's back: one byte of one stored event changed, the JSON still valid (bit rot, a stray edit)."""
    assert len(needle) == len(replacement)
    if backend == "jsonl":
        path = home / "sessions" / "s.jsonl"
        data = path.read_bytes()
        assert data.count(needle) == 1
        path.write_bytes(data.replace(needle, replacement))
    elif backend == "sqlite":
        import sqlite3

        with sqlite3.connect(home / "sessions.sqlite3") as db:
            (seq, body), = [(s, bytes(b)) for s, b in db.execute("SELECT seq, body FROM events") if needle in bytes(b)]
            db.execute("UPDATE events SET body = ? WHERE seq = ? AND session_id = 's'", (body.replace(needle, replacement), seq))
    else:
        from pg_helpers import connect_to

        with connect_to(os.environ["CAIRN_DATABASE_URL"]) as db:
            (seq, body), = [(s, bytes(b)) for s, b in db.execute("SELECT seq, body FROM events") if needle in bytes(b)]
            db.execute("UPDATE events SET body = %s WHERE seq = %s AND session_id = 's'", (body.replace(needle, replacement), seq))


def test_a_byte_changed_inside_a_stored_text_is_damage_named_and_nothing_is_written(tmp_path, backend_name):
    home = tmp_path / "home"
    (tmp_path / "ws").mkdir()
    for prompt in ("list files", "read README.md please", "write notes.txt: hello"):
        args = ("run", "--yes", "--session-id", "s", prompt) if prompt == "list files" else \
               ("run", "--yes", "--resume", "s", prompt)
        proc = subprocess.run([CAIRN, *args], env=env_for(home, backend_name), cwd=tmp_path / "ws",
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    before = cairn(home, backend_name, "show", "s", "--json").stdout
    change_one_stored_byte(home, backend_name, b"README.md please", b"README.md pleas3")

    for args in (("show", "s"), ("show", "s", "--json"), ("export", "s"), ("run", "--resume", "s", "more")):
        assert_one_line(cairn(home, backend_name, *args), 4, "changed after they were written")
    (row,) = [json.loads(line) for line in cairn(home, backend_name, "sessions", "--all", "--json").stdout.splitlines()]
    assert row["status"] == "unreadable" and "changed after they were written" in row["reason"]
    change_one_stored_byte(home, backend_name, b"README.md pleas3", b"README.md please")
    assert cairn(home, backend_name, "show", "s", "--json").stdout == before  # the refusals wrote nothing


def env_for(home: Path, backend: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CAIRN_HOME": str(home), "LANG": "C.UTF-8",
           "CAIRN_PROVIDER": "demo", "CAIRN_DEMO_DELAY_MS": "0", "CAIRN_BACKEND": backend}
    if "CAIRN_DATABASE_URL" in os.environ:
        env["CAIRN_DATABASE_URL"] = os.environ["CAIRN_DATABASE_URL"]
    return env


@pytest.mark.parametrize("lost", ["the last turn's events", "every event"])
def test_sqlite_events_lost_behind_cairns_back_are_damage_not_a_shorter_history(tmp_path, lost):
    import sqlite3

    home = tmp_path / "home"
    (tmp_path / "ws").mkdir()
    for args in (("run", "--session-id", "s", "list files"), ("run", "--resume", "s", "read README.md")):
        proc = subprocess.run([CAIRN, *args], env=env_for(home, "sqlite"), cwd=tmp_path / "ws", capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(home / "sessions.sqlite3") as db:
        bodies = {seq: json.loads(body) for seq, body in db.execute("SELECT seq, body FROM events")}
        first_of_turn_2 = min(seq for seq, e in bodies.items() if e["type"] == "turn/start" and e["turn"] == 2)
        db.execute("DELETE FROM events WHERE seq >= ?", (first_of_turn_2 if lost != "every event" else 0,))
    for args in (("show", "s"), ("run", "--resume", "s", "more")):
        assert_one_line(cairn(home, "sqlite", *args), 4, "missing or changed")
    (row,) = [json.loads(line) for line in cairn(home, "sqlite", "sessions", "--all", "--json").stdout.splitlines()]
    assert row["status"] == "unreadable"


async def test_a_sqlite_database_from_before_the_checks_loads_and_is_checked_from_then_on(tmp_path):
    import sqlite3

    from test_contract import complete_turn

    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "sessions.sqlite3") as db:  # rev 2's schema: no chk column, no checks in the bodies
        db.executescript("""
            CREATE TABLE sessions (id TEXT PRIMARY KEY, format TEXT NOT NULL, version INTEGER NOT NULL,
                                   created INTEGER NOT NULL, cwd TEXT NOT NULL, writer TEXT);
            CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
                                 PRIMARY KEY (session_id, seq)) WITHOUT ROWID;""")
        db.execute("INSERT INTO sessions VALUES ('old', 'cairn-session', 1, 1, '/w', NULL)")
        from cairn.persistence.events import encode_event

        for seq, event in enumerate(complete_turn(1, "hello")):
            event.seq, event.time = seq, 1 + seq
            db.execute("INSERT INTO events VALUES ('old', ?, ?)", (seq, encode_event(event)))
    store = SessionStore(home, "sqlite")
    assert len(store.inspect("old").events) == 8
    from cairn.persistence.session import LiveSession
    from cairn.persistence.events import TurnStart

    async with LiveSession(store.open_for_resume("old")) as live:
        live.append(TurnStart(turn=2))
    assert len(store.inspect("old").events) == 9
    with sqlite3.connect(home / "sessions.sqlite3") as db:  # now the old events are covered by the new check
        db.execute("UPDATE events SET body = replace(body, 'hello', 'jello') WHERE session_id = 'old'")
    with pytest.raises(Exception, match="changed after they were written"):
        store.inspect("old")


def test_damaged_sqlite_pages_are_unreadable_never_an_empty_history(tmp_path):
    """Bytes overwritten from page 5 on (a failing disk): every command refuses with exit 4 or lists the sessions as
    unreadable with the reason; nothing is written into the damaged file."""
    import sqlite3

    home = tmp_path / "home"
    (tmp_path / "ws").mkdir()
    for i in range(6):
        for args in (("run", "--session-id", f"s{i}", "list files"), ("run", "--resume", f"s{i}", "read README.md")):
            proc = subprocess.run([CAIRN, *args], env=env_for(home, "sqlite"), cwd=tmp_path / "ws",
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
    path = home / "sessions.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[4 * 4096:] = bytes(len(data) - 4 * 4096)
    path.write_bytes(bytes(data))

    rows = [json.loads(line) for line in cairn(home, "sqlite", "sessions", "--all", "--json").stdout.splitlines()]
    assert rows and all(r["status"] == "unreadable" and r["reason"] for r in rows), rows
    for args in (("show", "s5"), ("export", "s5"), ("run", "--resume", "s5", "more")):
        assert_one_line(cairn(home, "sqlite", *args), 4, "sessions.sqlite3")
    assert path.read_bytes() == bytes(data)
