"""Proofs for issue 4 beyond the crash matrix: storage faults at every barrier kind, a read-only store, secrets, and bad
input through the real CLI.

- Faults (SPEC §3) run in process through the backends' own seams: a `FileOps` for JSONL (ENOSPC/EIO at write, where a
  filling disk first makes a short write, and at fdatasync) and a connection factory for SQLite (a failing COMMIT: the
  barrier is one `synchronous=FULL` commit, so write and sync cannot fail separately there). The fault is armed by a
  hook wrapper placed outside the policy's, only while that one barrier runs, and the write-behind window is so long
  that only barriers write: each case is deterministic.
- A read-only store must be refused at start (exit 2, one line), before any turn begins. Tests run as root here, where
  permission bits do not stop writes; see `unprivileged()` for how the child is made subject to them.
- Secrets and bad input go through `cairn` subprocesses and a real local OpenAI-protocol server.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from crash_harness import CAIRN, Rig, assert_contiguous, types
from openai_server import OpenAIServer, error, malformed, raw, text, tool_calls

from cairn.app.agent.approval import headless_approver
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config
from cairn.persistence.events import encode_event, event_type
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.sqlite import SqliteBackend
from cairn.persistence.store import SessionStore

LONG = 3600.0  # write-behind window: only barriers write


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cairn: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# ================================================================================================ 3. faults at barriers


class FaultyOps(FileOps):
    """Real file operations; while armed with (op, errno), that operation fails. A write first goes through
    half-way (a short write, as on a filling disk) and fails on the rest: a torn line is really on disk then."""

    def __init__(self) -> None:
        self.armed: tuple[str, int] | None = None
        self.fired = 0
        self._short = False

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.armed and self.armed[0] == "write":
            self.fired += 1
            self._short = not self._short
            if self._short and len(data) > 1:
                return super().write(fd, data[: len(data) // 2])
            raise OSError(self.armed[1], os.strerror(self.armed[1]))
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if self.armed and self.armed[0] == "fdatasync":
            self.fired += 1
            raise OSError(self.armed[1], os.strerror(self.armed[1]))
        super().fdatasync(fd)


class FaultyCommits:
    """SQLite connections whose COMMIT fails with `message` while armed (the transaction is then rolled back)."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.armed: bool = False
        self.fired = 0

    def connect(self, path: str) -> sqlite3.Connection:
        faults = self

        class Connection(sqlite3.Connection):
            def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
                if sql == "COMMIT" and faults.armed:
                    faults.fired += 1
                    raise sqlite3.OperationalError(faults.message)
                return super().execute(sql, *args)

        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0, factory=Connection)


FAULTS = {
    # name: (backend, op, errno or sqlite message, words the surfaced error must contain)
    "jsonl-write-ENOSPC": ("jsonl", "write", errno.ENOSPC, "No space left on device"),
    "jsonl-write-EIO": ("jsonl", "write", errno.EIO, "Input/output error"),
    "jsonl-fsync-ENOSPC": ("jsonl", "fdatasync", errno.ENOSPC, "No space left on device"),
    "jsonl-fsync-EIO": ("jsonl", "fdatasync", errno.EIO, "Input/output error"),
    "sqlite-commit-EIO": ("sqlite", "commit", "disk I/O error", "disk I/O error"),
    "sqlite-commit-FULL": ("sqlite", "commit", "database or disk is full", "database or disk is full"),
}


class Fault:
    def __init__(self, home: Path, name: str) -> None:
        self.backend, self.op, self.code, self.words = FAULTS[name]
        if self.backend == "jsonl":
            self.ops = FaultyOps()
            self.store = SessionStore(home, JsonlBackend(home, self.ops))
        else:
            self.commits = FaultyCommits(self.code)  # type: ignore[arg-type]
            self.store = SessionStore(home, SqliteBackend(home, connect=self.commits.connect))

    def arm(self, on: bool) -> None:
        if self.backend == "jsonl":
            self.ops.armed = (self.op, self.code) if on else None  # type: ignore[assignment]
        else:
            self.commits.armed = on

    @property
    def fired(self) -> int:
        return self.ops.fired if self.backend == "jsonl" else self.commits.fired


