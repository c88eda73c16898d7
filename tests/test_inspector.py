"""The session inspector (`cairn inspect`, `i` on the sessions and resume screens): the pure model (marks, repair, filters,
search, jumps), the screen driven by Pilot, following a session a real `cairn run` is writing, and snapshots of a
crashed-and-repaired session. Snapshot tests are plain `def` (snap_compare runs its own loop)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from crash_harness import CAIRN, Rig
from tui_helpers import CREATED, completed_turn, crashed_turn, make_world, wait_for, wait_sync, write_log

from cairn.app.inspect.follow import JsonlTail, SqliteTail, open_tail
from cairn.app.inspect.model import FilterError, InspectorModel, format_delta, parse_filter
from cairn.app.screens.inspector import EventTable, InspectorApp, InspectorScreen
from cairn.persistence.events import (
    AssistantMessage,
    ContextEnvironment,
    ContextInstructions,
    InstructionFile,
    OperatorCommand,
    OperatorResult,
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
    event_type,
)
from cairn.persistence.store import SessionStore

pytestmark = pytest.mark.anyio


def two_tool_turn() -> list:
    """SPEC §2's example turn: step 1 calls two tools, step 2 answers."""
    a, b = ToolCallRequest("a", "read_file", {"path": "x"}), ToolCallRequest("b", "list_dir", {"path": "."})
    call = lambda r: ToolCall(turn=1, step=1, call_id=r.call_id, name=r.name, arguments=r.arguments,  # noqa: E731
                              safety="read_only", parent_call_id=None)
    result = lambda r, s: ToolResult(turn=1, step=1, call_id=r.call_id, is_error=False, content="ok",  # noqa: E731
                                     error_code=None, source_seq=s)
    header = lambda step: RequestHeader(turn=1, step=step, provider="script", model="m", params={},  # noqa: E731
                                        tools=[], message_count=2)
    return [
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="go"), header(1),
        AssistantMessage(turn=1, step=1, text="", tool_calls=[a, b], interrupted=False),
        call(a), result(a, 5), call(b), result(b, 7), StepEnd(turn=1, step=1),
        StepStart(turn=1, step=2), header(2),
        AssistantMessage(turn=1, step=2, text="done", tool_calls=[], interrupted=False),
        StepEnd(turn=1, step=2), TurnEnd(turn=1, reason="completed", error=None),
    ]


def crashed_world(tmp_path, session_id="crashed"):
    """Turn 1 completed; turn 2 cut by a crash while run_command ran (OUTCOME_UNKNOWN) before edit_file began."""
    world = make_world(tmp_path, [])
    second = crashed_turn()
    for e in second:
        if hasattr(e, "turn"):
            e.turn = 2
    write_log(world.store, session_id, completed_turn(1, "list the files", "Here they are.") + second)
    return world


def model_of(store: SessionStore, session_id: str) -> InspectorModel:
    return InspectorModel.from_inspection(session_id, store.inspect(session_id), "jsonl")


# -- the model ----------------------------------------------------------------------------------------------------------


def test_barrier_marks_fall_where_spec_section_2_places_them():
    events = two_tool_turn()
    for seq, e in enumerate(events):
        e.seq, e.time = seq, CREATED + seq
    model = InspectorModel("s", events)
    marks = [(event_type(e), model.barrier(i)) for i, e in enumerate(events) if model.barrier(i)]
    assert marks == [
        ("user/message", "pre-step"), ("request/header", "pre-request"), ("tool/call", "pre-tool"),
        ("tool/call", "pre-tool"), ("step/start", "pre-step"), ("request/header", "pre-request"),
        ("turn/end", "turn-end"),
    ]


def test_an_operator_command_turn_has_its_barrier_kinds_and_summaries():
    """A `!command` turn (issue 42): the command is durable before it starts, so its mark is the pre-tool barrier; the
    context events a turn may start with are summarised, not shown as bare "other" rows."""
    events = [
        TurnStart(turn=1),
        ContextEnvironment(turn=1, text="- Date: 2026-12-05\n- OS: Linux 6.1"),
        ContextInstructions(turn=1, files=[InstructionFile(path="AGENTS.md", scope="project", sha256="ab", size=3)],
                            text="## AGENTS.md\nhi"),
        OperatorCommand(turn=1, command="make test"),
        OperatorResult(turn=1, exit_code=2, output="boom\nmore"),
        TurnEnd(turn=1, reason="completed", error=None),
    ]
    for seq, e in enumerate(events):
        e.seq, e.time = seq, CREATED + seq
    model = InspectorModel("s", events)
    assert [model.barrier(i) for i in range(len(events))] == [None, None, None, "pre-tool", None, "turn-end"]
    assert [model.kind(i) for i in range(len(events))] == ["boundary", "other", "other", "tool", "result", "boundary"]
    assert model.summary(3) == "! make test"
    assert model.summary(4) == "exit 2 — boom"
    assert model.summary(2) == "instructions: AGENTS.md"
    assert model.summary(1) == "environment: Date: 2026-12-05 · OS: Linux 6.1"

