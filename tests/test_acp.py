"""`cairn acp` end to end: a real ACP client (the package's client side) drives a real `cairn acp` child process.

Every test spawns the agent over real pipes with an explicit environment, then checks two things: what the client saw
(updates in order, stop reasons, permission requests, protocol errors) and what the session log on disk says.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest
from acp import RequestError, image_block, resource_link_block, text_block
from anyio.streams.buffered import BufferedByteReceiveStream

from acp_helpers import (
    RecordingClient,
    agent_stderr,
    connect,
    content_text,
    prompt,
    result_text,
    rig_fixture,
    script_env,
    summary,
    wait_for,
)
from cairn.app.acp.agent import prompt_text
from cairn.app.acp.updates import replay
from crash_harness import CAIRN, Rig, types, wait_until
from cairn.persistence.events import (AssistantChunk, AssistantMessage, RecoveryVerdict, StepEnd, StepStart,
                                ToolCallRequest, ToolResult, TurnEnd, TurnStart, UserMessage, event_type)
from cairn.persistence.repair import outcome_unknown_text

pytestmark = pytest.mark.anyio
rig = pytest.fixture(rig_fixture, name="rig")

SLOW_TEXT = {"text": "".join(f"word{i} " for i in range(60)), "chunks": 60, "delay_ms": 100}  # ~6 s if left alone




def kinds(updates) -> list[str]:
    """Update kinds, consecutive message chunks collapsed (how many chunks a text takes is the provider's business)."""
    out: list[str] = []
    for u in updates:
        kind = u.session_update
        if not (out and kind == out[-1] and kind.endswith("message_chunk")):
            out.append(kind)
    return out


def text_of(updates, kind: str = "agent_message_chunk") -> str:
    return "".join(u.content.text for u in updates if u.session_update == kind)



# --------------------------------------------------------------------------------------------------------- initialize


async def test_initialize_advertises_load_list_and_text_only_prompts(rig):
    async with connect(rig, RecordingClient()) as agent:
        caps = agent.init.agent_capabilities
        assert agent.init.protocol_version == 1
        assert caps.load_session is True
        assert caps.session_capabilities.list is not None
        prompts = caps.prompt_capabilities
        assert (prompts.image, prompts.audio, prompts.embedded_context) == (False, False, False)
        assert agent.init.agent_info.name == "cairn"
    assert agent.process.returncode == 0


# ------------------------------------------------------------------------------------------------------------- prompt


async def test_demo_prompt_streams_text_then_the_tool_call_then_the_report(rig):
    (rig.ws / "hello.txt").write_text("hi\n")
    client = RecordingClient()
    async with connect(rig, client) as agent:
        session = await agent.conn.new_session(cwd=str(rig.ws))
        response = await prompt(agent.conn, session.session_id, "list files")
    assert response.stop_reason == "end_turn"
    updates = client.updates
    assert kinds(updates) == ["agent_message_chunk", "tool_call", "tool_call_update", "tool_call_update",
                              "agent_message_chunk"]
    start, running, done = [u for u in updates if u.session_update.startswith("tool_call")]
    assert (start.tool_call_id, start.status, start.kind, start.raw_input) == ("call_1_1_1", "pending", "read",
                                                                                {"path": "."})
    assert summary(running) == ("tool_call_update", "call_1_1_1", "in_progress")
    assert summary(done) == ("tool_call_update", "call_1_1_1", "completed")
    assert "hello.txt" in content_text(done)
    assert text_of(updates).startswith("I'll use `list_dir` for that.")
    assert "hello.txt" in text_of(updates[4:])
    assert client.permission_requests == []  # read-only: nothing to approve


async def test_script_prompt_chunks_arrive_in_order_and_match_the_log(rig):
    responses = [{"text": "one two six ", "chunks": 3}, {"text": "second turn"}]
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, responses)) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        first = await prompt(agent.conn, sid, "hello")
        chunks_of_turn_1 = [summary(u) for u in client.updates]
        second = await prompt(agent.conn, sid, "again")
    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn")
    assert chunks_of_turn_1 == [("agent_message_chunk", "one "), ("agent_message_chunk", "two "),
                                ("agent_message_chunk", "six ")]
    events = rig.show(sid)
    assert types(events)[:10] == ["turn/start", "step/start", "user/message", "request/header", "assistant/chunk",
                                  "assistant/chunk", "assistant/chunk", "assistant/message", "step/end", "turn/end"]
    assert [e["delta"] for e in events if e["type"] == "assistant/chunk"][:3] == ["one ", "two ", "six "]
    assert [(e["turn"], e["reason"]) for e in events if e["type"] == "turn/end"] == [(1, "completed"), (2, "completed")]
    assert events[2]["text"] == "hello"