SCRIPTS = {
    "pre-step": [{"text": "never requested"}],
    "pre-request": [{"text": "never requested"}],
    "pre-tool": [
        {"tool_calls": [{"call_id": "c1", "name": "run_command", "arguments": {"command": "touch ran.txt"}}]},
        {"text": "ok"},
    ],
    "turn-end": [{"text": "one"}, {"text": "two"}],
}
HOOK_POINT = {"pre-step": "before_step", "pre-request": "around_stream", "pre-tool": "around_tool",
              "turn-end": "after_turn"}
PLAIN_TURN = ["turn/start", "step/start", "user/message", "request/header", "assistant/chunk", "assistant/message",
              "step/end", "turn/end"]


@pytest.mark.anyio
@pytest.mark.parametrize("fault_name", list(FAULTS))
@pytest.mark.parametrize("barrier", list(SCRIPTS))
async def test_a_failed_barrier_fails_closed_and_loses_nothing(tmp_path, barrier, fault_name):
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": SCRIPTS[barrier]}))
    home = tmp_path / "home"
    config = resolve_config(home=str(home), backend=FAULTS[fault_name][0], provider="script", script=str(script),
                            workspace=str(ws), env={"CAIRN_SNAPSHOTS": "off"})  # the barriers' own order is proved
    fault = Fault(home, fault_name)
    reports: list[str] = []
    during: list[tuple[int, int, int]] = []  # (queued, durable_seq, last seq) while the fault was on

    async with open_agent(config, opened=fault.store.create(str(ws), "s"), approver=headless_approver(True),
                          report=reports.append, window=LONG) as agent:
        session = agent.session
        provider = agent.loop.provider
        constructed: list[Any] = []
        real_stream = provider.stream
        provider.stream = lambda request: constructed.append(request) or real_stream(request)  # type: ignore

        async def only_this_barrier(ctx: Any, call_next: Any) -> Any:
            if ctx.turn != 1 or during:
                return await call_next()
            fault.arm(True)
            try:
                return await call_next()
            finally:
                fault.arm(False)
                during.append((session.coordinator.queued, session.coordinator.durable_seq, session.events[-1].seq))

        agent.loop.hooks.chains[HOOK_POINT[barrier]].insert(0, only_this_barrier)  # outermost: around the policy's
        first = await agent.run("first")
        second = await agent.run("second") if barrier == "turn-end" else None
        events = list(session.events)

    assert fault.fired >= 1 and len(during) == 1
    queued, durable, last = during[0]
    assert queued >= 1 and durable < last, "while the fault lasted, the events stayed queued and nothing claimed them"
    kinds = types([json.loads(encode_event(e)) for e in events])
    end = events[-1]
    if barrier in ("pre-step", "pre-request"):  # the turn ends `error` and the provider is never called
        assert constructed == []
        assert first.reason == "error" and first.error.code == "CHECKPOINT_FAILED"
        assert fault.words in first.error.message
        opening = ["turn/start", "step/start", "user/message"]
        opening += ["request/header"] if barrier == "pre-request" else []
        assert kinds == [*opening, "step/end", "turn/end"]
        assert end.reason == "error" and end.error.code == "CHECKPOINT_FAILED"
    elif barrier == "pre-tool":  # the body never runs; the model hears CHECKPOINT_FAILED and the turn goes on
        assert not (ws / "ran.txt").exists()
        call = next(e for e in events if event_type(e) == "tool/call")
        result = next(e for e in events if event_type(e) == "tool/result")
        assert (result.is_error, result.error_code, result.source_seq) == (True, "CHECKPOINT_FAILED", call.seq)
        assert fault.words in result.content
        assert kinds == ["turn/start", "step/start", "user/message", "request/header", "assistant/message",
                         "approval/asked", "approval/decided", "tool/call", "tool/result", "step/end",
                         "step/start", "request/header", "assistant/chunk", "assistant/message", "step/end",
                         "turn/end"]
        assert {"role": "tool", "tool_call_id": "c1", "content": result.content} in constructed[1].messages
        assert first.reason == "completed"
    else:  # turn-end: reported live, nothing appended after the closed turn, later work still runs
        assert first.reason == "completed" and second is not None and second.reason == "completed"
        assert len(reports) == 1 and "turn 1" in reports[0] and fault.words in reports[0]
        assert kinds == PLAIN_TURN + PLAIN_TURN

    # after the fault cleared, later barriers wrote everything: a fault-free reader finds each event exactly once
    reread = SessionStore(home, config.backend)
    stored = reread.backend.load("s")
    assert [encode_event(e) for e in stored.events] == [encode_event(e) for e in events]
    assert_contiguous([json.loads(encode_event(e)) for e in stored.events])
    if config.backend == "jsonl":
        data = reread.backend.path("s").read_bytes()
        assert stored.torn_bytes == 0 and data.count(b"\n") == 1 + len(events)
    opened = reread.open_for_resume("s")  # and the session loads (cold) for the next turn, nothing to repair
    try:
        assert opened.repaired == [] and len(opened.events) == len(events)
    finally:
        opened.writer.close()
        opened.lock.release()


