"""The loop's event sequences (SPEC §2), exactly, through the real composition with the script provider."""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest
from agent_helpers import script_agent, types
from waiting import wait_until

from cairn.app.agent.approval import ApprovalRequest, headless_approver
from cairn.app.agent.notices import TurnFinished
from cairn.app.tools.base import Tool, ToolContext
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.persistence.events import (
    AssistantMessage,
    ToolCall,
    ToolResult,
    TurnEnd,
)

pytestmark = pytest.mark.anyio

CHUNKS = ["assistant/chunk"]


def results(events: list[Any]) -> list[ToolResult]:
    return [e for e in events if isinstance(e, ToolResult)]


def after_message(events: list[Any], count: int | None = None) -> list[str]:
    """Event types from the first assistant/message on (these scripted answers stream no text before it)."""
    kinds = types(events)
    assert kinds[:4] == ["turn/start", "step/start", "user/message", "request/header"]
    start = kinds.index("assistant/message")
    return kinds[start : None if count is None else start + count]


async def test_plain_turn_emits_the_exact_sequence(tmp_path):
    async with script_agent(tmp_path, [{"text": "Hello there", "chunks": 3}]) as agent:
        result = await agent.run("hi")
        events = agent.session.events
    assert types(events) == [
        "turn/start", "step/start", "user/message", "request/header",
        *CHUNKS * 3, "assistant/message", "step/end", "turn/end",
    ]
    assert result.reason == "completed" and result.text == "Hello there"
    assert [e.seq for e in events] == list(range(len(events)))
    message = next(e for e in events if isinstance(e, AssistantMessage))
    assert message.text == "Hello there" and message.interrupted is False


async def test_two_tool_step_emits_approvals_calls_and_results_in_order(tmp_path):
    responses = [
        {"text": "writing", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}},
            {"name": "run_command", "arguments": {"command": "cat a.txt"}},
        ]},
        {"text": "done"},
    ]
    async with script_agent(tmp_path, responses) as agent:
        await agent.run("do it")
        events = agent.session.events
    assert types(events) == [
        "turn/start", "step/start", "user/message", "request/header", "assistant/chunk", "assistant/message",
        "approval/asked", "approval/decided", "tool/call", "tool/result",
        "approval/asked", "approval/decided", "tool/call", "tool/progress", "tool/result",
        "step/end", "step/start", "request/header", "assistant/chunk", "assistant/message", "step/end", "turn/end",
    ]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.safety, c.parent_call_id) for c in calls] == [
        ("write_file", "idempotent", None), ("run_command", "side_effecting", None)]
    res = results(events)
    assert [r.source_seq for r in res] == [c.seq for c in calls]
    assert not any(r.is_error for r in res) and "A" in res[1].content


async def test_parallel_read_only_calls_run_together_and_results_keep_the_models_order(tmp_path):
    running: list[str] = []
    both_running = anyio.Event()

    async def slow_read(args: dict, ctx: ToolContext) -> str:
        running.append(ctx.call_id)
        if len(running) == 2:
            both_running.set()
        with anyio.fail_after(5):  # only returns if the other call runs at the same time
            await both_running.wait()
        if args["n"] == 1:
            await anyio.sleep(0.05)  # the first call finishes last
        return f"read {args['n']}"

    tools = ToolRegistry([Tool("slow_read", "t", {"type": "object"}, "read_only", slow_read)])
    responses = [{"tool_calls": [{"name": "slow_read", "arguments": {"n": 1}},
                                 {"name": "slow_read", "arguments": {"n": 2}}]}, {"text": "ok"}]
    async with script_agent(tmp_path, responses, tools=tools) as agent:
        await agent.run("read both")
        events = agent.session.events
    assert after_message(events, 5) == ["assistant/message", "tool/call", "tool/call", "tool/result", "tool/result"]
    assert [r.content for r in results(events)] == ["read 1", "read 2"]
    assert agent.policy.barriers.count("pre-tool") == 2  # two barriers ...
    # ... that shared the flush: both tool/calls were written by the first one
    assert len(running) == 2