# -------------------------------------------------------------------------------------------------------- permissions


def two_commands(rig: Rig) -> list[dict]:
    calls = [
        {"call_id": "c1", "name": "run_command", "arguments": {"command": "printf one >> ran.txt"}},
        {"call_id": "c2", "name": "run_command", "arguments": {"command": "printf two >> ran.txt"}},
    ]
    return [{"text": "Running.", "tool_calls": calls}, {"text": "Done."}]


@pytest.mark.parametrize("choice, asked, decisions", [
    ("allow_once", ["c1", "c2"], ["allowed_once", "allowed_once"]),
    # the second call of the same tool is not asked about again, and the log names the grant that let it run
    ("allow_always", ["c1"], ["allowed_session", "granted"]),
])
async def test_permission_allowed_runs_the_calls_and_records_the_decisions(rig, choice, asked, decisions):
    client = RecordingClient([choice, choice])
    async with connect(rig, client, script_env(rig, two_commands(rig))) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "run both")
    assert response.stop_reason == "end_turn"
    assert (rig.ws / "ran.txt").read_text() == "onetwo"
    requests = client.permission_requests
    assert [tool_call.tool_call_id for tool_call, _ in requests] == asked
    assert requests[0][1] == ["allow_once", "allow_always", "reject_once"]
    assert requests[0][0].kind == "execute" and requests[0][0].raw_input == {"command": "printf one >> ran.txt"}
    # the client knew about the call before it was asked about it
    first_ask = next(i for i, (kind, _) in enumerate(client.timeline) if kind == "permission")
    announced = [summary(u) for kind, u in client.timeline[:first_ask] if kind == "update"]
    assert ("tool_call", "c1", "pending") in announced
    calls = [summary(u) for u in client.updates if u.session_update.startswith("tool_call")]
    assert calls == [("tool_call", "c1", "pending"), ("tool_call", "c2", "pending"),
                     ("tool_call_update", "c1", "in_progress"), ("tool_call_update", "c1", "completed"),
                     ("tool_call_update", "c2", "in_progress"), ("tool_call_update", "c2", "completed")]
    events = rig.show(sid)
    assert [e["decision"] for e in events if e["type"] == "approval/decided"] == decisions
    assert [e["call_id"] for e in events if e["type"] == "approval/asked"] == asked


@pytest.mark.parametrize("choice, decision, stop", [
    ("reject_once", "denied", "end_turn"),
    ("cancel", "cancelled", "cancelled"),  # the client dismissed the request: the turn is cancelled, as in the TUI
])
async def test_permission_rejected_or_dismissed_never_runs_the_call(rig, choice, decision, stop):
    calls = [{"call_id": "c1", "name": "run_command", "arguments": {"command": "printf ran > ran.txt"}}]
    client = RecordingClient([choice])
    async with connect(rig, client, script_env(rig, [{"tool_calls": calls}, {"text": "Not run."}])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        response = await prompt(agent.conn, sid, "run it")
    assert response.stop_reason == stop
    assert not (rig.ws / "ran.txt").exists()
    last = [u for u in client.updates if u.session_update.startswith("tool_call")][-1]
    assert summary(last) == ("tool_call_update", "c1", "failed")
    events = rig.show(sid)
    assert [e["decision"] for e in events if e["type"] == "approval/decided"] == [decision]
    result = next(e for e in events if e["type"] == "tool/result")
    assert result_text(last).startswith(result["error_code"].split("_")[0])  # DENIED… / ABORTED…
    assert last.field_meta["cairn"]["error_code"] == result["error_code"]
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == ["completed" if stop == "end_turn" else stop]
    assert "tool/call" not in types(events)


# ------------------------------------------------------------------------------------------------------------- cancel


async def test_cancel_mid_stream_ends_the_turn_cancelled(rig):
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [SLOW_TEXT])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        async with anyio.create_task_group() as tg:
            result = {}

            async def run() -> None:
                result["response"] = await prompt(agent.conn, sid, "talk slowly")

            tg.start_soon(run)
            await wait_for(lambda: client.updates, "the first chunk", rig)
            await agent.conn.cancel(session_id=sid)
        assert result["response"].stop_reason == "cancelled"
        stored = rig.inspect(sid)  # the agent still holds the session: read as it stands on disk
    assert stored.repair == []
    assert [event_type(e) for e in stored.events][-3:] == ["assistant/message", "step/end", "turn/end"]
    message, turn_end = stored.events[-3], stored.events[-1]
    assert message.interrupted and 0 < len(message.text) < len(SLOW_TEXT["text"])
    assert message.text == text_of(client.updates)  # the client saw exactly what was recorded
    assert turn_end.reason == "cancelled"


