"""The `openai` provider against a real local HTTP server speaking the streaming protocol (tests/openai_server.py)."""

from __future__ import annotations

import json
import socket
import time

import anyio
import pytest

from cairn.app.providers.base import ModelRequest, ProviderError, RawToolCall, StreamEnd, TextDelta, ToolSchema
from cairn.app.providers.openai import OpenAIProvider
from openai_server import OpenAIServer, close, error, hang, malformed, raw, text, tool_calls

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
    server.push(text("Hello, streaming world!", chunks=5))
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


async def test_stream_call_contacts_nothing_until_iterated(server, provider):
    server.push(text("late"))
    gen = provider.stream(make_request())
    await anyio.sleep(0.2)
    assert server.requests == []
    assert provider._client is None  # the client is created lazily, on the first iteration
    items = [item async for item in gen]
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
    start = time.monotonic()
    with anyio.move_on_after(0.3) as scope:
        await collect(provider)  # provider timeout is 5 s; the caller's cancellation wins and propagates as-is
    assert scope.cancelled_caught and time.monotonic() - start < 2
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
    start = time.monotonic()
    try:
        err = await failure(p)
    finally:
        await p.aclose()
    assert time.monotonic() - start < 3
    assert err.code == "TIMEOUT" and "timed out" in str(err) and "0.5s" in str(err)
    assert_one_line_no_key(err)


async def test_stream_that_hangs_midway_times_out(server):
    server.push(text("abcdef", chunks=6, hold_after=2))
    p = OpenAIProvider("m", base_url=server.base_url, api_key=KEY, timeout=0.5)
    received = []
    start = time.monotonic()
    try:
        with pytest.raises(ProviderError) as info:
            async for item in p.stream(make_request()):
                received.append(item)
    finally:
        await p.aclose()
    assert time.monotonic() - start < 3
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
    server.push(text("fine", done=False))
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
            with client.stream("POST", url, json={"model": "m", "messages": [], "stream": True}) as response:
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

    with OpenAIServer([text("abc", chunks=3, hold_after=2)]) as s:
        result = {}

        def client():
            with httpx.Client(timeout=5) as c:
                result["body"] = c.post(s.base_url + "/chat/completions", json={"model": "m"}).text

        t = threading.Thread(target=client)
        t.start()
        req = s.wait_for_requests(1, timeout=5)
        assert req.body == {"model": "m"}
        s.wait_for_hold(1, timeout=5)
        assert "body" not in result
        s.release()
        t.join(5)
        assert result["body"].count("data: ") == 6  # role, 3 text pieces, finish, [DONE]
