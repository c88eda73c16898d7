"""P4 on PostgreSQL — cold load of a 100k-event session from the database.

The session of p4_cold_load.py (same generator, same events) is written to the postgres backend; `store.inspect()` (a
new process's first read: connect, check the schema, fetch every body, decode, compute repair) is timed against the
JSONL baseline of the same run: `read()` of the JSONL file + `decode_lines`. Target: ratio <= 3 (the bodies cross a
socket from another process). Also printed (not part of the ratio): this process's CPU time during `inspect()` and,
when the server is on this machine, its backend's (a cold store opens a new connection, so a new backend: all of its
CPU is this load), which say where the time went when the machine is shared.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header, median, now_ns, temp_dir
from _pg import pg_schema, server_settings

import msgspec

from cairn.persistence.events import KnownEvent
from cairn.persistence.store import SessionStore
from p4_cold_load import EVENTS, SESSION_ID, SessionGenerator, raw_load, write_session

REPEATS = 5
TARGET = 3.0


def main() -> None:
    events = SessionGenerator().generate(EVENTS)
    with temp_dir("p4-pg") as home, pg_schema("p4") as url:
        header(f"P4 on PostgreSQL: cold load of a {EVENTS}-event session", home)
        print(f"   {server_settings(url)}")
        jsonl = SessionStore(home, "jsonl")
        write_session(jsonl, events)
        path = jsonl.backend.path(SESSION_ID)
        size = os.path.getsize(path)
        t0 = now_ns()
        write_session(SessionStore(home / "pg", "postgres", database_url=url), events)
        print(f"   written to PostgreSQL in {(now_ns() - t0) / 1e9:.1f} s (batches of 2000, the last one durable)")
        del events
        gc.collect()
        decoder = msgspec.json.Decoder(KnownEvent)
        pg: list[int] = []
        raw: list[int] = []
        cpu: list[int] = []  # this process's CPU time during inspect()
        server_cpu: list[float] = []  # the server backend's (a local server only)
        for r in range(REPEATS + 1):
            ns, result = raw_load(path, decoder)
            assert len(result) == EVENTS
            del result
            gc.collect()
            store = SessionStore(home / "pg", "postgres", database_url=url)  # cold: a new connection, schema check
            c0 = time.process_time_ns()
            t0 = now_ns()
            inspection = store.inspect(SESSION_ID)
            pg_ns = now_ns() - t0
            client_ns = time.process_time_ns() - c0
            assert len(inspection.events) == EVENTS and inspection.live_pid is None
            # New backends: all of their CPU is this load (a split load's helper connection too, when there is one).
            backends = [c.info.backend_pid for c in (store.backend._reader, getattr(store.backend, "_helper", None)) if c]
            cpus = [backend_cpu_ms(pid) for pid in backends]
            server = None if None in cpus else sum(cpus)
            store.backend.close()
            del inspection
            gc.collect()
            if r:
                raw.append(ns)
                pg.append(pg_ns)
                cpu.append(client_ns)
                if server is not None:
                    server_cpu.append(server)
    value, base = median(pg) / 1e9, median(raw) / 1e9
    print(f"   {'JSONL read + decode_lines (GC off)':<36} median {base * 1e3:7.1f} ms ({size / 1e6:.1f} MB)")
    print(f"   {'cairn inspect() postgres':<36} median {value * 1e3:7.1f} ms  runs {[round(x / 1e6) for x in pg]}")
    print(f"   {'  CPU: this process':<36} median {median(cpu) / 1e6:7.1f} ms"
          + (f"; the server backend {median(server_cpu):.0f} ms (10 ms ticks)" if server_cpu else ""))
    print(f"   ratio {value / base:.2f}, target <= {TARGET}")
    emit("p4_pg_cold_load", value, "s", base, TARGET, value / base <= TARGET, events=EVENTS,
         size_mb=round(size / 1e6, 1), client_cpu_ms=round(median(cpu) / 1e6, 1),
         server_cpu_ms=median(server_cpu) if server_cpu else None)


def backend_cpu_ms(pid: int) -> float | None:
    """User + system CPU of a server backend process, when the server runs on this machine (else None)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    sys.exit(main())
