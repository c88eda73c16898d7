"""The openai provider inside real turns: tool calls round-trip, errors end the turn resumably, no key on disk."""

from __future__ import annotations

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