# --------------------------------------------------------------------------------------------------------------- list


async def test_list_shows_this_workspaces_sessions_with_their_first_prompt(rig):
    other = rig.root / "other"
    other.mkdir()
    async with connect(rig, RecordingClient(), script_env(rig, [{"text": "ok"}])) as agent:
        here = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        await prompt(agent.conn, here, "first prompt here\nsecond line")
        there = (await agent.conn.new_session(cwd=str(other))).session_id
        listed_here = (await agent.conn.list_sessions(cwd=str(rig.ws))).sessions
        listed_all = (await agent.conn.list_sessions()).sessions
    assert [(s.session_id, s.cwd, s.title) for s in listed_here] == [(here, str(rig.ws), "first prompt here")]
    assert {s.session_id for s in listed_all} == {here, there}
    assert listed_here[0].updated_at.endswith("Z")


# --------------------------------------------------------------------------------------------------------------- load


SIDE_EFFECT = "echo $$ > side.pid; printf done > side.marker; sleep 60"


def evidence_of(update) -> dict | None:
    return (update.field_meta or {}).get("cairn", {}).get("evidence")


def crash_during_side_effect(rig: Rig, sid: str) -> None:
    """A `cairn run --yes` child SIGKILLed while its first tool call's side effect is in progress."""
    calls = [
        {"call_id": "call_side", "name": "run_command", "arguments": {"command": SIDE_EFFECT}},
        {"call_id": "call_later", "name": "write_file", "arguments": {"path": "later.txt", "content": "later"}},
    ]
    script = rig.script([{"text": "Two things.", "tool_calls": calls}])
    child = rig.spawn("run", "--yes", "--provider", "script", "--script", script, "--session-id", sid, "do both")
    rig.process_groups.append(rig.ws / "side.pid")  # `sleep 60` outlives the SIGKILLed cairn: killed at teardown
    marker = rig.ws / "side.marker"
    wait_until(lambda: marker.exists() and marker.read_text() == "done", "the command's side effect", child=child)
    child.kill()


async def test_load_of_a_crashed_session_replays_history_with_recovered_calls(rig):
    crash_during_side_effect(rig, "crashed")
    client = RecordingClient()
    env = script_env(rig, [{"text": "I will check first."}])
    async with connect(rig, client, env) as agent:
        await agent.conn.load_session(cwd=str(rig.ws), session_id="crashed")
        replayed = list(client.updates)  # everything before the load's answer
        stored = rig.inspect("crashed")  # repair was committed by the load
        response = await prompt(agent.conn, "crashed", "what happened?")
    assert [summary(u) for u in replayed] == [
        ("user_message_chunk", "do both"),
        ("agent_message_chunk", "Two things."),
        ("agent_message_chunk", "Cairn stopped here (crash or kill); recovered calls below."),
        ("tool_call", "call_side", "failed"),
        ("tool_call", "call_later", "failed"),
    ]
    side, later = replayed[3], replayed[4]
    # the same status word as live (rev 2 of this test: repair's TOOL_ prefix is no longer shown), and machine-readable
    side_result = [c.content.text for c in side.content if c.type == "content"][-2 if evidence_of(side) else -1]
    assert side_result.startswith("OUTCOME_UNKNOWN: ") and "side-effecting" in side_result
    assert result_text(later).startswith("NOT_STARTED: ")
    # the command's process is checked when its tool/progress reached the log before the kill (it is written behind
    # the barrier, so the kill may come first): then the evidence is in the log after the turn's end, and on the card
    progress = [e for e in stored.events if event_type(e) == "tool/progress"]
    evidence = [e for e in stored.events if event_type(e) == "recovery/evidence"]
    assert [(e.call_id, e.finding) for e in evidence] == ([("call_side", "unknown")] if progress else [])
    expected_meta = {"status": "OUTCOME_UNKNOWN", "error_code": "TOOL_OUTCOME_UNKNOWN", "safety": "side_effecting",
                     "recovered": True}
    if evidence:
        assert f"pid {progress[0].pid}" in evidence[0].detail
        expected_meta["evidence"] = {"finding": "unknown", "detail": evidence[0].detail}
        assert side.raw_output["evidence"] == expected_meta["evidence"]
        assert content_text(side).endswith(f"Cairn checked after the crash: unknown — {evidence[0].detail}")
    assert side.field_meta["cairn"] == expected_meta
    assert later.field_meta["cairn"] == {"status": "NOT_STARTED", "error_code": "TOOL_NOT_STARTED",
                                         "safety": "idempotent", "recovered": True}
    assert side.raw_output["status"] == "OUTCOME_UNKNOWN" and later.raw_output["error_code"] == "TOOL_NOT_STARTED"
    assert SIDE_EFFECT in content_text(side)  # the full command is part of the call
    assert [c.type for c in later.content] == ["content"]  # no diff for a write that never happened
    assert (side.kind, side.raw_input) == ("execute", {"command": SIDE_EFFECT})
    closing = ["tool/result", "tool/result", "step/end", "turn/end"] + ["recovery/evidence"] * len(evidence)
    assert [event_type(e) for e in stored.events][-len(closing):] == closing
    assert stored.events[-1 - len(evidence)].reason == "interrupted" and stored.repair == []
    assert response.stop_reason == "end_turn"  # and the session goes on
    assert [e["type"] for e in rig.show("crashed")][-1] == "turn/end"


