"""Hostile inputs, rev 4: each is one line on stderr and the SPEC exit code (4 damaged log or store, 2 user or
configuration error), never a traceback, never a hang, never a wrong answer. Real files and real `cairn` child
processes, as in tests/test_hostile_storage.py.

1. a damaged *middle* JSONL line that does not parse: exit 4 naming file and line on every command that reads the
   session; `cairn sessions` lists every other session and marks it `unreadable` (the same damage on the last line
   stays a torn tail, repaired on resume);
2. a damaged SQLite header or schema: exit 4 naming the file (never "free some space or fix permissions");
3. a read-only home (a read-only bind mount): show, sessions and export work on SQLite as on JSONL; writing is exit 2;
4. `CAIRN_HOME/snapshots` a regular file: turns and rewind go on without snapshots, saying why in one line;
5. JSON nested 100,000 deep in a server chunk, 5,000 deep in a config file, 50,000 deep in tool arguments: a
   malformed stream, exit 2 naming the file, BAD_ARGUMENTS to the model;
6. a FIFO (or a device) as the config or script file: refused without being read, exit 2, no hang;
7. a deleted current directory: exit 2 in one line;
8. a full disk: what is durable and what was lost, said truly (no "written at its next checkpoint" and then exit);
9. a key given as `--model`: masked wherever the value is echoed.

Mount-based cases (3, 8) need root (CAP_SYS_ADMIN) and are skipped without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from openai_server import OpenAIServer, raw, text, tool_calls

from cairn.persistence.store import SessionStore

CAIRN = str(Path(sys.executable).parent / "cairn")
TIMEOUT = 30  # seconds: a command that hangs (a FIFO opened for reading) fails the test instead of the suite


class World:
    """One isolated Cairn world: `home` (CAIRN_HOME), `ws` (the workspace and the current directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.ws = root / "ws"
        self.ws.mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": str(self.root), "LANG": "C.UTF-8", "CAIRN_HOME": str(self.home),
                "CAIRN_PROVIDER": "demo", "CAIRN_DEMO_DELAY_MS": "0", **extra}

    def run(self, *args: str, prefix: list[str] | None = None, cwd: Path | None = None,
            **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*(prefix or []), CAIRN, *args], env=self.env(**extra), cwd=str(cwd or self.ws),
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    def ok(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        proc = self.run(*args, prefix=None, cwd=None, **extra)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.returncode, proc.stderr)
        return proc


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The process ended with `code` and said why in exactly one `cairn: ` line naming every needle."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cairn: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, proc.stderr


def listed(world: World, *options: str) -> dict[str, dict]:
    proc = world.ok(*options, "sessions", "--all", "--json")
    return {row["id"]: row for row in map(json.loads, proc.stdout.splitlines())}


def show_json(world: World, session_id: str, *options: str) -> list[dict]:
    return [json.loads(line) for line in world.ok(*options, "show", session_id, "--json").stdout.splitlines()]


@contextlib.contextmanager
def mounted(*how: str) -> Iterator[None]:
    """Run `mount *how`, skipping the test where this process may not mount (not root); unmount afterwards."""
    target = how[-1]
    try:
        done = subprocess.run(["mount", *how], capture_output=True, text=True, timeout=TIMEOUT)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", target], capture_output=True, timeout=TIMEOUT)


@contextlib.contextmanager
def read_only_view(path: Path) -> Iterator[Path]:
    """`path` seen through a read-only bind mount: what `chmod` cannot show to root (root ignores permission bits)."""
    view = path.parent / f"{path.name}-ro"
    view.mkdir()
    try:
        with mounted("--bind", str(path), str(view)):
            remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True, text=True,
                                     timeout=TIMEOUT)
            if remount.returncode != 0:
                pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
            with pytest.raises(OSError):  # it really is read-only, for root too
                (view / "probe").write_text("x")
            yield view
    finally:
        view.rmdir()


# -- 1. a damaged middle line ---------------------------------------------------------------------------------------


READERS = [
    ("show", "bad"), ("show", "bad", "--json"), ("export", "bad"), ("export", "bad", "--format", "json"),
    ("rewind", "bad", "--turn", "1"), ("rewind", "bad", "--turn", "1", "--dry-run"), ("fork", "bad"),
    ("run", "--resume", "bad", "go on"), ("inspect", "bad"),
]


