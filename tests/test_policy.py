"""The checkpoint policy's rules (SPEC §3), one test per rule, through the real loop, store and coordinator."""

from __future__ import annotations

import threading
from typing import Any, AsyncIterator

import anyio
import pytest
from agent_helpers import ControlledOps, script_agent, types

from cairn.app.agent.hooks import Hooks, StreamContext
from cairn.app.providers.base import ModelRequest, StreamEnd, TextDelta
from cairn.app.tools.base import Tool, ToolContext
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import (
    ABORTED_BEFORE_DISPATCH,
    CHECKPOINT_FAILED,
    RequestHeader,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)

pytestmark = pytest.mark.anyio


def last(events: list[Any], kind: type) -> Any:
    return next(e for e in reversed(events) if isinstance(e, kind))


class RecordingProvider:
    """Records what was durable at the moment its stream was constructed (the pre-request barrier's promise)."""

    name = "recording"
    model = "m"

    def __init__(self) -> None:
        self.constructed_with_durable_seq: list[int] = []
        self.session: Any = None

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.constructed_with_durable_seq.append(self.session.coordinator.durable_seq)

        async def gen() -> AsyncIterator[Any]:
            yield TextDelta("hi")
            yield StreamEnd([], "stop")

        return gen()

    async def aclose(self) -> None:
        pass


def use_provider(agent: Any, provider: RecordingProvider) -> None:
    provider.session = agent.session
    agent.loop.provider = provider


async def test_pre_request_barrier_is_awaited_before_the_provider_stream_is_constructed(tmp_path):
    async with script_agent(tmp_path, []) as agent:
        provider = RecordingProvider()
        use_provider(agent, provider)
        await agent.run("hello")
        header = last(agent.session.events, RequestHeader)
    assert provider.constructed_with_durable_seq == [header.seq]  # exactly through request/header, nothing later
    assert agent.policy.barriers[:2] == ["pre-step", "pre-request"]


async def test_pre_step_barrier_makes_the_prompt_durable_before_the_request_is_derived(tmp_path):
    seen: list[int] = []
    async with script_agent(tmp_path, []) as agent:

        async def observe(ctx: Any, call_next: Any) -> Any:  # registered after the policy: runs inside its wrapper
            seen.append(ctx.session.coordinator.durable_seq)
            return await call_next()

        agent.loop.hooks.add("before_step", observe)
        await agent.run("remember me")
        prompt = next(e for e in agent.session.events if isinstance(e, UserMessage))
    assert seen == [prompt.seq]
    assert agent.policy.barriers[0] == "pre-step"


async def test_no_barrier_and_no_provider_call_when_the_session_is_not_live(tmp_path):
    called = []
    async with script_agent(tmp_path, []) as agent:
        policy = agent.policy
        await agent.session.coordinator.aclose()  # the session is no longer live
        ctx = StreamContext(agent.session, 1, 1, ModelRequest([], [], "m"))

        async def construct() -> None:
            called.append(True)

        before = list(policy.barriers)
        with pytest.raises(CheckpointFailed):
            await policy.pre_request(ctx, construct)
        assert policy.barriers == before
        assert called == []
        agent.loop.cancel()


async def test_rejected_pre_request_barrier_means_the_provider_is_never_called(tmp_path):
    ops = ControlledOps()
    async with script_agent(tmp_path, [], ops=ops) as agent:
        provider = RecordingProvider()
        use_provider(agent, provider)

        async def fail_next_barrier(ctx: Any, call_next: Any) -> Any:  # runs after pre-step, before pre-request
            ops.fail_fsync = 3  # the barrier and the coordinator's retries within it
            return await call_next()

        agent.loop.hooks.add("before_step", fail_next_barrier)
        result = await agent.run("hello")
        ops.fail_fsync = 0
        events = agent.session.events
    assert provider.constructed_with_durable_seq == []
    assert result.reason == "error" and result.error.code == "CHECKPOINT_FAILED"
    assert types(events)[-3:] == ["request/header", "step/end", "turn/end"]


def gated_tool(started: list[str], name: str = "probe", safety: str = "side_effecting") -> Tool:
    async def body(args: dict, ctx: ToolContext) -> str:
        started.append(ctx.call_id)
        return "ran"

    return Tool(name, "test tool", {"type": "object", "properties": {}}, safety, body)  # type: ignore[arg-type]


async def test_pre_tool_barrier_is_awaited_before_a_top_level_tool_body(tmp_path):
    durable_at_body: list[int] = []

    async def body(args: dict, ctx: ToolContext) -> str:
        durable_at_body.append(agent.session.coordinator.durable_seq)
        return "ok"

    tools = ToolRegistry([Tool("probe", "t", {"type": "object"}, "side_effecting", body)])
    responses = [{"tool_calls": [{"name": "probe", "arguments": {}}]}, {"text": "done"}]
    async with script_agent(tmp_path, responses, tools=tools) as agent:
        await agent.run("go")
        call = next(e for e in agent.session.events if isinstance(e, ToolCall))
    assert durable_at_body == [call.seq]
    assert "pre-tool" in agent.policy.barriers


