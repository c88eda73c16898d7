"""P2 — do concurrent barriers share their fsync (group commit)?

A round is what parallel read-only tool calls do: eight tasks in one anyio task group each reach a barrier at about the
same time. Three shapes are measured, because they stress the coordinator differently:

- "append, then 8 flushes": the eight tool/call events are appended first, then eight tasks call `flush()` at once
  (every caller's events are already queued, so one fsync should cover all of them);
- "each appends + flushes": each task appends its own tool/call and immediately calls `flush()`; the tasks start one
  after another, so a caller may find a flush in flight that does not contain its event and have to start one
  more (bound: 2 fsyncs). In practice the checkpoint in the coordinator's lock lets all eight append before the
  first write takes its batch, so this costs 1;
- "late arrivals": task 0 appends and flushes; tasks 1-7 append and call `flush()` only once task 0's write has
  been handed to the worker thread (the writer is wrapped so that, for this one write, it signals the event loop
  and waits until all seven have arrived before doing the real write + fsync). Their events are not in that batch,
  so they must share exactly one more fsync: the worst case for barriers that are truly concurrent (expected: 2).
  Arrivals spread over *longer* than one fsync legitimately cost more: an fsync covers only what was queued
  before it started.

The figure is `coordinator.stats.fsyncs` before/after each round (the write-behind task never fsyncs). value = the
worst round over all shapes; target <= 2; baseline = 8 (what naive per-caller fsync would cost). The JSONL store is
the headline; SQLite is reported as an extra key.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header, median, now_ns, temp_dir

import anyio

from cairn.persistence.backend import EncodedEvent, Writer
from cairn.persistence.events import ToolCall
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

CALLERS = 8
ROUNDS = 150  # per shape
TARGET = 2
BASELINE = CALLERS


def tool_call(round_no: int, k: int) -> ToolCall:
    return ToolCall(
        turn=1 + round_no, step=1, call_id=f"call_{round_no}_{k}", name="read_file",
        arguments={"path": f"src/module_{k}.py"}, safety="read_only", parent_call_id=None,
    )


class Gate:
    def __init__(self, late: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.in_thread = anyio.Event()  # set (from the writer's thread, via the loop) once the first write is in flight
        self.all_arrived = threading.Event()
        self.late = late
        self.arrived = 0


class GatedWriter(Writer):
    inline_safe = False  # it holds a write at a gate from its worker thread

    """Delegates to the real writer; when armed, holds its next write until the late callers have arrived."""

    def __init__(self, inner: Writer) -> None:
        self.inner = inner
        self.gate: Gate | None = None

    def append(self, batch: list[EncodedEvent], durable: bool) -> int:
        gate = self.gate
        if gate is not None and durable:
            self.gate = None
            gate.loop.call_soon_threadsafe(gate.in_thread.set)
            if not gate.all_arrived.wait(timeout=5):
                raise RuntimeError("late callers never arrived")
        return self.inner.append(batch, durable)

    def close(self) -> None:
        self.inner.close()


async def run(home, backend: str) -> dict[str, tuple[list[int], list[int]]]:
    store = SessionStore(home, backend)
    opened = store.create(cwd=str(home), session_id=f"p2-{backend}")
    writer = opened.writer = GatedWriter(opened.writer)
    results: dict[str, tuple[list[int], list[int]]] = {}
    async with LiveSession(opened) as session:
        stats = session.coordinator.stats

        async def flush_only() -> None:
            await session.flush()

        async def append_and_flush(event: ToolCall) -> None:
            session.append(event)
            await session.flush()

        async def late_append_and_flush(event: ToolCall, gate: Gate) -> None:
            await gate.in_thread.wait()
            session.append(event)
            gate.arrived += 1
            if gate.arrived == gate.late:
                gate.all_arrived.set()
            await session.flush()

        for shape in ("append, then 8 flushes", "each appends + flushes", "late arrivals"):
            fsyncs: list[int] = []
            times: list[int] = []
            for r in range(ROUNDS):
                before = stats.fsyncs
                t0 = now_ns()
                async with anyio.create_task_group() as tg:
                    if shape.startswith("append,"):
                        for k in range(CALLERS):
                            session.append(tool_call(r, k))
                        for _ in range(CALLERS):
                            tg.start_soon(flush_only)
                    elif shape.startswith("each"):
                        for k in range(CALLERS):
                            tg.start_soon(append_and_flush, tool_call(r, k))
                    else:
                        gate = writer.gate = Gate(CALLERS - 1)
                        tg.start_soon(append_and_flush, tool_call(r, 0))
                        for k in range(1, CALLERS):
                            tg.start_soon(late_append_and_flush, tool_call(r, k), gate)
                times.append(now_ns() - t0)
                fsyncs.append(stats.fsyncs - before)
                # every caller returned, so everything appended is durable
                assert session.coordinator.durable_seq == session.coordinator.next_seq - 1
            results[shape] = (fsyncs, times)
    return results


def report(backend: str, results: dict[str, tuple[list[int], list[int]]]) -> int:
    worst = 0
    for shape, (fsyncs, times) in results.items():
        hist = ", ".join(f"{n} fsync{'s' if n != 1 else ''}: {c}" for n, c in sorted(Counter(fsyncs).items()))
        print(
            f"   {backend:<6} {shape:<23} rounds={len(fsyncs)}  max {max(fsyncs)}  mean {sum(fsyncs) / len(fsyncs):.2f}"
            f"  round median {median(times) / 1e6:.3f} ms   [{hist}]"
        )
        worst = max(worst, max(fsyncs))
    return worst


def main() -> None:
    with temp_dir("p2") as home:
        header(f"P2 group commit ({CALLERS} concurrent flush() calls per round)", home)
        jsonl = anyio.run(run, home / "jsonl", "jsonl")
        sqlite = anyio.run(run, home / "sqlite", "sqlite")
    worst = report("jsonl", jsonl)
    worst_sqlite = report("sqlite", sqlite)
    all_rounds = [n for fs, _ in jsonl.values() for n in fs]
    print(f"   worst round: {worst} fsyncs (JSONL), {worst_sqlite} (SQLite); naive per-caller fsync: {BASELINE}")
    emit(
        "p2_group_commit", float(worst), "fsyncs/round", float(BASELINE), TARGET, worst <= TARGET,
        mean=sum(all_rounds) / len(all_rounds), rounds=len(all_rounds), sqlite_max=worst_sqlite,
        shapes={shape: max(fs) for shape, (fs, _) in jsonl.items()},
    )


if __name__ == "__main__":
    sys.exit(main())