def damage(path: Path, old: bytes, new: bytes, last: bool = False) -> int:
    """Replace the first (or last) `old` in `path` by `new`; the 1-based line number it is on."""
    data = path.read_bytes()
    at = data.rfind(old) if last else data.find(old)
    assert at >= 0, old
    path.write_bytes(data[:at] + new + data[at + len(old):])
    return data.count(b"\n", 0, at) + 1


def test_a_damaged_middle_line_is_exit_4_naming_file_and_line_on_every_command_that_reads_it(world):
    world.ok("run", "--session-id", "good", "hello")
    world.ok("run", "--session-id", "bad", "hello")
    log = world.home / "sessions" / "bad.jsonl"
    # one byte: the closing quote of a type becomes a "2", so the line is no longer JSON (and its tag is unknown)
    line = damage(log, b'"type":"step/start"', b'"type":"step/start2')
    assert 1 < line < len(log.read_bytes().splitlines())  # a middle line, not the tail
    before = log.read_bytes()

    for args in READERS:
        one_line(world.run(*args), 4, f"bad.jsonl:{line}", "corrupt")
    assert log.read_bytes() == before  # nothing was cut, repaired or rewritten

    rows = listed(world)
    assert rows["good"]["status"] == "completed"
    assert rows["bad"]["status"] == "unreadable" and rows["bad"]["reason"].startswith(f"line {line}: ")
    table = world.ok("sessions").stdout
    assert re.search(r"^good\s+completed", table, re.M) and re.search(r"^bad\s+unreadable", table, re.M), table
    world.ok("show", "good")
    world.ok("run", "--resume", "good", "still fine")


def test_the_same_damage_on_the_last_line_is_still_a_torn_tail_that_resume_cuts_and_copies(world):
    world.ok("run", "--session-id", "s", "hello")
    log = world.home / "sessions" / "s.jsonl"
    line = damage(log, b'"type":"turn/end"', b'"type":"turn/end2', last=True)
    assert line == len(log.read_bytes().splitlines())
    shown = world.ok("show", "s")
    assert "torn last line" in shown.stderr and "interrupted" in shown.stdout
    world.ok("run", "--resume", "s", "go on")
    assert list(log.parent.glob("s.jsonl.torn-*"))  # the cut tail was copied first
    assert show_json(world, "s")[-1]["type"] == "turn/end"


# -- 2. a damaged SQLite database -----------------------------------------------------------------------------------


def sqlite_world(world: World) -> Path:
    world.ok("--backend", "sqlite", "run", "--session-id", "a", "hello")
    world.ok("--backend", "sqlite", "run", "--session-id", "b", "hello")
    db = world.home / "sessions.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for leftover in world.home.glob("sessions.sqlite3-*"):
        leftover.unlink()
    return db


def overwrite(path: Path, offset: int, data: bytes) -> None:
    content = bytearray(path.read_bytes())
    content[offset:offset + len(data)] = data
    path.write_bytes(bytes(content))


WRITERS = [("run", "--resume", "a", "go on"), ("run", "--session-id", "new", "hi")]
READS = [("sessions", "--all"), ("show", "a"), ("export", "a")]


@pytest.mark.parametrize("how", ["schema format", "schema name not UTF-8", "page size"])
def test_a_damaged_sqlite_header_or_schema_is_exit_4_naming_the_file(world, how):
    db = sqlite_world(world)
    if how == "schema format":  # header bytes 44-47: 1-4 in every database SQLite writes
        overwrite(db, 44, b"\xff\xff\xff\xff")
    elif how == "page size":
        overwrite(db, 16, b"\x03\x00")
    else:  # a byte of the table's name in sqlite_master: SQLite's own message then quotes bytes that are not UTF-8
        overwrite(db, db.read_bytes().index(b"tablesessionssessions") + 5, b"\xb8")
    before = db.read_bytes()
    for args in READS + WRITERS:
        line = one_line(world.run("--backend", "sqlite", *args), 4, "sessions.sqlite3")
        assert "free some space" not in line and "permissions" not in line
    assert db.read_bytes() == before


