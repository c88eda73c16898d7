"""P5 — what does checkpointing one agent step cost, Cairn vs LangGraph, and how does storage grow?

A step here is what Cairn's loop appends for one model call that asks for one tool, with the barriers where
app/agent/policy.py places them (3 fdatasyncs per step):

    step/start                                  -> pre-step barrier (flush)
    request/header                              -> pre-request barrier (flush)
    assistant/message (one ~600-byte tool call)
    tool/call                                   -> pre-tool barrier (flush)
    tool/result (~300 bytes), step/end          (no barrier: written by write-behind / the next step's pre-step barrier)

Cairn: a LiveSession over the JSONL store; a step is timed from the step/start append to the step/end append (what it
leaves queued is paid for by the next step's first barrier). The same steps over the SQLite backend are an extra.

LangGraph (baseline, same run, same temp dir): a StateGraph whose node appends the same four dicts (request/header,
assistant/message, tool/call, tool/result, as Cairn writes them) to `messages: Annotated[list, operator.add]`,
compiled with `SqliteSaver` on a real SQLite file (its own defaults: WAL, synchronous=FULL) and run with
`durability="sync"`. Headline shape: the node loops back to itself, so one `graph.stream(...)` call runs one
super-step per agent step (1 checkpoint + 1 write batch = 2 fsyncs per step) — how a LangGraph agent loop runs, and
the cheapest per-step shape LangGraph has. A step is one `next()` on the stream (all of the super-step's work happens
inside it). The two stores are stepped alternately (order swapped every step) so machine noise hits both.
Extras: one `graph.invoke(..., durability="sync")` per step on the same thread_id (each call writes an input checkpoint
plus two loop checkpoints: 3 checkpoints + 2 write batches per step), and the beta `DeltaChannel` reducer (stores
writes, with a full snapshot every 100 updates, instead of the full list in every checkpoint).

value = Cairn JSONL median ms/step over steps 1..200; baseline = LangGraph (loop) median ms/step over the same steps;
target ratio <= 0.2.

Storage after 100, 200 and 400 steps. Cairn JSONL: the .jsonl file size after a flush. SQLite stores (LangGraph and
Cairn's SQLite backend): main db file + -wal file after `PRAGMA wal_checkpoint(TRUNCATE)` (so the WAL's reused, stale
frames are not counted and the db file holds everything); the LangGraph figure also lists the logical bytes stored
(checkpoint + metadata blobs + write values). Target: Cairn linear, bytes(400)/bytes(100) within 4 +- 0.1.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import sys
from typing import Annotated, Any, TypedDict

import _common  # noqa: F401  (loads the checkout's cairn package)
import anyio
import msgspec
from _common import describe, emit, header, median, now_ns, percentile, temp_dir

from cairn.persistence.events import (
    AssistantMessage,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnStart,
)
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

try:
    from langgraph.channels.delta import DeltaChannel
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
except ImportError:  # pragma: no cover
    sys.exit("P5 needs LangGraph: pip install -e '.[bench]' (langgraph, langgraph-checkpoint-sqlite)")

TIMED = 200  # per-step figures: median over steps 1..TIMED
MARKS = (100, 200, 400)  # storage measured after this many steps
STEPS = MARKS[-1]
INVOKE_STEPS = 200  # the invoke-per-step extra writes 3 full-state checkpoints per step: kept to 200 steps
TARGET = 0.2
LINEAR_TOLERANCE = 0.1  # bytes(400)/bytes(100) must be within 4 +- this

SOURCE = "".join(f"def handler_{i}(request):\n    return respond(request, status=200, body=render_{i}())\n" for i in range(7))
RESULT_TEXT = "".join(f"{i:4d}  def handler_{i}(request):  return respond(request, status=200)\n" for i in range(5))


# -- the workload ----------------------------------------------------------------------------------------------------


def step_events(step: int) -> list:
    """Fresh event objects for one step (append stamps seq/time into them), in append order."""
    turn, call_id = 1, f"call_{step:06d}"
    arguments = {"path": f"src/app/handlers_{step % 10}.py", "content": SOURCE, "mode": "overwrite"}
    return [
        StepStart(turn=turn, step=step),
        RequestHeader(
            turn=turn, step=step, provider="openai", model="gpt-5.1",
            params={"temperature": 0.2, "max_tokens": 4096, "stream": True},
            tools=["read_file", "write_file", "run_shell", "search", "list_dir"], message_count=2 * step + 1,
        ),
        AssistantMessage(
            turn=turn, step=step, text="", interrupted=False,
            tool_calls=[ToolCallRequest(call_id=call_id, name="write_file", arguments=arguments)],
        ),
        ToolCall(
            turn=turn, step=step, call_id=call_id, name="write_file", arguments=arguments, safety="side_effecting",
            parent_call_id=None,
        ),
        ToolResult(
            turn=turn, step=step, call_id=call_id, is_error=False, content=RESULT_TEXT, error_code=None,
            source_seq=None,
        ),
        StepEnd(turn=turn, step=step),
    ]


def step_payload(step: int) -> list[dict[str, Any]]:
    """What the LangGraph node appends: the same request/header, assistant/message, tool/call and tool/result dicts."""
    events = step_events(step)
    return [msgspec.to_builtins(e) for e in events[1:5]]


# -- Cairn -----------------------------------------------------------------------------------------------------------


class CairnRun:
    """One LiveSession; `step(i)` appends step i's events with the three barriers and returns its duration (ns)."""

    def __init__(self, home, backend: str, session_id: str) -> None:
        self.home = home
        self.backend = backend
        self.opened = SessionStore(home, backend).create(cwd=str(home), session_id=session_id)
        self.session = LiveSession(self.opened)
        self.id = session_id

    async def __aenter__(self) -> "CairnRun":
        await self.session.__aenter__()
        self.session.append(TurnStart(turn=1))
        await self.session.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.__aexit__(*exc)

    async def step(self, i: int) -> int:
        s = self.session
        start, request, message, call, result, end = step_events(i)
        t0 = now_ns()
        s.append(start)
        await s.flush()  # pre-step
        s.append(request)
        await s.flush()  # pre-request
        s.append(message)
        s.append(call)
        await s.flush()  # pre-tool
        s.append(result)
        s.append(end)
        return now_ns() - t0

    async def size(self) -> int:
        await self.session.flush()
        if self.backend == "jsonl":
            return os.path.getsize(self.home / "sessions" / f"{self.id}.jsonl")
        return sqlite_files_size(self.home / "sessions.sqlite3")