def test_a_crashed_session_marks_where_the_log_ended_and_what_repair_would_append(tmp_path):
    world = crashed_world(tmp_path)
    model = model_of(world.store, "crashed")
    stored = len(world.log("crashed"))
    assert len(model.stored) == stored and [e.seq for e in model.pending] == list(range(stored, stored + 4))
    assert model.crash_ends() == [stored - 1]
    assert [model.is_repair(i) for i in range(len(model))] == [False] * stored + [True] * 4
    assert all(model.is_pending(i) for i in range(stored, len(model)))
    assert [model.barrier(i) for i in range(stored, len(model))] == [None] * 4  # repair's events take no barrier
    assert [model.kind(i) for i in range(stored, len(model))] == ["recovery"] * 4
    assert model.state() == "ended"
    view = model.view()
    crash_line = next(p for p, line in enumerate(view.lines) if line < 0 and view.separators[-line - 1][0] == "crash")
    assert view.lines[crash_line - 1] == stored - 1 and view.lines[crash_line + 1] == stored
    assert "repair would append" in view.separators[-view.lines[crash_line] - 1][1]


def test_repair_already_written_at_resume_is_recognised_byte_for_byte(tmp_path):
    world = crashed_world(tmp_path)
    opened = world.store.open_for_resume("crashed")
    opened.writer.close()
    opened.lock.release()
    model = model_of(world.store, "crashed")
    first = opened.repaired[0].seq
    assert model.pending == [] and model.repair_blocks == [(first, first + len(opened.repaired))]
    assert model.crash_ends() == [first - 1]
    assert "repair appended" in model.view().separators[-1][1]


def test_results_that_look_like_repair_but_are_not_its_output_are_not_marked(tmp_path):
    """Only a tail that repair reproduces byte for byte is marked: repair reuses the last event's time."""
    events = completed_turn(1, "p", "a")[:-2] + [StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="interrupted", error=None)]
    for seq, e in enumerate(events):
        e.seq, e.time = seq, CREATED + seq * 10
    assert InspectorModel("s", events).repair_blocks == []  # its own time: written by something else
    events[-1].time = events[-2].time
    model = InspectorModel("s", events)
    assert model.repair_blocks == [(6, 7)]  # the step/end before it has another time than repair would give it
    assert model.crash_ends() == [5]


def test_filters_by_type_prefix_turn_call_id_and_kind(tmp_path):
    model = model_of(crashed_world(tmp_path).store, "crashed")
    types = lambda text: {model.type_of(i) for i in model.view(parse_filter(text)).indices}  # noqa: E731
    assert types("type:tool") == {"tool/call", "tool/result"}
    assert types("type:tool/result turn:2") == {"tool/result"}
    assert types("turn:1") == {"turn/start", "step/start", "user/message", "request/header", "assistant/message",
                               "step/end", "turn/end"}
    calls = model.view(parse_filter("call:call_1_1_1")).indices
    assert {model.call_id(i) for i in calls} == {"call_1_1_1"} and len(calls) == 4  # asked, decided, call, result
    assert types("kind:recovery") == {"tool/result", "step/end", "turn/end"}
    view = model.view(parse_filter("kind:recovery"))
    assert [s[1] for s in view.separators] == [
        "turn 2", view.separators[1][1]]  # turn 1 shows no event: no rule for it
    assert view.separators[1][0] == "crash"
    assert model.view(parse_filter("")).indices == list(range(len(model)))
    for bad, said in (("turn:x", "number"), ("colour:red", "unknown filter"), ("kind:purple", "kind is one of")):
        with pytest.raises(FilterError, match=said):
            parse_filter(bad)