# ======================================================================================== 3b. a read-only store


@functools.cache
def _nobody_can_run_cairn() -> bool:
    try:
        proc = subprocess.run([CAIRN, "--help"], user=65534, group=65534, extra_groups=[], cwd="/",
                              capture_output=True, timeout=30)
    except OSError:  # e.g. the interpreter lives under a directory nobody may enter
        return False
    return proc.returncode == 0


def unprivileged() -> tuple[list[str], dict[str, Any]]:
    """How to start `cairn` so that permission bits apply to it: (argv prefix, Popen keyword arguments).

    Not root: nothing to do. Root: uid 65534 (nobody) when it can run this venv's `cairn`; otherwise (here the venv's
    interpreter lives under /root, mode 0700, which nobody cannot enter) the same root process without the two
    capabilities that let root ignore permission bits, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (util-linux
    `setpriv`, dropped from the bounding set so exec cannot regain them). Either way the child is subject to
    permission checks like any user; nothing is mocked.
    """
    if os.geteuid() != 0:
        return [], {}
    if _nobody_can_run_cairn():
        return [], {"user": 65534, "group": 65534, "extra_groups": []}
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("running as root with neither a venv that uid 65534 can use nor `setpriv` to drop "
                    "CAP_DAC_OVERRIDE: there is no honest way to make a directory read-only for the child here")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps, "--"], {}


@pytest.fixture
def ro_root(tmp_path):
    """A root directory the unprivileged child can traverse (pytest's own base directory is 0700 under root)."""
    prefix, kwargs = unprivileged()
    if "user" not in kwargs:
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="cairn-ro-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)  # as root: permission bits do not stand in the way


def read_only(*paths: Path) -> None:
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)


RO_CASES = {
    # name: (backend, whether a session "old" exists first, what to make read-only (given the home))
    "jsonl-new-session-in-read-only-sessions-dir": ("jsonl", False, lambda home: [home / "sessions"]),
    "jsonl-resume-in-read-only-sessions-dir": (
        "jsonl", True, lambda home: [home / "sessions", home / "sessions" / "old.jsonl"]),
    "jsonl-read-only-locks-dir": ("jsonl", False, lambda home: [home / "locks"]),
    "sqlite-new-session-in-read-only-home": ("sqlite", False, lambda home: [home]),
    "sqlite-resume-in-read-only-home": ("sqlite", True, lambda home: [home, home / "sessions.sqlite3"]),
}


