"""P13 on PostgreSQL, first half — how soon a follower shows what a writer on another process committed.

A writer process (this script with `--writer`) appends events to a session on the local PostgreSQL server, one barrier
each at 5-25 ms intervals, and stamps on its stdout, for each, the seq and the moment just before the barrier
(`time.monotonic_ns`: one clock for every process on Linux). The stamp precedes the commit by the barrier's own round
trip (~0.5 ms), so both figures below include it. In the same run, on the same commits:
- the value: `cairn show ID --follow --json`, a real subprocess; latency = the moment this script reads the event's line
  from its stdout minus the writer's stamp;
- the baseline: a bare psycopg client `LISTEN`ing on the schema's channel in a thread here; latency = the moment the
  notification naming that seq is received minus the stamp.
Target: the follower's p95 <= 0.2 s (SPEC §13). The takeover half of P13 (a host cut off, another resumes) is
bench/p13_takeover.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header, median, percentile
from _pg import pg_schema, server_settings

EVENTS = 400
WARMUP = 20
TARGET = 0.2  # seconds, p95
SESSION = "p13-follow"
# `cairn` from the measured checkout (CAIRN_BENCH_SRC or this one), as `_common` loads it
CAIRN = [sys.executable, "-c", "import sys, _common; from cairn.app.cli import main; sys.exit(main(sys.argv[1:]))"]


async def write(url: str, home: str) -> None:
    """The writer: one barrier per event once the bench says go (a line on stdin); `ready` once the session is live."""
    from cairn.persistence.events import TurnEnd, TurnStart, UserMessage
    from cairn.persistence.session import LiveSession
    from cairn.persistence.store import SessionStore

    store = SessionStore(home, "postgres", database_url=url)
    async with LiveSession(store.create(cwd="/bench", session_id=SESSION)) as session:
        session.append(TurnStart(turn=1))
        await session.flush()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for i in range(WARMUP + EVENTS):
            await asyncio.sleep(random.uniform(0.005, 0.025))
            seq = session.coordinator.next_seq
            stamp = time.monotonic_ns()
            session.append(UserMessage(turn=1, step=1, text=f"message {i} " + "x" * 200))
            await session.flush()
            print(seq, stamp, flush=True)
        session.append(TurnEnd(turn=1, reason="completed", error=None))
        await session.flush()


def listen(url: str, schema: str, seen: dict[int, int], stop: threading.Event, ready: threading.Event) -> None:
    import psycopg
    from psycopg import sql

    from cairn.persistence.postgres_follow import channel

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        ready.set()
        while not stop.is_set():
            for notice in conn.notifies(timeout=0.2):
                seen.setdefault(int(notice.payload.rsplit(" ", 1)[1]), time.monotonic_ns())


def read_lines(stream, seen: dict[int, int]) -> None:
    for line in stream:
        seen.setdefault(json.loads(line)["seq"], time.monotonic_ns())


def run(url: str, schema: str, home: Path) -> tuple[list[float], list[float]]:
    env = {**os.environ, "CAIRN_HOME": str(home), "CAIRN_BACKEND": "postgres", "CAIRN_DATABASE_URL": url,
           "PYTHONPATH": str(Path(__file__).resolve().parent)}
    writer = subprocess.Popen([sys.executable, __file__, "--writer", url, str(home)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdin and writer.stdout
    assert writer.stdout.readline().strip() == "ready", "the writer did not start"
    notified: dict[int, int] = {}
    shown: dict[int, int] = {}
    stop, listening = threading.Event(), threading.Event()
    listener = threading.Thread(target=listen, args=(url, schema, notified, stop, listening), daemon=True)
    listener.start()
    follower = subprocess.Popen([*CAIRN, "show", SESSION, "--follow", "--json"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    reader = threading.Thread(target=read_lines, args=(follower.stdout, shown), daemon=True)
    reader.start()
    while 0 not in shown or not listening.is_set():  # the follower printed the session as it stands: it follows
        if follower.poll() is not None:
            raise SystemExit(f"the follower ended early: {follower.stderr.read() if follower.stderr else ''}")
        time.sleep(0.01)
    writer.stdin.write("go\n")
    writer.stdin.flush()
    stamps = dict(tuple(map(int, line.split())) for line in writer.stdout)  # type: ignore[misc]
    assert writer.wait() == 0, "the writer failed"
    follower.wait(timeout=30)
    reader.join(timeout=5)
    stop.set()
    listener.join(timeout=5)
    measured = sorted(stamps)[WARMUP:]
    missing = [seq for seq in measured if seq not in shown or seq not in notified]
    assert not missing, f"seqs never seen: {missing[:10]}"
    return ([(shown[s] - stamps[s]) / 1e9 for s in measured], [(notified[s] - stamps[s]) / 1e9 for s in measured])


def main() -> None:
    if sys.argv[1:2] == ["--writer"]:
        asyncio.run(write(sys.argv[2], sys.argv[3]))
        return
    from _common import temp_dir

    with pg_schema("p13") as url, temp_dir("p13") as home:
        header("P13 on PostgreSQL: commit-to-display latency of `cairn show --follow --json`", home)
        print(f"   {server_settings(url)}")
        schema = url.rsplit("search_path%3D", 1)[-1]
        follow, bare = run(url, schema, home)
    for label, values in (("bare LISTEN client (baseline)", bare), ("cairn show --follow --json", follow)):
        print(f"{label:<34} n={len(values):<5} p50 {median(values) * 1e3:8.2f} ms   p95 "
              f"{percentile(values, 95) * 1e3:8.2f} ms   max {max(values) * 1e3:8.2f} ms")
    p95, base95 = percentile(follow, 95), percentile(bare, 95)
    print(f"   p95 target <= {TARGET * 1e3:.0f} ms (the writer's stamp precedes its commit by the barrier's round trip)")
    emit("p13_follow_latency", p95 * 1e3, "ms", base95 * 1e3, TARGET * 1e3, p95 <= TARGET, p50=median(follow) * 1e3,
         baseline_p50=median(bare) * 1e3, events=len(follow))


if __name__ == "__main__":
    sys.exit(main())