def test_search_and_jumps_wrap_around_in_the_view(tmp_path):
    model = model_of(crashed_world(tmp_path).store, "crashed")
    indices = model.view().indices
    deploy = model.next_where(indices, -1, model.search_predicate("MAKE DEPLOY"))
    assert model.type_of(indices[deploy]) == "assistant/message"  # the first event holding it, case-insensitive
    recovered = model.next_where(indices, 0, model.is_recovered_call)
    again = model.next_where(indices, recovered, model.is_recovered_call)
    wrapped = model.next_where(indices, again, model.is_recovered_call)
    assert [model.summary(indices[p]).split(" ")[0] for p in (recovered, again)] == ["OUTCOME_UNKNOWN", "NOT_STARTED"]
    assert wrapped == recovered
    assert model.next_where(indices, 0, model.is_error) is None
    assert model.next_where(indices, -1, model.search_predicate("no such text anywhere")) is None


def test_time_gaps_fit_six_cells():
    gaps = (None, 0, 850, 1234, 42_000, 184_000, 2_520_000, 7_500_000, 400_000_000)
    assert [format_delta(ms) for ms in gaps] == [
        "", "+0ms", "+850ms", "+1.2s", "+42s", "+3m04s", "+42m", "+2h05m", "+4d"]
    assert all(len(format_delta(ms)) <= 6 for ms in range(0, 10**9, 9_973))


# -- the screen ---------------------------------------------------------------------------------------------------------


def table_text(app) -> str:
    table = app.screen.query_one(EventTable)
    return "\n".join(table.render_line(y).text for y in range(table.size.height))