async def test_load_errors_name_the_problem(rig):
    held = rig.store().create(cwd=str(rig.ws), session_id="held")  # this test process holds its lock
    try:
        async with connect(rig, RecordingClient()) as agent:
            with pytest.raises(RequestError) as locked:
                await agent.conn.load_session(cwd=str(rig.ws), session_id="held")
            with pytest.raises(RequestError) as missing:
                await agent.conn.load_session(cwd=str(rig.ws), session_id="nope")
            with pytest.raises(RequestError) as unknown_prompt:
                await prompt(agent.conn, "nope", "hello")
    finally:
        held.writer.close()
        held.lock.release()
    assert locked.value.code == -32603
    assert f"session 'held' is live in process {os.getpid()}" in str(locked.value)
    assert (missing.value.code, str(missing.value)) == (-32002, "no session 'nope'; `cairn sessions` lists the ones "
                                                                "that exist")
    assert unknown_prompt.value.code == -32002


# ------------------------------------------------------------------------------------------- disconnect and shutdown


async def test_client_disconnect_mid_turn_leaves_a_real_cancelled_turn_end(tmp_path, backend_name):
    rig = Rig(tmp_path, backend_name)
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [SLOW_TEXT])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt, agent.conn, sid, "talk slowly")
            await wait_for(lambda: client.updates, "the first chunk", rig)
            tg.cancel_scope.cancel()  # the client stops waiting; leaving `connect` closes the agent's stdin
    assert agent.process.returncode == 0, agent_stderr(rig)  # it exited by itself on EOF, not by a signal
    events = rig.show(sid)  # a fresh process: the session is no longer live
    assert rig.inspect(sid).repair == []  # nothing to repair: the turn was closed for real
    assert types(events)[-3:] == ["assistant/message", "step/end", "turn/end"]
    assert events[-3]["interrupted"] is True
    assert (events[-1]["reason"], events[-1]["error"]) == ("cancelled", None)


async def test_sigterm_mid_turn_answers_cancelled_then_closes_the_session(rig):
    client = RecordingClient()
    async with connect(rig, client, script_env(rig, [SLOW_TEXT])) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        async with anyio.create_task_group() as tg:
            result = {}

            async def run() -> None:
                result["response"] = await prompt(agent.conn, sid, "talk slowly")

            tg.start_soon(run)
            await wait_for(lambda: client.updates, "the first chunk", rig)
            agent.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await agent.process.wait()
    assert result["response"].stop_reason == "cancelled"
    assert agent.process.returncode == 0, agent_stderr(rig)
    assert rig.inspect(sid).repair == []
    events = rig.show(sid)
    assert (events[-1]["type"], events[-1]["reason"]) == ("turn/end", "cancelled")


# ------------------------------------------------------------------------------------------------ hand-written JSON-RPC


