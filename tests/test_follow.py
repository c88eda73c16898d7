"""`cairn show ID --follow [--json]` (SPEC §13 rev 4): a real writer (`cairn run`, the script provider, a tool call that
runs until the test lets it go) followed from another process, on every backend; the PostgreSQL writer's notifications
read by a bare LISTEN client; Ctrl-C; a session that is not live; and the same from a second host (network namespaces,
tests/pg_hosts.py). The other tests here use two processes on this host: a follower on PostgreSQL only ever talks to
the database, so the second host adds only the network.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from pg_helpers import PG_URL, connect_to, fresh_schema
from psycopg import sql
from pg_hosts import CAIRN, long_call, script, two_hosts
from waiting import wait_sync

from cairn.persistence.postgres_follow import channel

WAIT = 60.0  # seconds; generous for a loaded 2-core machine
SECRET = "sk-follow-7f3a9c-never-in-a-payload"


class World:
    """One workspace and CAIRN_HOME; `backend` and, on PostgreSQL, a fresh schema's URL."""

    def __init__(self, root: Path, backend: str, url: str = "") -> None:
        self.root, self.backend, self.url = root, backend, url
        self.workspace = root / "project"
        self.workspace.mkdir()
        self.started, self.go = root / "started", root / "go"

    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root), "LANG": "C.UTF-8",
               "CAIRN_HOME": str(self.root / "home"), "CAIRN_BACKEND": self.backend, "CAIRN_DEMO_DELAY_MS": "0",
               "CAIRN_SNAPSHOTS": "off", "CAIRN_PROJECT_CONTEXT": "off"}
        return {**env, "CAIRN_DATABASE_URL": self.url} if self.url else env

    def popen(self, *args: str, out: Path) -> subprocess.Popen:
        with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
            return subprocess.Popen([CAIRN, *args], env=self.env(), cwd=self.workspace, stdout=stdout, stderr=stderr)

    def cairn(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([CAIRN, *args], env=self.env(), cwd=self.workspace, capture_output=True, text=True,
                              timeout=WAIT)

    def writer(self, session_id: str = "s") -> subprocess.Popen:
        """`cairn run` stopped inside a tool call (its output holds SECRET) until `go` appears."""
        call = long_call(self.started, self.go)
        call["tool_calls"][0]["arguments"]["command"] = f"echo {SECRET}; " + call["tool_calls"][0]["arguments"]["command"]
        plan = script(self.root / "script.json", call, {"text": "all done"})
        child = self.popen("run", "--yes", "--provider", "script", "--script", str(plan), "--session-id", session_id,
                           "go", out=self.root / "run.out")
        wait_sync(lambda: self.started.exists() and self.started.read_text() or child.poll() is not None,
                  "the writer's tool call to start", timeout=WAIT)
        assert child.poll() is None, (self.root / "run.err").read_text()
        return child


@contextmanager
def world(tmp_path: Path, backend: str) -> Iterator[World]:
    if backend != "postgres":
        yield World(tmp_path, backend)
        return
    with fresh_schema("follow") as (_, url):
        yield World(tmp_path, backend, url)


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("backend", ["postgres", "jsonl", "sqlite"])
def test_a_follower_started_mid_session_prints_what_came_before_then_every_event_once_in_order_until_the_writer_ends(
        tmp_path, backend):
    with world(tmp_path, backend) as w:
        writer = w.writer()
        follower = w.popen("show", "s", "--follow", "--json", out=tmp_path / "follow.out")
        before = wait_sync(lambda: [e for e in json_lines(tmp_path / "follow.out") if e["type"] == "tool/call"],
                           "the follower to print the session as it stands", timeout=WAIT)
        assert follower.poll() is None, "the follower ended while the writer was live"
        w.go.write_text("")
        assert writer.wait(WAIT) == 0, (tmp_path / "run.err").read_text()
        assert follower.wait(WAIT) == 0, (tmp_path / "follow.err").read_text()
        followed = json_lines(tmp_path / "follow.out")
        stored = [json.loads(line) for line in w.cairn("show", "s", "--json").stdout.splitlines()]
    assert before and followed == stored  # every event, each once, in order
    assert [e["seq"] for e in followed] == list(range(len(stored)))
    assert followed[-1]["type"] == "turn/end" and followed[-1]["reason"] == "completed"
    err = (tmp_path / "follow.err").read_text().splitlines()
    assert err[-1] == "cairn: the writer of session s ended; the session is not interrupted (its last turn ended: " \
                      "completed)", err


def test_text_follow_prints_each_event_as_cairn_show_does_and_says_a_killed_writer_left_it_interrupted(tmp_path):
    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        follower = w.popen("show", "s", "--follow", out=tmp_path / "follow.out")
        wait_sync(lambda: "→ run_command" in (tmp_path / "follow.out").read_text(), "the session as it stands",
                  timeout=WAIT)
        writer.send_signal(signal.SIGKILL)
        writer.wait(WAIT)
        assert follower.wait(WAIT) == 0, (tmp_path / "follow.err").read_text()
        shown = w.cairn("show", "s").stdout
        w.go.write_text("")  # the killed writer's tool body, if it outlived it
    out = (tmp_path / "follow.out").read_text()
    assert out.splitlines() == shown.splitlines()[: len(out.splitlines())]  # the same lines, no repair added
    assert (tmp_path / "follow.err").read_text().splitlines()[-1].startswith(
        "cairn: the writer of session s ended; the session is interrupted (its last turn has no end; `cairn resume s`")


def test_notifications_name_only_the_session_and_its_newest_seq_never_event_content(tmp_path):
    """A bare LISTEN client on the schema's channel (and one on another schema's) sees every payload the writer sends:
    `<session id> <seq>`, up to the newest seq, never the secret the tool printed; the other schema's hears nothing."""
    with world(tmp_path, "postgres") as w, fresh_schema("other") as (other, _):
        schema = connect_to(w.url).execute("SELECT current_schema()").fetchone()[0]
        with connect_to(w.url) as listener, connect_to(w.url) as elsewhere:
            listener.execute(f'LISTEN "{channel(schema)}"')
            elsewhere.execute(f'LISTEN "{channel(other)}"')
            writer = w.writer()
            w.go.write_text("")
            assert writer.wait(WAIT) == 0, (tmp_path / "run.err").read_text()
            payloads = [n.payload for n in listener.notifies(timeout=1.0)]
            heard = [n.payload for n in elsewhere.notifies(timeout=0.2)]
        stored = [json.loads(line) for line in w.cairn("show", "s", "--json").stdout.splitlines()]
    assert SECRET in json.dumps(stored)  # it is in the log ...
    assert payloads and not [p for p in payloads if SECRET in p or not re.fullmatch(r"s \d+", p)], payloads
    seqs = [int(p.split()[1]) for p in payloads]
    assert seqs == sorted(seqs) and seqs[-1] == stored[-1]["seq"]  # ... and the payloads say only where it ends
    assert heard == []


def test_ctrl_c_ends_a_follower_with_exit_130_and_no_traceback(tmp_path):
    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        follower = w.popen("show", "s", "--follow", "--json", out=tmp_path / "follow.out")
        wait_sync(lambda: (tmp_path / "follow.out").read_text(), "the follower to print the session", timeout=WAIT)
        follower.send_signal(signal.SIGINT)
        code = follower.wait(WAIT)
        w.go.write_text("")
        writer.wait(WAIT)
    err = (tmp_path / "follow.err").read_text()
    assert code == 130 and "Traceback" not in err, err


def test_a_session_that_is_not_live_is_printed_and_the_follower_exits_at_once(tmp_path):
    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        w.go.write_text("")
        assert writer.wait(WAIT) == 0
        followed = w.cairn("show", "s", "--follow", "--json")
        shown = w.cairn("show", "s", "--json")
    assert followed.returncode == 0 and followed.stdout == shown.stdout
    assert followed.stderr == "cairn: session s is not live: nothing to follow\n"


def test_a_follower_sees_no_notification_after_a_reconnect_twice_nor_misses_one(tmp_path):
    """The follower's LISTEN connection is killed by the server mid-session: it reconnects, listens again, and fetches
    from the next seq it expects, so the events are still each shown once and in order."""
    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        follower = w.popen("show", "s", "--follow", "--json", out=tmp_path / "follow.out")
        wait_sync(lambda: (tmp_path / "follow.out").read_text(), "the follower to print the session", timeout=WAIT)
        with connect_to(w.url) as admin:
            killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE application_name LIKE %s", (f"cairn % {follower.pid}",)).fetchall()
        w.go.write_text("")
        assert writer.wait(WAIT) == 0
        assert follower.wait(WAIT) == 0, (tmp_path / "follow.err").read_text()
        stored = [json.loads(line) for line in w.cairn("show", "s", "--json").stdout.splitlines()]
    assert killed and all(ok for ok, in killed)
    assert json_lines(tmp_path / "follow.out") == stored


@pytest.mark.slow
def test_a_session_on_host_a_is_followed_from_host_b_every_event_once_and_in_order(tmp_path):
    with fresh_schema("hosts") as (schema, url), two_hosts(tmp_path, schema) as (a, b):
        started, go = tmp_path / "started", tmp_path / "go"
        plan = script(tmp_path / "script.json", long_call(started, go), {"text": "all done"})
        with open(tmp_path / "a.err", "wb") as err:
            writer = subprocess.Popen(a.command("run", "--yes", "--provider", "script", "--script", str(plan),
                                                "--session-id", "shared", "go"), cwd=a.workspace, env=a.env(),
                                      stdout=subprocess.DEVNULL, stderr=err)
        wait_sync(lambda: started.exists() and started.read_text() or writer.poll() is not None,
                  "hostA's tool call to start", timeout=WAIT)
        assert writer.poll() is None, (tmp_path / "a.err").read_text()
        with open(tmp_path / "b.out", "wb") as out, open(tmp_path / "b.err", "wb") as err:
            follower = subprocess.Popen(b.command("show", "shared", "--follow", "--json"), cwd=b.workspace,
                                        env=b.env(), stdout=out, stderr=err)
        wait_sync(lambda: (tmp_path / "b.out").read_text(), "hostB to print the session", timeout=WAIT)
        go.write_text("")
        assert writer.wait(WAIT) == 0, (tmp_path / "a.err").read_text()
        assert follower.wait(WAIT) == 0, (tmp_path / "b.err").read_text()
        shown = b.cairn("show", "shared", "--json")
    followed = json_lines(tmp_path / "b.out")
    assert followed == [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["seq"] for e in followed] == list(range(len(followed))) and followed[-1]["type"] == "turn/end"
    assert "live in process" in (tmp_path / "b.err").read_text()


def test_the_listen_channel_fits_postgresql_and_keeps_schemas_apart():
    assert channel("public") == "cairn_events:public"
    long = channel("x" * 63)
    assert len(long.encode()) <= 63 and long.startswith("cairn_events:#") and long != channel("x" * 62 + "y")
    with connect_to(PG_URL) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(long)))  # a valid channel name


