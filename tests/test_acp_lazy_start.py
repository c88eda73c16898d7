"""`cairn acp` answers `initialize` before it imports what only a session needs (issue 44, app/acp/early.py).

Real processes over real pipes: the early answer is the package's answer, lines the client sent together with
`initialize` are served in order, a session still works after it, and a bad configuration is still one line and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from acp_helpers import rig_fixture
from crash_harness import CAIRN

rig = pytest.fixture(rig_fixture, name="rig")

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False}}}}
SESSION_ONLY = ("acp", "pydantic", "textual", "mcp", "httpx", "asyncio", "msgspec",
                "cairn.app.acp.serve", "cairn.app.acp.agent", "cairn.app.agent.loop", "cairn.app.providers.openai",
                "cairn.persistence.store", "cairn.app.config.resolver", "cairn.app.config.provider",
                "cairn.app.providers.base", "cairn.app.tools.command")


def exchange(rig, lines: list[dict | str], answers: int, env: dict[str, str] | None = None) -> tuple[list[dict], str]:
    """Write `lines` in one write on a real pipe, read `answers` answer lines, close stdin; (answers, stderr)."""
    payload = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()
    proc = subprocess.Popen([CAIRN, "acp"], env=rig.env(env), cwd=rig.ws, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout and proc.stderr
    proc.stdin.write(payload)
    proc.stdin.flush()
    got = []
    while len(got) < answers:
        line = proc.stdout.readline()
        if not line:
            break
        message = json.loads(line)
        if "id" in message:  # (not a notification)
            got.append(message)
    proc.stdin.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, stderr
    return got, stderr


def test_the_acp_entry_imports_nothing_a_session_needs(rig):
    """What `cairn acp` (the CLI's own `main`, over real pipes) has imported when `initialize` is answered: the CLI and
    early.py, not the configuration, the ACP package, pydantic, the providers, the loop, the backends or asyncio. The
    harness wraps early.py's `answer_initialize` to print `sys.modules` just after it answered."""
    code = ("import os, sys\n"
            "import cairn.app.acp.early as early\n"
            "answer = early.answer_initialize\n"
            "def answered(i, o):\n"
            "    rest = answer(i, o)\n"
            f"    print([m for m in {SESSION_ONLY!r} if m in sys.modules], file=sys.stderr, flush=True)\n"
            "    return rest\n"
            "early.answer_initialize = answered\n"
            "from cairn.app.cli import main\n"
            "sys.exit(main(['acp']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=rig.env(), cwd=rig.ws, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(json.dumps(INITIALIZE).encode() + b"\n", timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[0])["result"]["protocolVersion"] == 1
    assert err.decode().splitlines()[0] == "[]", err


def test_the_early_answer_to_initialize_is_the_packages_answer(rig):
    """A first line that is `initialize` is answered by early.py; after a blank first line the same request goes to
    the ACP package (early.py answers only a first line). Both answers are the same."""
    early, _ = exchange(rig, [INITIALIZE], 1)
    package, _ = exchange(rig, ["", INITIALIZE], 1)
    assert early[0]["id"] == 0 and early[0]["result"]["protocolVersion"] == 1
    assert early == package


def test_lines_sent_with_initialize_are_all_answered_in_order(rig):
    """initialize, session/list and an unknown method written in one go: early.py answers the first, the package the
    others, none lost."""
    got, _ = exchange(rig, [INITIALIZE, {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}},
                            {"jsonrpc": "2.0", "id": 2, "method": "session/teleport", "params": {}}], 3)
    assert [m["id"] for m in got] == [0, 1, 2]
    assert got[1]["result"] == {"sessions": []}
    assert got[2]["error"]["code"] == -32601


def test_an_initialize_early_py_would_not_vouch_for_goes_to_the_package(rig):
    """No protocolVersion: early.py leaves it alone and the package refuses it (-32602)."""
    bad = {**INITIALIZE, "params": {}}
    got, _ = exchange(rig, [bad, {**INITIALIZE, "id": 5}], 2)
    assert got[0]["id"] == 0 and got[0]["error"]["code"] == -32602
    assert got[1]["id"] == 5 and got[1]["result"]["agentCapabilities"]["loadSession"] is True


def test_a_session_works_after_the_early_initialize(rig):
    """initialize answered early, then session/new and a prompt on the demo provider: a turn that completes."""
    new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(rig.ws), "mcpServers": []}}
    proc = subprocess.Popen([CAIRN, "acp"], env=rig.env({"CAIRN_PROVIDER": "demo"}), cwd=rig.ws,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout

    def send(message: dict) -> None:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def answer(request_id: int) -> dict:
        while True:
            message = json.loads(proc.stdout.readline())
            if message.get("id") == request_id:
                return message

    send(INITIALIZE)
    assert answer(0)["result"]["protocolVersion"] == 1
    send(new)
    session_id = answer(1)["result"]["sessionId"]
    send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
          "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "hello"}]}})
    assert answer(2)["result"]["stopReason"] == "end_turn"
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    events = rig.show(session_id)
    assert (events[-1]["type"], events[-1]["reason"]) == ("turn/end", "completed")


def test_a_bad_configuration_is_still_one_line_and_exit_2_after_an_early_answer(rig):
    """With a client on pipes, initialize is answered first; the provider configuration is checked next, and a bad
    one ends the process with one `cairn:` line and exit code 2, before any session."""
    proc = subprocess.Popen([CAIRN, "acp"], env=rig.env({"CAIRN_PROVIDER": "script",
                                                         "CAIRN_SCRIPT": str(rig.root / "missing.json")}),
                            cwd=rig.ws, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(json.dumps(INITIALIZE).encode() + b"\n", timeout=60)
    assert proc.returncode == 2
    assert json.loads(out.splitlines()[0])["id"] == 0
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cairn: ") and "missing.json" in lines[0], err
    assert "Traceback" not in err.decode()


def test_nothing_is_read_before_the_checks_when_stdin_is_not_a_pipe(rig):
    """/dev/null as stdin (no client): the configuration is checked first, as before, and stdin is never read."""
    done = subprocess.run([CAIRN, "acp"], env=rig.env({"CAIRN_PROVIDER": "script",
                                                       "CAIRN_SCRIPT": str(rig.root / "missing.json")}),
                          cwd=rig.ws, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert "missing.json" in done.stderr and len(done.stderr.strip().splitlines()) == 1
