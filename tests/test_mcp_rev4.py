"""Issue 40, MCP (SPEC §8 rev 4): what a real server sends is what the model hears.

- A listed tool whose input schema is not an object's (`{"type": "string"}`) is left out — never rewritten to an empty
  object and offered — with one line naming the server and the tool, on every face: headless stderr (also when the
  servers start in the background), the composition's `report` (the TUI's notice), and ACP (an agent message).
- An answer holding a lone surrogate escape (a TypeScript server that cut a string mid-emoji) arrives at once, with
  U+FFFD in its place, over stdio and over HTTP; before, the SDK dropped it and the call waited for its time limit.
- A call to an HTTP server that is down when the call is made never reached it: its result says so (it did not run),
  while a server that dies during a call is still OUTCOME_UNKNOWN.

The servers are tests/mcp_raw_server.py (raw JSON-RPC, stdio or `--http PORT`).
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp_helpers import RecordingClient, agent_stderr, connect, rig_fixture, script_env
from crash_harness import Rig, json_lines, wait_until

from cairn.app.tools.mcp_wire import (
    STDIO_ENCODING,
    JsonTextDecoder as _JsonTextDecoder,
    register_codec as _register_codec,
    replace_lone_surrogates,
)

RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))
rig = pytest.fixture(rig_fixture, name="rig")

EMOJI_ANSWER = "cut \ufffd here, whole \U0001F600, escaped \\ud83d"  # what the model must read
STRINGY_LINE = ("MCP server `raw`: tool `stringy` left out: its input schema is not an object schema "
                "(type \"string\"), and a tool's arguments are always an object")


def stdio_table(extra: str = "") -> str:
    return (f"[mcp_servers.raw]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(RAW_SERVER)}]\n{extra}")


def configure(rig: Rig, table: str) -> dict[str, str]:
    path = rig.io / "config.toml"
    path.write_text(table)
    return {"CAIRN_CONFIG": str(path)}


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, RAW_SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_until(listening, "the HTTP MCP server to listen")
    return server


# ---------------------------------------------------------------------------------------------------- a schema


def test_a_tool_whose_schema_is_not_an_object_is_left_out_with_one_line_headless_new_and_resumed(rig):
    env = configure(rig, stdio_table())
    env.update(script_env(rig, [{"text": "hello"}, {"text": "again"}]))
    sid = None
    for args in (["run", "--json", "go"], None):
        if args is None:
            args = ["run", "--json", "--resume", sid, "go on"]
        proc = rig.run(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        events = json_lines(proc.stdout)
        sid = json.loads(proc.stdout.splitlines()[0])["id"]
        assert [line for line in proc.stderr.splitlines() if "stringy" in line] == [f"cairn: {STRINGY_LINE}"]
        tools = by_type(events, "request/header")[0]["tools"]
        assert "raw__stringy" not in tools and {"raw__good", "raw__emoji"} <= set(tools)  # the others stay


async def _report_lines(rig: Rig) -> tuple[list[str], list[str], list[str]]:
    from cairn.app.agent.approval import headless_approver
    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config

    env = rig.env(configure(rig, stdio_table()))
    env.update(script_env(rig, [{"text": "hi"}]))
    config = resolve_config(workspace=str(rig.ws), env=env)
    reported: list[str] = []
    # as the TUI and `cairn run` mount it: the servers start in the background and the first request waits for them
    async with open_agent(config, approver=headless_approver(False), report=reported.append,
                          mcp_background=True) as agent:
        await agent.run("hi")
        names = [t.name for t in agent.loop.tools]
        return reported, agent.mcp.left_out, names


@pytest.mark.anyio
async def test_the_left_out_line_reaches_report_when_servers_start_in_the_background(rig):
    reported, left_out, names = await _report_lines(rig)
    assert [line for line in reported if "stringy" in line] == [STRINGY_LINE]  # the TUI shows `report` as a notice
    assert STRINGY_LINE in left_out and "raw__stringy" not in names and "raw__good" in names


@pytest.mark.anyio
async def test_acp_names_the_left_out_tool_in_a_message_on_new_and_on_load(rig):
    env = configure(rig, stdio_table())
    env.update(script_env(rig, [{"text": "hi"}]))
    client = RecordingClient()
    async with connect(rig, client, env) as agent:
        sid = (await agent.conn.new_session(cwd=str(rig.ws))).session_id
        await agent.conn.prompt(session_id=sid, prompt=[{"type": "text", "text": "hi"}])
    said = [u.content.text for u in client.session_updates("agent_message_chunk")]
    assert [t for t in said if "stringy" in t] == [f"{STRINGY_LINE}. The server's other tools are available."]
    assert STRINGY_LINE in agent_stderr(rig)
    again = RecordingClient()
    async with connect(rig, again, env) as agent:
        await agent.conn.load_session(cwd=str(rig.ws), session_id=sid)
    said = [u.content.text for u in again.session_updates("agent_message_chunk")]
    assert [t for t in said if "stringy" in t] == [f"{STRINGY_LINE}. The server's other tools are available."]


def test_schema_problem_takes_object_schemas_and_refuses_the_rest():
    from cairn.app.tools.mcp_tools import input_schema as _schema, schema_problem

    assert schema_problem({"type": "object", "properties": {}}) is None
    assert schema_problem({}) is None  # no type: an object's (Cairn adds it)
    assert schema_problem({"type": ["object", "null"]}) is None
    assert _schema({"type": ["object", "null"], "properties": {"a": {}}}) == {"type": "object", "properties": {"a": {}}}
    for bad in ({"type": "string"}, {"type": "array"}, {"type": ["string", "null"]}, "not an object", None):
        assert schema_problem(bad) is not None, bad


# ---------------------------------------------------------------------------------------------------- lone surrogates


def test_an_answer_with_a_lone_surrogate_arrives_at_once_over_stdio(rig):
    env = configure(rig, stdio_table("call_timeout = 30\n"))
    env.update(script_env(rig, [{"tool_calls": [{"name": "raw__emoji", "arguments": {}}]}, {"text": "done"}]))
    proc = rig.run("run", "--json", "go", env=env)
    assert proc.returncode == 0, proc.stderr
    (result,) = by_type(json_lines(proc.stdout), "tool/result")
    # the answer itself, not the call_timeout's error: a dropped answer would have ended the call only by timing out
    assert (result["is_error"], result["content"]) == (False, EMOJI_ANSWER), result
    assert "Failed to parse" not in proc.stderr, proc.stderr  # nothing was dropped


def test_an_answer_with_a_lone_surrogate_arrives_at_once_over_http(rig):
    port = free_port()
    server = http_server(port)
    try:
        env = configure(rig, f'[mcp_servers.raw]\nurl = "http://127.0.0.1:{port}/mcp"\ncall_timeout = 30\n')
        env.update(script_env(rig, [{"tool_calls": [{"name": "raw__emoji", "arguments": {}}]}, {"text": "done"}]))
        proc = rig.run("run", "--json", "go", env=env)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr
    (result,) = by_type(json_lines(proc.stdout), "tool/result")
    assert (result["is_error"], result["content"]) == (False, EMOJI_ANSWER), result  # the answer, not the timeout


def test_lone_surrogate_escapes_are_replaced_wherever_a_chunk_ends():
    """Random strings of surrogate halves, backslashes, quotes and text, encoded as JSON the way a JavaScript server
    does (escapes), read back in random pieces: the JSON always parses, a well-formed pair stays whole, every lone
    half is U+FFFD, and an escaped backslash is never taken for an escape."""
    rng = random.Random(40)
    alphabet = ["a", "\\", "\n", "\ud83d", "\ude00", "\U0001F600", "é", '"', "u", "d", "8"]
    decoder = _JsonTextDecoder("replace")
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        sent = json.dumps(text)
        want = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        whole, held = replace_lone_surrogates(sent)
        assert held == "" and json.loads(whole) == want, (sent, whole)
        assert len(whole) == len(sent)  # same length: a Content-Length stays right
        data, pieces, at = sent.encode(), [], 0
        decoder.reset()
        while at < len(data):
            step = rng.randint(1, 7)
            pieces.append(decoder.decode(data[at:at + step]))
            at += step
        pieces.append(decoder.decode(b"", final=True))
        assert "".join(pieces) == whole
    _register_codec()
    assert b'"\\ud83d!"'.decode(STDIO_ENCODING, "replace") == '"\\ufffd!"'
    assert b"caf\xe9".decode(STDIO_ENCODING, "replace") == "caf\ufffd"  # invalid UTF-8: replaced as before


def test_a_message_boundary_is_never_held_back():
    """Only an escape cut by a chunk's end waits for the next chunk: a whole message (which ends outside any string)
    is handed on at once, so a line-reading transport never waits for bytes that are not coming."""
    for message in ('{"text": "a\\\\"}\n', '{"text": "\\ud83d"}\n', '{"t": "\\u00e9"}\n'):
        text, held = replace_lone_surrogates(message, final=False)
        assert held == "" and text.endswith("}\n"), message


# ---------------------------------------------------------------------------------------------------- a server down


async def _call_twice(rig: Rig, port: int, server: subprocess.Popen, kill_first: bool,
                      tool: str) -> list[Any]:
    from cairn.app.agent.approval import headless_approver
    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config
    from cairn.persistence.events import ToolResult

    env = rig.env(configure(rig, f'[mcp_servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\ncall_timeout = 30\n'))
    env.update(script_env(rig, [{"tool_calls": [{"name": f"web__{tool}", "arguments": {}}]},
                                {"tool_calls": [{"name": "web__good", "arguments": {"text": "again"}}]},
                                {"text": "done"}]))
    config = resolve_config(workspace=str(rig.ws), env=env)
    async with open_agent(config, approver=headless_approver(True)) as agent:
        (state,) = agent.mcp.states
        assert state.status == "ready", state
        if kill_first:  # down before the call is made
            server.kill()
            server.wait(timeout=10)
        with anyio.fail_after(60):
            await agent.run("go")
        return [e for e in agent.session.events if isinstance(e, ToolResult)]


@pytest.mark.anyio
async def test_a_call_to_an_http_server_that_is_already_down_says_it_never_reached_it(rig):
    port = free_port()
    server = http_server(port)
    try:
        first, second = await _call_twice(rig, port, server, True, "good")
    finally:
        server.kill()
        server.wait(timeout=10)
    assert first.is_error and first.error_code == "TOOL_ERROR", first
    assert "stopped while this call" not in first.content and "may or may not" not in first.content
    assert first.content.startswith("the MCP server `web` could not be reached (ConnectError"), first.content
    assert "was never sent and did not run" in first.content
    # the next call tries to start the server again, and says the same in its own words
    assert second.is_error and second.error_code == "TOOL_ERROR" and "`web__good` was not called" in second.content


@pytest.mark.anyio
async def test_an_http_server_that_dies_during_the_call_is_still_outcome_unknown(rig):
    port = free_port()
    server = http_server(port)
    try:
        first, second = await _call_twice(rig, port, server, False, "die")
    finally:
        server.kill()
        server.wait(timeout=10)
    assert first.error_code == "TOOL_OUTCOME_UNKNOWN", first
    assert "the MCP server `web` stopped while this call to `web__die` was running" in first.content
    assert second.is_error and "was not called" in second.content  # (the server is gone for good)


def test_a_stdio_server_that_exited_between_calls_is_started_again_before_the_next_call(rig):
    """The next call was never sent to the server that had gone (its connection had ended): not OUTCOME_UNKNOWN
    "stopped while this call was running", but a new server, and the call answered (SPEC §8)."""
    record = rig.io / "raw.jsonl"
    env = configure(rig, stdio_table(f"env = {{ MCP_RECORD = {json.dumps(str(record))} }}\n"))
    env.update(script_env(rig, [
        {"tool_calls": [{"name": "raw__quit", "arguments": {}}]},
        {"text": "then", "chunks": 2, "delay_ms": 300,  # the server's exit is seen before the next call is made
         "tool_calls": [{"name": "raw__good", "arguments": {"text": "again"}}]},
        {"text": "done"},
    ]))
    proc = rig.run("run", "--json", "go", env=env)
    assert proc.returncode == 0, proc.stderr
    bye, again = by_type(json_lines(proc.stdout), "tool/result")
    assert bye["content"] == "bye" and (again["is_error"], again["content"]) == (False, "ok again"), again
    pids = {json.loads(line)["pid"] for line in record.read_text().splitlines()}
    assert len(pids) == 2

