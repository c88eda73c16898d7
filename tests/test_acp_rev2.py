"""`cairn acp` rev 2: reasoning as `agent_thought_chunk` (live and on `session/load`), token usage on the prompt's
response, `max_tokens` as the stop reason of an answer cut at the output limit, and lone surrogates never reaching the
wire. A real ACP client drives a real `cairn acp` child over real pipes (acp_helpers.py); the model is the `script`
provider.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acp_helpers import RecordingClient, connect, content_text, prompt, rig_fixture, script_env, summary
from cairn.app.acp.updates import LiveView, replay, wire
from cairn.persistence.events import (
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    StepEnd,
    StepStart,
    ToolCallRequest,
    ToolResult,
    TurnStart,
    UserMessage,
)

pytestmark = pytest.mark.anyio
rig = pytest.fixture(rig_fixture, name="rig")





TWO_STEPS = [
    {"reasoning": "I should list the files first.", "text": "Looking.",
     "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
     "usage": {"input_tokens": 1000, "output_tokens": 30, "reasoning_tokens": 12}},
    {"reasoning": "One file: report it.", "text": "There is one file.",
     "usage": {"input_tokens": 1100, "output_tokens": 8, "cached_tokens": 900}},
]


async def test_reasoning_streams_as_thought_chunks_before_each_answer_and_usage_comes_with_the_response(rig):
    (rig.ws / "a.txt").write_text("a\n")
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, TWO_STEPS)) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "what is here?")
    assert response.stop_reason == "end_turn"
    assert [summary(u)[:2] for u in client.updates] == [
        ("agent_thought_chunk", "I should list the files first."),
        ("agent_message_chunk", "Looking."),
        ("tool_call", "call_1_1_1"),
        ("tool_call_update", "call_1_1_1"),
        ("tool_call_update", "call_1_1_1"),
        ("agent_thought_chunk", "One file: report it."),
        ("agent_message_chunk", "There is one file."),
    ]
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (2100, 38, 2138)
    assert (usage.thought_tokens, usage.cached_read_tokens) == (12, 900)


async def test_a_turn_without_reported_usage_answers_without_usage(rig):
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [{"text": "plain"}])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "hi")
    assert response.stop_reason == "end_turn" and response.usage is None
    assert [u.session_update for u in client.updates] == ["agent_message_chunk"]  # no thought chunk from nothing


async def test_session_load_replays_each_steps_reasoning_as_a_thought_before_its_text(rig):
    (rig.ws / "a.txt").write_text("a\n")
    async with connect(rig, RecordingClient(), script_env(rig, TWO_STEPS)) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        await prompt(agent.conn, sid, "what is here?")

    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [])) as agent:
        await agent.conn.load_session(cwd=str(rig.ws), session_id=sid)
        replayed = list(client.updates)
    assert [summary(u) for u in replayed] == [
        ("user_message_chunk", "what is here?"),
        ("agent_thought_chunk", "I should list the files first."),
        ("agent_message_chunk", "Looking."),
        ("tool_call", "call_1_1_1", "completed"),
        ("agent_thought_chunk", "One file: report it."),
        ("agent_message_chunk", "There is one file."),
    ]


async def test_an_answer_cut_at_the_output_limit_stops_with_max_tokens_and_its_calls_fail_truncated(rig):
    client = RecordingClient()
    cut = [{"text": "Writing", "finish_reason": "length",
            "tool_calls": [{"name": "write_file", "arguments": {"path": "x.txt", "content": "cut"}}]}]
    async with connect(rig, client, script_env(rig, cut)) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "write x")
    assert response.stop_reason == "max_tokens"
    calls = [u for u in client.updates if u.session_update.startswith("tool_call")]
    assert [summary(u) for u in calls] == [("tool_call", "call_1_1_1", "pending"),
                                           ("tool_call_update", "call_1_1_1", "failed")]
    assert content_text(calls[-1]).startswith("TRUNCATED")
    assert client.permission_requests == []  # a cut call is never offered for approval
    assert not (rig.ws / "x.txt").exists()


async def test_a_prompt_with_a_lone_surrogate_runs_and_loads_back_with_a_replacement_character(rig):
    async with connect(rig, RecordingClient(), script_env(rig, [{"text": "ok"}])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "bad \ud800 byte")
    assert response.stop_reason == "end_turn"

    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [])) as agent:
        await agent.conn.load_session(cwd=str(rig.ws), session_id=sid)
        replayed = list(client.updates)
    assert summary(replayed[0]) == ("user_message_chunk", "bad \ufffd byte")


def test_updates_carry_no_lone_surrogate_whatever_the_events_hold():
    """Strict JSON parsers (serde_json in Zed) refuse a `\\ud800` escape: every text that goes out is cleaned, even
    from events written before rev 2 cleaned them at append."""
    bad = "x\udcff"
    call = ToolCallRequest(call_id="c1", name="read_file", arguments={"path": bad, "nested": [bad]})
    events = [
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text=bad),
        ReasoningChunk(turn=1, step=1, delta=bad), AssistantChunk(turn=1, step=1, delta=bad),
        AssistantMessage(turn=1, step=1, text=bad, tool_calls=[call], interrupted=False, reasoning=bad),
        ToolResult(turn=1, step=1, call_id="c1", is_error=False, content=bad, error_code=None, source_seq=None),
        StepEnd(turn=1, step=1),
    ]
    view = LiveView(Path("/ws"))
    updates = replay(events, Path("/ws")) + [u for e in events for u in view.updates(e)]
    assert {u.session_update for u in updates} >= {"agent_thought_chunk", "agent_message_chunk", "tool_call"}
    for update in updates:
        wire_text = json.dumps(update.model_dump(mode="json", by_alias=True), ensure_ascii=False)
        wire_text.encode("utf-8")  # would raise on a lone surrogate
        assert "\ufffd" in wire_text or update.session_update == "tool_call_update"
    assert wire({"a": [bad, 1, None]}) == {"a": ["x\ufffd", 1, None]}
