"""Every server wording SPEC §7 (rev 3, "Servers as they really are") names is recognised on its own.

Each case is one wording, in an error body that carries that wording and none of the others SPEC names (real fixtures
usually carry two — llama.cpp's template error says "Unable to generate parser" *and* "roles must alternate", OpenAI's
context refusal says "maximum context length" *and* `context_length_exceeded` — so a test with such a fixture keeps
passing when one of them is forgotten). It goes through the real provider (OpenAI-compatible, or Anthropic for
Anthropic's wording) against the real local test server, inside a real turn of the real loop:

- "No tool role": the refused request is sent once more in text form (no `tool` message, no `tool_calls`), recorded
  in `request/header.params`, and the turn completes;
- "Context refusals in every wording": one compaction (a summary request), one retry, and the turn completes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from agent_helpers import script_agent
from anthropic_server import AnthropicServer, message
from openai_server import OpenAIServer, error, text, tool_calls

from cairn.app.providers.anthropic import AnthropicProvider
from cairn.app.providers.openai import OpenAIProvider
from cairn.persistence.events import ContextCompaction, RequestHeader, TurnEnd

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Wording:
    words: str  # as SPEC §7 names it
    server: str  # "openai" (any OpenAI-compatible server) or "anthropic"
    refusal: str  # "tool role" or "length"
    body: dict[str, Any]  # the error body the server answers with (HTTP 400)


WORDINGS = [
    # llama.cpp serving a Gemma-style chat template (the Jinja exception's own words, without the parser preamble)
    Wording("roles must alternate", "openai", "tool role", {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": "Conversation roles must alternate user/assistant/user/assistant/..."}}),
    # OpenAI: the code says it (the message is whatever the API says this year)
    Wording("context_length_exceeded", "openai", "length", {"error": {
        "message": "Invalid request.", "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}}),
    # Anthropic
    Wording("prompt is too long", "anthropic", "length", {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
    # llama.cpp: its error type, and its message — each on its own
    Wording("exceed_context_size_error", "openai", "length", {"error": {
        "code": 400, "type": "exceed_context_size_error", "message": "request (19579 tokens) refused"}}),
    Wording("exceeds the available context size", "openai", "length", {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": "request (19579 tokens) exceeds the available context size (8192 tokens), try increasing it"}}),
    # vLLM (its body has no "error" wrapper)
    Wording("maximum context length", "openai", "length", {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400,
        "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in "
                   "the messages, 1000 in the completion). Please reduce the length of the messages or completion."}),
]
IDS = [w.words.replace(" ", "-") for w in WORDINGS]


@pytest.mark.parametrize("wording", WORDINGS, ids=IDS)
def test_each_fixture_carries_its_own_wording_and_no_other_that_spec_names(wording):
    body = json.dumps(wording.body).lower()
    assert wording.words.lower() in body
    others = [w.words for w in WORDINGS if w is not wording and w.words.lower() in body]
    assert others == []


def refused(wording: Wording) -> dict[str, Any]:
    return error(400, body=wording.body)


def answer(wording: Wording, said: str) -> dict[str, Any]:
    return message(said) if wording.server == "anthropic" else text(said)


@pytest.mark.parametrize("wording", WORDINGS, ids=IDS)
async def test_a_server_refusal_in_this_wording_alone_is_recognised(tmp_path, wording):
    if wording.refusal == "tool role":
        first_turn = [tool_calls([{"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}}]),
                      text("Listed.")]
        second_turn = [refused(wording), text("Answered in text form.")]
    else:
        first_turn = [answer(wording, "First answer.")]
        second_turn = [refused(wording), answer(wording, "The summary of turn 1."), answer(wording, "Second answer.")]
    server_class = AnthropicServer if wording.server == "anthropic" else OpenAIServer
    with server_class(first_turn + second_turn) as server:
        if wording.server == "anthropic":
            provider: Any = AnthropicProvider("claude-test", base_url=server.base_url, api_key="sk-ant-test",
                                              timeout=10)
        else:
            provider = OpenAIProvider("m", base_url=server.base_url, api_key="sk-test", timeout=10)
        async with script_agent(tmp_path, []) as agent:
            agent.loop.provider = provider
            try:
                first = await agent.run("look around")
                count = len(agent.session.events)
                second = await agent.run("go on")
            finally:
                await provider.aclose()
            later = agent.session.events[count:]
        requests = list(server.requests)
    assert first.reason == "completed", first.error
    assert second.reason == "completed", (wording.words, second.error)
    assert [e.reason for e in later if isinstance(e, TurnEnd)] == ["completed"]
    headers = [e for e in later if isinstance(e, RequestHeader)]
    assert len(requests) == len(first_turn) + len(second_turn)
    if wording.refusal == "tool role":
        assert [h.params.get("transcript") for h in headers] == [None, "text"]
        resent = requests[-1].body["messages"]
        assert all(m["role"] != "tool" and not m.get("tool_calls") for m in resent)
        assert "list_dir" in json.dumps(resent)  # the earlier call is still there, written as text
    else:
        assert [h.purpose for h in headers] == ["turn", "compaction", "turn"]
        assert len([e for e in later if isinstance(e, ContextCompaction)]) == 1
        assert "The summary of turn 1." in json.dumps(requests[-1].body)
