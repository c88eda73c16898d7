"""An MCP call that outlives its server's `call_timeout` (SPEC §8 rev 3: "every call has a time limit … after which it
is OUTCOME_UNKNOWN for a side-effecting tool"): a real stdio MCP server (tests/mcp_server.py) whose `slow_deploy`
sleeps far longer than the limit, driven through `cairn run`. The call was sent, so it may have taken effect: the
result is TOOL_OUTCOME_UNKNOWN with the advice of its safety class — never a TOOL_ERROR, which would read as "it did
not happen" — and the turn goes on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from acp_helpers import rig_fixture, script_env
from crash_harness import Rig, json_lines

from cairn.persistence.repair import SAFETY_ADVICE

SERVER = str(Path(__file__).with_name("mcp_server.py"))
rig = pytest.fixture(rig_fixture, name="rig")


def test_a_call_past_its_call_timeout_is_outcome_unknown_and_says_so(rig: Rig):
    record = rig.io / "record.jsonl"
    config = rig.io / "config.toml"
    config.write_text(f"[mcp_servers.tix]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(SERVER)}]\n"
                      f"env = {{ MCP_RECORD = {json.dumps(str(record))} }}\ncall_timeout = 0.5\n")
    env = {"CAIRN_CONFIG": str(config)}
    env.update(script_env(rig, [
        {"tool_calls": [{"call_id": "call_slow", "name": "tix__slow_deploy", "arguments": {"seconds": 60}}]},
        {"text": "I could not tell whether the deploy happened."},
    ]))
    proc = rig.run("run", "--yes", "--json", "deploy", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    events = json_lines(proc.stdout)
    (call,) = [e for e in events if e["type"] == "tool/call"]
    (result,) = [e for e in events if e["type"] == "tool/result"]
    assert call["safety"] == "side_effecting"
    assert (result["call_id"], result["is_error"], result["error_code"]) == ("call_slow", True, "TOOL_OUTCOME_UNKNOWN")
    assert result["source_seq"] == call["seq"]
    assert result["content"] == (
        "TOOL_OUTCOME_UNKNOWN: the MCP server `tix` did not answer this call to `tix__slow_deploy` within 0.5 s, so it "
        f"may or may not have taken effect. {SAFETY_ADVICE['side_effecting']}")
    started = [r for r in map(json.loads, record.read_text().splitlines()) if r["event"] == "started"]
    assert [r["key"] for r in started] == ["call_slow"]  # it was sent (and started): that is why it is unknown
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == ["completed"]
