"""The `openai` provider against a real local HTTP server speaking the streaming protocol (tests/openai_server.py)."""

from __future__ import annotations

import base64
import email.utils
import json
import socket
import time

import anyio
import httpx
import pytest

from cairn.app.providers.base import (
    RETRYABLE_STATUSES,
    ModelRequest,
    ProviderError,
    RawToolCall,
    ReasoningDelta,
    StreamEnd,
    TextDelta,
    ToolSchema,
)
from cairn.app.providers.openai import OpenAIProvider, redact_url
from cairn.persistence.events import Usage
from openai_server import (
    OpenAIServer,
    close,
    cut_off,
    error,
    failing,
    hang,
    malformed,
    raw,
    stream_error,
    text,
    tool_calls,
)

pytestmark = pytest.mark.anyio

KEY = "sk-test-SECRET-0123456789abcdef"
TOOLS = [
    ToolSchema("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSchema("run_command", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}}),
]


def make_request(tools=(), params=None) -> ModelRequest:
    return ModelRequest(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        tools=list(tools),
        model="test-model",
        params=dict(params or {}),
    )


async def collect(provider: OpenAIProvider, request: ModelRequest | None = None) -> list:
    return [item async for item in provider.stream(request or make_request())]


async def failure(provider: OpenAIProvider, request: ModelRequest | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await collect(provider, request)
    return info.value


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


@pytest.fixture
async def provider(server):
    p = OpenAIProvider("test-model", base_url=server.base_url, api_key=KEY, timeout=5)
    yield p
    await p.aclose()


def assert_one_line_no_key(err: ProviderError) -> None:
    message = str(err)
    assert KEY not in message
    assert "\n" not in message and message.strip() == message and message


# --------------------------------------------------------------------------- streaming


async def test_text_deltas_in_order_then_one_stream_end(server, provider):
    server.push(text("Hello, streaming world!", chunks=5, usage=False))  # usage: see the usage tests
    items = await collect(provider)
    assert all(isinstance(i, TextDelta) for i in items[:-1])
    assert [i.text for i in items[:-1]] == ["Hello", ", str", "eamin", "g wo", "rld!"]
    assert items[-1] == StreamEnd(tool_calls=[], finish_reason="stop")


async def test_payloads_split_across_tcp_reads_and_sse_comments(server, provider):
    # every event is written in 13-byte pieces, so JSON payloads straddle reads; comments and event: lines are ignored
    server.push(text("naïve — ünïcode ✓ text", chunks=4, fragment=13, comments=True))
    items = await collect(provider)
    assert "".join(i.text for i in items[:-1]) == "naïve — ünïcode ✓ text"
    assert isinstance(items[-1], StreamEnd)


@pytest.mark.parametrize("interleave", ["sequential", "round_robin", "same_chunk"])
async def test_tool_call_deltas_assemble(server, provider, interleave):
    args_a = {"path": "src/app.py"}
    args_b = {"command": "echo 'hello world' && ls -la /tmp"}
    server.push(
        tool_calls(
            [
                {"id": "call_A", "name": "read_file", "arguments": args_a},
                {"id": "call_B", "name": "run_command", "arguments": args_b},
            ],
            text="Let me look.",
            arg_chunks=5,
            interleave=interleave,
        )
    )
    items = await collect(provider, make_request(TOOLS))
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "Let me look."
    end = items[-1]
    assert isinstance(end, StreamEnd) and end.finish_reason == "tool_calls"
    assert [type(i) for i in items].count(StreamEnd) == 1
    assert end.tool_calls == [
        RawToolCall("call_A", "read_file", json.dumps(args_a)),
        RawToolCall("call_B", "run_command", json.dumps(args_b)),
    ]


async def test_tool_call_without_id_gets_one_and_invalid_json_is_kept_raw(server, provider):
    server.push(
        tool_calls(
            [
                {"id": None, "name": "read_file", "arguments": '{"path": "a"}'},
                {"id": None, "name": "read_file", "arguments": '{"path": '},
                {"id": "call_X", "name": "list_dir", "arguments": ""},
            ]
        )
    )
    end = (await collect(provider))[-1]
    first, second, third = end.tool_calls
    assert first.call_id.startswith("call_") and second.call_id.startswith("call_") and first.call_id != second.call_id
    assert (first.name, first.arguments) == ("read_file", '{"path": "a"}')
    assert second.arguments == '{"path": '  # invalid JSON reaches the loop as sent
    assert third == RawToolCall("call_X", "list_dir", "{}")  # empty arguments → "{}"


async def test_request_body_and_auth_header(server, provider):
    server.push(text("ok"))
    provider.params = {"temperature": 0.5}
    await collect(provider, make_request(TOOLS, params={"max_tokens": 7}))
    req = server.wait_for_requests(1)
    assert req.method == "POST" and req.path == "/v1/chat/completions"
    assert req.header("authorization") == f"Bearer {KEY}"
    assert req.header("content-type") == "application/json"
    body = req.body
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["messages"] == make_request().messages
    assert body["temperature"] == 0.5 and body["max_tokens"] == 7
    assert body["tools"] == [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS
    ]
    assert KEY not in req.raw.decode()  # the key is only in the header


async def test_no_key_no_authorization_header_and_no_empty_tools(server):
    server.push(text("ok"))
    p = OpenAIProvider("local-model", base_url=server.base_url + "/")  # trailing slash tolerated
    try:
        await collect(p, make_request())
    finally:
        await p.aclose()
    req = server.wait_for_requests(1)
    assert req.path == "/v1/chat/completions"
    assert req.header("authorization") is None
    assert "tools" not in req.body


async def test_client_built_at_construction_but_nothing_contacted_until_iterated(server, provider):
    """rev 2: the client is built in the constructor (the first request paid ~40 ms for it), yet neither building it
    nor calling stream() opens a connection; the request starts on the first iteration."""
    server.push(text("late", usage=False))
    client = provider._client
    assert isinstance(client, httpx.AsyncClient) and not client.is_closed
    gen = provider.stream(make_request())
    await anyio.sleep(0.2)
    assert server.requests == []
    items = [item async for item in gen]
    assert provider._client is client
    assert items[-1] == StreamEnd([], "stop")
    assert len(server.requests) == 1


async def test_client_is_reused_and_closed(server, provider):
    server.push(text("one"), text("two"))
    assert (await collect(provider))[0] == TextDelta("one")
    client = provider._client
    assert (await collect(provider))[0] == TextDelta("two")
    assert provider._client is client
    await provider.aclose()
    assert provider._client is None and client.is_closed


async def test_non_streaming_json_answer_is_accepted(server, provider):
    answer = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "whole",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    server.push(raw([json.dumps(answer)], content_type="application/json"))
    items = await collect(provider)
    assert items == [TextDelta("whole"), StreamEnd([RawToolCall("c1", "f", "{}")], "tool_calls")]


async def test_early_break_closes_cleanly(server, provider):
    server.push(text("abcdef", chunks=6, hold_after=3))
    gen = provider.stream(make_request())
    first = await gen.__anext__()
    assert first == TextDelta("a")
    await gen.aclose()  # the consumer stops (e.g. cancellation) while the server still holds the stream
    server.release()
    server.push(text("next"))
    assert (await collect(provider))[0] == TextDelta("next")


async def test_cancellation_while_waiting_is_not_a_provider_error(server, provider):
    server.push(hang())
    with anyio.move_on_after(0.3) as scope:
        await collect(provider)  # provider timeout is 5 s; the caller's cancellation wins and propagates as-is
    assert scope.cancelled_caught  # (had the provider's timeout come first, its ProviderError would have propagated)
    server.release()
    server.push(text("after"))
    assert (await collect(provider))[0] == TextDelta("after")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "status,message",
    [(429, "Rate limit reached for requests"), (500, "The server had an error while processing your request")],
)
async def test_http_errors(server, provider, status, message):
    server.push(error(status, message))
    err = await failure(provider)
    assert err.code == f"HTTP_{status}"
    assert str(status) in str(err) and message in str(err)
    assert_one_line_no_key(err)


async def test_http_error_message_is_truncated_and_plain_text_bodies_work(server, provider):
    server.push(error(400, "x" * 5000), error(502, body_text="<html>\n<b>Bad gateway</b>\n</html>"))
    err = await failure(provider)
    assert err.code == "HTTP_400" and len(str(err)) < 400
    err = await failure(provider)
    assert err.code == "HTTP_502" and "Bad gateway" in str(err)
    assert_one_line_no_key(err)


async def test_hung_connection_times_out(server):
    server.push(hang())
    p = OpenAIProvider("m", base_url=server.base_url, api_key=KEY, timeout=0.5)
    try:
        with anyio.fail_after(30):  # the server never answers: only the provider's own timeout ends this
            err = await failure(p)
    finally:
        await p.aclose()
    assert err.code == "TIMEOUT" and "timed out" in str(err) and "0.5s" in str(err)
    assert_one_line_no_key(err)


async def test_stream_that_hangs_midway_times_out(server):
    server.push(text("abcdef", chunks=6, hold_after=2))
    p = OpenAIProvider("m", base_url=server.base_url, api_key=KEY, timeout=0.5)
    received = []
    try:
        with anyio.fail_after(30), pytest.raises(ProviderError) as info:  # the server holds the rest for good
            async for item in p.stream(make_request()):
                received.append(item)
    finally:
        await p.aclose()
    assert received == [TextDelta("a")]  # role chunk + "a" were sent before the hold
    assert info.value.code == "TIMEOUT" and "middle of the answer" in str(info.value)


@pytest.mark.parametrize(
    "behaviour,expected",
    [
        (malformed(), "not JSON"),
        (raw(['data: {"id": "x", "object": "chat.completion.chunk"}', "", "data: [DONE]", ""]), "no choices"),
        (text("cut", finish_reason=None, done=False), "ended before [DONE]"),
        (raw(["data: [1, 2]", ""]), "not a JSON object"),
    ],
    ids=["not-json", "missing-choices", "no-done-no-finish", "not-object"],
)
async def test_malformed_streams(server, provider, behaviour, expected):
    server.push(behaviour)
    err = await failure(provider)
    assert err.code == "MALFORMED_STREAM" and expected in str(err)
    assert_one_line_no_key(err)


async def test_sse_framing_variants(server, provider):
    """`data:` without a space, events not separated by blank lines, CRLF line ends, multi-line data, [DONE]."""
    def chunk(delta, finish=None):
        return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    server.push(
        raw(
            [
                "event: completion\r",
                "data:" + chunk({"content": "a"}) + "\r",
                "data: " + chunk({"content": "b"}),
                "id: 7",
                "",
                'data: {"choices": [{"index": 0,',
                'data:  "delta": {"content": "c"}}]}',
                "",
                "data: " + chunk({}, "stop"),
                "data: [DONE]",
            ]
        )
    )
    assert await collect(provider) == [TextDelta("a"), TextDelta("b"), TextDelta("c"), StreamEnd([], "stop")]


async def test_stream_without_done_but_with_finish_reason_is_accepted(server, provider):
    server.push(text("fine", done=False, usage=False))
    assert await collect(provider) == [TextDelta("fine"), StreamEnd([], "stop")]


async def test_connection_closed_mid_stream(server, provider):
    server.push(close("abcdef", chunks=6, after=3))
    received = []
    with pytest.raises(ProviderError) as info:
        async for item in provider.stream(make_request()):
            received.append(item)
    assert received == [TextDelta("a"), TextDelta("b")]
    assert info.value.code == "CONNECTION_LOST" and "mid-stream" in str(info.value)


async def test_connection_refused():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    p = OpenAIProvider("m", base_url=base_url, api_key=KEY, timeout=2)
    try:
        err = await failure(p)
    finally:
        await p.aclose()
    assert err.code == "CONNECT" and f"cannot reach {base_url}" in str(err)
    assert_one_line_no_key(err)


async def test_error_inside_stream(server, provider):
    server.push(raw(['data: {"error": {"message": "overloaded, try later"}}', ""]))
    err = await failure(provider)
    assert err.code == "STREAM_ERROR" and "overloaded, try later" in str(err)


async def test_api_key_is_scrubbed_from_every_error(server, provider):
    server.push(
        error(401, "Incorrect API key provided", echo_auth=True),
        error(500, body_text=f"upstream said: key={KEY}"),
        raw([f"data: {{not json {KEY}", ""]),
        raw([json.dumps({"error": {"message": f"bad key {KEY}"}}).join(["data: ", ""]), ""]),
    )
    errors = [await failure(provider) for _ in range(4)]
    assert [e.code for e in errors] == ["HTTP_401", "HTTP_500", "MALFORMED_STREAM", "STREAM_ERROR"]
    # the server really echoed it: the recorded header carries the key
    assert server.requests[0].header("authorization") == f"Bearer {KEY}"
    for err in errors:
        assert_one_line_no_key(err)
        assert KEY not in repr(err) and KEY not in str(err.args)
    assert "Bearer ***" in str(errors[0]) and "Incorrect API key provided" in str(errors[0])
    assert "***" in str(errors[1]) and "***" in str(errors[3])
    assert KEY not in repr(provider)


async def test_server_script_exhausted_is_a_clear_500(server, provider):
    err = await failure(provider)
    assert err.code == "HTTP_500" and "script exhausted" in str(err)


# --------------------------------------------------------------------------- the test server itself


def test_server_standalone_mode(tmp_path):
    """`python tests/openai_server.py --script F --port-file P` serves the script out of process."""
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [text("hi there", chunks=2, hold_after=1)]}))
    port_file, markers, release = tmp_path / "port", tmp_path / "markers.jsonl", tmp_path / "release"
    server_py = Path(__file__).with_name("openai_server.py")
    proc = subprocess.Popen(
        [sys.executable, str(server_py), "--script", str(script), "--port-file", str(port_file),
         "--marker-file", str(markers), "--release-file", str(release)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1/chat/completions"
        with httpx.Client(timeout=5) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            with client.stream("POST", url, json=body) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")  # the role chunk, sent before the hold
                while "held" not in (markers.read_text() if markers.exists() else ""):
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                release.touch()
                rest = "\n".join(lines)
        assert '"hi t"' in rest and '"here"' in rest and "data: [DONE]" in rest
        events = [json.loads(line)["event"] for line in markers.read_text().splitlines()]
        assert events == ["request", "held"]
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_server_hooks_in_process():
    """wait_for_requests / wait_for_hold / release, as a crash harness would use them."""
    import threading

    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with OpenAIServer([text("abc", chunks=3, hold_after=2)]) as s:
        result = {}

        def client():
            with httpx.Client(timeout=5) as c:
                result["body"] = c.post(s.base_url + "/chat/completions", json=body).text

        t = threading.Thread(target=client)
        t.start()
        req = s.wait_for_requests(1, timeout=5)
        assert req.body == body
        s.wait_for_hold(1, timeout=5)
        assert "body" not in result
        s.release()
        t.join(5)
        assert result["body"].count("data: ") == 6  # role, 3 text pieces, finish, [DONE]


# --------------------------------------------------------------------------- rev 2: finish reasons


@pytest.mark.parametrize(
    "sent,expected",
    [("stop", "stop"), ("eos", "stop"), ("end_turn", "stop"), ("tool_calls", "tool_calls"),
     ("function_call", "tool_calls"), ("length", "length"), ("content_filter", "content_filter"),
     ("something_new", "other")],
)
async def test_finish_reason_is_normalised(server, provider, sent, expected):
    server.push(text("x", finish_reason=sent, usage=False))
    assert (await collect(provider))[-1] == StreamEnd([], expected)


async def test_done_without_finish_reason_ends_with_finish_reason_none(server, provider):
    server.push(text("said", finish_reason=None, done=True, usage=False))
    assert await collect(provider) == [TextDelta("said"), StreamEnd([], None)]


async def test_length_cut_inside_tool_arguments_ends_with_length_and_the_partial_call(server, provider):
    calls = [{"id": "call_1", "name": "write_file", "arguments": {"path": "a.txt", "content": "x" * 50}},
             {"id": "call_2", "name": "read_file", "arguments": {"path": "b.txt"}}]
    server.push(cut_off(calls, keep=20, text="Writing."))
    end = (await collect(provider, make_request(TOOLS)))[-1]
    assert end.finish_reason == "length"
    assert end.tool_calls == [RawToolCall("call_1", "write_file", json.dumps(calls[0]["arguments"])[:20])]


async def test_repeated_tool_call_ids_are_passed_on_as_sent(server, provider):
    server.push(tool_calls([{"id": "call_1", "name": "read_file", "arguments": {"path": "a"}},
                            {"id": "call_1", "name": "read_file", "arguments": {"path": "b"}}]))
    end = (await collect(provider, make_request(TOOLS)))[-1]
    pairs = [(c.call_id, c.arguments) for c in end.tool_calls]
    assert pairs == [("call_1", '{"path": "a"}'), ("call_1", '{"path": "b"}')]  # the loop makes ids unique


# --------------------------------------------------------------------------- rev 2: reasoning


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_streams_before_text_and_tool_calls(server, provider, field):
    server.push(tool_calls([{"id": "call_1", "name": "read_file", "arguments": {"path": "a"}}], text="Looking.",
                           reasoning="The user wants a. Read it.", reasoning_chunks=3, reasoning_field=field))
    items = await collect(provider, make_request(TOOLS))
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["ReasoningDelta"] * 3 + ["TextDelta", "StreamEnd"]
    assert "".join(i.text for i in items[:3]) == "The user wants a. Read it."
    assert items[-1].tool_calls == [RawToolCall("call_1", "read_file", '{"path": "a"}')]


async def test_reasoning_content_wins_when_a_delta_carries_both(server, provider):
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": "think", "reasoning": "think"}}]}
    server.push(raw(["data: " + json.dumps(chunk), "",
                     "data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), "",
                     "data: [DONE]", ""]))
    assert await collect(provider) == [ReasoningDelta("think"), StreamEnd([], "stop")]


async def test_non_streaming_answer_with_reasoning_and_usage(server, provider):
    answer = {
        "choices": [{"index": 0, "finish_reason": "eos",
                     "message": {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 3}},
    }
    server.push(raw([json.dumps(answer)], content_type="application/json"))
    assert await collect(provider) == [
        ReasoningDelta("6 times 7"), TextDelta("42"),
        StreamEnd([], "stop", usage=Usage(input_tokens=11, output_tokens=5, reasoning_tokens=3)),
    ]


async def test_assistant_reasoning_content_is_sent_back_unchanged_and_satisfies_deepseek(server, provider):
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
    messages = [
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "Read a first."},
        {"role": "tool", "tool_call_id": "call_1", "content": "alpha"},
    ]
    server.push(text("It says alpha.", require_reasoning=True))
    request = ModelRequest(messages=messages, tools=TOOLS, model="test-model")
    assert (await collect(provider, request))[0] == TextDelta("It says alpha.")
    assert server.requests[0].body["messages"] == messages and server.refusals == []


# --------------------------------------------------------------------------- rev 2: usage


async def test_usage_chunk_after_the_finish_chunk_is_parsed(server, provider):
    usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
             "prompt_tokens_details": {"cached_tokens": 100}, "completion_tokens_details": {"reasoning_tokens": 12}}
    server.push(text("counted", usage=usage))
    items = await collect(provider)
    assert server.requests[0].body["stream_options"] == {"include_usage": True}
    assert items[-1] == StreamEnd([], "stop", usage=Usage(120, 30, 100, 12))


async def test_usage_on_the_finish_chunk_with_missing_counts_as_none(server, provider):
    server.push(text("counted", usage={"prompt_tokens": 9, "completion_tokens": 2}, usage_in_finish=True))
    assert (await collect(provider))[-1].usage == Usage(input_tokens=9, output_tokens=2)


async def test_include_usage_false_sends_no_stream_options(server):
    server.push(text("plain"))
    p = OpenAIProvider("m", base_url=server.base_url, include_usage=False)
    try:
        items = await collect(p)
    finally:
        await p.aclose()
    assert "stream_options" not in server.requests[0].body
    assert items[-1] == StreamEnd([], "stop", usage=None)


# --------------------------------------------------------------------------- rev 2: parameters


async def test_only_parameters_that_are_set_are_sent(server):
    server.push(text("a"), text("b"), text("c"))
    full = OpenAIProvider(
        "m", base_url=server.base_url, max_tokens=100, temperature=0.2, top_p=0.9, reasoning_effort="low",
        tool_choice="auto", parallel_tool_calls=False, extra_headers={"X-Title": "cairn"},
        extra_body={"seed": 7, "top_k": 20}, params={"presence_penalty": 0.1},
    )
    bare = OpenAIProvider("m", base_url=server.base_url, max_tokens=None)
    try:
        await collect(full, make_request(TOOLS))
        await collect(full, make_request())  # no tools: tool_choice / parallel_tool_calls would be refused
        await collect(OpenAIProvider("m", base_url=server.base_url), make_request())
        server.push(text("d"))
        await collect(bare, make_request())
    finally:
        await full.aclose()
        await bare.aclose()
    with_tools, without_tools, default, nothing = (r.body for r in server.requests)
    assert {k: with_tools[k] for k in ("max_tokens", "temperature", "top_p", "reasoning_effort", "tool_choice",
                                       "parallel_tool_calls", "seed", "top_k", "presence_penalty")} == {
        "max_tokens": 100, "temperature": 0.2, "top_p": 0.9, "reasoning_effort": "low", "tool_choice": "auto",
        "parallel_tool_calls": False, "seed": 7, "top_k": 20, "presence_penalty": 0.1}
    assert server.requests[0].header("x-title") == "cairn"
    assert "tool_choice" not in without_tools and "parallel_tool_calls" not in without_tools
    assert default["max_tokens"] == 8192
    core = {"model", "messages", "stream", "stream_options", "max_tokens"}
    assert set(default) == core and set(nothing) == core - {"max_tokens"}


# --------------------------------------------------------------------------- rev 2: retry information


@pytest.mark.parametrize("status", sorted(RETRYABLE_STATUSES))
async def test_retryable_statuses_carry_retry_after(server, provider, status):
    server.push(error(status, "busy", headers={"Retry-After": "7"}))
    err = await failure(provider)
    assert (err.code, err.retryable, err.retry_after) == (f"HTTP_{status}", True, 7.0)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_statuses_are_not_retryable(server, provider, status):
    server.push(error(status, "no"))
    err = await failure(provider)
    assert (err.code, err.retryable, err.retry_after) == (f"HTTP_{status}", False, None)


async def test_retry_after_as_http_date_is_capped_and_garbage_ignored(server, provider):
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.push(error(429, headers={"Retry-After": soon}), error(503, headers={"Retry-After": "3600"}),
                error(503, headers={"Retry-After": "soon-ish"}), error(429, headers={"retry-after-ms": "1500"}))
    first, second, third, fourth = [await failure(provider) for _ in range(4)]
    assert 25 <= first.retry_after <= 30
    assert second.retry_after == 60.0 and third.retry_after is None and fourth.retry_after == 1.5



async def test_litellms_relayed_retry_after_is_honoured_like_the_servers_own(server, provider):
    """LiteLLM passes the upstream's `Retry-After` on as `llm_provider-retry-after` (and `-ms`): the same wait."""
    server.push(error(429, headers={"llm_provider-retry-after": "7"}), error(503, headers={
        "llm_provider-retry-after-ms": "2500"}), error(429, headers={"llm_provider-retry-after": "3600"}),
        error(429, headers={"Retry-After": "2", "llm_provider-retry-after": "9"}))
    relayed, relayed_ms, capped, own = [await failure(provider) for _ in range(4)]
    assert (relayed.retry_after, relayed_ms.retry_after, capped.retry_after) == (7.0, 2.5, 60.0)
    assert own.retry_after == 2.0  # the proxy's own word comes first

async def test_failing_then_success_script(server, provider):
    server.push(*failing(503, 2, text("finally"), retry_after=1))
    errors = [await failure(provider) for _ in range(2)]
    assert [(e.code, e.retryable, e.retry_after) for e in errors] == [("HTTP_503", True, 1.0)] * 2
    assert (await collect(provider))[0] == TextDelta("finally")


async def test_connection_lost_before_the_first_chunk_is_retryable(server, provider):
    server.release()  # the hang ends at once: the server closes the connection without answering
    server.push(hang())
    err = await failure(provider)
    assert err.code == "CONNECTION_LOST" and "before answering" in str(err) and err.retryable


async def test_errors_after_the_first_delta_are_not_retryable(server, provider):
    server.push(close("abcdef", chunks=6, after=3), stream_error("abcdef", chunks=6, after=2, status=503))
    for code in ("CONNECTION_LOST", "STREAM_ERROR"):
        received = []
        with pytest.raises(ProviderError) as info:
            async for item in provider.stream(make_request()):
                received.append(item)
        assert received and received[0] == TextDelta("a")
        assert info.value.code == code and info.value.retryable is False


async def test_stream_error_before_any_chunk_with_a_retryable_code_is_retryable(server, provider):
    server.push(stream_error("abc", after=0, status=529, message="overloaded"))
    err = await failure(provider)
    assert err.code == "STREAM_ERROR" and "overloaded" in str(err) and err.retryable


async def test_timeouts_are_retryable_only_before_the_answer_starts(server):
    server.push(hang(), text("abcdef", chunks=6, hold_after=2))
    p = OpenAIProvider("m", base_url=server.base_url, timeout=0.3)
    try:
        before = await failure(p)
        with pytest.raises(ProviderError) as info:
            async for _ in p.stream(make_request()):
                pass
    finally:
        await p.aclose()
        server.release()
    assert before.code == "TIMEOUT" and before.retryable
    assert info.value.code == "TIMEOUT" and not info.value.retryable


async def test_connect_failure_is_retryable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=2)
    try:
        err = await failure(p)
    finally:
        await p.aclose()
    assert err.code == "CONNECT" and err.retryable and err.retry_after is None