@pytest.mark.parametrize("case", list(RO_CASES))
def test_a_read_only_store_is_refused_at_start_with_one_line(ro_root, case):
    backend, existing, targets = RO_CASES[case]
    rig = Rig(ro_root, backend)
    script = rig.script([{"text": "should never stream"}])
    if existing:
        assert rig.run("run", "--session-id", "old", "--provider", "script", "--script", script, "hi").returncode == 0
    rig.home.mkdir(exist_ok=True)
    for d in ("sessions", "locks"):
        (rig.home / d).mkdir(exist_ok=True)
    ids_before = sorted(rig.store().backend.list_ids())
    log_before = rig.raw_log("old") if existing else None
    prefix, kwargs = unprivileged()
    if "user" in kwargs:  # the child runs as nobody: hand it the world, then take away exactly the targets
        for p in [ro_root, *ro_root.rglob("*")]:
            os.chown(p, 65534, 65534, follow_symlinks=False)
    read_only(*targets(rig.home))
    args = ["run", "--provider", "script", "--script", script, *(["--resume", "old"] if existing else []), "hello"]

    proc = subprocess.run([*prefix, CAIRN, *args], env=rig.env(), cwd=rig.ws, capture_output=True, text=True,
                          timeout=60, **kwargs)

    assert_one_line_error(proc, 2, "writable", str(rig.home))
    assert proc.stdout == "", "refused before any turn began"
    for p in [rig.home, *rig.home.rglob("*")]:
        p.chmod(0o700 if p.is_dir() else 0o600)
    assert sorted(rig.store().backend.list_ids()) == ids_before, "no session was created"
    if existing:
        assert rig.raw_log("old") == log_before, "the existing log is untouched"
        assert rig.run("show", "old").returncode == 0


# ================================================================================================= 5. secrets


def scan_for(secret: str, home: Path) -> list[Path]:
    """Every file under `home` (the SQLite -wal and -shm included), asserting `secret` is in none of their bytes."""
    files = [p for p in home.rglob("*") if p.is_file()]
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"the API key leaked into {path}"
    return files


def test_the_api_key_reaches_no_byte_under_cairn_home(tmp_path, backend_name):
    key = f"sk-proof-{secrets.token_hex(16)}"
    # ALIAS_TOKEN: the same key under another name (a shell that did `export CAIRN_API_KEY=$ALIAS_TOKEN`)
    rig = Rig(tmp_path, backend_name,
              env={"CAIRN_API_KEY": key, "ALIAS_TOKEN": key, "CAIRN_MODEL": "m", "CAIRN_TIMEOUT": "10"})
    echoed = f"Authorization: Bearer {key}"
    runs = [  # (behaviours for one `cairn run`, exit code, a word the outcome must show)
        ([text("Hello there.", chunks=2)], 0, "Hello there."),
        ([tool_calls([{"id": "call_env", "name": "run_command",
                       "arguments": {"command": 'env; echo "key=$CAIRN_API_KEY $OPENAI_API_KEY"'}}]),
          text("Seen it.")], 0, "Seen it."),
        ([error(401, "invalid api key", echo_auth=True)], 1, "401"),
        ([error(404, "no such model", echo_auth=True)], 1, "404"),  # not retried (a 5xx would be, SPEC §7)
        ([error(400, body_text=f"bad request; you sent {echoed}")], 1, "400"),
        ([raw([f'data: {{"error": {{"message": "token revoked ({echoed})"}}}}', ""])], 1, "token revoked"),
        ([malformed(lines=[f"data: {{not json {echoed}", ""])], 1, "not JSON"),
    ]
    with OpenAIServer(default=text("(default)")) as server:
        rig.extra_env["CAIRN_BASE_URL"] = server.base_url
        for i, (behaviours, code, word) in enumerate(runs):
            server.push(*behaviours)
            session = ["--session-id", "s"] if i == 0 else ["--resume", "s"]
            proc = rig.run("run", *session, "--provider", "openai", "--yes", f"turn {i + 1}")
            assert proc.returncode == code, proc.stderr
            assert word in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
            assert key not in proc.stderr, "error messages are scrubbed"
            scan_for(key, rig.home)

        # the last turn is held right after its turn-end barrier: scan while the process is live (the SQLite WAL
        # still holds the commits), then SIGKILL it and scan what it left behind
        server.push(text("Last one."))
        child = rig.spawn("run", "--resume", "s", "--provider", "openai", "last", failpoint="turn-ended")
        child.wait_failpoint("turn-ended", "s")
        live_files = scan_for(key, rig.home)
        child.kill()
        scan_for(key, rig.home)
        requests = server.requests

    assert requests and all(r.header("authorization") == f"Bearer {key}" for r in requests), "the key was sent"
    if backend_name == "sqlite":
        wal = rig.home / "sessions.sqlite3-wal"
        assert wal in live_files and wal.stat().st_size > 0, "the WAL was scanned while it held the commits"
    events = rig.show("s")
    env_result = next(e for e in events if e["type"] == "tool/result" and e["call_id"] == "call_env")
    assert "CAIRN_CALL_ID=call_env" in env_result["content"], "the command ran and its output was recorded"
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == [
        "completed", "completed", "error", "error", "error", "error", "error", "completed"]
    assert all(key not in json.dumps(e) for e in events)


