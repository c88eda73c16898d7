"""The fleet listing on PostgreSQL (SPEC rev 4 §13, issue 43): `cairn sessions --all` and the TUI's sessions screen say
which host and process write each live session, from the lock's connection; a session whose writer's connection is
gone is listed as its log says (`interrupted` mid-turn), with no host.

The writers are real `cairn run` processes on two "machines" (tests/pg_hosts.py: network namespaces with their own host
names, reaching the shared server through a forwarder), stopped at a failpoint while they hold their sessions; the
listing comes from a third process on this machine, and from the other host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from crash_harness import failpoint_line
from pg_helpers import fresh_schema
from pg_hosts import CAIRN, Host, holders_on, two_hosts
from tui_helpers import make_world, screen_text
from waiting import wait_for, wait_sync

from cairn.persistence.postgres import PostgresBackend
from cairn.persistence.postgres_connections import default_connect
from cairn.persistence.store import SessionStore

WAIT = 30.0  # seconds; generous for a loaded 2-core machine


@contextmanager
def writer_on(host: Host, session_id: str, root: Path) -> Iterator[subprocess.Popen]:
    """`cairn run` on `host`, stopped (alive, its session locked) after its prompt's barrier; killed afterwards."""
    marker, err_path = root / f"{session_id}.marker", root / f"{session_id}.err"
    marker.write_text("")
    with err_path.open("w") as err:
        child = subprocess.Popen(
            host.command("run", "--session-id", session_id, "--provider", "demo", f"hello from {host.name}"),
            cwd=host.workspace, env=host.env(CAIRN_FAILPOINT="prompt-accepted", CAIRN_FAILPOINT_MARKER=str(marker)),
            stdout=subprocess.DEVNULL, stderr=err,
        )
    try:
        wait_sync(lambda: marker.read_text() == failpoint_line("prompt-accepted", session_id, child.pid) or
                  child.poll() is not None, f"{host.name} to hold {session_id}", timeout=WAIT)
        assert child.poll() is None, err_path.read_text()
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def cairn_here(url: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    """`cairn` as a third process, on this machine (its own host name), reaching the server directly."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "CAIRN_HOME": str(home),
           "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": url}
    proc = subprocess.run([CAIRN, *args], env=env, cwd=home.parent, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def listed(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.slow
def test_sessions_all_names_each_live_writers_host_pid_and_since_and_a_killed_ones_session_is_interrupted(tmp_path):
    """hostA and hostB each hold a session mid-turn. A third process lists both with the writer's host, pid and the
    time its lock connection started (JSON), and `host:pid` in the table's HOST column; hostB lists them the same.
    hostA's writer is SIGKILLed: once the server has dropped its connection, its session is `interrupted` with no
    host, pid or since, and `-` in HOST, while hostB's is still live."""
    home = tmp_path / "here" / "home"
    home.mkdir(parents=True)
    with fresh_schema("fleet") as (schema, url), two_hosts(tmp_path, schema) as (a, b):
        before = time.time_ns() // 1_000_000
        with writer_on(a, "on-a", tmp_path) as on_a, writer_on(b, "on-b", tmp_path) as on_b:
            rows = listed(cairn_here(url, home, "sessions", "--all", "--json"))
            after = time.time_ns() // 1_000_000
            assert set(rows) == {"on-a", "on-b"}
            for sid, host, child in (("on-a", "hostA", on_a), ("on-b", "hostB", on_b)):
                row = rows[sid]
                assert (row["status"], row["host"], row["pid"]) == ("live", host, child.pid), row
                assert isinstance(row["since"], int) and before - 5_000 <= row["since"] <= after + 5_000, row
                assert row["first_prompt"] == f"hello from {host}" and row["cwd"] == str((a if sid == "on-a" else b)
                                                                                            .workspace)
            from_b = b.cairn("sessions", "--all", "--json")
            assert from_b.returncode == 0, from_b.stderr
            assert {sid: (r["host"], r["pid"]) for sid, r in listed(from_b).items()} == {
                "on-a": ("hostA", on_a.pid), "on-b": ("hostB", on_b.pid)}

            table = cairn_here(url, home, "sessions", "--all").stdout.splitlines()
            assert table[0].split()[:3] == ["ID", "STATUS", "HOST"], table
            assert table[0].index("HOST") == table[1].index(table[1].split()[2])  # the column lines up
            by_id = {line.split()[0]: line.split() for line in table[1:]}
            assert by_id["on-a"][1:3] == ["live", f"hostA:{on_a.pid}"], table
            assert by_id["on-b"][1:3] == ["live", f"hostB:{on_b.pid}"], table

            os.kill(on_a.pid, signal.SIGKILL)
            assert on_a.wait(timeout=WAIT) == -signal.SIGKILL
            wait_sync(lambda: not holders_on(url, "hostA"), "the server to drop hostA's lock connection", timeout=WAIT)
            rows = listed(cairn_here(url, home, "sessions", "--all", "--json"))
            assert {k: rows["on-a"][k] for k in ("status", "host", "pid", "since")} == {
                "status": "interrupted", "host": None, "pid": None, "since": None}, rows["on-a"]
            assert (rows["on-b"]["status"], rows["on-b"]["host"], rows["on-b"]["pid"]) == ("live", "hostB", on_b.pid)
            table = cairn_here(url, home, "sessions", "--all").stdout.splitlines()
            by_id = {line.split()[0]: line.split() for line in table[1:]}
            assert by_id["on-a"][1:3] == ["interrupted", "-"] and by_id["on-b"][2] == f"hostB:{on_b.pid}", table


@pytest.mark.slow
@pytest.mark.anyio
async def test_tui_sessions_screen_shows_the_host_column_and_h_narrows_it_to_one_host_at_a_time(tmp_path, utc):
    """The sessions screen on PostgreSQL lists both hosts' live sessions and a finished one, with `host:pid` in its host
    column; `h` shows only hostA's, then only hostB's, then every session again."""
    from textual.widgets import DataTable

    from cairn.app.screens.sessions import SessionsScreen

    with fresh_schema("fleettui") as (schema, url), two_hosts(tmp_path, schema) as (a, b):
        finished = b.cairn("run", "--session-id", "done", "--provider", "demo", "a finished one")
        assert finished.returncode == 0, finished.stderr
        with writer_on(a, "on-a", tmp_path) as on_a, writer_on(b, "on-b", tmp_path) as on_b:
            world = make_world(tmp_path, [])
            world.store = SessionStore(tmp_path / "here", "postgres", database_url=url)
            app = world.sessions_app()
            async with app.run_test(size=(200, 50)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
                screen = app.screen
                table = screen.query_one(DataTable)

                def rows() -> set[str]:
                    return {str(key.value) for key in table.rows}

                await wait_for(pilot, lambda: rows() == {"on-a", "on-b", "done"}, "every session listed")
                text = screen_text(app)
                assert " host " in text and f"hostA:{on_a.pid}" in text and f"hostB:{on_b.pid}" in text, text
                assert "h: host" in text and " h Host " in text  # the key line and the footer say how

                steps = [({"on-a"}, "Sessions on hostA (1 of 3)"), ({"on-b"}, "Sessions on hostB (1 of 3)"),
                         ({"on-a", "on-b", "done"}, "Sessions (3)")]
                for shown, title in steps:
                    await pilot.press("h")
                    await wait_for(pilot, lambda want=shown: rows() == want, f"the list narrowed to {shown}")
                    assert title in screen_text(app), screen_text(app)
                await app.action_quit()


class CountingConnection:
    """A psycopg connection that notes every statement it runs on pg_locks (the lock table a holder is found in)."""

    def __init__(self, conn: Any, seen: list[str]) -> None:
        self._conn, self._seen = conn, seen

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "pg_locks" in str(query):
            self._seen.append(str(query))
        return self._conn.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_one_query_finds_every_live_writer_however_many_sessions_are_listed(tmp_path, pg_database_url):
    """Three sessions live in this process and one finished: a listing from another store looks the writers up with one
    statement on pg_locks, not one per session, and names this host, this pid and a time for each live one."""
    writer = SessionStore(tmp_path / "w", "postgres", database_url=pg_database_url)
    opened = [writer.create(cwd=str(tmp_path), session_id=f"live-{n}") for n in range(3)]
    done = writer.create(cwd=str(tmp_path), session_id="done")
    done.writer.close()
    done.lock.release()
    seen: list[str] = []
    reader = SessionStore(tmp_path / "r", PostgresBackend(
        pg_database_url, connect=lambda url, role, **kw: CountingConnection(default_connect(url, role, **kw), seen)))
    try:
        summaries = {s.id: s for s in reader.list_sessions()}
        assert len(seen) == 1, seen
        for n in range(3):
            s = summaries[f"live-{n}"]
            assert (s.status, s.host, s.pid) == ("live", socket.gethostname(), os.getpid())
            assert isinstance(s.since, int) and s.since > 0
        assert (summaries["done"].status, summaries["done"].host, summaries["done"].pid) == ("completed", None, None)
    finally:
        for o in opened:
            o.writer.close()
            o.lock.release()