# --------------------------------------------------------------------------- rev 2: secrets in the base URL


@pytest.mark.parametrize(
    "url,shown",
    [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("https://me:hunter2secret@api.example.com/v1", "https://***@api.example.com/v1"),
        ("https://tok3n-only@api.example.com/v1", "https://***@api.example.com/v1"),
        ("https://x.azure.com/openai/deployments/d?api-version=2024-06-01&api-key=abc123",
         "https://x.azure.com/openai/deployments/d?api-version=2024-06-01&api-key=***"),
        ("https://h/v1?key=K&token=T&access_token=A&sig=S&signature=G&password=P&api_key=Q&keep=1",
         "https://h/v1?key=***&token=***&access_token=***&sig=***&signature=***&password=***&api_key=***&keep=1"),
        ("http://[::1/v1?key=abc", "***"),  # not even parseable: hide it all
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


async def test_url_credentials_are_used_but_never_shown(server):
    user_secret, query_secret = "pa55word-SECRET", "QUERY-SECRET-99"
    base = server.base_url.replace("http://", f"http://alice:{user_secret}@") + f"?api-version=1&api-key={query_secret}"
    server.push(error(500, body_text=f"upstream: you sent {user_secret} and {query_secret} and {KEY}"), text("ok"))
    p = OpenAIProvider("m", base_url=base, api_key=KEY)
    try:
        err = await failure(p)
        await collect(p)
    finally:
        await p.aclose()
    for secret in (user_secret, query_secret, KEY):
        assert secret not in str(err) and secret not in repr(p)
    assert "http://***@127.0.0.1" in str(err) and "api-key=***" in str(err) and "api-version=1" in str(err)
    sent = server.requests[1]
    assert sent.path == f"/v1/chat/completions?api-version=1&api-key={query_secret}"  # the query string is kept
    assert sent.header("authorization") == "Basic " + base64.b64encode(f"alice:{user_secret}".encode()).decode()
    assert set(p.secrets) >= {KEY, user_secret, query_secret} and "alice" not in p.secrets


def test_secrets_include_auth_like_extra_headers_only():
    p = OpenAIProvider("m", base_url="http://h/v1", extra_headers={"api-key": "azure-key-123", "X-Title": "cairn"})
    assert p.secrets == ["azure-key-123"]


# --------------------------------------------------------------------------- strict test server


def tool_call(call_id: str, arguments: str = '{"path": "a"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}


def assistant_calls(*calls: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def tool_message(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "alpha"}


USER = {"role": "user", "content": "hi"}
STRICT_CASES = [
    ("alternation", [USER, USER], {}, 400, "Conversation roles must alternate user/assistant/user/assistant/..."),
    ("first_not_user", [{"role": "assistant", "content": "hello"}, USER], {}, 400,
     "Conversation roles must alternate"),
    ("bad_arguments", [USER, assistant_calls(tool_call("c1", '{"path": ')), tool_message("c1")], {}, 500,
     "Failed to parse tool call arguments as JSON"),
    ("unanswered_tool_call", [USER, assistant_calls(tool_call("c1")), USER], {}, 400,
     "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'"),
    ("orphan_tool_message", [USER, tool_message("c9")], {}, 400, "must be followed by tool messages"),
    ("duplicate_id", [USER, assistant_calls(tool_call("c1"), tool_call("c1")), tool_message("c1"), tool_message("c1")],
     {}, 400, "must be followed by tool messages"),
    ("missing_reasoning", [USER, assistant_calls(tool_call("c1")), tool_message("c1")], {"require_reasoning": True},
     400, "Missing `reasoning_content` field in the assistant message at message index 1"),
]


@pytest.mark.parametrize("kind,messages,options,status,wording", STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
async def test_strict_server_refuses_like_real_servers(server, provider, kind, messages, options, status, wording):
    server.push(text("scripted answer", **options))
    err = await failure(provider, ModelRequest(messages=messages, tools=TOOLS, model="test-model"))
    assert err.code == f"HTTP_{status}" and wording in str(err)
    refused = server.requests[0]
    assert server.refusals == [refused] and refused.refused == status and refused.body["messages"] == messages
    assert kind in {v.kind for v in refused.violations}
    # the refusal used up nothing: a valid conversation now gets the scripted answer
    assert (await collect(provider))[0] == TextDelta("scripted answer")


async def test_strict_mode_can_be_turned_off_per_server_or_per_answer(server, provider):
    bad = ModelRequest(messages=[USER, USER], tools=[], model="test-model")
    server.push(text("lenient", strict=False))
    assert (await collect(provider, bad))[0] == TextDelta("lenient")
    with OpenAIServer([text("anything goes")], strict=False) as lenient:
        p = OpenAIProvider("m", base_url=lenient.base_url)
        try:
            assert (await collect(p, bad))[0] == TextDelta("anything goes")
        finally:
            await p.aclose()
        assert lenient.refusals == []