# ============================================================================================= 6. bad input via the CLI


@pytest.fixture
def rig(tmp_path, backend_name):
    rig = Rig(tmp_path, backend_name)
    yield rig
    rig.cleanup()


@pytest.fixture
def jrig(tmp_path):
    rig = Rig(tmp_path, "jsonl")
    yield rig
    rig.cleanup()


def test_malformed_scripts_are_one_line_usage_errors_and_create_nothing(jrig):
    bad = {
        "shape.json": '{"responses": {"a": 1}}',
        "calls.json": '{"responses": [{"text": "x", "tool_calls": {"name": "run_command"}}]}',
        "chunks.json": '{"responses": [{"text": "x", "chunks": -1}]}',
        "broken.json": '{"responses": [\n  {"text": "x"},\n  oops\n]}',
    }
    words = {"shape.json": '"responses" list', "calls.json": '"tool_calls" must be a list',
             "chunks.json": "non-negative integer", "broken.json": "line 3"}
    for name, content in bad.items():
        path = jrig.io / name
        path.write_text(content)
        proc = jrig.run("run", "--provider", "script", "--script", str(path), "hi")
        assert_one_line_error(proc, 2, str(path), words[name])
    missing = jrig.io / "missing.json"
    assert_one_line_error(jrig.run("run", "--provider", "script", "--script", str(missing), "hi"), 2, "does not exist")
    assert jrig.run("sessions", "--all", "--json").stdout == ""


def test_unknown_provider_or_backend_is_a_usage_error(jrig):
    proc = jrig.run("run", "hi", env={"CAIRN_PROVIDER": "psychic"})
    assert_one_line_error(proc, 2, "'psychic'", "demo, script, openai")
    assert_one_line_error(jrig.run("run", "hi", env={"CAIRN_BACKEND": "mongo"}), 2, "'mongo'", "jsonl, sqlite")
    proc = jrig.run("run", "--provider", "psychic", "hi")  # argparse's own refusal: usage, then the error
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "invalid choice: 'psychic'" in proc.stderr.strip().splitlines()[-1]
    assert jrig.run("sessions", "--all", "--json").stdout == ""


def test_common_options_work_before_the_command_too(jrig, tmp_path):
    """`cairn --home DIR --backend sqlite run …` must use DIR and SQLite, not silently fall back to the defaults."""
    other = tmp_path / "other-home"
    script = jrig.script([{"text": "stored elsewhere"}])

    proc = jrig.run("--home", str(other), "--backend", "sqlite", "--provider", "script", "--script", script,
                    "run", "--session-id", "here", "hi")

    assert proc.returncode == 0, proc.stderr
    assert (other / "sessions.sqlite3").exists() and not jrig.home.exists()
    listed = jrig.run("--home", str(other), "--backend", "sqlite", "sessions", "--all", "--json")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["here"]
    assert jrig.run("--home", str(other), "--backend", "sqlite", "show", "here").returncode == 0


