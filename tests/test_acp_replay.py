"""Issue 40 (SPEC rev 4): after `session/load`, every turn is replayed as it happened.

A real ACP client (acp_helpers.py) drives a real `cairn acp` child over pipes and records every `session/update` sent
live: a turn whose file changes (a new file, an overwrite, two edits of one file) were approved, a turn the user
cancelled while its command ran, and a turn whose agent was SIGKILLed while its command ran. A fresh `cairn acp` then
loads the session, and the replay is compared with what was sent live, field by field: each tool call's card (title,
kind, status, content — diffs included —, locations, rawInput, rawOutput, `_meta`), the text of each turn, and how
each turn ended (a cancel as a cancel, `recovered` only for what crash repair closed).
"""

from __future__ import annotations

import hashlib
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_helpers import RecordingClient, agent_stderr, connect, content_text, prompt, rig_fixture, script_env, wait_for
from cairn.app.acp.updates import CANCELLED_HERE, STOPPED_HERE, LiveView, replay
from cairn.persistence.events import (
    AssistantMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from cairn.persistence.repair import repair_interrupted_turn

pytestmark = pytest.mark.anyio
rig = pytest.fixture(rig_fixture, name="rig")

CARD_FIELDS = ("title", "kind", "status", "content", "locations", "raw_input", "raw_output", "field_meta")
NOTES, CODE = "old notes\n", "x = 1\ny = 2\n"
CANCELLED_COMMAND = "echo $$ > cancel.pid; printf go > cancel.marker; sleep 60"
KILLED_COMMAND = "echo $$ > kill.pid; printf go > kill.marker; sleep 60"

RESPONSES = [
    # turn 1: three file changes, then a second edit of the same file in the next step
    {"text": "Writing.", "tool_calls": [
        {"name": "write_file", "arguments": {"path": "new.txt", "content": "fresh\n"}},
        {"name": "write_file", "arguments": {"path": "notes.txt", "content": "new notes\n"}},
        {"name": "edit_file", "arguments": {"path": "code.py", "old": "y = 2", "new": "y = 3"}},
    ]},
    {"tool_calls": [{"name": "edit_file", "arguments": {"path": "code.py", "old": "x = 1", "new": "x = 10"}}]},
    {"text": "Done."},
    # turn 2: cancelled while its command runs
    {"text": "Running.", "tool_calls": [{"name": "run_command", "arguments": {"command": CANCELLED_COMMAND}}]},
    # turn 3: the agent is SIGKILLed while its command runs
    {"text": "Again.", "tool_calls": [{"name": "run_command", "arguments": {"command": KILLED_COMMAND}}]},
]


def dumped(update: Any) -> dict[str, Any]:
    return update.model_dump(mode="json", by_alias=False, exclude_unset=False)


def live_cards(updates: list[Any]) -> dict[str, dict[str, Any]]:
    """Each tool call as a client holds it after the live updates: the `tool_call`, then every `tool_call_update`'s
    fields laid over it (ACP: an update replaces the fields it carries)."""
    cards: dict[str, dict[str, Any]] = {}
    for u in updates:
        if u.session_update == "tool_call":
            cards[u.tool_call_id] = dumped(u)
        elif u.session_update == "tool_call_update":
            cards[u.tool_call_id].update({k: v for k, v in dumped(u).items() if v is not None})
    return cards


def turns(updates: list[Any]) -> list[list[Any]]:
    """The replayed updates of each turn (a turn starts with its prompt; live, the client sent it)."""
    out: list[list[Any]] = []
    for u in updates:
        if u.session_update == "user_message_chunk":
            out.append([])
        out[-1].append(u)
    return out


def cairn_meta(update: Any) -> dict[str, Any]:
    return (update.field_meta or {}).get("cairn", {})


def texts(updates: list[Any]) -> str:
    """The agent's own words in a turn (not Cairn's markers of how it ended), joined."""
    return "".join(u.content.text for u in updates
                   if u.session_update == "agent_message_chunk" and "turn_end" not in cairn_meta(u))


def markers(updates: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(u.content.text, cairn_meta(u)) for u in updates
            if u.session_update == "agent_message_chunk" and "turn_end" in cairn_meta(u)]


def diff_of(card: dict[str, Any]) -> tuple[str, str | None, str] | None:
    found = [c for c in card["content"] or [] if c["type"] == "diff"]
    return (found[0]["path"], found[0]["old_text"], found[0]["new_text"]) if found else None


async def test_load_replays_file_changes_a_cancel_and_a_crash_exactly_as_they_were_sent_live(rig):
    (rig.ws / "notes.txt").write_text(NOTES)
    (rig.ws / "code.py").write_text(CODE)
    rig.process_groups += [rig.ws / "cancel.pid", rig.ws / "kill.pid"]  # a `sleep` a SIGKILL left: killed at teardown
    live = RecordingClient(choices=["allow_once"] * 6)
    answers: dict[int, Any] = {}
    async with connect(rig, live, script_env(rig, RESPONSES)) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        answers[1] = await prompt(agent.conn, sid, "change the files")
        ends = [len(live.updates)]  # where each turn's live updates end

        async def run(turn: int, text: str) -> None:
            with suppress(Exception):  # turn 3: the agent dies under the request
                answers[turn] = await prompt(agent.conn, sid, text)

        async with anyio.create_task_group() as tg:  # turn 2: cancelled while its command runs
            tg.start_soon(run, 2, "run it")
            await wait_for(lambda: (rig.ws / "cancel.marker").exists(), "the command of turn 2", rig)
            await agent.conn.cancel(session_id=sid)
        ends.append(len(live.updates))
        async with anyio.create_task_group() as tg:  # turn 3: SIGKILL while its command runs
            tg.start_soon(run, 3, "run it again")
            await wait_for(lambda: (rig.ws / "kill.marker").exists() and any(
                u.session_update == "tool_call_update" and u.status == "in_progress" and u.tool_call_id == "call_3_1_1"
                for u in live.updates), "the command of turn 3", rig)
            agent.process.kill()
            with anyio.fail_after(20):
                await agent.process.wait()
            tg.cancel_scope.cancel()
    assert answers[1].stop_reason == "end_turn" and answers[2].stop_reason == "cancelled" and 3 not in answers
    assert (rig.ws / "code.py").read_text() == "x = 10\ny = 3\n"

    loader = RecordingClient()
    async with connect(rig, loader, script_env(rig, [])) as fresh:
        await fresh.conn.load_session(cwd=str(rig.ws), session_id=sid)
        replayed = list(loader.updates)
    assert "Traceback" not in agent_stderr(rig)

    sent = [live.updates[:ends[0]], live.updates[ends[0]:ends[1]], live.updates[ends[1]:]]
    again = turns(replayed)
    assert len(sent) == len(again) == 3
    for turn in range(3):
        assert texts(again[turn]) == texts(sent[turn]), turn + 1

    # every finished call: the same card as the client held live, field by field
    held = live_cards(live.updates)
    cards = {u.tool_call_id: dumped(u) for u in replayed if u.session_update == "tool_call"}
    assert list(cards) == list(held) == ["call_1_1_1", "call_1_1_2", "call_1_1_3", "call_1_2_1", "call_2_1_1",
                                         "call_3_1_1"]
    for call_id in list(held)[:-1]:
        for name in CARD_FIELDS:
            assert cards[call_id][name] == held[call_id][name], (call_id, name)

    # the diffs are the whole files before and after each change, as the operator approved them
    ws = str(rig.ws.resolve())
    assert [diff_of(cards[c]) for c in list(cards)[:4]] == [
        (f"{ws}/new.txt", None, "fresh\n"),
        (f"{ws}/notes.txt", NOTES, "new notes\n"),
        (f"{ws}/code.py", CODE, "x = 1\ny = 3\n"),
        (f"{ws}/code.py", "x = 1\ny = 3\n", "x = 10\ny = 3\n"),
    ]

    # turn 2 was cancelled: said as a cancel, with the stop reason the live prompt got; nothing in it is "recovered"
    cancelled = cards["call_2_1_1"]
    assert cancelled["status"] == "failed" and cancelled["field_meta"]["cairn"]["status"] == "OUTCOME_UNKNOWN"
    assert cancelled["field_meta"]["cairn"]["recovered"] is False
    assert "Cancelled while `run_command` was running" in cancelled["raw_output"]["text"]
    assert markers(again[1]) == [(CANCELLED_HERE, {"turn_end": "cancelled", "stop_reason": answers[2].stop_reason})]
    assert not any(STOPPED_HERE in u.content.text for u in again[1] if u.session_update == "agent_message_chunk")

    # turn 3 was killed: repair closed it, and only there does the replay say so and mark the call recovered
    killed, announced = cards["call_3_1_1"], held["call_3_1_1"]
    for name in ("title", "kind", "locations", "raw_input"):
        assert killed[name] == announced[name], name
    assert announced["status"] == "in_progress"  # the last the client heard live
    assert killed["status"] == "failed" and killed["field_meta"]["cairn"]["recovered"] is True
    assert killed["raw_output"]["status"] == "OUTCOME_UNKNOWN"
    assert markers(again[2]) == [(f"{STOPPED_HERE}; recovered calls below.",
                                  {"turn_end": "interrupted", "recovered": True})]
    # and turn 1 ended as it did live: no marker at all
    assert markers(again[0]) == []
    assert all(card["field_meta"]["cairn"]["recovered"] is False for card in list(cards.values())[:5])


# --------------------------------------------------------------------------------------------- pure parts, no process


def numbered(events: list[Any]) -> list[Any]:
    for seq, e in enumerate(events):
        e.seq, e.time = seq, 1
    return events


def test_recovered_is_only_what_repair_wrote_not_an_outcome_unknown_the_loop_wrote_before_the_crash():
    """An MCP call past its time limit is OUTCOME_UNKNOWN live; when the agent then dies, repair closes the turn after
    it. The replay marks only repair's own result as recovered, and says "Cairn stopped here" before that one."""
    timed_out = ("TOOL_OUTCOME_UNKNOWN: the MCP server `tix` did not answer this call to `tix__deploy` within 5 s, so "
                 "it may or may not have taken effect.")
    events = numbered([
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="go"),
        AssistantMessage(turn=1, step=1, text="", interrupted=False, tool_calls=[
            ToolCallRequest("c1", "tix__deploy", {}), ToolCallRequest("c2", "run_command", {"command": "ls"})]),
        ToolCall(turn=1, step=1, call_id="c1", name="tix__deploy", arguments={}, safety="side_effecting",
                 parent_call_id=None),
        ToolResult(turn=1, step=1, call_id="c1", is_error=True, content=timed_out, error_code="TOOL_OUTCOME_UNKNOWN",
                   source_seq=4),
    ])
    events += repair_interrupted_turn(events)
    updates = replay(events, Path("/ws"))
    messages = [u.content.text for u in updates if u.session_update == "agent_message_chunk"]
    cards = {u.tool_call_id: u for u in updates if u.session_update == "tool_call"}
    assert messages == [f"{STOPPED_HERE}; recovered calls below."]
    assert [u.tool_call_id for u in updates if u.session_update == "tool_call"] == ["c1", "c2"]
    assert updates.index(cards["c1"]) < updates.index(next(u for u in updates if u.session_update ==
                                                           "agent_message_chunk"))
    assert cairn_meta(cards["c1"])["recovered"] is False and cairn_meta(cards["c2"])["recovered"] is True
    assert cairn_meta(cards["c2"])["status"] == "NOT_STARTED"