def test_a_damaged_write_version_refuses_writing_with_exit_4_and_still_reads_the_intact_data(world):
    """Header byte 18 (the write version) past 2 makes SQLite open the file read-only, and it says "attempt to write
    a readonly database": that is damage (exit 4), not permissions. The data itself is intact and still reads."""
    db = sqlite_world(world)
    overwrite(db, 18, b"\xff")
    before = db.read_bytes()
    for args in WRITERS:
        line = one_line(world.run("--backend", "sqlite", *args), 4, "sessions.sqlite3", "file format version")
        assert "free some space" not in line
    assert "hello" in world.ok("--backend", "sqlite", "show", "a").stdout
    assert set(listed(world, "--backend", "sqlite")) == {"a", "b"}
    assert db.read_bytes() == before


def test_damaged_text_in_one_sqlite_session_lists_it_unreadable_beside_the_others(world):
    db = sqlite_world(world)
    with sqlite3.connect(db) as conn:  # a text value that is not UTF-8: what a flipped bit in a page leaves
        conn.execute("UPDATE sessions SET cwd = CAST(X'2FFF' AS TEXT) WHERE id = 'a'")
    rows = listed(world, "--backend", "sqlite")
    assert (rows["a"]["status"], rows["b"]["status"]) == ("unreadable", "completed")
    for args in (("show", "a"), ("run", "--resume", "a", "go on")):
        one_line(world.run("--backend", "sqlite", *args), 4, "sessions.sqlite3")
    world.ok("--backend", "sqlite", "show", "b")


# -- 3. a read-only home --------------------------------------------------------------------------------------------


def test_a_read_only_home_is_read_on_every_backend_and_refuses_writing_with_exit_2(world, backend_name):
    world.ok("--backend", backend_name, "run", "--session-id", "a", "hello")
    expected = show_json(world, "a", "--backend", backend_name)
    with read_only_view(world.home) as view:
        home = {"CAIRN_HOME": str(view)}
        assert [json.loads(x) for x in world.ok("--backend", backend_name, "show", "a", "--json",
                                                **home).stdout.splitlines()] == expected
        assert "hello" in world.ok("--backend", backend_name, "show", "a", **home).stdout
        assert "hello" in world.ok("--backend", backend_name, "export", "a", **home).stdout
        assert len(world.ok("--backend", backend_name, "export", "a", "--format", "json",
                            **home).stdout.splitlines()) == len(expected)
        rows = world.ok("--backend", backend_name, "sessions", "--all", "--json", **home).stdout.splitlines()
        assert [(r["id"], r["status"]) for r in map(json.loads, rows)] == [("a", "completed")]
        line = one_line(world.run("--backend", backend_name, "run", "--resume", "a", "go on", **home), 2)
        assert "writable" in line or "permissions" in line
        # a dry run compares with a fresh snapshot of the workspace, which a read-only store cannot take
        dry = world.run("--backend", backend_name, "rewind", "a", "--turn", "1", "--dry-run", **home)
        if dry.returncode:
            one_line(dry, 2, "Read-only file system", "nothing was written")


def test_a_read_only_sqlite_home_with_a_live_write_ahead_log_shows_what_the_log_holds(world):
    """A writer that died leaves its last commits in `-wal` (and `-shm`): a reader on a read-only mount must read
    them, not the older main file alone."""
    db = sqlite_world(world)
    copy = ("import os, sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA journal_mode=WAL')\n"
            "c.execute(\"INSERT INTO sessions SELECT 'c', format, version, created, cwd, NULL, chk FROM sessions "
            "WHERE id = 'a'\")\n"
            "c.execute(\"INSERT INTO events SELECT 'c', seq, body FROM events WHERE session_id = 'a'\")\n"
            "os._exit(0)\n")  # killed: no checkpoint, the new session is in the -wal only
    subprocess.run([sys.executable, "-c", copy, str(db)], check=True, timeout=TIMEOUT)
    assert (world.home / "sessions.sqlite3-wal").stat().st_size > 0
    with read_only_view(world.home) as view:
        rows = world.ok("--backend", "sqlite", "sessions", "--all", "--json", CAIRN_HOME=str(view)).stdout
        assert sorted(json.loads(r)["id"] for r in rows.splitlines()) == ["a", "b", "c"]
        assert "hello" in world.ok("--backend", "sqlite", "show", "c", CAIRN_HOME=str(view)).stdout


