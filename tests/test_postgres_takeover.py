"""Takeover and fencing across two hosts (issue 43, SPEC §13 rev 4): hostA is cut off mid-tool (its end of the link
goes down: no FIN, no RST, its process lives on); the server notices through the TCP keepalives Cairn sets on every
connection and drops hostA's connections, and with them the session's lock; hostB resumes the session, repairing the
running call as OUTCOME_UNKNOWN. When hostA's link comes back, its next write is fenced: one line, exit 3, and nothing
it wrote after the cut is stored.

The hosts' connections go straight to a private server listening on their links (pg_hosts.direct_server): through the
forwarder the server's end would be the forwarder's, which never vanishes. How long the takeover takes is measured by
bench/p13_takeover.py; here the waits only bound it generously.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from crash_harness import wait_until
from pg_helpers import connect_to, fresh_schema, stored_rows
from pg_hosts import Host, direct_server, holders_on, long_call, script, two_hosts

TAKEOVER_WAIT = 90.0  # seconds: the keepalive bound is ~20 s; generous for a loaded 2-core machine


def stored_types(url: str, session_id: str) -> list[str]:
    return [kind for _, kind, _ in stored_rows(url, session_id)]


def holder_of(url: str, schema: str, session_id: str) -> int | None:
    """The server backend holding the session's advisory lock, if any."""
    from cairn.persistence.postgres_schema import lock_key

    key = lock_key(schema, session_id) & 0xFFFFFFFFFFFFFFFF
    with connect_to(url) as conn:
        row = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                           "AND classid::bigint = %s AND objid::bigint = %s", (key >> 32, key & 0xFFFFFFFF)).fetchone()
    return row[0] if row else None


