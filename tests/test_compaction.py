"""Context compaction (issue 16): long sessions stay inside a small context window, crash-safely, and recovery facts
survive every compaction. Driven against the real local OpenAI-compatible server (strict mode on), taught to refuse
any request longer than its context window with the wording OpenAI uses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conversation_rules import conversation_violations
from openai_server import OpenAIServer, RecordedRequest, error, text, tool_calls

from cairn.app.agent.compaction import (
    CARRIED_HEADER,
    SUMMARY_SYSTEM,
    carried_facts,
    context_window_for,
    estimate_tokens,
    is_context_overflow,
)
from cairn.app.agent.transcript import Transcript
from cairn.app.compose import open_agent
from cairn.app.config.resolver import ConfigError, resolve_config
from cairn.app.providers.base import ProviderError
from cairn.persistence.events import ContextCompaction, RecoveryVerdict, ToolCall, ToolResult

CAIRN = str(Path(sys.executable).parent / "cairn")
WINDOW = 4096  # tokens, for the server and for Cairn alike


def size_in_tokens(req: RecordedRequest) -> int:
    return len(json.dumps(req.body.get("messages", []), ensure_ascii=False)) // 4


class SmallModel:
    """A server-side model with a small context window: summary requests get a summary, requests past the window an
    HTTP 400 `context_length_exceeded`, everything else a plain answer (or what `answers` holds, in order)."""

    def __init__(self, window: int = WINDOW, hold_summary: bool = False, answer_chars: int = 300,
                 session_file: Path | None = None) -> None:
        self.window, self.hold_summary, self.answer_chars = window, hold_summary, answer_chars
        self.summaries = 0
        self.overflows = 0
        self.session_file = session_file  # when given: what its log held when each request arrived
        self.arrivals: list[tuple[str, int, int]] = []  # (purpose, requests of that purpose so far, headers on disk)

    def __call__(self, req: RecordedRequest) -> dict[str, Any]:
        messages = req.body.get("messages", [])
        purpose = "compaction" if messages and messages[0].get("content") == SUMMARY_SYSTEM else "turn"
        if self.session_file is not None and self.session_file.exists():
            lines = self.session_file.read_text().splitlines()[1:]
            headers = [json.loads(x) for x in lines if '"request/header"' in x]
            on_disk = sum(1 for h in headers if h.get("purpose", "turn") == purpose)
            self.arrivals.append((purpose, sum(1 for a in self.arrivals if a[0] == purpose) + 1, on_disk))
        if purpose == "compaction" and size_in_tokens(req) > self.window:  # real servers refuse those too
            self.overflows += 1
            return error(400, f"This model's maximum context length is {self.window} tokens. (context_length_exceeded)")
        if purpose == "compaction":
            self.summaries += 1
            hold = {"hold_before": True} if self.hold_summary and self.summaries == 1 else {}
            return text(f"Summary {self.summaries}: the user asked for many paragraphs; all were written.", **hold)
        tokens = size_in_tokens(req)
        if tokens > self.window:
            self.overflows += 1
            return error(400, f"This model's maximum context length is {self.window} tokens. However, your messages "
                              f"resulted in {tokens} tokens. (context_length_exceeded)")
        return text("A paragraph. " * (self.answer_chars // 13))


def test_the_estimate_window_and_overflow_words():
    assert context_window_for("deepseek-chat", {}) == 128_000
    assert context_window_for("anthropic/claude-sonnet-4", {}) == 200_000
    assert context_window_for("some-local-model", {}) == 128_000
    assert context_window_for("x", {"CAIRN_CONTEXT_WINDOW": "4096"}) == 4096
    for bad in ("abc", "-5", "100"):
        with pytest.raises(ConfigError, match="CAIRN_CONTEXT_WINDOW"):
            context_window_for("x", {"CAIRN_CONTEXT_WINDOW": bad})
    assert estimate_tokens([{"role": "user", "content": "x" * 4000}]) > 1000
    assert is_context_overflow(ProviderError("HTTP 400: prompt is too long: 210000 tokens > 200000", "HTTP_400"))
    assert is_context_overflow(ProviderError("HTTP 400 ... (context_length_exceeded)", "HTTP_400"))
    assert not is_context_overflow(ProviderError("HTTP 400 bad request", "HTTP_400"))
    assert not is_context_overflow(ProviderError("HTTP 503 context length", "HTTP_503"))


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_200_turn_session_never_outgrows_a_4k_window(tmp_path):
    model = SmallModel()
    with OpenAIServer(default=model) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="small", base_url=server.base_url,
                                workspace=str(tmp_path), env={"CAIRN_API_KEY": "sk-small"})
        async with open_agent(config) as agent:
            agent.loop.context_window = WINDOW
            for turn in range(200):
                result = await agent.run(f"Write paragraph {turn} about the history of cairns. " + "Detail. " * 20)
                assert result.reason == "completed", result.error
            events = agent.session.events
    assert model.overflows == 0 and not server.refusals
    compactions = [e for e in events if isinstance(e, ContextCompaction)]
    assert len(compactions) >= 5
    assert all(a.through_seq < b.through_seq for a, b in zip(compactions, compactions[1:]))
    chat = [r for r in server.requests if r.body["messages"][0]["content"] != SUMMARY_SYSTEM]
    assert max(size_in_tokens(r) for r in chat) <= WINDOW
    last = chat[-1].body["messages"]
    assert last[1]["content"].startswith("[Cairn: summary of the earlier conversation")
    assert not conversation_violations(last)


@pytest.mark.anyio
async def test_a_context_length_refusal_compacts_once_and_sends_again(tmp_path):
    model = SmallModel(window=1500)
    with OpenAIServer(default=model) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="small", base_url=server.base_url,
                                workspace=str(tmp_path), env={"CAIRN_API_KEY": "sk-small"})
        async with open_agent(config) as agent:
            agent.loop.context_window = 1_000_000  # Cairn thinks the window is huge: only the server's 400 tells it
            results = [await agent.run("Tell me more. " + "More. " * 150) for _ in range(8)]
            events = agent.session.events
    assert all(r.reason == "completed" for r in results), [r.error for r in results]
    assert model.overflows >= 1, "the server refused at least once"
    assert any(isinstance(e, ContextCompaction) for e in events)
    kinds = [e.type if hasattr(e, "type") else type(e).__struct_config__.tag for e in events]
    at = kinds.index("context/compaction")
    assert kinds[at - 1] == "request/header" and kinds[at + 1] == "request/header", "refused header, then a new one"


def crash_log(home: Path, server: OpenAIServer, ws: Path, env: dict[str, str]) -> str:
    """A session whose first turn was SIGKILLed while `run_command` ran: repair makes it OUTCOME_UNKNOWN."""
    marker = ws / "started.txt"
    server.push(tool_calls([{"id": "call_deploy", "name": "run_command",
                             "arguments": {"command": f"echo yes > {marker}; sleep 60"}}]))
    child = subprocess.Popen([CAIRN, "run", "--session-id", "s", "--yes", "deploy"], env=env, cwd=ws,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        if marker.exists() and marker.read_text() == "yes\n":
            break
        subprocess.run(["sleep", "0.05"])
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    return "s"


@pytest.mark.slow
def test_outcome_unknown_survives_two_compactions_and_reaches_the_model(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    model = SmallModel(window=2048, answer_chars=200)
    with OpenAIServer(default=model) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": "sk-small", "CAIRN_PROVIDER": "openai",
               "CAIRN_MODEL": "small", "CAIRN_CONTEXT_WINDOW": "2048"}
        sid = crash_log(tmp_path / "home", server, ws, env)
        for i in range(12):
            proc = subprocess.run([CAIRN, "run", "--resume", sid, f"Next part {i}. " + "Words. " * 120], env=env,
                                  cwd=ws, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        shown = subprocess.run([CAIRN, "show", sid, "--json"], env=env, capture_output=True, text=True, timeout=60)
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    compactions = [e for e in events if e["type"] == "context/compaction"]
    assert len(compactions) >= 2 and model.overflows == 0
    for compaction in compactions:
        (fact,) = compaction["carried"]
        assert fact["call_id"] == "call_deploy" and fact["status"] == "OUTCOME_UNKNOWN"
        assert fact["arguments"]["command"].endswith("sleep 60") and "do NOT retry" in fact["told"]
    last = [r for r in server.requests if r.body["messages"][0]["content"] != SUMMARY_SYSTEM][-1].body["messages"]
    assert CARRIED_HEADER in last[1]["content"] and "call_deploy" in last[1]["content"]


@pytest.mark.slow
def test_sigkill_during_the_compaction_request_then_resume_compacts_again(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    model = SmallModel(window=2048, hold_summary=True, answer_chars=200,
                       session_file=tmp_path / "home" / "sessions" / "s.jsonl")
    with OpenAIServer(default=model) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": "sk-small", "CAIRN_PROVIDER": "openai",
               "CAIRN_MODEL": "small", "CAIRN_CONTEXT_WINDOW": "2048"}
        first = subprocess.run([CAIRN, "run", "--session-id", "s", "Start. " + "Words. " * 120], env=env, cwd=ws,
                               capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        child = None
        for i in range(10):  # turns until one needs a compaction: its summary request is held, and killed
            child = subprocess.Popen([CAIRN, "run", "--resume", "s", f"More {i}. " + "Words. " * 120], env=env,
                                     cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while child.poll() is None and model.summaries == 0:
                subprocess.run(["sleep", "0.02"])
            if model.summaries:
                break
        assert child is not None and model.summaries == 1
        server.wait_for_hold(1, timeout=20)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        server.release()
        stored = subprocess.run([CAIRN, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert stored.returncode == 0
        stored_events = [json.loads(x) for x in stored.stdout.splitlines()]
        assert not any(e["type"] == "context/compaction" for e in stored_events)
        # the summary request that was killed had its own header, written before the server saw the request
        assert [e["purpose"] for e in stored_events if e["type"] == "request/header"][-1] == "compaction"
        assert model.arrivals[-1] == ("compaction", 1, 1)
        resumed = subprocess.run([CAIRN, "run", "--resume", "s", "And now?"], env=env, cwd=ws, capture_output=True,
                                 text=True, timeout=60)
        shown = subprocess.run([CAIRN, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert model.summaries == 2, "the resumed session compacts again"
    events = [json.loads(x) for x in shown.stdout.splitlines()]
    assert [e["type"] for e in events].count("context/compaction") == 1
    assert not server.refusals
    # every request that reached the server, summary requests included, found its own header already in the log
    assert len(model.arrivals) == len(server.requests) and model.arrivals
    assert all(requests_so_far <= on_disk for _, requests_so_far, on_disk in model.arrivals), model.arrivals
    headers = [e.get("purpose") for e in events if e["type"] == "request/header"]
    assert headers.count("compaction") == 2 and headers.count("turn") == len(server.requests) - 2


def test_carried_facts_keep_unknown_calls_and_attach_later_verdicts():
    call = ToolCall(turn=1, step=1, call_id="c1", name="run_command", arguments={"command": "deploy"},
                    safety="side_effecting", parent_call_id=None)
    call.seq = 3
    unknown = ToolResult(turn=1, step=1, call_id="c1", is_error=True, content="may have run; do NOT retry",
                         error_code="TOOL_OUTCOME_UNKNOWN", source_seq=3)
    unknown.seq = 4
    verdict = RecoveryVerdict(call_id="c1", verdict="did_not_happen", note="checked the server")
    verdict.seq = 6
    (fact,) = carried_facts([call, unknown], through_seq=10)
    assert fact["verdict"] is None and fact["arguments"] == {"command": "deploy"}
    earlier = ContextCompaction(summary="s", through_seq=5, model="m", carried=[fact])
    earlier.seq = 5
    (again,) = carried_facts([earlier, verdict], through_seq=10)
    assert (again["verdict"], again["note"], again["told"]) == ("did_not_happen", "checked the server",
                                                               "may have run; do NOT retry")
    transcript = Transcript([earlier, verdict])
    transcript.extend([earlier, verdict])
    assert "`run_command`" in transcript.messages[-1]["content"]


def test_the_summary_says_why_it_was_written():
    from cairn.app.agent.compaction import SUMMARY_HEADER, SUMMARY_HEADER_ASKED, summary_text

    asked = ContextCompaction(summary="s", through_seq=3, model="m", reason="operator")
    grown = ContextCompaction(summary="s", through_seq=3, model="m", reason="length")
    old = ContextCompaction(summary="s", through_seq=3, model="m")  # written before rev 3
    assert summary_text(asked).startswith(SUMMARY_HEADER_ASKED) and "operator asked" in SUMMARY_HEADER_ASKED
    assert summary_text(grown).startswith(SUMMARY_HEADER) and summary_text(old).startswith(SUMMARY_HEADER)


LLAMA_CPP_CONTEXT_ERROR = {"error": {"code": 400, "message": "request (19579 tokens) exceeds the available context size "
                                     "(8192 tokens), try increasing it", "type": "exceed_context_size_error",
                                     "n_prompt_tokens": 19579, "n_ctx": 8192}}


@pytest.mark.anyio
async def test_llama_cpps_real_context_refusal_is_recognised_as_one():
    """The exact body llama-server answers (issue 26), through the real provider: a length refusal, so Cairn compacts."""
    from cairn.app.providers.base import ModelRequest
    from cairn.app.providers.openai import OpenAIProvider

    with OpenAIServer([error(400, body=LLAMA_CPP_CONTEXT_ERROR)]) as server:
        provider = OpenAIProvider("gemma", base_url=server.base_url, api_key=None)
        with pytest.raises(ProviderError) as info:
            async for _ in provider.stream(ModelRequest(messages=[{"role": "user", "content": "hi"}], tools=[],
                                                        model="gemma")):
                pass
        await provider.aclose()
    assert "exceeds the available context size" in str(info.value)
    assert is_context_overflow(info.value)


def test_a_history_longer_than_the_window_is_summarised_in_pieces_that_each_fit(tmp_path):
    """Issue 26: with a window of 2048 tokens, one tool result of ~3,000 tokens makes the next request too long; the
    summary of it cannot go in one request either, so it is summarised in pieces, oldest first, each one fitting."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text("".join(f"line {i}: some words about the data\n" for i in range(340)))
    model = SmallModel(window=2048, answer_chars=200, session_file=tmp_path / "home" / "sessions" / "s.jsonl")
    read = tool_calls([{"id": "call_read", "name": "read_file", "arguments": {"path": "big.txt"}}])
    with OpenAIServer([read], default=model) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": "sk-small", "CAIRN_PROVIDER": "openai",
               "CAIRN_MODEL": "small", "CAIRN_CONTEXT_WINDOW": "2048"}
        proc = subprocess.run([CAIRN, "run", "--session-id", "s", "read big.txt and tell me about it"], env=env,
                              cwd=ws, capture_output=True, text=True, timeout=60)
        summaries = [r for r in server.requests if r.body["messages"][0]["content"] == SUMMARY_SYSTEM]
        shown = subprocess.run([CAIRN, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(summaries) >= 2 and all(size_in_tokens(r) <= 2048 for r in summaries)
    assert "summary of the conversation so far" in summaries[-1].body["messages"][1]["content"]
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["type"] for e in events].count("context/compaction") == 1
    assert [e.get("purpose") for e in events if e["type"] == "request/header"].count("compaction") == len(summaries)


def test_the_window_comes_from_llama_cpps_props_when_none_is_configured(tmp_path):
    """Issue 26: a llama.cpp-style server says `n_ctx` in GET /props; with no window configured (and a model name no
    family table knows) Cairn compacts before the server has to refuse anything."""
    ws = tmp_path / "ws"
    ws.mkdir()
    model = SmallModel(window=2048, answer_chars=200)
    with OpenAIServer(default=model, props={"default_generation_settings": {"n_ctx": 2048}}) as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
               "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": "sk-small", "CAIRN_PROVIDER": "openai",
               "CAIRN_MODEL": "some-local-gguf"}
        for i in range(8):
            args = ["--session-id", "p"] if i == 0 else ["--resume", "p"]
            proc = subprocess.run([CAIRN, "run", *args, f"Part {i}. " + "Words. " * 120], env=env, cwd=ws,
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        props_asked = server.props_asked
        shown = subprocess.run([CAIRN, "show", "p", "--json"], env=env, capture_output=True, text=True, timeout=60)
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["type"] for e in events].count("context/compaction") >= 1
    assert model.overflows == 0  # compacted in time: the server never had to refuse a request
    assert 1 <= props_asked <= 8  # at most once per process