# -- 4. the snapshot store is a regular file ------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="snapshots need git")
def test_a_snapshot_store_that_is_a_regular_file_is_named_and_turns_and_rewind_go_on_without_it(world):
    """Snapshots are an addition to the log (SPEC §9: without them rewind works from the file tools' before-images
    "and says so"); a session stays continuable whatever sits beside it (§7). So an unusable store is named once per
    command, and turns and rewind go on without it."""
    world.home.mkdir(mode=0o700)
    store = world.home / "snapshots"
    store.write_text("not a directory\n")
    first = world.ok("run", "--session-id", "s", "--yes", "write notes.txt: hello")
    said = [line for line in first.stderr.splitlines() if str(store) in line]
    assert len(said) == 1 and "not a directory" in said[0] and "file tools" in said[0], first.stderr
    world.ok("run", "--resume", "s", "--yes", "write notes.txt: goodbye")
    assert (world.ws / "notes.txt").read_text() == "goodbye\n"
    assert not any(e["type"] == "workspace/snapshot" for e in show_json(world, "s"))

    dry = world.ok("rewind", "s", "--turn", "2", "--dry-run")
    assert "notes.txt" in dry.stdout and str(store) in dry.stderr
    rewound = world.ok("rewind", "s", "--turn", "2")
    assert [line for line in rewound.stderr.splitlines() if str(store) in line], rewound.stderr
    assert (world.ws / "notes.txt").read_text() == "hello\n"  # from the file tool's before-image
    assert store.read_text() == "not a directory\n"  # nothing was made or removed at that path


# -- 5. JSON nested too deeply --------------------------------------------------------------------------------------


def test_a_server_chunk_nested_100000_deep_is_a_malformed_stream(world):
    with OpenAIServer([raw(["data: " + "[" * 100_000, ""])], strict=False) as server:
        proc = world.run("run", "--session-id", "s", "hi", CAIRN_PROVIDER="openai", CAIRN_BASE_URL=server.base_url)
    assert proc.returncode == 1
    no_traceback(proc)
    assert proc.stderr.strip().splitlines()[-1].startswith("cairn: turn ended in error: malformed stream")
    end = show_json(world, "s")[-1]
    assert end["type"] == "turn/end" and end["reason"] == "error" and end["error"]["code"] != "INTERNAL_ERROR"


def test_tool_arguments_nested_50000_deep_are_invalid_arguments_for_the_model(world):
    deep = "[" * 50_000 + "]" * 50_000
    with OpenAIServer([tool_calls([{"id": "deep", "name": "read_file", "arguments": deep}]), text("done")]) as server:
        proc = world.run("run", "--session-id", "s", "hi", CAIRN_PROVIDER="openai", CAIRN_BASE_URL=server.base_url)
        second = server.requests[1].body["messages"]
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    result = next(e for e in show_json(world, "s") if e["type"] == "tool/result")
    assert (result["call_id"], result["is_error"], result["error_code"]) == ("deep", True, "BAD_ARGUMENTS")
    assert "nested more than" in result["content"]
    assert any(m.get("role") == "tool" and "nested more than" in m.get("content", "") for m in second)


@pytest.mark.parametrize("depth", [5000, 100])
def test_a_config_file_nested_too_deeply_is_exit_2_naming_it(world, depth):
    config = world.root / "deep.toml"
    config.write_text("x = " + "[" * depth + "]" * depth + "\n")
    for args in (("config",), ("run", "hi"), ("--config", str(config), "config")):
        one_line(world.run(*args, CAIRN_CONFIG=str(config)), 2, str(config), "nested")