def test_the_inspectors_postgresql_tail_reads_rows_when_a_notification_wakes_it_not_on_its_timer(tmp_path):
    """`cairn inspect --follow` polls its tail every 0.2 s: on PostgreSQL a poll reads nothing from the table unless
    a notification for the session came (or the once-a-second look at the lock's holder is due, pushed out here)."""
    from cairn.app.inspect.follow import PostgresTail, open_tail
    from cairn.persistence.store import SessionStore

    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        w.go.write_text("")
        assert writer.wait(WAIT) == 0
        store = SessionStore(w.root / "home", "postgres", database_url=w.url)
        known = len(store.inspect("s").events)
        tail = open_tail(store, "s", known)
        try:
            assert isinstance(tail, PostgresTail)
            assert tail.poll() == ([], None)  # the first poll reads: nothing new, and nobody holds the session
            tail.asked = float("inf")  # no look at the holder is due from here on
            body = json.dumps({"type": "step/end", "seq": known, "time": 1, "turn": 1, "step": 9}).encode()
            with connect_to(w.url) as conn:
                conn.execute("INSERT INTO events (session_id, seq, time, type, body) VALUES ('s', %s, 1, 'step/end', "
                             "%s)", (known, body))
                assert tail.poll() == ([], None)  # committed, not notified: not read
                schema = conn.execute("SELECT current_schema()").fetchone()[0]
                conn.execute("SELECT pg_notify(%s, %s)", (channel(schema), f"s {known}"))
                wait_sync(lambda: tail.follower.wait(0.05), "the notification")
                new, holder = tail.poll()
        finally:
            tail.close()
    assert [(type(e).__name__, e.seq) for e in new] == [("StepEnd", known)] and holder is None


def test_show_follow_imports_neither_textual_nor_acp_nor_mcp(tmp_path):
    import sys

    code = ("import sys; from cairn.app.cli import main; code = main(['show', 's', '--follow', '--json']);"
            "print([m for m in ('textual', 'acp', 'mcp', 'pydantic') if m in sys.modules], code)")
    with world(tmp_path, "postgres") as w:
        writer = w.writer()
        with open(tmp_path / "child.out", "wb") as out:
            child = subprocess.Popen([sys.executable, "-c", code], env=w.env(), cwd=w.workspace, stdout=out,
                                     stderr=subprocess.PIPE)
        wait_sync(lambda: (tmp_path / "child.out").read_text(), "the follower to print the session", timeout=WAIT)
        w.go.write_text("")
        assert writer.wait(WAIT) == 0
        _, err = child.communicate(timeout=WAIT)
    lines = (tmp_path / "child.out").read_text().splitlines()
    assert lines[-1] == "[] 0", err
    assert json.loads(lines[-2])["type"] == "turn/end"  # it followed to the end before the check