async def test_malformed_input_gets_protocol_errors_and_the_agent_stays_up(rig):
    """No ACP library on this side: raw newline-delimited JSON over the agent's real pipes."""
    with open(rig.io / "acp.stderr", "wb") as stderr:
        async with await anyio.open_process([CAIRN, "acp"], env=rig.env(), cwd=rig.ws, stderr=stderr) as process:
            assert process.stdin is not None and process.stdout is not None
            replies = BufferedByteReceiveStream(process.stdout)

            async def exchange(line: str) -> dict:
                await process.stdin.send(line.encode() + b"\n")
                with anyio.fail_after(20):
                    return json.loads(await replies.receive_until(b"\n", 1 << 20))

            parse_error = await exchange('{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {')
            not_an_object = await exchange("[1, 2, 3]")
            unknown = await exchange('{"jsonrpc": "2.0", "id": 2, "method": "session/teleport", "params": {}}')
            init = await exchange('{"jsonrpc": "2.0", "id": 3, "method": "initialize", '
                                  '"params": {"protocolVersion": 1}}')
            await process.stdin.aclose()
            with anyio.fail_after(20):
                assert await process.wait() == 0, agent_stderr(rig)
    assert (parse_error["id"], parse_error["error"]["code"]) == (None, -32700)
    assert (not_an_object["id"], not_an_object["error"]["code"]) == (None, -32600)
    assert (unknown["id"], unknown["error"]["code"], unknown["error"]["message"]) == (2, -32601, "Method not found")
    assert init["id"] == 3 and init["result"]["protocolVersion"] == 1
    assert init["result"]["agentCapabilities"]["loadSession"] is True
    assert init["result"]["agentCapabilities"]["promptCapabilities"] == {"image": False, "audio": False,
                                                                         "embeddedContext": False}


def test_acp_refuses_a_file_as_its_stdio_in_one_line(rig):
    proc = subprocess.run([CAIRN, "acp"], env=rig.env(), cwd=rig.ws, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("cairn: cairn acp speaks the Agent Client Protocol over stdin/stdout pipes")


# ------------------------------------------------------------------------------------------ pure parts, no process


def test_replay_keeps_text_cut_by_a_crash_and_shows_verdicts_beside_the_result():
    events = [
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="go"),
        AssistantChunk(turn=1, step=1, delta="Half a"), AssistantChunk(turn=1, step=1, delta=" sentence"),
        StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="interrupted", error=None),  # crash mid-stream, repaired
        TurnStart(turn=2), StepStart(turn=2, step=1), UserMessage(turn=2, step=1, text="again"),
        AssistantMessage(turn=2, step=1, text="", tool_calls=[ToolCallRequest("c9", "edit_file", {"path": "a.txt"})],
                         interrupted=False),
        ToolResult(turn=2, step=1, call_id="c9", is_error=True, content=outcome_unknown_text("edit_file",
                   "side_effecting"), error_code="TOOL_OUTCOME_UNKNOWN", source_seq=None),
        StepEnd(turn=2, step=1), TurnEnd(turn=2, reason="interrupted", error=None),
        RecoveryVerdict(call_id="c9", verdict="happened", note="the file was edited"),
    ]
    updates = replay(events, Path("/ws"))
    assert [summary(u) for u in updates] == [
        ("user_message_chunk", "go"), ("agent_message_chunk", "Half a sentence"),
        ("agent_message_chunk", "Cairn stopped here (crash or kill)."), ("user_message_chunk", "again"),
        ("agent_message_chunk", "Cairn stopped here (crash or kill); recovered calls below."),
        ("tool_call", "c9", "failed"), ("tool_call_update", "c9", "failed"),  # the verdict keeps the call finished
    ]
    assert updates[5].kind == "edit" and updates[5].locations[0].path == "/ws/a.txt"
    assert updates[5].title == "Edit `a.txt`"
    assert content_text(updates[6]).endswith("Operator's verdict: happened (the file was edited)")
    assert updates[6].field_meta["cairn"]["verdict"] == {"verdict": "happened", "note": "the file was edited"}


def test_prompt_text_takes_text_and_links_and_refuses_images(tmp_path):
    ws = tmp_path.resolve()
    assert prompt_text([text_block("look at "), resource_link_block("a.py", f"file://{ws}/src/a%20b.py"),
                        text_block(" and "), resource_link_block("docs", "https://example.org/d"),
                        text_block(" please")], ws) == 'look at @"src/a b.py" and [docs](https://example.org/d) please'
    # a link is a mention (issue 42): set apart from the text around it, so the loop attaches the file
    assert prompt_text([text_block("read"), resource_link_block("a", f"file://{ws}/a.py"), text_block("now")],
                       ws) == "read @a.py now"
    with pytest.raises(RequestError) as outside:
        prompt_text([resource_link_block("passwd", "file:///etc/passwd")], ws)
    assert outside.value.code == -32602 and "outside this session's workspace" in outside.value.data["details"]
    with pytest.raises(RequestError) as refused:
        prompt_text([image_block("AAAA", "image/png")], ws)
    assert refused.value.code == -32602 and "text prompts only" in str(refused.value)
    with pytest.raises(RequestError):
        prompt_text([text_block("  ")], ws)


