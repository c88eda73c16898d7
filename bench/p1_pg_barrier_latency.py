"""P1 on PostgreSQL — what one barrier costs over the bare round trip it needs.

One barrier = append the events of one of the three barrier shapes (as in p1_barrier_latency.py) to a LiveSession on
the postgres backend and `await session.flush()`. The baseline, interleaved in the same run on the same server, is a
bare `INSERT` of exactly the same rows into a table of the same shape plus a durable `COMMIT` (synchronous_commit on),
on one already-open connection. Target: median ratio <= 1.5 (the barrier also checks the writer token and the advisory
lock in its transaction, and hops to a worker thread).
"""

from __future__ import annotations

import sys

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import describe, emit, header, median, now_ns, percentile
from _pg import pg_schema, server_settings

import anyio
import psycopg
from msgspec.structs import replace

from cairn.persistence.coordinator import now_ms
from cairn.persistence.events import encode_event
from cairn.persistence.postgres_schema import event_columns
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore
from p1_barrier_latency import barrier_events

ITERATIONS = 600
WARMUP = 30
TARGET = 1.5


def raw_barrier(conn: psycopg.Connection, seq0: int, bodies: list[bytes]) -> int:
    rows = [("raw", seq0 + k, *reversed(event_columns(b)), b) for k, b in enumerate(bodies)]
    t0 = now_ns()
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO raw_events (session_id, seq, time, type, body) VALUES (%s, %s, %s, %s, %s)", rows)
    conn.commit()
    return now_ns() - t0


async def run(url: str) -> tuple[list[int], list[int], int]:
    store = SessionStore("/tmp/cairn-bench-p1-pg-home", "postgres", database_url=url)
    raw_conn = psycopg.connect(url)
    raw_conn.execute("CREATE TABLE raw_events (session_id text, seq bigint, time bigint, type text, body bytea, "
                     "PRIMARY KEY (session_id, seq))")
    raw_conn.execute("SET synchronous_commit = on")
    raw_conn.commit()
    cairn: list[int] = []
    raw: list[int] = []
    raw_seq = 0
    async with LiveSession(store.create(cwd="/bench", session_id="p1-pg")) as session:
        async def cairn_barrier(events: list) -> int:
            t0 = now_ns()
            for e in events:
                session.append(e)
            await session.flush()
            return now_ns() - t0

        for i in range(WARMUP + ITERATIONS):
            events = barrier_events(i)
            seq, t = session.coordinator.next_seq, now_ms()
            bodies = [encode_event(replace(e, seq=seq + k, time=t)) for k, e in enumerate(events)]
            if i % 2 == 0:
                c = await cairn_barrier(events)
                r = raw_barrier(raw_conn, raw_seq, bodies)
            else:
                r = raw_barrier(raw_conn, raw_seq, bodies)
                c = await cairn_barrier(events)
            raw_seq += len(bodies)
            if i >= WARMUP:
                cairn.append(c)
                raw.append(r)
        fsyncs = session.coordinator.stats.fsyncs
    raw_conn.close()
    return cairn, raw, fsyncs


def main() -> None:
    with pg_schema("p1") as url:
        header("P1 on PostgreSQL: barrier latency (append a few events + flush)")
        print(f"   {server_settings(url)}")
        cairn, raw, fsyncs = anyio.run(run, url)
    print(describe("bare INSERT + durable COMMIT", raw))
    print(describe("cairn postgres barrier", cairn))
    overhead = [c - r for c, r in zip(cairn, raw)]
    value, base = median(cairn) / 1e6, median(raw) / 1e6
    print(f"   median paired overhead (cairn - raw): {median(overhead) / 1e3:.1f} us; durable commits {fsyncs}")
    print(f"   ratio (median): {value / base:.3f}   target <= {TARGET}")
    emit("p1_pg_barrier_latency", value, "ms", base, TARGET, value / base <= TARGET,
         p99=percentile(cairn, 99) / 1e6, baseline_p99=percentile(raw, 99) / 1e6,
         overhead_us=median(overhead) / 1e3, iterations=ITERATIONS)


if __name__ == "__main__":
    sys.exit(main())