def start_run(host: Host, root: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    err = root / f"{host.name}.err"
    with open(err, "w") as stream:
        child = subprocess.Popen(host.command("run", *args), cwd=host.workspace, env=host.env(),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stream)
    return child, err


def resume_until_free(host: Host, *args: str) -> subprocess.CompletedProcess:
    """`cairn run --resume …` again and again while the session is still locked (exit 3); the first other outcome."""
    refused: list[str] = []

    def attempt() -> subprocess.CompletedProcess | None:
        done = host.cairn("run", "--resume", *args)
        if done.returncode == 3 and "live in process" in done.stderr:
            refused.append(done.stderr)
            return None
        return done

    done = wait_until(attempt, "hostA's lock to be released by the server", timeout=TAKEOVER_WAIT)
    assert refused, "hostB resumed at once: hostA had lost the session before the cut"
    assert "on host hostA" in refused[0], refused[0]
    return done


@pytest.mark.slow  # two hosts in network namespaces, ~20 s of keepalives
def test_a_host_cut_off_mid_tool_is_taken_over_and_fenced_when_it_comes_back(tmp_path):
    """hostA's `cairn run` is inside a long `run_command` when its link goes down. hostB's `cairn run --resume` is
    refused (exit 3, naming hostA) until the server drops hostA's connections, then succeeds: the running call is
    repaired as OUTCOME_UNKNOWN and hostB's turn is added. hostA's link comes back and its tool finishes: its next
    write fails with exit 3 and one line saying the session was taken over, and the stored rows are exactly those
    hostB left (nothing hostA wrote after the cut)."""
    started, go = tmp_path / "started", tmp_path / "go"
    first = script(tmp_path / "a.json", long_call(started, go), {"text": "hostA's answer"})
    second = script(tmp_path / "b.json", {"text": "hostB's answer"})
    with two_hosts(tmp_path, "public") as (a, b), direct_server(a, b) as server:
        a, b = replace(a, url=a.direct_url()), replace(b, url=b.direct_url())
        child, err = start_run(a, tmp_path, "--session-id", "cut", "--provider", "script", "--script", str(first),
                               "--yes", "run the long command")
        try:
            wait_until(lambda: started.exists() or child.poll() is not None, "hostA's tool to start", timeout=60)
            assert child.poll() is None, err.read_text()
            wait_until(lambda: "tool/call" in [kind for _, kind, _ in stored_rows(server.url, "cut")],
                       "hostA's tool/call to be stored")
            assert holders_on(server.url, "hostA")
            before = stored_rows(server.url, "cut")

            a.cut()
            resumed = resume_until_free(b, "cut", "--provider", "script", "--script", str(second), "carry on")
            assert resumed.returncode == 0, resumed.stderr
            assert "hostB's answer" in resumed.stdout
            assert not holders_on(server.url, "hostA")
            taken = stored_rows(server.url, "cut")
            assert taken[: len(before)] == before  # everything hostA had stored before the cut is kept
            results = [json.loads(body) for _, kind, body in taken[len(before):] if kind == "tool/result"]
            assert [r["error_code"] for r in results] == ["TOOL_OUTCOME_UNKNOWN"], taken[len(before):]
            assert child.poll() is None  # hostA knows nothing yet: its tool still runs

            a.restore()
            go.write_text("")
            code = child.wait(timeout=TAKEOVER_WAIT)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        stderr = err.read_text()
        assert code == 3, stderr
        assert "Traceback" not in stderr
        failures = [line for line in stderr.splitlines() if "taken over" in line]
        assert len(failures) == 1 and failures[0].startswith("cairn: "), stderr
        assert stderr.rstrip("\n").splitlines()[-1] == failures[0], stderr  # the run ends with it, nothing after
        assert stored_rows(server.url, "cut") == taken  # nothing of hostA's after the cut
        shown = b.cairn("show", "cut")
        assert shown.returncode == 0 and "hostB's answer" in shown.stdout and "hostA's answer" not in shown.stdout


# -- keepalives on every connection ------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["write", "lock", "read", "follow"])
def test_every_connection_sets_keepalives_on_both_ends_unless_the_url_sets_its_own(role):
    """Client side (libpq parameters) and server side (the backend's settings), so that either end notices a vanished
    peer within the bound; a URL's own keepalive parameter is kept."""
    from cairn.persistence.postgres import PostgresBackend
    from cairn.persistence.postgres_connections import (
        KEEPALIVE_COUNT,
        KEEPALIVE_IDLE,
        KEEPALIVE_INTERVAL,
        USER_TIMEOUT_MS,
    )

    with fresh_schema("keepalive") as (_, url):
        for own, idle in ((False, KEEPALIVE_IDLE), (True, 42)):
            conn = PostgresBackend(f"{url}&keepalives_idle=42" if own else url).connect(role)
            try:
                client = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
                assert (client["keepalives"], client["keepalives_idle"]) == ("1", str(idle))
                assert client["tcp_user_timeout"] == str(USER_TIMEOUT_MS)
                server = [conn.execute(f"SHOW {name}").fetchone()[0] for name in ("tcp_keepalives_idle",
                                                                                     "tcp_keepalives_interval",
                                                                                     "tcp_keepalives_count",
                                                                                     "tcp_user_timeout")]
                assert server == [str(v) for v in (KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT, USER_TIMEOUT_MS)]
            finally:
                conn.close()


# -- the TUI: a clear notice, and nothing written once fenced ----------------------------------------------------------


@pytest.mark.anyio
async def test_the_tui_of_a_writer_whose_session_was_taken_over_says_so_and_writes_nothing_more(tmp_path):
    """The TUI's session loses its lock connection (the server dropped it, as for a cut-off host) and another writer
    resumes it and writes. The TUI's next prompt fails at its first checkpoint: a "Session taken over" notice, and no
    row of that turn is stored; a prompt after it is refused without starting a turn."""
    from tui_helpers import make_world, running, submit, wait_for

    from cairn.app.tui import CairnApp
    from cairn.persistence.events import TurnStart
    from cairn.persistence.session import LiveSession
    from cairn.persistence.store import SessionStore

    world = make_world(tmp_path, [{"text": "first answer"}, {"text": "second answer"}])
    with fresh_schema("takeover") as (schema, url):
        store = SessionStore(tmp_path / "home", "postgres", database_url=url)
        app = CairnApp(world.config, store.create(cwd=str(world.workspace), session_id="tui"), store)
        async with running(app) as pilot:
            await submit(pilot, "hello")
            await wait_for(pilot, lambda: stored_types(url, "tui")[-1:] == ["turn/end"], "the first turn to be stored")
            with connect_to(url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (holder_of(url, schema, "tui"),))
            await wait_for(pilot, lambda: holder_of(url, schema, "tui") is None, "the server to drop the TUI's lock")
            other = SessionStore(tmp_path / "other", "postgres", database_url=url)
            async with LiveSession(other.open_for_resume("tui")) as live:
                live.append(TurnStart(turn=2))
                await live.flush()
            taken = stored_types(url, "tui")

            await submit(pilot, "again")
            await wait_for(pilot, lambda: app.chat.fenced, "the TUI to learn it was fenced")
            notices = [(n.title, n.message) for n in app._notifications]
            fenced = [message for title, message in notices if title == "Session taken over"]
            assert len(fenced) == 1 and "was taken over by another writer" in fenced[0], notices
            starts = sum(isinstance(e, TurnStart) for e in app.session.events)

            await submit(pilot, "and again")
            await wait_for(pilot, lambda: any("no longer writes" in n.message and n.title != "Session taken over"
                                              for n in app._notifications), "the prompt to be refused")
            assert sum(isinstance(e, TurnStart) for e in app.session.events) == starts  # no turn started
            await pilot.press("ctrl+q")
        assert app.chat.service.fenced is not None and "taken over" in app.chat.service.fenced  # (cli: exit 3)
        assert not app.session.live
        assert stored_types(url, "tui") == taken  # nothing of the TUI's after the takeover, its close included