def sqlite_files_size(path, conn: sqlite3.Connection | None = None) -> int:
    """db + -wal bytes after a TRUNCATE checkpoint (through `conn`, or a short-lived side connection)."""
    own = conn is None
    c = conn if conn is not None else sqlite3.connect(path)
    try:
        busy, _, _ = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError(f"wal_checkpoint(TRUNCATE) on {path} was blocked")
    finally:
        if own:
            c.close()
    wal = f"{path}-wal"
    return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)


# -- LangGraph -------------------------------------------------------------------------------------------------------


def extend(state: list, writes: list) -> list:
    """DeltaChannel reducer: operator.add over a batch of writes."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class LoopState(TypedDict):
    messages: Annotated[list, operator.add]
    step: int


class DeltaLoopState(TypedDict):
    messages: Annotated[list, DeltaChannel(extend)]
    step: int


class InvokeState(TypedDict):
    messages: Annotated[list, operator.add]
    step: int


class LangGraphRun:
    def __init__(self, path, state: type, payloads: list, loop_steps: int | None) -> None:
        self.path = path
        self.conn = sqlite3.connect(str(path), check_same_thread=False)  # as SqliteSaver.from_conn_string does
        self.saver = SqliteSaver(self.conn)
        self.config: dict[str, Any] = {"configurable": {"thread_id": "p5"}}
        b = StateGraph(state)
        if loop_steps is None:  # invoke-per-step shape: START -> step -> END

            def node(st: dict) -> dict:
                return {"messages": payloads[st["step"]]}

            b.add_node("step", node)
            b.add_edge(START, "step")
            b.add_edge("step", END)
        else:  # loop shape: step -> step ... one super-step per agent step

            def node(st: dict) -> dict:
                n = st["step"] + 1
                return {"messages": payloads[n], "step": n}

            def route(st: dict) -> str:
                return "step" if st["step"] < loop_steps else END

            b.add_node("step", node)
            b.add_edge(START, "step")
            b.add_conditional_edges("step", route)
            self.config["recursion_limit"] = loop_steps + 10
        self.graph = b.compile(checkpointer=self.saver)
        self._stream = None

    def loop_step(self) -> int:
        """One super-step of the looping graph (the first call starts the stream)."""
        t0 = now_ns()
        if self._stream is None:
            self._stream = iter(
                self.graph.stream({"messages": [], "step": 0}, self.config, durability="sync", stream_mode="updates")
            )
        next(self._stream)
        return now_ns() - t0

    def invoke_step(self, i: int) -> int:
        t0 = now_ns()
        self.graph.invoke({"step": i}, self.config, durability="sync")
        return now_ns() - t0

    def size(self) -> int:
        with self.saver.lock:  # the saver's connection, between super-steps: no transaction is open
            return sqlite_files_size(self.path, self.conn)

    def logical(self) -> tuple[int, int, int]:
        with self.saver.lock:
            n, blobs = self.conn.execute(
                "SELECT count(*), coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints"
            ).fetchone()
            (writes,) = self.conn.execute("SELECT coalesce(sum(length(value)), 0) FROM writes").fetchone()
        return n, blobs, writes

    def drain(self) -> None:
        if self._stream is not None:
            for _ in self._stream:  # the last super-step routes to END
                pass
            self._stream = None

    def messages(self) -> int:
        """Messages in the thread's latest checkpoint (after the stream has ended)."""
        self.drain()
        return len(self.graph.get_state({"configurable": {"thread_id": "p5"}}).values["messages"])

    def finish(self) -> None:
        self.drain()
        self.conn.close()


