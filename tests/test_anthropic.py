"""The `anthropic` provider (SPEC §7 rev 2) against a real local Messages-API server (`tests/anthropic_server.py`,
strict like the real API): text, tool_use input assembled, tool_result blocks, thinking signatures stored and sent back,
usage, retries (429 with retry-after, 529 overloaded, an in-stream error before any delta), `max_tokens`, the
conversation converter, and a SIGKILL mid-stream followed by a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import open_session
from cairn.app.providers.anthropic import AnthropicProvider, to_anthropic
from cairn.app.providers.base import ModelRequest, ReasoningDelta, StreamEnd, TextDelta, ToolSchema
from cairn.persistence.events import AssistantChunk
from cairn.persistence.store import SessionStore

from anthropic_server import AnthropicServer, message, overloaded, rate_limited, signature_for, tool_use, violations
from waiting import wait_sync

pytestmark = pytest.mark.anyio
CAIRN = str(Path(sys.executable).parent / "cairn")
KEY = "sk-ant-test-SECRET-0042"
TOOLS = [ToolSchema("read_file", "read a file", {"type": "object", "properties": {"path": {"type": "string"}}})]


def request(*messages: dict) -> ModelRequest:
    return ModelRequest([{"role": "system", "content": "be brief"}, *messages], TOOLS, "claude-test")


async def collect(provider: AnthropicProvider, req: ModelRequest) -> list:
    try:
        return [item async for item in provider.stream(req)]
    finally:
        await provider.aclose()


def profile_file(tmp_path: Path, server: AnthropicServer, **extra: object) -> Path:
    lines = ['[profiles.claude]', 'provider = "anthropic"', f'base_url = "{server.base_url}"',
             'api_key_env = "TEST_ANTHROPIC_KEY"', 'model = "claude-test"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the provider alone --------------------------------------------------------------------------------------------------


async def test_text_and_thinking_stream_with_signature_usage_and_the_api_headers():
    with AnthropicServer([message("Hello world", chunks=3, thinking="Think first", thinking_chunks=2)], key=KEY) as s:
        provider = AnthropicProvider("claude-test", base_url=s.base_url, api_key=KEY, thinking_budget=2048)
        items = await collect(provider, request({"role": "user", "content": "hi"}))
        sent = s.requests[0]
    assert [i.text for i in items if isinstance(i, ReasoningDelta)] == ["Think ", "first"]
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "Hello world"
    end = items[-1]
    assert isinstance(end, StreamEnd) and end.finish_reason == "stop" and end.tool_calls == []
    assert end.reasoning_meta == {"anthropic_thinking": [{"signature": signature_for("Think first"), "chars": 11}]}
    assert end.usage is not None and end.usage.input_tokens and end.usage.output_tokens
    assert sent.path == "/v1/messages" and sent.header("x-api-key") == KEY and sent.header("anthropic-version")
    assert sent.header("authorization") is None
    assert sent.body["system"] == "be brief" and sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent.body["tools"][0]["input_schema"]["properties"]["path"] == {"type": "string"}
    assert sent.body["max_tokens"] == 8192 and sent.body["stream"] is True


async def test_tool_use_input_deltas_are_assembled_into_one_call():
    calls = [{"id": "toolu_a", "name": "read_file", "input": {"path": "notes/a.txt"}},
             {"id": "toolu_b", "name": "read_file", "input": {}}]
    with AnthropicServer([tool_use(calls, text="Reading.", arg_chunks=4)]) as s:
        items = await collect(AnthropicProvider("m", base_url=s.base_url, api_key=KEY), request(
            {"role": "user", "content": "read"}))
    end = items[-1]
    assert end.finish_reason == "tool_calls"
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in end.tool_calls] == [
        ("toolu_a", "read_file", {"path": "notes/a.txt"}), ("toolu_b", "read_file", {})]


async def test_a_max_tokens_stop_is_length():
    with AnthropicServer([message("cut sh", stop_reason="max_tokens")]) as s:
        items = await collect(AnthropicProvider("m", base_url=s.base_url, api_key=KEY, max_tokens=5),
                              request({"role": "user", "content": "x"}))
        assert s.requests[0].body["max_tokens"] == 5
    assert items[-1].finish_reason == "length"


async def test_an_in_stream_overload_before_any_delta_is_retryable_after_one_is_not():
    from cairn.app.providers.base import ProviderError

    with AnthropicServer([message("abc", error_after=1), message("abc", chunks=3, error_after=4)]) as s:
        for retryable in (True, False):
            with pytest.raises(ProviderError) as info:
                await collect(AnthropicProvider("m", base_url=s.base_url, api_key=KEY),
                              request({"role": "user", "content": "x"}))
            assert info.value.retryable is retryable and "overloaded_error" in str(info.value)


async def test_http_errors_name_the_status_and_never_show_the_key():
    from cairn.app.providers.base import ProviderError

    with AnthropicServer([rate_limited(retry_after=3)]) as s:
        with pytest.raises(ProviderError) as info:
            await collect(AnthropicProvider("m", base_url=s.base_url, api_key=KEY),
                          request({"role": "user", "content": "x"}))
    assert info.value.code == "HTTP_429" and info.value.retryable and info.value.retry_after == 3
    assert KEY not in str(info.value)


# -- the conversation ----------------------------------------------------------------------------------------------------


def test_the_converter_keeps_alternation_tool_results_first_and_safe_ids():
    thinking = "I should read it"
    system, messages = to_anthropic([
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": "ok", "reasoning_content": thinking,
         "reasoning_meta": {"anthropic_thinking": [{"signature": signature_for(thinking), "chars": len(thinking)}]},
         "tool_calls": [{"id": "c1-dup#2", "type": "function", "function": {"name": "read_file", "arguments": "{\"p\": 1}"}},
                        {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c1-dup#2", "content": "A"},
        {"role": "tool", "tool_call_id": "c2", "content": ""},
        {"role": "user", "content": "[Cairn recovery] note"},
    ])
    assert system == "sys" and [m["role"] for m in messages] == ["user", "assistant", "user"]
    assistant = messages[1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": thinking, "signature": signature_for(thinking)}
    assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use", "tool_use"]
    assert assistant[2]["id"] == "c1-dup_2" and assistant[2]["input"] == {"p": 1} and assistant[3]["input"] == {}
    results = messages[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[0]["tool_use_id"] == "c1-dup_2" and results[1]["content"] == "(no output)"
    assert violations({"max_tokens": 1, "messages": messages}, {"anthropic-version": "x"}) == []


def test_unsigned_thinking_is_not_sent_and_then_thinking_is_turned_off_for_that_request():
    provider = AnthropicProvider("m", base_url="http://127.0.0.1:9", api_key=KEY, thinking_budget=2048)
    body = provider.build_body(request(
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "reasoning_content": "from another provider",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "A"},
    ))
    assert body["messages"][1]["content"][0]["type"] == "tool_use" and "thinking" not in body
    fresh = provider.build_body(request({"role": "user", "content": "go"}))
    assert fresh["thinking"] == {"type": "enabled", "budget_tokens": 2048}


# -- whole turns ---------------------------------------------------------------------------------------------------------


async def test_a_thinking_signature_is_stored_and_sent_back_with_the_tool_result(tmp_path, monkeypatch):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("apple")
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", KEY)
    script = [tool_use([{"id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}}], thinking="Need a.txt"),
              message("It says apple.", thinking="Done")]
    with AnthropicServer(script, key=KEY) as s:
        config = profile_file(tmp_path, s, thinking_budget=2048)
        async with open_session(str(tmp_path / "ws"), home=str(tmp_path / "home"), config_file=str(config),
                                profile="claude") as agent:
            result = await agent.run("what is in a.txt?")
            events = list(agent.session.events)
        second = s.requests[1]
    assert result.reason == "completed" and result.text == "It says apple.", result
    assert s.refusals == []
    answer = next(e for e in events if type(e).__name__ == "AssistantMessage" and e.tool_calls)
    assert answer.reasoning == "Need a.txt"
    assert answer.reasoning_meta == {"anthropic_thinking": [{"signature": signature_for("Need a.txt"), "chars": 10}]}
    sent_back = second.body["messages"]
    assert sent_back[1]["content"][0] == {"type": "thinking", "thinking": "Need a.txt",
                                          "signature": signature_for("Need a.txt")}
    assert sent_back[2]["content"][0]["type"] == "tool_result" and sent_back[2]["content"][0]["content"] == "apple"
    headers = [e for e in events if type(e).__name__ == "RequestHeader"]
    assert {(h.provider, h.model) for h in headers} == {("anthropic", "claude-test")}


@pytest.mark.parametrize("failure", ["429", "529"])
async def test_rate_limits_and_overloads_are_retried_before_any_delta(tmp_path, failure):
    first = rate_limited(retry_after=0.05) if failure == "429" else overloaded()
    (tmp_path / "ws").mkdir()
    with AnthropicServer([first, message("after the retry")]) as s:
        async with open_session(str(tmp_path / "ws"), home=str(tmp_path / "home"), provider="anthropic",
                                base_url=s.base_url, api_key=KEY, model="claude-test") as agent:
            agent.loop.retry_base_delay = 0.01
            result = await agent.run("hi")
            retries = [e for e in agent.session.events if type(e).__name__ == "RequestRetry"]
    assert result.reason == "completed" and result.text == "after the retry"
    assert [(r.attempt, r.reason) for r in retries] == [(2, f"HTTP {failure}")]
    if failure == "429":
        assert retries[0].delay_ms == 50


# -- the real command ----------------------------------------------------------------------------------------------------


def cairn_env(tmp_path: Path, server: AnthropicServer) -> dict[str, str]:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "LANG": "C.UTF-8", "CAIRN_PROVIDER": "anthropic", "CAIRN_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": KEY, "CAIRN_MODEL": "claude-test"}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAIRN, *args], env=env, cwd=Path(env["HOME"]) / "ws", capture_output=True, text=True,
                          timeout=60)


def test_cairn_run_streams_the_answer_and_a_max_tokens_stop_is_exit_1(tmp_path):
    with AnthropicServer([message("Hi there", chunks=2), message("cut", stop_reason="max_tokens")]) as s:
        env = cairn_env(tmp_path, s)
        ok = run(env, "run", "hello")
        cut = run(env, "run", "--max-tokens", "3", "more")
    assert ok.returncode == 0 and ok.stdout == "Hi there\n", ok.stderr
    assert cut.returncode == 1 and "3" in cut.stderr and "--max-tokens" in cut.stderr, cut.stderr
    assert KEY not in ok.stderr + cut.stderr


def test_a_missing_anthropic_key_is_exit_2_naming_the_variable(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home")}
    proc = subprocess.run([CAIRN, "run", "--provider", "anthropic", "hi"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr and "Traceback" not in proc.stderr


def test_sigkill_mid_stream_then_resume_sends_a_conversation_the_api_accepts(tmp_path):
    script = [message("half of an answer that never ends", chunks=4, hold_after=4),
              message("resumed fine")]
    with AnthropicServer(script, key=KEY) as s:
        env = cairn_env(tmp_path, s)
        child = subprocess.Popen([CAIRN, "run", "--json", "tell me"], env=env, cwd=tmp_path / "ws",
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            s.wait_for_hold(1, timeout=30)
            first_line = child.stdout.readline()
            # the chunks already sent reach the log (write-behind) before the kill: the resume has half an answer
            store = SessionStore(tmp_path / "home")
            wait_sync(lambda: any(isinstance(e, AssistantChunk)
                                  for e in store.backend.load(json.loads(first_line)["id"]).events),
                      "the first chunk in the log", timeout=30)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
            child.stdout.close()
            child.stderr.close()
        session_id = json.loads(first_line)["id"]
        env.pop("CAIRN_PROVIDER")  # the resumed session keeps its own provider
        env.pop("CAIRN_MODEL")
        resumed = run(env, "run", "--resume", session_id, "go on")
        second = s.requests[1]
    assert resumed.returncode == 0 and resumed.stdout == "resumed fine\n", resumed.stderr
    assert s.refusals == []
    assert second.body["model"] == "claude-test"
    roles = [m["role"] for m in second.body["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))