async def test_denied_call_records_the_decision_and_never_runs(tmp_path):
    responses = [{"tool_calls": [{"name": "run_command", "arguments": {"command": "touch x"}}]}, {"text": "ok"}]
    async with script_agent(tmp_path, responses, approver=headless_approver(False)) as agent:
        await agent.run("touch")
        events = agent.session.events
    assert after_message(events, 4) == ["assistant/message", "approval/asked", "approval/decided", "tool/result"]
    assert events[6].decision == "denied"
    r = results(events)[0]
    assert r.error_code == "DENIED" and r.is_error and r.source_seq is None
    assert not any(isinstance(e, ToolCall) for e in events)
    assert not (tmp_path / "ws" / "x").exists()


async def test_allow_for_session_stops_asking_for_that_tool(tmp_path):
    asked: list[str] = []

    async def approver(request: ApprovalRequest) -> str:
        asked.append(request.call_id)
        return "allowed_session"

    call = {"name": "run_command", "arguments": {"command": "true"}}
    responses = [{"tool_calls": [call, call]}, {"text": "ok"}]
    async with script_agent(tmp_path, responses, approver=approver) as agent:
        await agent.run("twice")
        events = agent.session.events
    assert len(asked) == 1
    assert types(events).count("approval/asked") == 1 and types(events).count("tool/call") == 2


async def test_cancel_mid_stream_records_an_interrupted_message(tmp_path):
    responses = [{"text": "x" * 200, "chunks": 100, "delay_ms": 20}]
    async with script_agent(tmp_path, responses) as agent:
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def run() -> None:
                got.append(await agent.run("talk"))

            tg.start_soon(run)
            await wait_until(lambda: types(agent.session.events).count("assistant/chunk") >= 3, "three chunks")
            agent.loop.cancel()
        events = agent.session.events
    n = types(events).count("assistant/chunk")
    assert types(events) == [
        "turn/start", "step/start", "user/message", "request/header", *CHUNKS * n,
        "assistant/message", "step/end", "turn/end",
    ]
    message = next(e for e in events if isinstance(e, AssistantMessage))
    assert message.interrupted is True and message.text == "x" * (2 * n)
    assert events[-1].reason == "cancelled" and got[0].reason == "cancelled"


async def test_cancel_mid_tool_kills_the_command_and_records_outcome_unknown(tmp_path):
    pid_file = tmp_path / "ws" / "pid"
    responses = [
        {"tool_calls": [
            {"name": "run_command", "arguments": {"command": f"echo $$ > {pid_file}; sleep 30"}},
            {"name": "read_file", "arguments": {"path": "pid"}},
        ]},
    ]
    async with script_agent(tmp_path, responses) as agent:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "sleep")
            await wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the command's pid")
            agent.loop.cancel()
        events = agent.session.events
    assert after_message(events) == [
        "assistant/message", "approval/asked", "approval/decided", "tool/call", "tool/progress", "tool/result",
        "tool/result", "step/end", "turn/end",
    ]
    first, second = results(events)
    assert first.error_code == "TOOL_OUTCOME_UNKNOWN" and first.source_seq is not None
    assert second.error_code == "ABORTED_BEFORE_DISPATCH" and second.source_seq is None
    assert events[-1].reason == "cancelled"
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_cancel_while_waiting_for_approval_records_cancelled_and_aborts(tmp_path):
    waiting = anyio.Event()

    async def approver(request: ApprovalRequest) -> str:
        waiting.set()
        await anyio.sleep_forever()
        return "denied"

    responses = [{"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]}]
    async with script_agent(tmp_path, responses, approver=approver) as agent:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "x")
            await waiting.wait()
            agent.loop.cancel()
        events = agent.session.events
    assert after_message(events) == [
        "assistant/message", "approval/asked", "approval/decided", "tool/result", "step/end", "turn/end"]
    assert events[6].decision == "cancelled"
    assert results(events)[0].error_code == "ABORTED_BEFORE_DISPATCH"


async def test_invalid_argument_json_and_unknown_tool_are_reported_to_the_model(tmp_path):
    responses = [
        {"tool_calls": [{"name": "read_file", "arguments": "{not json"}, {"name": "teleport", "arguments": {}}]},
        {"text": "sorry"},
    ]
    async with script_agent(tmp_path, responses) as agent:
        result = await agent.run("go")
        events = agent.session.events
    call = next(e for e in events if isinstance(e, ToolCall))
    assert call.arguments == "{not json"
    bad, unknown = results(events)
    assert bad.error_code == "BAD_ARGUMENTS" and bad.source_seq == call.seq
    assert unknown.error_code == "UNKNOWN_TOOL" and unknown.source_seq is None and "read_file" in unknown.content
    assert result.reason == "completed"


async def test_path_outside_the_workspace_is_bad_arguments(tmp_path):
    responses = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}]}, {"text": "ok"}]
    async with script_agent(tmp_path, responses) as agent:
        await agent.run("escape")
        r = results(agent.session.events)[0]
    assert r.error_code == "BAD_ARGUMENTS" and "root:" not in r.content