def test_replay_shows_a_turn_that_ended_in_an_error_as_that_error_not_an_unanswered_prompt():
    from cairn.app.acp.updates import replay
    from cairn.persistence.events import StepEnd, StepStart, TurnEnd, TurnError, TurnStart, UserMessage

    events = [TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="hi"),
              StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="error", error=TurnError("HTTP_500", "upstream down"))]
    for seq, e in enumerate(events):
        e.seq, e.time = seq, 1
    texts = [u.content.text for u in replay(events, ".") if u.session_update == "agent_message_chunk"]
    assert texts == ["The turn ended with an error: HTTP_500: upstream down"]


def test_replay_shows_a_successful_edit_as_the_whole_file_diff_it_showed_live():
    """Issue 40: live, an edit's diff is the whole file before and after; the replay rebuilds the same from the
    before-image its fingerprint names, and says so, without a diff, when the log cannot give it (never the
    fragment, which is not what was shown)."""
    import hashlib

    from cairn.app.acp.updates import replay
    from cairn.persistence.events import (AssistantMessage, StepEnd, StepStart, ToolCall, ToolCallRequest, ToolResult,
                                          TurnEnd, TurnStart, UserMessage)

    before, after = "say hello\nto all\n", "say goodbye\nto all\n"
    sha = {text: hashlib.sha256(text.encode()).hexdigest() for text in (before, after)}
    arguments = {"path": "notes.txt", "old": "hello", "new": "goodbye"}

    def events(**fingerprint: str) -> list:
        found = [TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="edit"),
                 AssistantMessage(turn=1, step=1, text="", tool_calls=[ToolCallRequest("c1", "edit_file", arguments)],
                                  interrupted=False),
                 ToolCall(turn=1, step=1, call_id="c1", name="edit_file", arguments=arguments, safety="side_effecting",
                          parent_call_id=None, **fingerprint),
                 ToolResult(turn=1, step=1, call_id="c1", is_error=False, content="edited notes.txt", error_code=None,
                            source_seq=4),
                 StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="completed", error=None)]
        for seq, e in enumerate(found):
            e.seq, e.time = seq, 1
        return found

    images = {sha[before]: before.encode()}
    fingerprinted = events(before_sha256=sha[before], after_sha256=sha[after])
    (card,) = [u for u in replay(fingerprinted, Path("/ws"), before_image=images.get) if u.session_update == "tool_call"]
    (diff,) = [c for c in card.content if getattr(c, "type", None) == "diff"]
    assert (diff.path, diff.old_text, diff.new_text) == ("/ws/notes.txt", before, after)
    for log, store in ((fingerprinted, {}.get), (events(), images.get)):  # no before-image kept / no fingerprints
        (card,) = [u for u in replay(log, Path("/ws"), before_image=store) if u.session_update == "tool_call"]
        assert [c.type for c in card.content] == ["content", "content"]
        assert content_text(card).startswith("edited notes.txt\nNo diff shown: ")


def test_replay_names_the_safety_of_a_not_started_call_from_the_sessions_tools():
    from cairn.app.acp.updates import replay
    from cairn.persistence.events import (AssistantMessage, StepEnd, StepStart, ToolCallRequest, ToolResult, TurnEnd,
                                          TurnStart, UserMessage)

    events = [TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="go"),
              AssistantMessage(turn=1, step=1, text="", interrupted=False,
                               tool_calls=[ToolCallRequest("m1", "tix__slow_deploy", {"seconds": 60})]),
              ToolResult(turn=1, step=1, call_id="m1", is_error=True, content="NOT_STARTED: …",
                         error_code="TOOL_NOT_STARTED", source_seq=3),
              StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="interrupted", error=None)]
    for seq, e in enumerate(events):
        e.seq, e.time = seq, 1
    safety = {"tix__slow_deploy": "side_effecting"}.get
    (card,) = [u for u in replay(events, Path("/ws"), safety) if u.session_update == "tool_call"]
    assert card.field_meta["cairn"]["safety"] == "side_effecting" and card.status == "failed"