def test_unknown_session_id_on_sqlite_is_a_usage_error(tmp_path):
    rig = Rig(tmp_path, "sqlite")  # the JSONL variant is in test_cli.py
    assert_one_line_error(rig.run("show", "nope"), 2, "'nope'", "cairn sessions")  # no database yet
    assert rig.run("run", "--session-id", "real", "hi").returncode == 0
    assert_one_line_error(rig.run("show", "nope"), 2, "'nope'")
    assert_one_line_error(rig.run("run", "--resume", "nope", "hi"), 2, "'nope'")
    assert rig.run("show", "real").returncode == 0


def corrupt_event(rig: Rig, sid: str, index: int, body: bytes) -> str:
    """Replace stored event `index` with `body`; returns the `path:line` a reader must name."""
    if rig.backend == "jsonl":
        path = rig.home / "sessions" / f"{sid}.jsonl"
        lines = path.read_bytes().split(b"\n")
        lines[index + 1] = body  # line 1 is the header
        path.write_bytes(b"\n".join(lines))
        return f"{path}:{index + 2}"
    db = rig.home / "sessions.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE events SET body = ? WHERE session_id = ? AND seq = ?", (body, sid, index))
    conn.close()
    return f"{db}[{sid}]:{index + 1}"  # rows count from line 1


def test_a_corrupt_event_in_the_middle_exits_4_naming_path_and_line_and_leaves_the_log_alone(rig):
    assert rig.run("run", "--session-id", "healthy", "hi").returncode == 0
    assert rig.run("run", "--session-id", "bad", "hi").returncode == 0
    assert rig.run("run", "--resume", "bad", "again").returncode == 0
    where = corrupt_event(rig, "bad", 3, b'{"type": "request/header", "seq": 3, "tim')
    damaged = rig.raw_log("bad")

    assert_one_line_error(rig.run("show", "bad"), 4, where, "corrupt")
    assert_one_line_error(rig.run("run", "--resume", "bad", "more"), 4, where)
    assert_one_line_error(rig.run("show", "bad", "--json"), 4, where)

    assert rig.raw_log("bad") == damaged, "nothing was repaired, truncated or appended"
    listing = rig.run("sessions", "--all", "--json")
    rows = {row["id"]: row for row in map(json.loads, listing.stdout.splitlines())}
    assert listing.returncode == 0 and set(rows) == {"healthy", "bad"}
    assert rows["healthy"]["status"] == "completed"
    assert rows["bad"]["status"] == "unreadable" and rows["bad"]["reason"], "listed with the reason, not hidden"
    assert rig.run("show", "healthy").returncode == 0


def test_a_future_format_version_exits_4_saying_newer_for_show_and_resume(rig):
    assert rig.run("run", "--session-id", "future", "hi").returncode == 0
    if rig.backend == "jsonl":
        path = rig.home / "sessions" / "future.jsonl"
        path.write_bytes(path.read_bytes().replace(b'"version":1', b'"version":2', 1))
    else:
        with sqlite3.connect(rig.home / "sessions.sqlite3") as conn:
            conn.execute("UPDATE sessions SET version = 2 WHERE id = 'future'")
        conn.close()
    before = rig.raw_log("future")

    for args in (("show", "future"), ("run", "--resume", "future", "x")):
        proc = rig.run(*args)
        assert_one_line_error(proc, 4, "newer", "version 2")
        assert "corrupt" not in proc.stderr

    assert rig.raw_log("future") == before


def last_request_messages(server: OpenAIServer) -> list[dict]:
    return server.requests[-1].body["messages"]