# -- 6. a FIFO or a device as a file ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["CAIRN_CONFIG", "--config"])
def test_a_fifo_as_the_config_file_is_refused_without_being_read(world, how):
    world.ok("run", "--session-id", "s", "hello")
    fifo = world.root / "config.toml"
    os.mkfifo(fifo)

    def cairn(*args: str) -> subprocess.CompletedProcess[str]:  # (a hang fails with TimeoutExpired)
        if how == "--config":
            return world.run("--config", str(fifo), *args)
        return world.run(*args, CAIRN_CONFIG=str(fifo))

    for args in (("config",), ("run", "hi"), ("run", "--resume", "s", "go on")):
        one_line(cairn(*args), 2, str(fifo), "FIFO", "not a regular file")
    # commands that only read sessions never depend on the config file (SPEC §6): they work, and never hang
    assert cairn("show", "s").returncode == 0
    assert "s " in cairn("sessions").stdout


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_the_script_file_is_refused_without_being_read(world, what):
    script = world.root / "script.json"
    if what == "fifo":
        os.mkfifo(script)
    else:
        script = Path(what)
    for args in (("run", "hi"), ("acp",)):
        one_line(world.run("--provider", "script", "--script", str(script), *args), 2, str(script),
                 "not a regular file")


# -- 7. a deleted current directory ---------------------------------------------------------------------------------


def test_a_deleted_current_directory_is_exit_2_in_one_line(world):
    gone = world.root / "gone"
    in_gone = ["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone)]  # cwd deleted under the process
    for args in (("sessions",), ("show", "s"), ("run", "hi"), ("config",), ()):
        gone.mkdir()
        one_line(world.run(*args, prefix=in_gone, cwd=world.root), 2, "current directory", "--workspace")
        assert not gone.exists()
    gone.mkdir()
    assert world.run("--workspace", str(world.ws), "sessions", prefix=in_gone, cwd=world.root).returncode == 0


# -- 8. a full disk -------------------------------------------------------------------------------------------------


def test_a_full_disk_says_what_is_durable_and_what_was_lost(world):
    world.home.mkdir()
    script = world.root / "long.json"
    script.write_text(json.dumps({"responses": [{"text": "x" * 600_000, "chunks": 50}]}))
    with mounted("-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(world.home)):
        proc = world.run("--provider", "script", "--script", str(script), "run", "--session-id", "s", "hi",
                         CAIRN_SNAPSHOTS="off")
        no_traceback(proc)
        assert proc.returncode == 1
        assert "writes them at its next checkpoint" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert "tries to write them again" in lines[-2] and "No space left on device" in lines[-2], proc.stderr
        found = re.match(r"cairn: session 's' was closed without writing its last (\d+) events \(seq (\d+)–(\d+)\)",
                         lines[-1])
        assert found, lines[-1]
        lost, first, last = map(int, found.groups())
        assert first + lost - 1 == last and f"Events up to seq {first - 1} are durable" in lines[-1]
        assert "lost" in lines[-1] and "--resume s" in lines[-1]
        # what it says is durable is there: every event up to that seq, in order (a torn tail at most after them)
        events = SessionStore(world.home).inspect("s").events
        assert [e.seq for e in events[:first]] == list(range(first))


# -- 9. a key given as the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model, secrets", [
    ("sk-abc123def456ghi789jkl0", ["sk-abc123def456ghi789jkl0"]),
    ("https://user:tok3n-abcdef@models.example/v1?api_key=k3y-abcdef123", ["tok3n-abcdef", "k3y-abcdef123"]),
    ("https://tok3n-abcdef@models.example/v1", ["tok3n-abcdef"]),
])
def test_a_key_given_as_the_model_is_masked_wherever_it_is_echoed(world, model, secrets):
    runs = [world.ok("--model", model, "run", "--session-id", "s", "hi"),
            world.ok("--model", model, "run", "--json", "hi"),
            world.ok("--model", model, "config"),
            world.ok("--model", model, "config", "--json")]
    for proc in runs:
        for secret in secrets:
            assert secret not in proc.stderr and secret not in proc.stdout, (secret, proc.stderr, proc.stdout)
    assert "***" in runs[0].stderr.splitlines()[0]
    assert "***" in json.loads(runs[1].stdout.splitlines()[0])["model"]
    world.ok("--model", "gpt-4o-mini", "run", "--session-id", "plain", "hi")  # an ordinary name is shown as it is
    assert "gpt-4o-mini" in world.ok("--model", "gpt-4o-mini", "config").stdout
