"""The loop's rev 2 rules (SPEC §2, §7): answers that end badly, retries, reasoning, usage, unique call ids, and
storing only what the reader accepts (lone surrogates, secrets, wrongly typed fields)."""

from __future__ import annotations

from typing import Any, AsyncIterator

import anyio
import pytest

from cairn.app.agent.notices import Waiting
from cairn.app.providers.base import ModelRequest, ProviderError, RawToolCall, StreamEnd, TextDelta
from cairn.app.tools.base import Tool, ToolContext
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.persistence.events import (
    AssistantMessage,
    InvalidEvent,
    ReasoningChunk,
    RequestRetry,
    ToolCall,
    ToolProgress,
    ToolResult,
    TurnEnd,
    UserMessage,
    Usage,
)
from cairn.persistence.store import SessionStore

from agent_helpers import script_agent, types
from waiting import wait_until

pytestmark = pytest.mark.anyio


def of(events: list[Any], cls: type) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


class FlakyProvider:
    """Fails the first `failures` attempts (before or after one delta), then answers; counts the attempts."""

    name = "flaky"
    model = "m"

    def __init__(self, failures: int, *, retryable: bool = True, after_delta: bool = False,
                 retry_after: float | None = 0.0) -> None:
        self.failures, self.retryable, self.after_delta, self.retry_after = failures, retryable, after_delta, retry_after
        self.attempts = 0

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            self.attempts += 1
            if self.attempts <= self.failures:
                if self.after_delta:
                    yield TextDelta("partial ")
                raise ProviderError("HTTP 503 Service Unavailable from test", "HTTP_503", retryable=self.retryable,
                                    retry_after=self.retry_after)
            yield TextDelta("answer")
            yield StreamEnd([], "stop")

        return gen()

    async def aclose(self) -> None:
        pass


class FixedProvider:
    """Answers every request with the same items."""

    name = "fixed"
    model = "m"

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        items = self.answers.pop(0) if self.answers else [TextDelta("done"), StreamEnd([], "stop")]

        async def gen() -> AsyncIterator[Any]:
            for item in items:
                yield item

        return gen()

    async def aclose(self) -> None:
        pass


async def test_reasoning_streams_as_chunks_and_is_stored_with_usage(tmp_path):
    answer = {"reasoning": "Let me think.", "text": "Four.", "usage": {"input_tokens": 12, "output_tokens": 3}}
    async with script_agent(tmp_path, [answer]) as agent:
        result = await agent.run("2+2?")
        events = agent.session.events
    assert result.reason == "completed"
    assert [e.delta for e in of(events, ReasoningChunk)] == ["Let me think."]
    (message,) = of(events, AssistantMessage)
    assert message.reasoning == "Let me think." and message.finish_reason == "stop"
    assert message.usage == Usage(input_tokens=12, output_tokens=3)
    kinds = types(events)
    assert kinds.index("reasoning/chunk") < kinds.index("assistant/chunk") < kinds.index("assistant/message")


async def test_length_truncated_answer_runs_none_of_its_calls_and_ends_max_tokens(tmp_path):
    marker = tmp_path / "ws" / "marker"
    answer = {"text": "", "finish_reason": "length",
              "tool_calls": [{"name": "run_command", "arguments": {"command": f"touch {marker}"}}]}
    async with script_agent(tmp_path, [answer]) as agent:
        result = await agent.run("go")
        events = agent.session.events
    assert not marker.exists()
    assert not of(events, ToolCall), "a truncated call is never dispatched"
    (res,) = of(events, ToolResult)
    assert res.error_code == "TRUNCATED" and res.is_error and res.source_seq is None
    assert result.reason == "error" and result.error is not None and result.error.code == "MAX_TOKENS"
    assert types(events)[-3:] == ["tool/result", "step/end", "turn/end"]


async def test_length_truncated_text_answer_is_an_error_not_a_completed_turn(tmp_path):
    async with script_agent(tmp_path, [{"text": "The answer is", "finish_reason": "length"}]) as agent:
        result = await agent.run("go")
    assert result.reason == "error" and result.error.code == "MAX_TOKENS"
    assert "output limit" in result.error.message


async def test_stream_without_finish_reason_is_malformed_and_keeps_its_text(tmp_path):
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = FixedProvider([TextDelta("half an answer"), StreamEnd([], None)])
        result = await agent.run("go")
        events = agent.session.events
    assert result.reason == "error" and result.error.code == "MALFORMED_STREAM"
    (message,) = of(events, AssistantMessage)
    assert message.text == "half an answer" and message.interrupted is True


