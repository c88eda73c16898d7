"""MCP tools with crash-safe semantics (issue 15): a real stdio MCP server (tests/mcp_server.py, written with the same
`mcp` package) driven through `cairn run`, the composition and `cairn acp`.

What is checked: annotations become safety classes (and a config override wins); approvals follow the class; the
call_id arrives as the idempotency key; output is text, with images summarised and size bounded; a server that fails
or hangs at start leaves the session working; a server that dies mid-call gives an error result at once; a cancel
reaches the server; SIGKILL during a slow call is OUTCOME_UNKNOWN with the advice of the class; the ordered teardown
(and a SIGKILL) leaves no server process; and without MCP configured, start-up imports nothing of it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from acp_helpers import RecordingClient, agent_stderr, connect, prompt, rig_fixture, script_env, wait_for
from crash_harness import Rig, json_lines, wait_until
from waiting import alive

from cairn.app.config.file import ConfigFileError, read_config_file
from cairn.app.config.resolver import ConfigError, resolve_config
from cairn.app.tools.mcp_tools import exposed_name, render_result, safety_from_annotations

SERVER = str(Path(__file__).with_name("mcp_server.py"))
rig = pytest.fixture(rig_fixture, name="rig")


# ---------------------------------------------------------------------------------------------------- helpers


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def server_table(name: str, *extra_args: str, record: Path | None = None, more: str = "") -> str:
    args = ", ".join(toml_string(a) for a in (SERVER, *extra_args))
    env = f"env = {{ MCP_RECORD = {toml_string(str(record))} }}\n" if record else ""
    return f"[mcp_servers.{name}]\ncommand = {toml_string(sys.executable)}\nargs = [{args}]\n{env}{more}\n"


def configure(rig: Rig, *tables: str) -> dict[str, str]:
    path = rig.io / "config.toml"
    path.write_text("".join(tables))
    return {"CAIRN_CONFIG": str(path)}


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls(responses_calls: list[tuple[str, dict]]) -> list[dict]:
    return [{"tool_calls": [{"name": n, "arguments": a} for n, a in responses_calls]}, {"text": "done"}]


def run_json(rig: Rig, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = rig.run("run", "--json", *args, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json_lines(proc.stdout)


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def result_of(events: list[dict], call_id: str) -> dict:
    return next(e for e in by_type(events, "tool/result") if e["call_id"] == call_id)


# ---------------------------------------------------------------------------------------------------- units


def test_annotations_map_to_safety_classes_with_side_effecting_as_the_default():
    from mcp.types import ToolAnnotations

    assert safety_from_annotations(ToolAnnotations(read_only_hint=True)) == "read_only"
    assert safety_from_annotations(ToolAnnotations(read_only_hint=True, idempotent_hint=True)) == "read_only"
    assert safety_from_annotations(ToolAnnotations(idempotent_hint=True)) == "idempotent"
    assert safety_from_annotations(ToolAnnotations(idempotent_hint=True, destructive_hint=True)) == "idempotent"
    assert safety_from_annotations(ToolAnnotations(destructive_hint=True)) == "side_effecting"
    assert safety_from_annotations(ToolAnnotations(destructive_hint=False)) == "side_effecting"
    assert safety_from_annotations(ToolAnnotations(read_only_hint=False)) == "side_effecting"
    assert safety_from_annotations(None) == "side_effecting"
    assert exposed_name("gh", "issues.create") == "gh__issues_create"
    assert len(exposed_name("gh", "x" * 100)) == 64


def test_results_keep_text_and_summarise_images_and_binary_resources():
    from mcp.types import (
        BlobResourceContents,
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        TextContent,
        TextResourceContents,
    )

    result = CallToolResult(content=[
        TextContent(type="text", text="hello"),
        ImageContent(type="image", data="A" * 4000, mime_type="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///a.txt", text="inside")),
        EmbeddedResource(type="resource", resource=BlobResourceContents(uri="file:///b.bin", blob="AAAA")),
    ])
    text = render_result(result)
    assert text.splitlines()[0] == "hello"
    assert "[image image/png, about 3000 bytes, not shown]" in text and "A" * 100 not in text
    assert "[resource file:///a.txt]\ninside" in text
    assert "[resource file:///b.bin, binary, about 3 bytes, not shown]" in text
    assert render_result(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'


def test_config_file_mcp_tables_are_validated_with_one_line_naming_file_line_and_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[mcp_servers.tix]\ncommand = "srv"\nargs = ["-v"]\nenabled_tools = ["a"]\n'
                    'safety = { a = "idempotent" }\nstartup_timeout = 3\n')
    (server,) = read_config_file(path).mcp_servers.values()
    assert (server.name, server.command, server.args, server.enabled_tools, server.safety, server.startup_timeout) == \
        ("tix", "srv", ("-v",), ("a",), {"a": "idempotent"}, 3.0)
    bad = {
        '[mcp_servers.tix]\ncommand = "srv"\ncomand = "x"\n': (f"{path}:3: mcp_servers.tix.comand", "did you mean command"),
        '[mcp_servers.tix]\ncommand = "srv"\nurl = "http://h/mcp"\n': (f"{path}:1: mcp_servers.tix", "exactly one of"),
        '[mcp_servers.tix]\nurl = "http://h/mcp"\nheaders = { Authorization = "Bearer x" }\n':
            (f"{path}:3: mcp_servers.tix.headers", "bearer_token_env"),
        '[mcp_servers.tix]\ncommand = "srv"\nsafety = { a = "harmless" }\n':
            (f"{path}:3: mcp_servers.tix.safety", "read_only, idempotent or side_effecting"),
        '[mcp_servers."a__b"]\ncommand = "srv"\n': ("mcp_servers.a__b", "NAME__tool"),
        'mcp_servers = 3\n': ("mcp_servers", "[mcp_servers.NAME]"),
    }
    for text, needles in bad.items():
        path.write_text(text)
        with pytest.raises(ConfigFileError) as raised:
            read_config_file(path)
        message = str(raised.value)
        assert "\n" not in message
        for needle in needles:
            assert needle in message, message


def test_config_carries_the_servers_and_a_bad_table_is_exit_2_in_one_line(rig):
    env = configure(rig, server_table("tix"))
    config = resolve_config(workspace=str(rig.ws), env=rig.env(env))
    assert [s.name for s in config.mcp_servers] == ["tix"]
    with pytest.raises(ConfigError):
        resolve_config(workspace=str(rig.ws), env=rig.env(configure(rig, "[mcp_servers.x]\nargs = []\n")))
    proc = rig.run("run", "hi", env=configure(rig, "[mcp_servers.x]\nargs = []\n"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "mcp_servers.x" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------- cairn run


def test_tools_are_listed_with_the_safety_of_their_annotations_and_the_call_id_is_the_idempotency_key(rig):
    record = rig.io / "record.jsonl"
    env = configure(rig, server_table("tix", record=record, more='safety = { plain = "idempotent" }\n'))
    env.update(script_env(rig, calls([("tix__lookup", {"query": "q"}), ("tix__set_flag", {"name": "f", "value": True}),
                                      ("tix__create_ticket", {"title": "t"}), ("tix__drop_table", {"table": "x"}),
                                      ("tix__plain", {})])))
    proc, events = run_json(rig, env, "--yes", "go")
    assert proc.returncode == 0, proc.stderr
    (header, _) = by_type(events, "request/header")
    assert {"tix__lookup", "tix__slow_deploy", "tix__crash", "read_file"} <= set(header["tools"])
    safety = {e["name"]: e["safety"] for e in by_type(events, "tool/call")}
    assert safety == {"tix__lookup": "read_only", "tix__set_flag": "idempotent", "tix__create_ticket": "side_effecting",
                      "tix__drop_table": "side_effecting", "tix__plain": "idempotent"}  # the override won
    ids = {e["name"].removeprefix("tix__"): e["call_id"] for e in by_type(events, "tool/call")}
    received = {r["tool"]: r["key"] for r in records(record)}
    assert received == ids  # every call carried its call_id in _meta
    assert result_of(events, ids["create_ticket"])["content"] == "ticket opened: t"
    # ordered teardown: the server is gone once cairn has exited
    (pid,) = {r["pid"] for r in records(record)}
    assert not alive(pid)


def test_without_yes_headless_approval_follows_the_class(rig):
    record = rig.io / "record.jsonl"
    env = configure(rig, server_table("tix", record=record))
    env.update(script_env(rig, calls([("tix__lookup", {"query": "q"}), ("tix__set_flag", {"name": "f", "value": True}),
                                      ("tix__create_ticket", {"title": "t"})])))
    proc, events = run_json(rig, env, "go")
    assert proc.returncode == 0, proc.stderr
    codes = [e["error_code"] for e in by_type(events, "tool/result")]
    assert codes == [None, "DENIED", "DENIED"]
    assert [r["tool"] for r in records(record)] == ["lookup"]  # nothing that needs approval reached the server


def test_output_is_bounded_errors_are_results_and_a_secret_echoed_back_is_scrubbed(rig):
    secret = "tok-8f3a9c2e71"
    env = configure(rig, server_table("tix", more=f'env_vars = ["SERVICE_TOKEN"]\n'))
    env["SERVICE_TOKEN"] = secret
    env.update(script_env(rig, calls([("tix__huge", {"size": 200_000}), ("tix__fail", {}),
                                      ("tix__echo", {"text": f"the token is {secret}"}), ("tix__picture", {})])))
    proc, events = run_json(rig, env, "go")
    assert proc.returncode == 0, proc.stderr
    huge, fail, echo, picture = by_type(events, "tool/result")
    assert len(huge["content"]) < 40_000 and "[output truncated:" in huge["content"]
    assert fail["is_error"] and fail["error_code"] == "TOOL_ERROR" and "the backend said no" in fail["content"]
    assert echo["content"] == "the token is ***"
    stored = b"".join(p.read_bytes() for p in (rig.home / "sessions").glob("*.jsonl"))
    assert secret.encode() not in stored
    assert "[image image/png" in picture["content"] and "iVBOR" not in picture["content"]


def test_a_server_that_fails_or_hangs_at_start_is_reported_and_the_session_still_works(rig):
    env = configure(rig, server_table("tix"), server_table("broken", "--fail-start"),
                    server_table("stuck", "--hang-start", more="startup_timeout = 1\n"),
                    '[mcp_servers.missing]\ncommand = "no-such-mcp-server"\n')
    env.update(script_env(rig, calls([("tix__lookup", {"query": "q"}), ("broken__lookup", {"query": "q"})])))
    proc, events = run_json(rig, env, "go")  # the hung server never answers: had Cairn waited for it, this never ends
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "did not start" in line]
    assert len(lines) == 3, proc.stderr
    assert any("broken" in line and "cannot reach the ticket system" in line for line in lines)
    assert any("stuck" in line and "did not answer within 1 s" in line for line in lines)
    assert any("missing" in line and "command not found: no-such-mcp-server" in line for line in lines)
    ok, unknown = by_type(events, "tool/result")
    assert ok["content"] == "found: q" and unknown["error_code"] == "UNKNOWN_TOOL"


def test_a_server_that_dies_mid_call_gives_an_error_result_at_once_and_is_restarted_for_the_next_call(rig):
    record = rig.io / "record.jsonl"
    env = configure(rig, server_table("tix", record=record))
    env.update(script_env(rig, [
        {"tool_calls": [{"name": "tix__crash", "arguments": {}}]},
        {"tool_calls": [{"name": "tix__lookup", "arguments": {"query": "q"}}]},
        {"text": "done"},
    ]))
    proc, events = run_json(rig, env, "go")
    assert proc.returncode == 0, proc.stderr
    crashed, after = by_type(events, "tool/result")
    assert crashed["error_code"] == "TOOL_OUTCOME_UNKNOWN"
    assert "the MCP server `tix` stopped while this call to `tix__crash` was running" in crashed["content"]
    assert "read-only, so retrying it is safe" in crashed["content"]
    assert not after["is_error"], after  # SPEC §8 rev 3: a broken connection is restarted before the next call
    pids = [r["pid"] for r in records(record)]
    assert len(set(pids)) == 2 and [r["tool"] for r in records(record)][-1] == "lookup"
    assert by_type(events, "turn/end")[-1]["reason"] == "completed"


RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))


def test_invalid_utf8_a_bad_schema_and_a_dead_server_each_cost_only_what_they_must(rig):
    """A raw JSON-RPC server (no SDK) sends a line of invalid UTF-8 and a result with invalid bytes, lists one tool
    with a schema that is not an object, and dies during a call: the bytes are replaced (no stall, later calls answer
    at once), the bad tool is one stderr line naming it while the others work, and the dead server is restarted."""
    record = rig.io / "raw.jsonl"
    table = (f"[mcp_servers.raw]\ncommand = {toml_string(sys.executable)}\nargs = [{toml_string(RAW_SERVER)}]\n"
             f"env = {{ MCP_RECORD = {toml_string(str(record))} }}\ncall_timeout = 5\n")
    env = configure(rig, table)
    env.update(script_env(rig, [
        {"tool_calls": [{"name": "raw__garble", "arguments": {}}]},
        {"tool_calls": [{"name": "raw__good", "arguments": {"text": "after garble"}}]},
        {"tool_calls": [{"name": "raw__die", "arguments": {}}]},
        {"tool_calls": [{"name": "raw__good", "arguments": {"text": "after restart"}}]},
        {"text": "done"},
    ]))
    proc, events = run_json(rig, env, "go")
    assert proc.returncode == 0, proc.stderr
    garbled, good, died, restarted = by_type(events, "tool/result")
    assert not garbled["is_error"] and "caf\ufffd" in garbled["content"], garbled
    assert good["content"] == "ok after garble" and not good["is_error"]
    assert died["error_code"] == "TOOL_OUTCOME_UNKNOWN"
    assert restarted["content"] == "ok after restart" and not restarted["is_error"]
    # no call waited for its time limit: none of them is the timeout's TOOL_OUTCOME_UNKNOWN ("did not answer")
    assert not any("did not answer" in r["content"] for r in (garbled, good, died, restarted))
    lines = [line for line in proc.stderr.splitlines() if "broken" in line]
    assert len(lines) == 1 and "tool `broken` left out" in lines[0], proc.stderr
    assert all(line.startswith("cairn: ") for line in proc.stderr.splitlines()), proc.stderr  # no pydantic report
    assert [line for line in proc.stderr.splitlines() if "Invalid JSON" in line] == [
        "cairn: MCP: Failed to parse JSONRPC message from server: Invalid JSON: expected value at line 1 column 1"]
    header = by_type(events, "request/header")[0]
    assert sorted(header["tools"]) == sorted(t for t in header["tools"]) and "raw__broken" not in header["tools"]
    assert {"raw__good", "raw__garble", "raw__die"} <= set(header["tools"])
    assert len({r["pid"] for r in records(record)}) == 2


def test_every_mcp_call_has_a_time_limit_by_default():
    from cairn.app.config.mcp_servers import DEFAULT_CALL_TIMEOUT, parse_server_table

    assert parse_server_table("s", {"command": "x"}).call_timeout == DEFAULT_CALL_TIMEOUT == 120.0
    assert parse_server_table("s", {"command": "x", "call_timeout": 5}).call_timeout == 5


def test_a_cancel_reaches_the_server_as_an_mcp_cancellation(rig):
    record = rig.io / "record.jsonl"
    env = configure(rig, server_table("tix", record=record))
    env.update(script_env(rig, calls([("tix__slow_deploy", {"seconds": 60})])))
    child = rig.spawn("run", "--yes", "--json", "deploy", env=env)
    wait_until(lambda: any(r["event"] == "started" for r in records(record)), "the slow call to start", child=child)
    os.kill(child.pid, signal.SIGINT)
    assert child.finish() == 130
    events = json_lines(child.stdout())
    (result,) = by_type(events, "tool/result")
    assert result["error_code"] == "TOOL_OUTCOME_UNKNOWN"
    (call,) = by_type(events, "tool/call")
    assert {"tool": "slow_deploy", "event": "cancelled", "key": call["call_id"]}.items() <= records(record)[-1].items()
    assert not alive(records(record)[0]["pid"])


@pytest.mark.parametrize("override, advice", [
    ("", "It is side-effecting: do NOT retry it blindly"),
    ('safety = { slow_deploy = "read_only" }\n', "It is read-only, so retrying it is safe."),
])
def test_sigkill_during_a_slow_mcp_call_is_outcome_unknown_with_the_advice_of_its_class(rig, override, advice):
    record = rig.io / "record.jsonl"
    env = configure(rig, server_table("tix", record=record, more=override))
    env.update(script_env(rig, calls([("tix__slow_deploy", {"seconds": 60})])))
    child = rig.spawn("run", "--yes", "--json", "deploy", env=env)
    wait_until(lambda: any(r["event"] == "started" for r in records(record)), "the slow call to start", child=child)
    child.kill()
    (started,) = [r for r in records(record) if r["event"] == "started"]  # the server may note its end after it
    wait_until(lambda: not alive(started["pid"]), "the MCP server to die with cairn")
    sid = json.loads(child.stdout().splitlines()[0])["id"]
    events = rig.show(sid)
    (call,) = by_type(events, "tool/call")
    assert call["call_id"] == started["key"]
    result = result_of(events, call["call_id"])
    assert result["error_code"] == "TOOL_OUTCOME_UNKNOWN" and result["source_seq"] == call["seq"]
    assert "`tix__slow_deploy`" in result["content"] and advice in result["content"]


def test_streamable_http_server_with_a_bearer_token_from_the_environment(rig):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = rig.io / "record.jsonl"
    server = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], env={**os.environ, "MCP_RECORD": str(record)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_until(listening, "the HTTP MCP server to listen")
        env = configure(rig, f'[mcp_servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\n'
                             'bearer_token_env = "WEB_TOKEN"\n')
        env["WEB_TOKEN"] = "secret-web-token"
        env.update(script_env(rig, calls([("web__lookup", {"query": "over http"})])))
        proc, events = run_json(rig, env, "go")
        assert proc.returncode == 0, proc.stderr
        (result,) = by_type(events, "tool/result")
        assert result["content"] == "found: over http"
        (call,) = by_type(events, "tool/call")
        assert records(record)[-1]["key"] == call["call_id"]
    finally:
        server.terminate()
        server.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------- composition


@pytest.mark.anyio
async def test_ordered_teardown_stops_servers_after_the_loop_quiesces_and_before_persistence_closes(rig):
    """Leaving the composition mid-call: the loop cancels the turn while the server still answers (it records the
    cancellation), the closing events are written, and only then are the servers stopped; nothing is left running."""
    from cairn.app.agent.approval import headless_approver
    from cairn.app.compose import open_agent

    record = rig.io / "record.jsonl"
    env = rig.env(configure(rig, server_table("tix", record=record)))
    env.update(script_env(rig, calls([("tix__slow_deploy", {"seconds": 60})])))
    config = resolve_config(workspace=str(rig.ws), env=env)
    async with open_agent(config, approver=headless_approver(True)) as agent:
        (state,) = agent.mcp.states
        assert state.status == "ready" and "tix__slow_deploy" in state.tools
        agent.loop.submit("deploy")
        with anyio.fail_after(20):
            while not records(record):
                await anyio.sleep(0.01)
        sid = agent.id
    assert state.status == "stopped"
    started, cancelled = records(record)
    assert (started["event"], cancelled["event"]) == ("started", "cancelled")
    assert not alive(started["pid"])
    events = rig.show(sid)
    assert [e["type"] for e in events][-3:] == ["tool/result", "step/end", "turn/end"]
    assert events[-1]["reason"] == "cancelled" and events[-3]["error_code"] == "TOOL_OUTCOME_UNKNOWN"


def test_no_mcp_configured_keeps_headless_start_up_lean(rig):
    code = (
        "import sys; from cairn.app.cli import main; rc = main(['run', 'list files']);"
        "bad = [m for m in ('mcp', 'pydantic', 'textual', 'acp') if m in sys.modules]; print(rc, bad)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=rig.env(), cwd=rig.ws, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip().endswith("0 []"), proc.stdout + proc.stderr
    # with servers configured, the commands that run no model still read no config file and load no SDK
    env = rig.env(configure(rig, server_table("tix")))
    code = code.replace("['run', 'list files']", "['sessions']")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=rig.ws, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().endswith("0 []"), proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------------- ACP


@pytest.mark.anyio
async def test_acp_editor_servers_are_used_with_approval_by_class_and_sse_is_named(rig):
    from acp.schema import EnvVariable, McpServerStdio, SseMcpServer

    record = rig.io / "record.jsonl"
    offered = [
        McpServerStdio(name="Tickets", command=sys.executable, args=[SERVER],
                       env=[EnvVariable(name="MCP_RECORD", value=str(record))]),
        SseMcpServer(type="sse", name="legacy", url="http://127.0.0.1:9/sse", headers=[]),
    ]
    client = RecordingClient(["allow_once"])
    env = script_env(rig, calls([("Tickets__lookup", {"query": "q"}), ("Tickets__create_ticket", {"title": "t"})]))
    async with connect(rig, client, env) as agent:
        assert agent.init.agent_capabilities.mcp_capabilities.http is True
        sid = (await agent.conn.new_session(cwd=str(rig.ws), mcp_servers=offered)).session_id
        await wait_for(lambda: [u for u in client.updates if u.session_update == "agent_message_chunk"], "notice", rig)
        response = await prompt(agent.conn, sid, "go")
        assert response.stop_reason == "end_turn"
    (notice,) = [u for u in client.updates if u.session_update == "agent_message_chunk"
                 and "MCP" in u.content.text]
    assert "legacy (sse transport" in notice.content.text and "Tickets" not in notice.content.text
    (asked, _options), = client.permission_requests  # the read-only call was not asked about
    events = rig.show(sid)
    asked_id = asked.tool_call_id
    ticket = next(e for e in by_type(events, "tool/call") if e["name"] == "Tickets__create_ticket")
    assert asked_id == ticket["call_id"] and ticket["safety"] == "side_effecting"
    assert [r["key"] for r in records(record)] == [e["call_id"] for e in by_type(events, "tool/call")]
    assert result_of(events, ticket["call_id"])["content"] == "ticket opened: t"
    assert not alive(records(record)[0]["pid"])
    assert "legacy" in agent_stderr(rig)


@pytest.mark.anyio
async def test_the_tui_lists_mcp_servers_and_their_tools_with_slash_mcp(rig):
    from tui_helpers import wait_for

    from cairn.app.tui import CairnApp
    from cairn.persistence.store import SessionStore
    from cairn.widgets.prompt_input import PromptInput
    from cairn.widgets.transcript import Notice, Transcript

    env = configure(rig, server_table("tix"), "[mcp_servers.broken]\ncommand = \"/nonexistent/cairn-mcp\"\n")
    config = resolve_config(home=str(rig.home), workspace=str(rig.ws), provider="demo", env=rig.env(env))
    store = SessionStore(rig.home, "jsonl")
    app = CairnApp(config, store.create(cwd=str(rig.ws), deferred=True), store)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the agent", 30)
            states = app.chat.agent.mcp.states
            await wait_for(pilot, lambda: all(s.status != "starting" for s in states), "the servers to start", 30)
            app.chat.query_one(PromptInput).insert("/mcp")
            await pilot.press("enter")
            said = lambda: [str(n.render()) for n in app.chat.query_one(Transcript).query(Notice)]  # noqa: E731
            await wait_for(pilot, lambda: any("tix: ready" in s for s in said()), "the /mcp answer")
            answer = next(s for s in said() if "tix: ready" in s)
            await pilot.press("ctrl+q")
    finally:
        app.close_if_still_open()
    assert "tix__" in answer and "broken: failed" in answer
