"""P4 — how long does opening a big session cold take, compared with just decoding its bytes?

A 100,000-event session (~55 MB) with a realistic mix is written through the store and the JSONL backend: turns of
several steps, each with a request header, ~20 streamed chunks, an assistant message with tool calls, approvals for
side-effecting calls, tool calls and tool results of a few KB (slices of real source files). The last turn is left
open (one tool call without a result, one never started) so repair has work to do, and the session lock is released
so `inspect()` treats it as cold.

Cairn: `SessionStore.inspect()` — read, header checks, `decode_lines` with the GC paused, seq checks, lock probe,
repair. Raw baseline (same run, same file): `open().read()` + `msgspec.json.Decoder(KnownEvent).decode_lines` of the
body (a zero-copy memoryview of it) with the cyclic GC disabled. Both read from the page cache (the file was just
written; dropping caches needs root): "cold" means no live owner and no in-memory state, not a cold disk.
value = median seconds over REPEATS alternated runs; target: ratio <= 1.5. The same session in the SQLite backend is
loaded too and reported as an extra key.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import sysconfig
from pathlib import Path

import _common  # noqa: F401  (loads the checkout's cairn package)
from _common import emit, header, median, now_ns, temp_dir

import msgspec

from cairn.persistence.events import (
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    KnownEvent,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
)
from cairn.persistence.store import SessionStore

EVENTS = 100_000
REPEATS = 7
SQLITE_REPEATS = 5
TARGET = 1.5
SESSION_ID = "p4-big"
T0 = 1_764_680_000_000  # 2025-12-02, ms

TOOLS = [("read_file", "read_only"), ("search", "read_only"), ("run_shell", "side_effecting"), ("apply_patch", "idempotent")]


def source_lines() -> list[str]:
    """Real code to use as tool output: the stdlib's asyncio, json and email packages (quotes, backslashes, indentation)."""
    lines: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for pkg in ("asyncio", "json", "email"):
        for path in sorted((stdlib / pkg).glob("*.py")):
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return lines