# -- runs ------------------------------------------------------------------------------------------------------------


class RawFloor:
    """The bare system calls a step needs: the same bytes, os.write + fdatasync at the same three points."""

    def __init__(self, path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.tail = b""

    def step(self, i: int) -> int:
        lines = [msgspec.json.encode(e) + b"\n" for e in step_events(i)]
        chunks = [self.tail + lines[0], lines[1], lines[2] + lines[3]]
        self.tail = lines[4] + lines[5]
        t0 = now_ns()
        for chunk in chunks:
            os.write(self.fd, chunk)
            os.fdatasync(self.fd)
        return now_ns() - t0

    def close(self) -> None:
        os.close(self.fd)


async def headline(root, payloads) -> dict:
    """Cairn JSONL, LangGraph (loop) and, for the timed steps, the raw floor, stepped in rotating order; storage at
    each mark."""
    (root / "cairn").mkdir()
    lg = LangGraphRun(root / "langgraph.sqlite", LoopState, payloads, STEPS)
    raw = RawFloor(root / "raw.jsonl")
    cairn_ns, lg_ns, raw_ns, cairn_bytes, lg_bytes, lg_logical = [], [], [], {}, {}, {}
    try:
        async with CairnRun(root / "cairn", "jsonl", "p5-jsonl") as cairn:
            for i in range(1, STEPS + 1):
                times: dict[str, int] = {}
                order = ("cairn", "lg", "raw")
                for who in order[i % 3 :] + order[: i % 3]:
                    if who == "cairn":
                        times[who] = await cairn.step(i)
                    elif who == "lg":
                        times[who] = lg.loop_step()
                    elif i <= TIMED:
                        times[who] = raw.step(i)
                cairn_ns.append(times["cairn"])
                lg_ns.append(times["lg"])
                if "raw" in times:
                    raw_ns.append(times["raw"])
                if i in MARKS:
                    cairn_bytes[i] = await cairn.size()
                    lg_bytes[i] = lg.size()
                    lg_logical[i] = lg.logical()
            fsyncs = cairn.session.coordinator.stats.fsyncs
            events = len(cairn.session.events)
        lg_messages = lg.messages()
    finally:
        lg.finish()
        raw.close()
    if lg_messages != 4 * STEPS or events != 1 + 6 * STEPS:
        raise RuntimeError(f"workload mismatch: LangGraph holds {lg_messages} messages, Cairn {events} events")
    return dict(cairn_ns=cairn_ns, lg_ns=lg_ns, raw_ns=raw_ns, cairn_bytes=cairn_bytes, lg_bytes=lg_bytes,
                lg_logical=lg_logical, fsyncs=fsyncs)


async def cairn_sqlite(root) -> tuple[list[int], dict[int, int]]:
    (root / "cairn-sqlite").mkdir()
    out, sizes = [], {}
    async with CairnRun(root / "cairn-sqlite", "sqlite", "p5-sqlite") as cairn:
        for i in range(1, STEPS + 1):
            out.append(await cairn.step(i))
            if i in MARKS:
                sizes[i] = await cairn.size()
    return out, sizes


def langgraph_extra(root, name: str, state: type, payloads, steps: int, loop: bool) -> tuple[list[int], dict]:
    lg = LangGraphRun(root / f"{name}.sqlite", state, payloads, steps if loop else None)
    out, sizes = [], {}
    try:
        for i in range(1, steps + 1):
            out.append(lg.loop_step() if loop else lg.invoke_step(i))
            if i in MARKS:
                sizes[i] = lg.size()
        checkpoints = lg.logical()[0]
    finally:
        lg.finish()
    sizes["checkpoints"] = checkpoints
    return out, sizes


def ms(values: list[int]) -> float:
    return median(values) / 1e6


def growth(sizes: dict) -> float:
    return sizes[MARKS[-1]] / sizes[MARKS[0]]


def fmt_sizes(sizes: dict) -> str:
    return "  ".join(f"{k}: {sizes[k] / 1e6:9.3f} MB" for k in MARKS if k in sizes)


def main() -> None:
    payloads = [None] + [step_payload(i) for i in range(1, STEPS + 2)]
    with temp_dir("p5") as root:
        header("P5 per-step checkpoint overhead: Cairn vs LangGraph SqliteSaver (durability='sync')", root)
        t_start = now_ns()
        h = anyio.run(headline, root, payloads)
        sqlite_ns, sqlite_bytes = anyio.run(cairn_sqlite, root)
        invoke_ns, invoke_bytes = langgraph_extra(root, "lg-invoke", InvokeState, payloads, INVOKE_STEPS, loop=False)
        delta_ns, delta_bytes = langgraph_extra(root, "lg-delta", DeltaLoopState, payloads, STEPS, loop=True)
        elapsed = (now_ns() - t_start) / 1e9

    cairn, lg = h["cairn_ns"][:TIMED], h["lg_ns"][:TIMED]
    step_bytes = msgspec.json.encode(step_events(1))
    print(f"   workload: 6 events/step, ~{len(step_bytes) + 6} B/step as JSONL; tool-call arguments "
          f"{len(msgspec.json.encode(step_events(1)[3].arguments))} B; LangGraph payload "
          f"{len(msgspec.json.encode(payloads[1]))} B/step as JSON")
    print(f"   per-step time, steps 1..{TIMED} (medians; interleaved):")
    print(describe("  cairn JSONL (3 barriers)", cairn))
    print(describe("  langgraph loop (1 super-step)", lg))
    print(describe("  raw floor (3x write+fdatasync)", h["raw_ns"]))
    print(describe("  cairn SQLite backend", sqlite_ns[:TIMED]))
    print(describe("  langgraph invoke per step", invoke_ns[:TIMED]))
    print(describe("  langgraph loop, DeltaChannel", delta_ns[:TIMED]))
    first, last = slice(0, 20), slice(TIMED - 20, TIMED)
    print(f"   growth of per-step time, median of steps 1-20 -> {TIMED - 19}-{TIMED} -> {STEPS - 19}-{STEPS}:")
    for label, xs in (("cairn JSONL", h["cairn_ns"]), ("langgraph loop", h["lg_ns"]), ("langgraph invoke", invoke_ns),
                      ("langgraph DeltaChannel", delta_ns)):
        tail = f" -> {ms(xs[-20:]):.3f}" if len(xs) >= STEPS else ""
        print(f"     {label:<24} {ms(xs[first]):.3f} -> {ms(xs[last]):.3f}{tail} ms")
    print(f"   cairn JSONL fsyncs: {h['fsyncs']} for {STEPS} steps (+1 turn start, +{len(MARKS)} size flushes)")
    print("   storage (Cairn JSONL: file size; SQLite: db + wal after wal_checkpoint(TRUNCATE)):")
    print(f"     {'cairn JSONL':<24} {fmt_sizes(h['cairn_bytes'])}   400/100 = {growth(h['cairn_bytes']):.2f}")
    print(f"     {'cairn SQLite':<24} {fmt_sizes(sqlite_bytes)}   400/100 = {growth(sqlite_bytes):.2f}")
    print(f"     {'langgraph loop':<24} {fmt_sizes(h['lg_bytes'])}   400/100 = {growth(h['lg_bytes']):.2f}")
    print(f"     {'langgraph DeltaChannel':<24} {fmt_sizes(delta_bytes)}   400/100 = {growth(delta_bytes):.2f}")
    print(f"     {'langgraph invoke/step':<24} {fmt_sizes(invoke_bytes)}   200/100 = "
          f"{invoke_bytes[200] / invoke_bytes[100]:.2f} ({invoke_bytes['checkpoints']} checkpoints for "
          f"{INVOKE_STEPS} steps)")
    for k in MARKS:
        n, blobs, writes = h["lg_logical"][k]
        print(f"     langgraph loop logical at {k}: {n} checkpoints, {blobs / 1e6:.3f} MB checkpoint+metadata blobs, "
              f"{writes / 1e6:.3f} MB writes")
    print(f"   total {elapsed:.1f} s")

    value, base = ms(cairn), ms(lg)
    ratio = value / base
    linear = abs(growth(h["cairn_bytes"]) - 4) <= LINEAR_TOLERANCE
    print(f"   cairn above the raw floor: {value - ms(h['raw_ns']):.3f} ms/step; floor / langgraph = "
          f"{ms(h['raw_ns']) / base:.3f} (the best ratio 3 fdatasyncs per step allow against this baseline)")
    print(f"   ratio (median ms/step): {ratio:.3f}   target <= {TARGET};  cairn storage linear: {linear}")
    emit(
        "p5_step_overhead", value, "ms/step", base, TARGET, ratio <= TARGET and linear,
        time_ok=ratio <= TARGET, steps_timed=TIMED,
        p99=percentile(cairn, 99) / 1e6, baseline_p99=percentile(lg, 99) / 1e6,
        cairn_first20=ms(h["cairn_ns"][first]), langgraph_first20=ms(h["lg_ns"][first]),
        ratio_first20=round(ms(h["cairn_ns"][first]) / ms(h["lg_ns"][first]), 3),
        raw_floor=ms(h["raw_ns"]), cairn_sqlite=ms(sqlite_ns[:TIMED]), langgraph_invoke=ms(invoke_ns[:TIMED]),
        langgraph_delta=ms(delta_ns[:TIMED]),
        cairn_bytes={str(k): h["cairn_bytes"][k] for k in MARKS},
        cairn_sqlite_bytes={str(k): sqlite_bytes[k] for k in MARKS},
        langgraph_bytes={str(k): h["lg_bytes"][k] for k in MARKS},
        langgraph_delta_bytes={str(k): delta_bytes[k] for k in MARKS},
        langgraph_invoke_bytes={str(k): invoke_bytes[k] for k in MARKS if k in invoke_bytes},
        cairn_growth=round(growth(h["cairn_bytes"]), 3), langgraph_growth=round(growth(h["lg_bytes"]), 3),
        cairn_linear=linear,
    )


if __name__ == "__main__":
    sys.exit(main())