async def test_opening_shows_the_crash_and_the_detail_of_the_last_event_written(tmp_path):
    world = crashed_world(tmp_path)
    before = (world.store.home / "sessions" / "crashed.jsonl").read_bytes()
    app = InspectorApp(InspectorScreen.load(world.store, "crashed"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        text = table_text(app)
        assert "the log ended here (crash or kill)" in text and "✚ repair" in text and "◆ tool" in text
        detail = app.screen.detail_text
        assert "tool/call" in detail and "make deploy" in detail and "the log ended here" in detail
        head = app.screen._headline().plain
        assert "ended — interrupted, not resumed yet" in head and "read-only" in head
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, "the app to end")
    assert (world.store.home / "sessions" / "crashed.jsonl").read_bytes() == before  # nothing written
    assert world.store.inspect("crashed").repair  # the repair is still only computed


async def test_filter_key_narrows_the_table_and_a_bad_filter_is_one_notice(tmp_path):
    world = crashed_world(tmp_path)
    app = InspectorApp(InspectorScreen.load(world.store, "crashed"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("f", *"type:tool/result", "enter")
        await pilot.pause()
        table = app.screen.query_one(EventTable)
        assert {table.model.type_of(i) for i in table.view.indices} == {"tool/result"}
        assert "filter: type:tool/result" in app.screen._headline().plain
        assert "tool/call" not in table_text(app)
        await pilot.press("f", "ctrl+u", *"turn:two", "enter")
        await pilot.pause()
        assert any("turn must be a number" in n.message for n in app._notifications)
        assert {table.model.type_of(i) for i in table.view.indices} == {"tool/result"}  # unchanged
        await pilot.press("escape", "f", "ctrl+u", "enter")  # empty: everything again
        await pilot.pause()
        assert len(table.view.indices) == len(table.model)


async def test_jump_keys_go_to_the_next_recovered_call_and_error_and_search_finds_text(tmp_path):
    world = crashed_world(tmp_path)
    app = InspectorApp(InspectorScreen.load(world.store, "crashed"))
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.screen.query_one(EventTable)
        await pilot.press("home", "r")
        await pilot.pause()
        assert table.model.summary(table.index).startswith("OUTCOME_UNKNOWN")
        assert "appended" not in app.screen.detail_text
        assert "repair would append this (not written)" in app.screen.detail_text
        await pilot.press("r")
        assert table.model.summary(table.index).startswith("NOT_STARTED")
        await pilot.press("e")
        await pilot.pause()
        assert any("no errors here" in n.message for n in app._notifications)
        await pilot.press("slash", *"changelog", "enter")
        await pilot.pause()
        assert "changelog" in table.model.detail(table.index).lower()
        first = table.index
        await pilot.press("n")
        assert table.index != first and "changelog" in table.model.detail(table.index).lower()


async def test_detail_pane_makes_control_characters_visible(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "esc", completed_turn(1, "paint \x1b[2J the screen", "ok"))
    app = InspectorApp(InspectorScreen.load(world.store, "esc"))
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.screen.query_one(EventTable)
        table.go_to_event(2)  # user/message
        await pilot.pause()
        detail = app.screen.detail_text
        assert "\x1b" not in detail and "\x1b" not in table_text(app)
        assert "paint" in detail


async def test_sessions_screen_i_key_opens_the_inspector(tmp_path):
    from cairn.app.screens.sessions import SessionsScreen

    world = crashed_world(tmp_path)
    app = world.sessions_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        await pilot.press("i")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen, "inspector")
        assert screen.model.session_id == "crashed" and not screen.follow
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen again")


def test_cli_inspect_of_an_unknown_session_is_one_line_and_exit_2(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home")}
    proc = subprocess.run([CAIRN, "inspect", "nope"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope" in proc.stderr


# -- following ----------------------------------------------------------------------------------------------------------


def test_jsonl_tail_waits_for_a_torn_last_line_instead_of_reporting_it(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "t", completed_turn(1, "p", "a")[:3])
    path = world.store.home / "sessions" / "t.jsonl"
    tail = open_tail(world.store, "t", 3)
    assert isinstance(tail, JsonlTail)
    try:
        assert tail.poll() == ([], None)
        header = RequestHeader(turn=1, step=1, provider="script", model="m", params={}, tools=[], message_count=2)
        header.seq, header.time = 3, CREATED + 4000
        line = encode_event(header) + b"\n"
        with open(path, "ab") as f:
            f.write(line[:20])
        assert tail.poll()[0] == []  # half a line: waited for, not an error
        with open(path, "ab") as f:
            f.write(line[20:])
        new, holder = tail.poll()
        assert [event_type(e) for e in new] == ["request/header"] and new[0].seq == 3 and holder is None
    finally:
        tail.close()


def test_sqlite_tail_polls_by_seq_while_another_writer_appends(tmp_path):
    store = SessionStore(tmp_path / "home", "sqlite")
    opened = store.create(cwd="/w", session_id="q", created=CREATED)
    try:
        events = completed_turn(1, "p", "a")
        batch = lambda es: [(e.seq, encode_event(e)) for e in es]  # noqa: E731
        for seq, e in enumerate(events):
            e.seq, e.time = seq, CREATED + seq
        opened.writer.append(batch(events[:2]), durable=True)
        tail = open_tail(store, "q", 2)
        assert isinstance(tail, SqliteTail)
        assert tail.poll() == ([], os.getpid())  # held by this process's writer
        opened.writer.append(batch(events[2:5]), durable=False)
        assert [e.seq for e in tail.poll()[0]] == [2, 3, 4]
        tail.close()
    finally:
        opened.writer.close()
        opened.lock.release()


async def test_follow_shows_each_event_a_headless_run_writes_and_then_that_it_ended(tmp_path):
    """A real `cairn run` with a slow tool and a slowly streamed answer writes while the inspector follows."""
    rig = Rig(tmp_path)
    script = rig.script([
        {"text": "Running it.", "tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 1"}}]},
        {"text": "All done, it slept.", "chunks": 4, "delay_ms": 250},
    ])
    child = rig.spawn("run", "--provider", "script", "--script", script, "--session-id", "live", "--yes", "go")
    try:
        store = rig.store()
        await asyncio.to_thread(lambda: wait_sync(lambda: len(rig.stored_types("live")) >= 3, "the first events", timeout=20))
        screen = InspectorScreen.load(store, "live", follow=True)
        app = InspectorApp(screen)
        sizes, states = [], set()
        async with app.run_test(size=(120, 36)) as pilot:
            model = screen.model

            def seen() -> bool:
                sizes.append(len(model.stored))
                states.add(model.state())
                return child.popen.poll() is not None and model.state() == "ended" and len(model.stored) == len(
                    rig.stored_types("live"))

            await wait_for(pilot, seen, "the run to end and every event to be shown", timeout=30)
            await pilot.pause()
            final = rig.stored_types("live")
            assert [event_type(e) for e in model.stored] == final and final[-1] == "turn/end"
            table = screen.query_one(EventTable)
            assert table.view.indices == list(range(len(final)))
            assert table.index == len(final) - 1  # the cursor followed the tail
            assert "turn 1 completed" in table_text(app), table_text(app)
            assert len(set(sizes)) >= 3, f"events arrived in several polls, not at once: {sorted(set(sizes))}"
            assert "live" in states and "ended" in states
            assert "ended" in screen._headline().plain
        assert child.finish() == 0
    finally:
        rig.cleanup()


# -- snapshots of a crashed-and-repaired session -------------------------------------------------------------------


def recovered_app(tmp_path) -> InspectorApp:
    """Crashed, then resumed (the repair written), with a verdict recorded and the next turn completed."""
    from cairn.persistence.events import RecoveryVerdict

    world = crashed_world(tmp_path, "recovered")
    opened = world.store.open_for_resume("recovered")
    try:
        last = opened.events[-1]
        verdict = RecoveryVerdict(call_id="call_1_1_1", verdict="happened", note="the site shows 1.4.0")
        more = [verdict] + completed_turn(3, "note 1.4.0 in the changelog", "Noted.")
        for k, e in enumerate(more, start=1):
            e.seq, e.time = last.seq + k, last.time + 60_000 + k * 700
        opened.writer.append([(e.seq, encode_event(e)) for e in more], durable=True)
    finally:
        opened.writer.close()
        opened.lock.release()
    return InspectorApp(InspectorScreen.load(world.store, "recovered"))


def test_snapshot_recovered_session_80x24(snap_compare, tmp_path):
    app = recovered_app(tmp_path)

    async def prepare(pilot):
        app.theme = "textual-dark"

    assert snap_compare(app, run_before=prepare, terminal_size=(80, 24))


def test_snapshot_recovered_session_160x45(snap_compare, tmp_path):
    app = recovered_app(tmp_path)

    async def prepare(pilot):
        app.theme = "textual-dark"

    assert snap_compare(app, run_before=prepare, terminal_size=(160, 45))


# -- recovery evidence (SPEC §9 rev 3) ---------------------------------------------------------------------------------


async def test_evidence_is_listed_readable_and_marked_on_the_recovered_call(tmp_path):
    """A real write SIGKILLed before its result: the evidence row is part of what repair appends (pending, then
    committed after the repaired turn's end), reads as a finding, and the recovered call's row and detail name it."""
    from crash_harness import Rig
    from test_show_evidence import CALL, EVIDENCE_DETAIL, SID, crash_after_a_write

    rig = Rig(tmp_path)
    try:
        crash_after_a_write(rig)
        store = rig.store()
        model = model_of(store, SID)
        ev = next(i for i, e in enumerate(model.events) if event_type(e) == "recovery/evidence")
        result = next(i for i, e in enumerate(model.events) if isinstance(e, ToolResult) and e.call_id == CALL)
        assert ev == len(model) - 1 and event_type(model.events[ev - 1]) == "turn/end"
        assert model.is_pending(ev) and model.is_repair(ev) and model.kind(ev) == "recovery"
        assert model.summary(ev).startswith(f"evidence on {CALL}: happened — {EVIDENCE_DETAIL}")
        assert model.call_id(ev) == CALL and model.matches(ev, parse_filter(f"call:{CALL}"))
        assert model.is_recovered_call(result) and model.summary(result).startswith("OUTCOME_UNKNOWN")
        assert model.summary(result).endswith(" · evidence: happened")

        app = InspectorApp(InspectorScreen.load(store, SID))
        async with app.run_test(size=(120, 36)) as pilot:
            table = app.screen.query_one(EventTable)
            await pilot.press("home", "r")
            await pilot.pause()
            assert table.index == result
            assert f"evidence: happened — {EVIDENCE_DETAIL}" in app.screen.detail_text
            table.go_to_event(ev)
            await pilot.pause()
            assert '"finding": "happened"' in app.screen.detail_text

        resumed = rig.run("run", "--resume", SID, "--provider", "script", "--script", rig.script([{"text": "ok"}]),
                          "go on")
        assert resumed.returncode == 0, resumed.stderr
        model = model_of(store, SID)  # written now: recognised as repair's, evidence included
        ev = next(i for i, e in enumerate(model.events) if event_type(e) == "recovery/evidence")
        assert model.pending == [] and model.is_repair(ev) and not model.is_pending(ev)
        assert any(start < ev + 1 == end for start, end in model.repair_blocks)
        assert model.summary(result).endswith(" · evidence: happened")
    finally:
        rig.cleanup()


def test_following_a_session_counts_evidence_that_arrives_after_its_repair_block(tmp_path):
    """`--follow` may read a resume's repair and its evidence in two polls: the block grows to include it."""
    from cairn.persistence.events import RecoveryEvidence
    from cairn.persistence.repair import repair_interrupted_turn

    events = crashed_turn()
    for seq, e in enumerate(events):
        e.seq, e.time = seq, CREATED + seq
    repaired = repair_interrupted_turn(events)
    model = InspectorModel("s", events + repaired)
    assert model.repair_blocks == [(len(events), len(events) + len(repaired))]
    evidence = RecoveryEvidence(call_id=repaired[0].call_id, finding="unknown", detail="pid 7 is no longer running")
    evidence.seq, evidence.time = repaired[-1].seq + 1, repaired[-1].time
    model.extend([evidence])
    assert model.repair_blocks == [(len(events), len(model))]
    assert model.summary(len(events)).endswith(" · evidence: unknown")
