"""P1 — how much does one barrier cost over the bare system calls it needs?

One barrier = append a few typical events to a LiveSession (JSONL store) and `await session.flush()`, timed from the
first append to the flush returning. The raw baseline, measured interleaved in the same run and directory, is
`os.write` of exactly the same bytes plus `os.fdatasync` on an already-open O_APPEND file. The three barrier shapes
of a turn are cycled: pre-tool (approval asked/decided + tool/call), pre-step (tool/result + step/end + step/start)
and pre-request (request/header). Target: median ratio <= 1.2. The SQLite backend's barrier is reported as an extra.
"""

from __future__ import annotations

import os
import sys

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import describe, emit, header, median, now_ns, percentile, temp_dir

import anyio
from msgspec.structs import replace

from cairn.persistence.events import (
    ApprovalAsked,
    ApprovalDecided,
    RequestHeader,
    SessionHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    encode_event,
    encoder,
)
from cairn.persistence.coordinator import now_ms
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

ITERATIONS = 1000
SQLITE_ITERATIONS = 400
WARMUP = 30
TARGET = 1.2

RESULT_TEXT = "".join(f"{i:4d}  def handler_{i}(request):  return respond(request, status=200)\n" for i in range(8))


def barrier_events(i: int) -> list:
    """The events appended before barrier i: one of the three barrier shapes of SPEC §2."""
    turn, step = 1 + i // 30, 1 + (i // 3) % 10
    call_id = f"call_{i:06d}"
    kind = i % 3
    if kind == 0:  # pre-tool
        return [
            ApprovalAsked(turn=turn, step=step, call_id=call_id),
            ApprovalDecided(turn=turn, step=step, call_id=call_id, decision="allowed_once"),
            ToolCall(
                turn=turn, step=step, call_id=call_id, name="read_file",
                arguments={"path": "src/app/handlers.py", "start": 1, "end": 200}, safety="read_only",
                parent_call_id=None,
            ),
        ]
    if kind == 1:  # pre-step
        return [
            ToolResult(
                turn=turn, step=step, call_id=f"call_{i - 1:06d}", is_error=False, content=RESULT_TEXT,
                error_code=None, source_seq=None,
            ),
            StepEnd(turn=turn, step=step),
            StepStart(turn=turn, step=step + 1),
        ]
    return [  # pre-request
        RequestHeader(
            turn=turn, step=step, provider="openai", model="gpt-5.1",
            params={"temperature": 0.2, "max_tokens": 4096, "stream": True},
            tools=["read_file", "write_file", "run_shell", "search", "list_dir"], message_count=2 * step + 1,
        )
    ]


def raw_barrier(fd: int, data: bytes) -> int:
    t0 = now_ns()
    os.write(fd, data)
    os.fdatasync(fd)
    return now_ns() - t0


async def run_jsonl(home, raw_path) -> tuple[list[int], list[int], dict]:
    store = SessionStore(home, "jsonl")
    opened = store.create(cwd=str(home), session_id="p1-jsonl")
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, encoder.encode(SessionHeader(id="raw", created=0, cwd=str(home))) + b"\n")
    os.fdatasync(fd)
    cairn: list[int] = []
    raw: list[int] = []
    raw_bytes = 0
    try:
        async with LiveSession(opened) as session:
            cairn_start = session.coordinator.stats.bytes

            async def cairn_barrier(events: list) -> int:
                t0 = now_ns()
                for e in events:
                    session.append(e)
                await session.flush()
                return now_ns() - t0

            for i in range(WARMUP + ITERATIONS):
                events = barrier_events(i)
                if i % 2 == 0:  # alternate which one goes first, so neither always follows the other's fsync
                    c = await cairn_barrier(events)
                    data = b"".join([encode_event(e) + b"\n" for e in events])  # exactly the bytes it wrote
                    r = raw_barrier(fd, data)
                else:
                    # raw first: the events stamped as the session is about to stamp them (same bytes, same length)
                    seq, t = session.coordinator.next_seq, now_ms()
                    data = b"".join(
                        [encode_event(replace(e, seq=seq + k, time=t)) + b"\n" for k, e in enumerate(events)]
                    )
                    r = raw_barrier(fd, data)
                    c = await cairn_barrier(events)
                raw_bytes += len(data)
                if i >= WARMUP:
                    cairn.append(c)
                    raw.append(r)
            info = {
                "fsyncs": session.coordinator.stats.fsyncs,
                "barriers": WARMUP + ITERATIONS,
                "cairn_bytes": session.coordinator.stats.bytes - cairn_start,
                "raw_bytes": raw_bytes,
            }
    finally:
        os.close(fd)
    return cairn, raw, info


async def run_sqlite(home) -> list[int]:
    store = SessionStore(home, "sqlite")
    opened = store.create(cwd=str(home), session_id="p1-sqlite")
    out: list[int] = []
    async with LiveSession(opened) as session:
        for i in range(WARMUP + SQLITE_ITERATIONS):
            events = barrier_events(i)
            t0 = now_ns()
            for e in events:
                session.append(e)
            await session.flush()
            if i >= WARMUP:
                out.append(now_ns() - t0)
    return out


async def thread_hop() -> list[int]:
    """Diagnostic: what one empty `anyio.to_thread.run_sync` round trip costs on this machine (the barrier pays one)."""
    out = []
    for i in range(WARMUP + 400):
        t0 = now_ns()
        await anyio.to_thread.run_sync(int)
        if i >= WARMUP:
            out.append(now_ns() - t0)
    return out


def main() -> None:
    with temp_dir("p1") as home:
        header("P1 barrier latency (append a few events + flush)", home)
        cairn, raw, info = anyio.run(run_jsonl, home / "jsonl", home / "raw.jsonl")
        sqlite = anyio.run(run_sqlite, home / "sqlite")
        hop = anyio.run(thread_hop)
        print(describe("raw os.write + fdatasync", raw))
        print(describe("cairn JSONL barrier", cairn))
        print(describe("cairn SQLite barrier (FULL commit)", sqlite))
        print(describe("empty anyio.to_thread round trip", hop, "us"))
        print(
            f"   JSONL: {info['fsyncs']} fsyncs for {info['barriers']} barriers; bytes written cairn {info['cairn_bytes']}"
            f", raw {info['raw_bytes']} ({info['raw_bytes'] / info['barriers']:.0f} B/barrier)"
        )
        # paired difference: per iteration, cairn minus the raw call that ran right beside it
        overhead = [c - r for c, r in zip(cairn, raw)]
        print(f"   median paired overhead (cairn - raw): {median(overhead) / 1e3:.1f} us")

    value, base = median(cairn) / 1e6, median(raw) / 1e6
    ratio = value / base
    print(f"   ratio (median): {ratio:.3f}   target <= {TARGET}")
    emit(
        "p1_barrier_latency", value, "ms", base, TARGET, ratio <= TARGET,
        p99=percentile(cairn, 99) / 1e6, baseline_p99=percentile(raw, 99) / 1e6,
        p99_ratio=round(percentile(cairn, 99) / percentile(raw, 99), 3),
        overhead_us=median(overhead) / 1e3, thread_hop_us=median(hop) / 1e3,
        sqlite_median=median(sqlite) / 1e6, sqlite_p99=percentile(sqlite, 99) / 1e6,
        iterations=ITERATIONS,
    )


if __name__ == "__main__":
    sys.exit(main())