class SessionGenerator:
    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.lines = source_lines()
        self.words = " ".join(self.lines[:4000]).split()
        self.events: list = []
        self.turn = 0
        self.calls = 0

    def add(self, event) -> None:
        event.seq = len(self.events)
        event.time = T0 + event.seq * 37
        self.events.append(event)

    def text(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        return " ".join(self.rng.choice(self.words) for _ in range(n))

    def tool_output(self) -> str:
        target = int(self.rng.lognormvariate(8.6, 0.6))  # median ~5.4 KB, long tail
        start = self.rng.randrange(len(self.lines) - 400)
        out, size, i = [], 0, start
        while size < target and i < len(self.lines):
            out.append(f"{i - start + 1:5d}\t{self.lines[i]}")
            size += len(out[-1]) + 1
            i += 1
        return "\n".join(out)

    def stream(self, turn: int, step: int, n_chunks: int) -> str:
        parts = []
        for _ in range(n_chunks):
            delta = self.text(3, 5)[: self.rng.randint(14, 26)]
            parts.append(delta)
            self.add(AssistantChunk(turn=turn, step=step, delta=delta))
        return "".join(parts)

    def request(self, turn: int, step: int) -> None:
        self.add(
            RequestHeader(
                turn=turn, step=step, provider="anthropic", model="claude-sonnet-4-5",
                params={"max_tokens": 8192, "temperature": 0.2, "stream": True},
                tools=[name for name, _ in TOOLS], message_count=4 * step + 2 * turn,
            )
        )

    def tool_requests(self, n: int) -> list[tuple[ToolCallRequest, str]]:
        out = []
        for _ in range(n):
            self.calls += 1
            name, safety = self.rng.choice(TOOLS)
            args = {"path": f"src/pkg/module_{self.rng.randrange(300)}.py", "query": self.text(1, 4)}
            out.append((ToolCallRequest(call_id=f"toolu_{self.calls:08d}", name=name, arguments=args), safety))
        return out

    def call(self, turn: int, step: int, req: ToolCallRequest, safety: str) -> int:
        if safety == "side_effecting":
            self.add(ApprovalAsked(turn=turn, step=step, call_id=req.call_id))
            self.add(ApprovalDecided(turn=turn, step=step, call_id=req.call_id, decision="allowed_once"))
        self.add(
            ToolCall(
                turn=turn, step=step, call_id=req.call_id, name=req.name, arguments=req.arguments, safety=safety,
                parent_call_id=None,
            )
        )
        return self.events[-1].seq

    def turn_events(self) -> None:
        """One complete turn: 2-6 steps with tools, then a final answer."""
        self.turn += 1
        t = self.turn
        self.add(TurnStart(turn=t))
        n_steps = self.rng.randint(3, 7)
        for s in range(1, n_steps + 1):
            self.add(StepStart(turn=t, step=s))
            if s == 1:
                self.add(UserMessage(turn=t, step=s, text=self.text(10, 60)))
            self.request(t, s)
            text = self.stream(t, s, self.rng.randint(8, 24))
            final = s == n_steps
            requests = [] if final else self.tool_requests(self.rng.choice((1, 1, 2, 2, 3)))
            self.add(
                AssistantMessage(
                    turn=t, step=s, text=text, tool_calls=[r for r, _ in requests], interrupted=False
                )
            )
            for req, safety in requests:
                source = self.call(t, s, req, safety)
                self.add(
                    ToolResult(
                        turn=t, step=s, call_id=req.call_id, is_error=False, content=self.tool_output(),
                        error_code=None, source_seq=source,
                    )
                )
            self.add(StepEnd(turn=t, step=s))
        self.add(TurnEnd(turn=t, reason="completed", error=None))

    def open_turn(self, total: int) -> None:
        """The interrupted last turn, streamed long enough that the log holds exactly `total` events.

        Call A finished, B (side-effecting, approved) was running when the process died, C never started.
        """
        self.turn += 1
        t = self.turn
        (a, sa), (b, _), (c, _) = self.tool_requests(3)
        fixed = 4 + 1 + (2 if sa == "side_effecting" else 0) + 2 + 2 + 1
        n_chunks = total - len(self.events) - fixed
        assert n_chunks >= 0
        self.add(TurnStart(turn=t))
        self.add(StepStart(turn=t, step=1))
        self.add(UserMessage(turn=t, step=1, text="please run the migration and then check the output"))
        self.request(t, 1)
        text = self.stream(t, 1, n_chunks)
        self.add(AssistantMessage(turn=t, step=1, text=text, tool_calls=[a, b, c], interrupted=False))
        source = self.call(t, 1, a, sa)
        self.add(
            ToolResult(
                turn=t, step=1, call_id=a.call_id, is_error=False, content=self.tool_output(), error_code=None,
                source_seq=source,
            )
        )
        self.call(t, 1, b, "side_effecting")

    def generate(self, total: int) -> list:
        while len(self.events) + 400 < total:  # no turn is longer than ~300 events
            self.turn_events()
        self.open_turn(total)
        assert len(self.events) == total
        return self.events


def write_session(store: SessionStore, events: list) -> int:
    opened = store.create(cwd="/home/user/project", session_id=SESSION_ID, created=T0 - 1000)
    total = 0
    try:
        for i in range(0, len(events), 2000):
            batch = [(e.seq, encode_event(e)) for e in events[i : i + 2000]]
            total += opened.writer.append(batch, durable=i + 2000 >= len(events))
    finally:
        opened.writer.close()
        opened.lock.release()
    return total


def raw_load(path: Path, decoder: msgspec.json.Decoder) -> tuple[int, list]:
    t0 = now_ns()
    with open(path, "rb") as f:
        data = f.read()
    body = memoryview(data)[data.find(b"\n") + 1 :]
    gc.disable()
    try:
        events = decoder.decode_lines(body)
    finally:
        gc.enable()
    return now_ns() - t0, events


def cairn_load(store: SessionStore) -> tuple[int, object]:
    t0 = now_ns()
    inspection = store.inspect(SESSION_ID)
    return now_ns() - t0, inspection


def main() -> None:
    t_gen = now_ns()
    events = SessionGenerator().generate(EVENTS)
    kinds: dict[str, int] = {}
    for e in events:
        tag = type(e).__struct_config__.tag
        kinds[tag] = kinds.get(tag, 0) + 1
    with temp_dir("p4") as home:
        header(f"P4 cold load of a {EVENTS}-event session", home)
        jsonl_store = SessionStore(home, "jsonl")
        written = write_session(jsonl_store, events)
        path = jsonl_store.backend.path(SESSION_ID)
        size = os.path.getsize(path)
        sqlite_store = SessionStore(home, "sqlite")
        write_session(sqlite_store, events)
        print(f"   generated and written (JSONL + SQLite) in {(now_ns() - t_gen) / 1e9:.1f} s")
        print(f"   JSONL file {size / 1e6:.1f} MB ({written / EVENTS:.0f} B/event); mix: "
              + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
        del events
        gc.collect()

        decoder = msgspec.json.Decoder(KnownEvent)
        cairn: list[int] = []
        raw: list[int] = []
        repair_len = 0
        for r in range(REPEATS + 1):  # run 0 is a warm-up
            order = ("cairn", "raw") if r % 2 else ("raw", "cairn")
            for which in order:
                if which == "cairn":
                    ns, result = cairn_load(jsonl_store)
                    repair_len = len(result.repair)
                    assert len(result.events) == EVENTS and result.live_pid is None
                    if r:
                        cairn.append(ns)
                else:
                    ns, result = raw_load(path, decoder)
                    assert len(result) == EVENTS
                    if r:
                        raw.append(ns)
                del result  # freeing 100k events is outside the timed region
                gc.collect()

        sqlite: list[int] = []
        for r in range(SQLITE_REPEATS + 1):
            ns, result = cairn_load(sqlite_store)
            assert len(result.events) == EVENTS and len(result.repair) == repair_len
            del result
            gc.collect()
            if r:
                sqlite.append(ns)

    value, base, sq = median(cairn) / 1e9, median(raw) / 1e9, median(sqlite) / 1e9
    ms = lambda xs: [round(x / 1e6, 1) for x in xs]  # noqa: E731
    print(f"   {'raw read + decode_lines (GC off)':<34} median {base * 1e3:7.1f} ms  {size / base / 1e6:6.0f} MB/s  runs {ms(raw)}")
    print(f"   {'cairn inspect() JSONL':<34} median {value * 1e3:7.1f} ms  {size / value / 1e6:6.0f} MB/s  runs {ms(cairn)}")
    print(f"   {'cairn inspect() SQLite':<34} median {sq * 1e3:7.1f} ms  {size / sq / 1e6:6.0f} MB/s  runs {ms(sqlite)}")
    print(f"   repair computed {repair_len} closing events; ratio {value / base:.2f}, target <= {TARGET}")
    emit(
        "p4_cold_load", value, "s", base, TARGET, value / base <= TARGET,
        sqlite=sq, sqlite_ratio=round(sq / base, 3), size_mb=round(size / 1e6, 1), events=EVENTS,
        repair_events=repair_len,
    )


if __name__ == "__main__":
    sys.exit(main())