async def test_retryable_error_before_any_delta_is_retried_with_request_retry_first(tmp_path):
    provider = FlakyProvider(2)
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = provider
        result = await agent.run("go")
        events = agent.session.events
    assert result.reason == "completed" and result.text == "answer"
    assert provider.attempts == 3
    retries = of(events, RequestRetry)
    assert [(r.attempt, r.reason) for r in retries] == [(2, "HTTP 503"), (3, "HTTP 503")]
    assert types(events).count("request/header") == 1
    assert len(of(events, AssistantMessage)) == 1


async def test_retry_honours_retry_after(tmp_path, monkeypatch):
    provider = FlakyProvider(1, retry_after=0.3)
    slept: list[float] = []
    real_sleep = anyio.sleep

    async def sleep(delay: float) -> None:  # what the loop waits before it asks again, as it asked for it
        slept.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(anyio, "sleep", sleep)
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = provider
        result = await agent.run("go")
        (retry,) = of(agent.session.events, RequestRetry)
    assert result.reason == "completed" and provider.attempts == 2
    assert retry.delay_ms == 300 and 0.3 in slept


async def test_no_retry_once_a_delta_arrived(tmp_path):
    provider = FlakyProvider(1, after_delta=True)
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = provider
        result = await agent.run("go")
        events = agent.session.events
    assert provider.attempts == 1 and result.reason == "error" and result.error.code == "HTTP_503"
    assert not of(events, RequestRetry)
    (message,) = of(events, AssistantMessage)
    assert message.text == "partial " and message.interrupted


async def test_non_retryable_error_and_exhausted_retries_end_the_turn(tmp_path):
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = once = FlakyProvider(1, retryable=False)
        first = await agent.run("go")
        agent.loop.provider = always = FlakyProvider(99)
        agent.loop.max_retries = 2
        second = await agent.run("again")
    assert once.attempts == 1 and first.reason == "error"
    assert always.attempts == 3 and second.reason == "error" and second.error.code == "HTTP_503"


async def test_cancel_interrupts_the_retry_wait(tmp_path):
    provider = FlakyProvider(1, retry_after=30)
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = provider
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def run() -> None:
                results.append(await agent.run("go"))

            tg.start_soon(run)
            await wait_until(lambda: of(agent.session.events, RequestRetry), "the retry wait")
            agent.loop.cancel()
            # the turn ends well inside the 30 s it was told to wait: the wait was interrupted, not sat out
            await wait_until(lambda: results, "the cancelled turn to end", timeout=10)
        assert results[0].reason == "cancelled" and provider.attempts == 1
        assert types(agent.session.events)[-2:] == ["step/end", "turn/end"]


async def test_repeated_call_ids_become_unique_within_and_across_answers(tmp_path):
    calls = [{"name": "list_dir", "call_id": "c1", "arguments": {"path": "."}},
             {"name": "list_dir", "call_id": "c1", "arguments": {"path": "."}}]
    async with script_agent(tmp_path, [{"tool_calls": calls}, {"tool_calls": calls[:1]}, {"text": "ok"}]) as agent:
        await agent.run("go")
        events = agent.session.events
    ids = [c.call_id for m in of(events, AssistantMessage) for c in m.tool_calls]
    assert ids == ["c1", "c1-dup", "c1-dup#2"]
    assert [r.call_id for r in of(events, ToolResult)] == ids
    assert [r.source_seq for r in of(events, ToolResult)] == [c.seq for c in of(events, ToolCall)]


async def test_lone_surrogates_in_text_and_prompt_are_stored_as_replacement_characters(tmp_path):
    async with script_agent(tmp_path, []) as agent:
        agent.loop.provider = FixedProvider([TextDelta("smile \ud83d now"), StreamEnd([], "stop")])
        result = await agent.run("bin \udcff\udcfe")
        events = agent.session.events
        sid = agent.session.id
    assert result.reason == "completed"
    (prompt,) = of(events, UserMessage)
    assert prompt.text == "bin \ufffd\ufffd"
    assert of(events, AssistantMessage)[0].text == "smile \ufffd now"
    reloaded = SessionStore(tmp_path / "home", "jsonl").inspect(sid)
    assert [e.seq for e in reloaded.events] == list(range(len(events)))


async def test_secret_values_never_reach_the_log(tmp_path):
    secret = "sk-test-SECRET-value-123"

    async def leak(args: dict, ctx: ToolContext) -> str:
        return f"env: KEY={secret}"

    tools = ToolRegistry([*builtin_tools(), Tool("leak", "prints a key", {"type": "object"}, "read_only", leak)])
    answers = [{"text": f"the key is {secret}", "tool_calls": [{"name": "leak", "arguments": {}}]}, {"text": "ok"}]
    async with script_agent(tmp_path, answers, tools=tools) as agent:
        agent.session.add_secrets([secret, None, "ab"])
        await agent.run(f"use {secret}")
        sid = agent.session.id
    raw = (tmp_path / "home" / "sessions" / f"{sid}.jsonl").read_bytes()
    assert secret.encode() not in raw
    assert b"KEY=***" in raw and b"the key is ***" in raw