async def test_queued_prompts_run_one_turn_at_a_time_in_order(tmp_path):
    responses = [{"text": "one", "chunks": 5, "delay_ms": 5}, {"text": "two"}, {"text": "three"}]
    async with script_agent(tmp_path, responses) as agent:
        done: list[Any] = []
        agent.loop.notices.append(lambda n: done.append(n.result) if isinstance(n, TurnFinished) else None)
        for prompt in ("first", "second", "third"):
            agent.loop.submit(prompt)
        assert agent.loop.busy
        with anyio.fail_after(10):
            await agent.loop.wait_idle()
        events = agent.session.events
    assert [r.text for r in done] == ["one", "two", "three"]
    starts = [i for i, t in enumerate(types(events)) if t == "turn/start"]
    ends = [i for i, t in enumerate(types(events)) if t == "turn/end"]
    assert len(starts) == 3 and all(e < s for e, s in zip(ends, starts[1:]))  # no overlap
    assert [e.turn for e in events if isinstance(e, TurnEnd)] == [1, 2, 3]


async def test_leaving_the_composition_mid_turn_writes_real_closing_events(tmp_path):
    responses = [{"text": "y" * 100, "chunks": 50, "delay_ms": 20}]
    async with script_agent(tmp_path, responses) as agent:
        agent.loop.submit("talk")
        await wait_until(lambda: "assistant/chunk" in types(agent.session.events), "the first chunk")
    # after exit: the loop was cancelled and waited for; the session flushed and closed
    from cairn.persistence.store import SessionStore

    log = SessionStore(tmp_path / "home").inspect(agent.id)
    assert log.repair == []
    assert types(log.events)[-3:] == ["assistant/message", "step/end", "turn/end"]
    assert log.events[-1].reason == "cancelled"


async def test_max_steps_ends_the_turn_in_error(tmp_path):
    call = {"name": "list_dir", "arguments": {}}
    async with script_agent(tmp_path, [{"tool_calls": [call]}] * 5) as agent:
        agent.loop.max_steps = 2
        result = await agent.run("loop forever")
    assert result.reason == "error" and result.error.code == "MAX_STEPS"


async def test_nested_call_cancelled_mid_run_gets_its_own_result_before_its_parent(tmp_path):
    inner_started = anyio.Event()

    async def inner(args: dict, ctx: ToolContext) -> str:
        inner_started.set()
        await anyio.sleep_forever()
        return ""

    async def outer(args: dict, ctx: ToolContext) -> str:
        return await ctx.dispatch("inner", {})

    tools = ToolRegistry([*builtin_tools(), Tool("inner", "t", {"type": "object"}, "read_only", inner),
                          Tool("outer", "t", {"type": "object"}, "read_only", outer)])
    async with script_agent(tmp_path, [{"tool_calls": [{"name": "outer", "arguments": {}}]}], tools=tools) as agent:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "x")
            await inner_started.wait()
            agent.loop.cancel()
        events = agent.session.events
    res = results(events)
    assert [(r.call_id.count("."), r.error_code) for r in res] == [
        (1, "TOOL_OUTCOME_UNKNOWN"), (0, "TOOL_OUTCOME_UNKNOWN")]
