"""Sessions stay continuable with strict servers (SPEC rev 2 §7), end to end: the real `cairn run` command in a child
process against the real local strict server (tests/openai_server.py), which refuses any request that breaks §7's
rules the way llama.cpp, OpenAI and DeepSeek do. After every kind of failure the next request must be accepted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from openai_server import OpenAIServer, close, cut_off, error, failing, raw, stream_error, text, tool_calls

CAIRN = str(Path(sys.executable).parent / "cairn")
KEY = "sk-continuable-0123456789abcdef"

pytestmark = pytest.mark.slow


class Cli:
    def __init__(self, tmp_path: Path, base_url: str, **env: str) -> None:
        self.home = tmp_path / "home"
        self.ws = tmp_path / "ws"
        self.ws.mkdir(exist_ok=True)
        self.env = {
            "PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(self.home), "CAIRN_BASE_URL": base_url,
            "CAIRN_API_KEY": KEY, "CAIRN_PROVIDER": "openai", "CAIRN_MODEL": "strict-model", "CAIRN_TIMEOUT": "10",
            **env,
        }

    def argv(self, *args: str) -> list[str]:
        return [CAIRN, *args]

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), env={**self.env, **env}, cwd=self.ws, capture_output=True, text=True,
                              timeout=60)

    def spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), env=self.env, cwd=self.ws, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def events(self, sid: str) -> list[dict[str, Any]]:
        proc = self.run("show", sid, "--json")
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def accepted(server: OpenAIServer) -> None:
    """The strict server refused nothing."""
    assert not server.refusals, [(r.refused, r.violations) for r in server.refusals]


def test_an_http_error_at_step_one_then_a_new_prompt(tmp_path):
    with OpenAIServer([error(400, "bad gateway config"), text("Fine now.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        first = cli.run("run", "--session-id", "s", "hello")
        second = cli.run("run", "--resume", "s", "try again")
    assert first.returncode == 1 and "400" in first.stderr
    assert second.returncode == 0 and "Fine now." in second.stdout, second.stderr
    accepted(server)
    messages = server.requests[-1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "hello" in messages[1]["content"] and "try again" in messages[1]["content"]


def test_sigkill_mid_stream_then_resume(tmp_path):
    with OpenAIServer([text("Half of an answer that never ends", chunks=6, hold_after=3), text("Resumed.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        child = cli.spawn("run", "--session-id", "s", "tell me a story")
        server.wait_for_hold(1, timeout=20)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        resumed = cli.run("run", "--resume", "s", "go on")
    assert resumed.returncode == 0 and "Resumed." in resumed.stdout, resumed.stderr
    accepted(server)
    roles = [m["role"] for m in server.requests[-1].body["messages"]]
    assert roles[0] == "system" and roles[-1] == "user"
    assert all(a != b for a, b in zip(roles[1:], roles[2:])), roles


def test_length_cut_inside_a_tool_call_runs_nothing_and_the_session_continues(tmp_path):
    marker = tmp_path / "ws" / "marker.txt"
    calls = [{"id": "call_touch", "name": "run_command", "arguments": {"command": f"touch {marker}"}}]
    with OpenAIServer([cut_off(calls, keep=12), text("Shorter then.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        first = cli.run("run", "--session-id", "s", "--yes", "make the marker")
        events = cli.events("s")
        second = cli.run("run", "--resume", "s", "--yes", "ok")
    assert first.returncode == 1 and "max_tokens" in first.stderr, first.stderr
    assert not marker.exists(), "a truncated call never runs, --yes or not"
    assert not of(events, "tool/call")
    assert [r["error_code"] for r in of(events, "tool/result")] == ["TRUNCATED"]
    assert of(events, "turn/end")[-1]["error"]["code"] == "MAX_TOKENS"
    assert of(events, "assistant/message")[-1]["finish_reason"] == "length"
    assert second.returncode == 0, second.stderr
    accepted(server)
    sent = server.requests[-1].body["messages"]
    assert [c["function"]["arguments"] for m in sent for c in m.get("tool_calls", [])] == ["{}"]


def test_invalid_json_arguments_then_the_next_step(tmp_path):
    calls = [{"id": "call_bad", "name": "read_file", "arguments": '{"path": "a.txt", '}]
    with OpenAIServer([tool_calls(calls), text("I will fix my JSON.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        proc = cli.run("run", "--session-id", "s", "read a.txt")
    assert proc.returncode == 0 and "I will fix my JSON." in proc.stdout, proc.stderr
    accepted(server)
    assert len(server.requests) == 2


def test_429_with_retry_after_is_retried_and_recorded(tmp_path):
    with OpenAIServer() as server:
        server.push(*failing(429, 1, text("After the wait."), retry_after=1))
        cli = Cli(tmp_path, server.base_url)
        proc = cli.run("run", "--session-id", "s", "hi")
        events = cli.events("s")
    assert proc.returncode == 0 and "After the wait." in proc.stdout, proc.stderr
    (retry,) = of(events, "request/retry")
    assert (retry["attempt"], retry["reason"], retry["delay_ms"]) == (2, "HTTP 429", 1000)
    assert retry["ignorable"] is True
    assert len(server.requests) == 2 and len(of(events, "request/header")) == 1


def test_503_after_the_first_delta_is_not_retried_and_nothing_is_duplicated(tmp_path):
    with OpenAIServer([stream_error("Partial answer here", after=2, chunks=4), text("Next turn.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        first = cli.run("run", "--session-id", "s", "hi")
        events = cli.events("s")
        second = cli.run("run", "--resume", "s", "again")
    assert first.returncode == 1 and len(server.requests) == 2
    assert not of(events, "request/retry")
    (message,) = of(events, "assistant/message")
    assert message["interrupted"] is True
    assert message["text"] and first.stdout.count(message["text"]) == 1
    assert second.returncode == 0, second.stderr
    accepted(server)


def test_deepseek_reasoning_is_shown_stored_and_sent_back_within_the_turn(tmp_path):
    calls = [{"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}}]
    answers = [tool_calls(calls, reasoning="I should look at the files."),
               text("There are no files.", reasoning="The listing is empty.", require_reasoning=True)]
    with OpenAIServer(answers) as server:
        cli = Cli(tmp_path, server.base_url)
        proc = cli.run("run", "--session-id", "s", "what is here?")
        events = cli.events("s")
    assert proc.returncode == 0 and "There are no files." in proc.stdout, proc.stderr
    assert "I should look at the files." in proc.stderr and "I should look" not in proc.stdout
    accepted(server)
    assert [m["reasoning"] for m in of(events, "assistant/message")] == [
        "I should look at the files.", "The listing is empty."]
    assert "".join(e["delta"] for e in of(events, "reasoning/chunk")).startswith("I should look at the files.")
    step2 = server.requests[-1].body["messages"]
    assert [m.get("reasoning_content") for m in step2 if m["role"] == "assistant"] == ["I should look at the files."]


def test_duplicate_ids_and_a_sigkill_during_the_second_call(tmp_path):
    first_marker = tmp_path / "ws" / "one.txt"
    calls = [{"id": "dup", "name": "run_command", "arguments": {"command": f"echo 1 > {first_marker}"}},
             {"id": "dup", "name": "run_command", "arguments": {"command": "echo started > two.txt; sleep 60"}}]
    with OpenAIServer([tool_calls(calls), text("Verified.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        child = cli.spawn("run", "--session-id", "s", "--yes", "do both")
        two = tmp_path / "ws" / "two.txt"
        for _ in range(400):
            if two.exists() and two.read_text() == "started\n":
                break
            subprocess.run(["sleep", "0.05"])
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        events = cli.events("s")
        resumed = cli.run("run", "--resume", "s", "--yes", "what happened?")
    results = {r["call_id"]: r for r in of(events, "tool/result")}
    assert set(results) == {"dup", "dup-dup"}
    assert results["dup"]["is_error"] is False
    assert results["dup-dup"]["error_code"] == "TOOL_OUTCOME_UNKNOWN"
    assert resumed.returncode == 0, resumed.stderr
    accepted(server)


def test_usage_is_recorded_on_the_answer(tmp_path):
    usage = {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38,
             "prompt_tokens_details": {"cached_tokens": 16}}
    with OpenAIServer([text("Counted.", usage=usage)]) as server:
        cli = Cli(tmp_path, server.base_url)
        proc = cli.run("run", "--session-id", "s", "count")
        events = cli.events("s")
    assert proc.returncode == 0, proc.stderr
    assert server.requests[0].body["stream_options"] == {"include_usage": True}
    assert of(events, "assistant/message")[0]["usage"] == {
        "input_tokens": 31, "output_tokens": 7, "cached_tokens": 16, "reasoning_tokens": None}


def test_a_lone_surrogate_in_streamed_text_and_in_the_prompt(tmp_path):
    chunk = {"choices": [{"index": 0, "delta": {"content": "smile \\ud83d now"}, "finish_reason": None}]}
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    lines = [f"data: {json.dumps(chunk).replace(chr(92) * 2, chr(92))}", "", f"data: {json.dumps(done)}", "",
             "data: [DONE]", ""]
    with OpenAIServer([raw(lines), text("Still here.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        first = cli.run("run", "--session-id", "s", "hi")
        second = subprocess.run(cli.argv("run", "--resume", "s", os.fsdecode(b"bin \xff\xfe")), env=cli.env,
                                cwd=cli.ws, capture_output=True, text=True, timeout=60)
        events = cli.events("s")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    assert of(events, "assistant/message")[0]["text"] == "smile \ufffd now"
    assert of(events, "user/message")[1]["text"] == "bin \ufffd\ufffd"
    accepted(server)


def test_credentials_in_the_base_url_reach_no_byte_under_cairn_home(tmp_path):
    password, token = "hunter2-password", "tok-0123456789secret"
    with OpenAIServer([error(401, "who are you", echo_auth=True), text("ok")]) as server:
        url = server.base_url.replace("http://", f"http://user:{password}@") + f"?api_key={token}"
        cli = Cli(tmp_path, url)
        first = cli.run("run", "--session-id", "s", "hi")
        second = cli.run("run", "--resume", "s", "hi again")
    for proc in (first, second):
        for secret in (password, token, KEY):
            assert secret not in proc.stdout + proc.stderr
    for path in cli.home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (password, token, KEY):
                assert secret.encode() not in data, path


def test_resume_keeps_the_model(tmp_path):
    with OpenAIServer([text("one"), text("two")]) as server:
        cli = Cli(tmp_path, server.base_url, CAIRN_MODEL="")
        first = cli.run("run", "--session-id", "s", "--model", "special-model", "hi")
        second = cli.run("run", "--resume", "s", "again")
    assert first.returncode == second.returncode == 0, second.stderr
    assert [r.body["model"] for r in server.requests] == ["special-model", "special-model"]


def test_a_connection_dropped_mid_stream_then_resume(tmp_path):
    with OpenAIServer([close("Some words that stop", chunks=4, after=2), text("Back.")]) as server:
        cli = Cli(tmp_path, server.base_url)
        first = cli.run("run", "--session-id", "s", "hi")
        second = cli.run("run", "--resume", "s", "again")
    assert first.returncode == 1 and second.returncode == 0, second.stderr
    accepted(server)