async def test_cancellation_during_the_tool_barrier_aborts_before_dispatch_and_the_body_never_runs(tmp_path):
    ops = ControlledOps()
    started: list[str] = []
    tools = ToolRegistry([gated_tool(started)])
    responses = [{"tool_calls": [{"name": "probe", "arguments": {}}]}]
    async with script_agent(tmp_path, responses, tools=tools, ops=ops) as agent:

        gate = threading.Event()
        armed = anyio.Event()

        async def hold_tool_barrier(ctx: Any, call_next: Any) -> Any:  # outermost: arm the gate just before pre-tool
            ops.fsync_entered.clear()
            ops.fsync_gate = gate
            armed.set()
            return await call_next()

        agent.loop.hooks.chains["around_tool"].insert(0, hold_tool_barrier)
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run("go"))

            tg.start_soon(run)
            await armed.wait()
            assert await anyio.to_thread.run_sync(ops.fsync_entered.wait, 10)  # the pre-tool fsync is in progress
            agent.loop.cancel()
            gate.set()
        ops.fsync_gate = None
        events = agent.session.events
    assert started == []
    result = last(events, ToolResult)
    assert result.error_code == ABORTED_BEFORE_DISPATCH and result.is_error
    assert results[0].reason == "cancelled"
    assert last(events, TurnEnd).reason == "cancelled"


async def test_rejected_tool_barrier_gives_checkpoint_failed_and_the_body_never_runs(tmp_path):
    ops = ControlledOps()
    started: list[str] = []
    tools = ToolRegistry([gated_tool(started)])
    responses = [{"tool_calls": [{"name": "probe", "arguments": {}}]}, {"text": "after"}]
    async with script_agent(tmp_path, responses, tools=tools, ops=ops) as agent:

        async def fail_tool_barrier(ctx: Any, call_next: Any) -> Any:
            ops.fail_fsync = 3
            try:
                return await call_next()
            finally:
                ops.fail_fsync = 0

        agent.loop.hooks.chains["around_tool"].insert(0, fail_tool_barrier)
        await agent.run("go")
        events = agent.session.events
    assert started == []
    result = next(e for e in events if isinstance(e, ToolResult))
    assert result.error_code == CHECKPOINT_FAILED and result.is_error
    assert result.source_seq == next(e for e in events if isinstance(e, ToolCall)).seq


async def test_nested_dispatch_takes_no_extra_barrier(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("inner\n")

    async def outer(args: dict, ctx: ToolContext) -> str:
        return "outer saw: " + await ctx.dispatch("read_file", {"path": "a.txt"})

    tools = ToolRegistry([*builtin_tools(), Tool("outer", "t", {"type": "object"}, "side_effecting", outer)])
    responses = [{"tool_calls": [{"name": "outer", "arguments": {}}]}, {"text": "done"}]
    async with script_agent(tmp_path, responses, tools=tools) as agent:
        await agent.run("go")
        events = agent.session.events
    assert agent.policy.barriers.count("pre-tool") == 1
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.parent_call_id) for c in calls] == [("outer", None), ("read_file", calls[0].call_id)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.call_id for r in results] == [calls[1].call_id, calls[0].call_id]
    assert "inner" in results[1].content


async def test_turn_end_barrier_comes_after_turn_end_and_makes_it_durable(tmp_path):
    async with script_agent(tmp_path, [{"text": "hi"}]) as agent:
        await agent.run("hello")
        end = last(agent.session.events, TurnEnd)
        assert agent.session.coordinator.durable_seq == end.seq
        assert agent.policy.barriers[-1] == "turn-end"


async def test_turn_end_barrier_failure_is_reported_and_later_queued_work_still_runs(tmp_path):
    ops = ControlledOps()
    reports: list[str] = []
    async with script_agent(tmp_path, [{"text": "one"}, {"text": "two"}], ops=ops, report=reports.append) as agent:

        async def fail_turn_end(ctx: Any, call_next: Any) -> Any:
            if ctx.turn == 1:
                ops.fail_fsync = 3
            try:
                return await call_next()
            finally:
                ops.fail_fsync = 0

        agent.loop.hooks.chains["after_turn"].insert(0, fail_turn_end)
        first = await agent.run("first")
        count_after_first = len(agent.session.events)
        second = await agent.run("second")
        events = agent.session.events
    assert first.reason == "completed" and second.reason == "completed"
    assert len(reports) == 1 and "turn 1" in reports[0]
    assert types(events)[count_after_first - 1] == "turn/end"  # nothing appended after the closed turn
    assert types(events)[count_after_first] == "turn/start"
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["completed", "completed"]


async def test_dispose_removes_the_policys_wrappers(tmp_path):
    async with script_agent(tmp_path, [{"text": "a"}, {"text": "b"}]) as agent:
        hooks: Hooks = agent.loop.hooks
        assert hooks.count() == 4
        await agent.run("with policy")
        taken = len(agent.policy.barriers)
        agent.policy.dispose()
        assert hooks.count() == 0
        await agent.run("without policy")
        assert len(agent.policy.barriers) == taken
