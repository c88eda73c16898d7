"""The openai provider inside real turns: tool calls round-trip, errors end the turn resumably, no key on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from openai_server import OpenAIServer, error, hang, text, tool_calls

CAIRN = str(Path(sys.executable).parent / "cairn")
KEY = "sk-test-SECRET-MARKER-7f3a9c"


def run_cairn(tmp_path: Path, base_url: str, *args: str) -> subprocess.CompletedProcess:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
        "CAIRN_BASE_URL": base_url, "CAIRN_API_KEY": KEY, "CAIRN_TIMEOUT": "1",
        "CAIRN_MAX_RETRIES": "0",  # each scripted failure must end its own turn (retries: tests/test_continuable.py)
    }
    return subprocess.run([CAIRN, *args], env=env, cwd=ws, capture_output=True, text=True, timeout=60)


def assert_key_nowhere(home: Path) -> None:
    for path in home.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"API key leaked into {path}"


def test_tool_call_turn_over_openai_sends_results_back_and_keeps_the_key_off_disk(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha\n")
    behaviours = [
        tool_calls([{"id": "call_A", "name": "read_file", "arguments": {"path": "a.txt"}}], text="Let me look."),
        text("It says alpha.", chunks=3),
    ]
    with OpenAIServer(behaviours) as server:
        proc = run_cairn(tmp_path, server.base_url, "run", "--model", "gpt-test", "what is in a.txt?")
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("It says alpha.\n")
    assert requests[0].header("authorization") == f"Bearer {KEY}"
    assert requests[0].body["model"] == "gpt-test" and requests[0].body["stream"] is True
    second = requests[1].body["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "call_A"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_A", "content": second[-1]["content"]}
    assert "alpha" in second[-1]["content"]
    assert_key_nowhere(tmp_path / "home")


def test_provider_errors_end_the_turn_with_exit_1_and_never_store_the_key(tmp_path):
    with OpenAIServer([error(500, "upstream exploded", echo_auth=True), error(429, "slow down"), hang()]) as server:
        for needle in ("500", "429", "timed out"):
            proc = run_cairn(tmp_path, server.base_url, "run", "hello")
            assert proc.returncode == 1, proc.stderr
            assert needle in proc.stderr and "Traceback" not in proc.stderr
            assert KEY not in proc.stderr
    ids = subprocess.run([CAIRN, "sessions", "--all"], env={"PATH": os.environ["PATH"], "CAIRN_HOME": str(tmp_path / "home")},
                         capture_output=True, text=True).stdout
    assert ids.count("  error  ") == 3  # an errored turn is closed (turn/end error), so the session is resumable
    assert_key_nowhere(tmp_path / "home")


def test_a_server_that_never_answers_is_waited_for_twice_not_max_retries_times(tmp_path):
    """SPEC §7 rev 3: a timed-out attempt is retried at most once, whatever CAIRN_MAX_RETRIES says (issue 26: a stalled
    server held a turn for about ten minutes)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with OpenAIServer([hang(), hang(), hang(), hang()]) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": KEY, "CAIRN_TIMEOUT": "1",
               "CAIRN_MAX_RETRIES": "4"}
        proc = subprocess.run([CAIRN, "run", "--json", "hello"], env=env, cwd=ws, capture_output=True, text=True,
                              timeout=60)
        attempts = len(server.requests)
    assert proc.returncode == 1 and "timed out" in proc.stderr, proc.stderr
    assert attempts == 2
    assert [line for line in proc.stdout.splitlines() if '"request/retry"' in line and '"TIMEOUT"' in line]


LLAMA_CPP_TEMPLATE_ERROR = {"error": {"code": 400, "type": "invalid_request_error", "message": (
    "Unable to generate parser for this template. Automatic parser generation failed: \n------------\nWhile executing "
    "CallExpression at line 6, column 21 in source:\n...\nError: Jinja Exception: Conversation roles must alternate "
    "user/assistant/user/assistant/...")}}


class NoToolRole:
    """A llama.cpp server with a Gemma-style chat template: any `tool` message or assistant `tool_calls` is refused
    with its exact error; the first request of a session gets a tool call, later ones an answer."""

    def __init__(self) -> None:
        self.refused = 0
        self.answered: list[list[dict]] = []

    def __call__(self, req):
        messages = req.body.get("messages", [])
        if any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
            self.refused += 1
            return error(400, body=LLAMA_CPP_TEMPLATE_ERROR)
        roles = [m["role"] for m in messages if m["role"] != "system"]
        assert all(a != b for a, b in zip(roles, roles[1:])) and roles[0] == "user", roles  # strictly alternating
        self.answered.append(messages)
        if len(self.answered) == 1:
            return tool_calls([{"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}}])
        return text(f"answer {len(self.answered)}")


def test_a_server_without_a_tool_role_gets_the_conversation_in_text_form_and_keeps_it(tmp_path):
    server_model = NoToolRole()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("x")
    with OpenAIServer(default=server_model, strict=False) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": KEY, "CAIRN_MODEL": "gemma"}
        first = subprocess.run([CAIRN, "run", "--session-id", "g", "what is here?"], env=env, cwd=tmp_path / "ws",
                               capture_output=True, text=True, timeout=60)
        second = subprocess.run([CAIRN, "run", "--resume", "g", "and now?"], env=env, cwd=tmp_path / "ws",
                                capture_output=True, text=True, timeout=60)
        shown = subprocess.run([CAIRN, "show", "g", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout.strip() == "answer 2", first.stderr
    assert second.returncode == 0 and second.stdout.strip() == "answer 3", second.stderr
    assert server_model.refused == 1  # once: then text form, kept for the resumed session too
    sent = json.dumps(server_model.answered[-1])
    assert "[I call the tool list_dir as call_ls" in sent and "[result of tool call call_ls]" in sent
    assert "notes.txt" in sent  # the tool's result reached the model
    headers = [json.loads(line) for line in shown.stdout.splitlines() if '"request/header"' in line]
    assert [h["params"].get("transcript") for h in headers] == [None, None, "text", "text"]
