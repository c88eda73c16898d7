"""P3 — what does persisting a streamed answer cost per chunk?

Cairn: 20,000 `assistant/chunk` events with ~20-byte deltas go through `LiveSession.append` (stamp, encode, queue; the
write-behind task hands batches to the OS every 20 ms; no fsync on this path), yielding to the event loop with
`anyio.sleep(0)` every YIELD_EVERY chunks as a provider stream does between network reads, then one final `flush()`.

Raw baseline (same run, same directory): per chunk, build the same event and `msgspec` encode it + `os.write` it with
its newline; one `fdatasync` at the end. It runs in the same event loop with the same `anyio.sleep(0)` cadence, so
the comparison is about persistence only; the bare synchronous loop (no yields) is reported as an extra.

Both sides build the `AssistantChunk` struct (a provider adapter has to create it either way). value = median µs per
chunk over REPEATS alternated runs, timed from the first append to the final flush returning. Target: ratio <= 2.0.
"""

from __future__ import annotations

import os
import random
import sys

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header, median, now_ns, temp_dir

import anyio

from cairn.persistence.events import AssistantChunk, SessionHeader, encoder
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

CHUNKS = 20_000
YIELD_EVERY = 8
REPEATS = 7
TARGET = 2.0

WORDS = (
    "the function returns a list of paths that match the pattern and we then read each file to find where "
    "the handler is registered so that the new route can be added next to the existing ones without breaking "
    "anything else in the module".split()
)


def make_deltas(n: int) -> list[str]:
    rng = random.Random(3)
    out = []
    for _ in range(n):
        s = ""
        while len(s) < 24:
            s += " " + rng.choice(WORDS)
        out.append(s[: rng.randint(17, 24)])
    return out


async def cairn_run(home, run_no: int, deltas: list[str]) -> tuple[int, int]:
    store = SessionStore(home, "jsonl")
    opened = store.create(cwd=str(home), session_id=f"p3-{run_no}")
    async with LiveSession(opened) as session:
        append = session.append
        t0 = now_ns()
        for i, delta in enumerate(deltas):
            append(AssistantChunk(turn=1, step=1, delta=delta))
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await anyio.sleep(0)
        await session.flush()
        elapsed = now_ns() - t0
        writes = session.coordinator.stats.writes
    return elapsed, writes


def _raw_open(path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    os.write(fd, encoder.encode(SessionHeader(id="raw", created=0, cwd="/")) + b"\n")
    os.fdatasync(fd)
    return fd


async def raw_run(path, deltas: list[str]) -> int:
    fd = _raw_open(path)
    encode, write = encoder.encode, os.write
    try:
        t0 = now_ns()
        for i, delta in enumerate(deltas):
            write(fd, encode(AssistantChunk(seq=i, time=1764680000000, turn=1, step=1, delta=delta)) + b"\n")
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await anyio.sleep(0)
        os.fdatasync(fd)
        return now_ns() - t0
    finally:
        os.close(fd)


def raw_sync_run(path, deltas: list[str]) -> int:
    fd = _raw_open(path)
    encode, write = encoder.encode, os.write
    try:
        t0 = now_ns()
        for i, delta in enumerate(deltas):
            write(fd, encode(AssistantChunk(seq=i, time=1764680000000, turn=1, step=1, delta=delta)) + b"\n")
        os.fdatasync(fd)
        return now_ns() - t0
    finally:
        os.close(fd)


def main() -> None:
    deltas = make_deltas(CHUNKS)
    cairn: list[float] = []
    raw: list[float] = []
    bare: list[float] = []
    writes: list[int] = []
    with temp_dir("p3") as home:
        header(f"P3 streaming appends ({CHUNKS} chunks, avg delta {sum(map(len, deltas)) / CHUNKS:.1f} chars)", home)
        for r in range(REPEATS + 1):  # run 0 is a warm-up
            order = ("cairn", "raw") if r % 2 else ("raw", "cairn")
            for which in order:
                if which == "cairn":
                    ns, w = anyio.run(cairn_run, home / "cairn", r, deltas)
                    if r:
                        cairn.append(ns / CHUNKS / 1e3)
                        writes.append(w)
                else:
                    ns = anyio.run(raw_run, home / f"raw-{r}.jsonl", deltas)
                    if r:
                        raw.append(ns / CHUNKS / 1e3)
            ns = raw_sync_run(home / f"bare-{r}.jsonl", deltas)
            if r:
                bare.append(ns / CHUNKS / 1e3)
        size = os.path.getsize(home / f"raw-{REPEATS}.jsonl")

    value, base, bare_med = median(cairn), median(raw), median(bare)
    print(f"   {'raw encode + os.write (same yields)':<40} median {base:6.2f} us/chunk   runs {[round(x, 2) for x in raw]}")
    print(f"   {'raw, bare synchronous loop':<40} median {bare_med:6.2f} us/chunk   runs {[round(x, 2) for x in bare]}")
    print(f"   {'cairn LiveSession.append + final flush':<40} median {value:6.2f} us/chunk   runs {[round(x, 2) for x in cairn]}")
    print(f"   cairn backend writes per run (write-behind batches + final barrier): {writes}")
    print(f"   log size {size / 1e6:.2f} MB; ratio {value / base:.2f} (vs bare loop {value / bare_med:.2f}); target <= {TARGET}")
    emit(
        "p3_streaming_appends", value, "us/chunk", base, TARGET, value / base <= TARGET,
        bare_baseline=bare_med, bare_ratio=round(value / bare_med, 3), chunks=CHUNKS, yield_every=YIELD_EVERY,
        runs=REPEATS,
    )


if __name__ == "__main__":
    sys.exit(main())