def test_live_results_are_never_recovered_even_an_outcome_unknown_cut_short_by_a_cancel():
    view = LiveView(Path("/ws"))
    view.updates(AssistantMessage(turn=1, step=1, text="", interrupted=False,
                                  tool_calls=[ToolCallRequest("c1", "run_command", {"command": "sleep 9"})]))
    (done,) = view.updates(ToolResult(turn=1, step=1, call_id="c1", is_error=True, error_code="TOOL_OUTCOME_UNKNOWN",
                                      content="Cancelled while `run_command` was running: …", source_seq=None))
    assert cairn_meta(done) == {"status": "OUTCOME_UNKNOWN", "error_code": "TOOL_OUTCOME_UNKNOWN",
                                "safety": "side_effecting", "recovered": False}


def test_a_write_whose_before_image_is_gone_says_so_instead_of_showing_a_new_file():
    """A write over an existing file whose before-image Cairn did not keep (too large, a secret): `oldText` null would
    say "a new file", which is false; the call says that its earlier content is not known."""
    content = "replaced\n"
    events = numbered([
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="write"),
        AssistantMessage(turn=1, step=1, text="", interrupted=False, tool_calls=[
            ToolCallRequest("c1", "write_file", {"path": "big.txt", "content": content})]),
        ToolCall(turn=1, step=1, call_id="c1", name="write_file", arguments={"path": "big.txt", "content": content},
                 safety="idempotent", parent_call_id=None, before_sha256="0" * 64,
                 after_sha256=hashlib.sha256(content.encode()).hexdigest()),
        ToolResult(turn=1, step=1, call_id="c1", is_error=False, content="wrote 9 bytes to big.txt", error_code=None,
                   source_seq=4),
        StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="completed", error=None),
    ])
    (card,) = [u for u in replay(events, Path("/ws"), before_image=lambda sha: None) if u.session_update == "tool_call"]
    assert [c.type for c in card.content] == ["content", "content"]
    assert "Cairn did not keep big.txt as it was before this call" in content_text(card)