def test_invalid_tool_argument_json_from_the_model_becomes_a_bad_arguments_result(jrig):
    raw_args = '{"path": "a.txt", '
    with OpenAIServer([tool_calls([{"id": "call_bad", "name": "read_file", "arguments": raw_args}]),
                       text("I will fix my JSON.")]) as server:
        proc = jrig.run("run", "--session-id", "s", "--provider", "openai", "--model", "m", "read a.txt",
                        env={"CAIRN_BASE_URL": server.base_url})
        messages = last_request_messages(server)

    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    events = jrig.show("s")
    call = next(e for e in events if e["type"] == "tool/call")
    result = next(e for e in events if e["type"] == "tool/result")
    assert call["arguments"] == raw_args, "kept exactly as the model sent it"
    assert (result["error_code"], result["is_error"], result["source_seq"]) == ("BAD_ARGUMENTS", True, call["seq"])
    assert "not valid JSON" in result["content"]
    assert messages[-2]["tool_calls"][0]["function"]["arguments"] == "{}", "invalid JSON is never sent back (SPEC §7)"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_bad", "content": result["content"]}
    assert events[-1]["reason"] == "completed"


def test_an_unknown_tool_name_from_the_model_becomes_an_unknown_tool_result(jrig):
    with OpenAIServer([tool_calls([{"id": "call_t", "name": "teleport", "arguments": {"to": "mars"}}]),
                       text("No teleporting then.")]) as server:
        proc = jrig.run("run", "--session-id", "s", "--provider", "openai", "--model", "m", "go to mars",
                        env={"CAIRN_BASE_URL": server.base_url})
        messages = last_request_messages(server)

    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    events = jrig.show("s")
    assert "tool/call" not in types(events), "an unknown tool never starts"
    result = next(e for e in events if e["type"] == "tool/result")
    assert (result["call_id"], result["error_code"], result["is_error"]) == ("call_t", "UNKNOWN_TOOL", True)
    assert "teleport" in result["content"] and "run_command" in result["content"]
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_t", "content": result["content"]}


def test_paths_outside_the_workspace_are_refused_and_nothing_leaks_or_lands_outside(jrig):
    outside = jrig.root / "outside.txt"
    outside.write_text("TOP-SECRET-OUTSIDE-CONTENT\n")
    calls = [
        {"call_id": "r", "name": "read_file", "arguments": {"path": "../outside.txt"}},
        {"call_id": "w", "name": "write_file", "arguments": {"path": "../escape.txt", "content": "x"}},
        {"call_id": "a", "name": "write_file", "arguments": {"path": str(jrig.root / "abs.txt"), "content": "x"}},
    ]
    script = jrig.script([{"tool_calls": calls}, {"text": "Understood."}])

    proc = jrig.run("run", "--session-id", "s", "--provider", "script", "--script", script, "--yes", "escape")

    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    events = jrig.show("s")
    results = {e["call_id"]: e for e in events if e["type"] == "tool/result"}
    for call_id in ("r", "w", "a"):
        result = results[call_id]
        assert result["error_code"] == "BAD_ARGUMENTS" and "outside the workspace" in result["content"]
    assert not (jrig.root / "escape.txt").exists() and not (jrig.root / "abs.txt").exists()
    assert b"TOP-SECRET-OUTSIDE-CONTENT" not in jrig.raw_log("s")


def test_a_command_printing_50_mb_is_truncated_visibly_and_the_log_stays_small(jrig):
    size = 50 * 1024 * 1024
    command = f"head -c {size} /dev/zero | tr '\\0' a"
    calls = [{"call_id": "big", "name": "run_command", "arguments": {"command": command}}]
    script = jrig.script([{"tool_calls": calls}, {"text": "That was a lot."}])

    proc = jrig.run("run", "--session-id", "s", "--provider", "script", "--script", script, "--yes", "flood")

    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    events = jrig.show("s")
    result = next(e for e in events if e["type"] == "tool/result")
    assert result["is_error"] is False and result["content"].endswith("[exit code 0]")
    assert "[output truncated:" in result["content"] and len(result["content"]) < 64 * 1024
    assert len(jrig.raw_log("s")) < 256 * 1024
    assert events[-1]["reason"] == "completed"