async def test_an_event_the_reader_would_refuse_is_never_stored(tmp_path):
    async with script_agent(tmp_path, []) as agent:
        before = agent.session.coordinator.next_seq
        with pytest.raises(InvalidEvent):
            agent.session.append(ToolCall(turn=1, step=1, call_id=5, name="x", arguments={},  # type: ignore[arg-type]
                                          safety="read_only", parent_call_id=None))
        assert agent.session.coordinator.next_seq == before
        result = await agent.run("still fine")
    assert result.reason == "completed"


async def test_tool_progress_records_the_started_process(tmp_path):
    async def spawn(args: dict, ctx: ToolContext) -> str:
        ctx.progress(4242, 1700000000000)
        return "ran"

    tools = ToolRegistry([*builtin_tools(), Tool("spawn", "starts a process", {"type": "object"}, "read_only", spawn)])
    async with script_agent(tmp_path, [{"tool_calls": [{"name": "spawn", "arguments": {}}]}], tools=tools) as agent:
        await agent.run("go")
        events = agent.session.events
    (progress,) = of(events, ToolProgress)
    call = of(events, ToolCall)[0]
    assert (progress.call_id, progress.pid, progress.started) == (call.call_id, 4242, 1700000000000)
    kinds = types(events)
    assert kinds.index("tool/call") < kinds.index("tool/progress") < kinds.index("tool/result")
    assert of(events, TurnEnd)[0].reason == "completed"


async def test_a_request_that_gets_no_answer_reports_how_long_it_has_waited_until_the_answer_starts(tmp_path):
    """Issue 26: a stalled server is visible (TUI status bar, headless stderr) at least every 10 s; here every 0.1 s."""
    from openai_server import OpenAIServer, text

    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config

    seen: list[float | None] = []
    (tmp_path / "ws").mkdir()
    with OpenAIServer([text("late but fine", hold_before=True)]) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", base_url=server.base_url, model="m",
                                workspace=str(tmp_path / "ws"), env={})
        async with open_agent(config) as agent:
            agent.loop.wait_report_every = 0.1
            agent.loop.notices.append(lambda n: seen.append(n.seconds) if isinstance(n, Waiting) else None)
            async with anyio.create_task_group() as tg:
                async def answer_late() -> None:  # the server answers only once three reports have come
                    while len([w for w in seen if w is not None]) < 3:
                        await anyio.sleep(0.02)
                    server.release()
                tg.start_soon(answer_late)
                result = await agent.run("hello")
    assert result.reason == "completed" and result.text == "late but fine"
    waits = [s for s in seen if s is not None]
    assert len(waits) >= 3 and waits == sorted(waits) and seen[-1] is None


async def test_an_answer_that_stops_mid_stream_is_reported_as_waiting_and_the_report_clears_when_bytes_come(tmp_path):
    """Issue 26: the silence between later bytes counts too (SPEC §7 rev 3, "for a first byte or for the next one")."""
    from openai_server import OpenAIServer, text

    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config
    from cairn.persistence.events import AssistantChunk

    order: list[object] = []  # "chunk" for each streamed piece, the seconds (or None) of each waiting report
    (tmp_path / "ws").mkdir()
    with OpenAIServer([text("first half, second half", chunks=4, hold_after=3)]) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", base_url=server.base_url, model="m",
                                workspace=str(tmp_path / "ws"), env={})
        async with open_agent(config) as agent:
            agent.loop.wait_report_every = 0.1
            agent.loop.notices.append(lambda n: order.append(n.seconds) if isinstance(n, Waiting) else None)
            agent.session.subscribe(lambda e: order.append("chunk") if isinstance(e, AssistantChunk) else None)
            async with anyio.create_task_group() as tg:
                async def answer_late() -> None:  # the rest comes once two reports came after text had streamed
                    while not ("chunk" in order and sum(isinstance(x, float) for x in
                                                        order[order.index("chunk"):]) >= 2):
                        await anyio.sleep(0.02)
                    server.release()
                tg.start_soon(answer_late)
                result = await agent.run("hello")
    assert result.reason == "completed" and result.text == "first half, second half"
    first_chunk = order.index("chunk")
    stalled = [i for i, x in enumerate(order) if isinstance(x, float) and i > first_chunk]
    assert len(stalled) >= 2  # reported while the answer had started and then stopped
    after = order[stalled[-1] + 1:]
    assert after and after[0] is None and "chunk" in after  # cleared when bytes came again, then the rest streamed
