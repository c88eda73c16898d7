"""A real local HTTP server speaking the Anthropic Messages streaming protocol, for tests.

Built on `openai_server` (same queue, recording, holds, gates, marker/release/requests files and standalone mode), with
the Messages wire format and the Messages API's own strictness:

    from anthropic_server import AnthropicServer, message, tool_use, overloaded

    with AnthropicServer([message("Hello", thinking="Let me think")]) as server:
        provider = AnthropicProvider("claude-test", base_url=server.base_url, api_key="sk-ant-test")
        ...
        req = server.wait_for_requests(1)
        assert req.header("x-api-key") == "sk-ant-test"

Out of process: `python tests/anthropic_server.py --script script.json --port-file port.txt [...]`, the options of
`openai_server.py`; point `CAIRN_BASE_URL` at `http://127.0.0.1:<port>` with `CAIRN_PROVIDER=anthropic`.

Behaviours (`POST /v1/messages`; anything else is 404):
- `message`: optional `thinking` (streamed as `thinking_delta`s in `thinking_chunks` pieces, then a signature the server
  can verify later), optional `text` (in `chunks` pieces), optional `tool_use` calls `[{"id", "name", "input": object
  or raw JSON text}]` streamed as `input_json_delta`s in `arg_chunks` pieces; `stop_reason` (default `tool_use` when
  there are calls, else `end_turn`; `max_tokens` for a cut-off answer; null sends none); `usage` overrides the counts;
  `redacted`: a `redacted_thinking` block before the thinking.
- `error`: HTTP `status` with an Anthropic error body (`error_type`, `message`), `headers` (e.g. `retry-after`).
- `hang`, and the options `hold_after` (after that many SSE events), `hold_before`, `gate`, `delay_ms`, `fragment`,
  `close_after` (cut the connection after that many events), `error_after` + `error_type` (an `error` event in the
  stream, then the end of the body).

Strict mode (on by default) refuses with 400 what the Messages API refuses: no `anthropic-version` header, no
`max_tokens`, a conversation that does not start with `user` or does not alternate, an empty text block, a `tool_use`
whose id does not fit `^[a-zA-Z0-9_-]+$`, duplicate ids, a `tool_use` not answered by a `tool_result` at the start of
the next user message, a `tool_result` for an id the previous assistant message did not use, a thinking block whose
signature this server did not issue for that text, and — with `thinking` enabled — a tool loop whose last assistant
message does not start with a thinking block. `server.key`, when set, must arrive as `x-api-key` (else 401).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import sys
import time
from typing import Any

from openai_server import (  # tests/ is on sys.path (pytest, or run as a script)
    Behaviour,
    OpenAIServer,
    RecordedRequest,
    _Handler,
    _HTTPServer,
    _split,
    _Stop,
    error,
    hang,
)
from openai_server import _script_strict, load_script, serve_until_signalled

__all__ = ["AnthropicServer", "message", "tool_use", "error", "hang", "overloaded", "rate_limited", "signature_for"]

SECRET = b"cairn-test-thinking"
ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")


def signature_for(thinking: str) -> str:
    """The signature this server issues for a thinking text (and checks when the text comes back)."""
    return "sig-" + hmac.new(SECRET, thinking.encode("utf-8"), hashlib.sha256).hexdigest()


def message(text: str = "", chunks: int = 1, **options: Any) -> Behaviour:
    return {"kind": "message", "text": text, "chunks": chunks, **options}


def tool_use(calls: list[dict[str, Any]], text: str = "", arg_chunks: int = 3, **options: Any) -> Behaviour:
    return {"kind": "message", "text": text, "tool_use": calls, "arg_chunks": arg_chunks, **options}


def overloaded(**options: Any) -> Behaviour:
    return error(529, "Overloaded", error_type="overloaded_error", **options)


def rate_limited(retry_after: float | str = 1, **options: Any) -> Behaviour:
    return error(429, "rate limited", error_type="rate_limit_error", headers={"retry-after": str(retry_after)}, **options)


def _anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def violations(body: Any, headers: dict[str, str]) -> list[str]:
    """What the Messages API would refuse in this request (first one first)."""
    if not headers.get("anthropic-version"):
        return ["anthropic-version: header is required"]
    if not isinstance(body, dict):
        return ["body: not a JSON object"]
    found: list[str] = []
    if not isinstance(body.get("max_tokens"), int):
        found.append("max_tokens: Field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return found + ["messages: at least one message is required"]
    seen_ids: set[str] = set()
    open_calls: list[str] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            found.append(f"messages.{i}: roles must alternate between \"user\" and \"assistant\", starting with user")
            break
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            found.append(f"messages.{i}: content must be a non-empty string or list")
            continue
        if role == "user":
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            leading = [b.get("tool_use_id") for b in blocks[: len(results)] if b.get("type") == "tool_result"]
            if open_calls and sorted(leading) != sorted(open_calls):
                found.append(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                             + ", ".join(sorted(set(open_calls) - set(leading))) if set(open_calls) - set(leading)
                             else f"messages.{i}: tool_result blocks must come first in the user message")
            for r in results:
                if r not in open_calls:
                    found.append(f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: {r}")
            open_calls = []
        for j, b in enumerate(blocks):
            kind = b.get("type") if isinstance(b, dict) else None
            where = f"messages.{i}.content.{j}"
            if kind == "text" and not (isinstance(b.get("text"), str) and b["text"]):
                found.append(f"{where}: text content blocks must be non-empty")
            elif kind == "tool_use":
                if role != "assistant":
                    found.append(f"{where}: tool_use is only allowed in assistant messages")
                if not isinstance(b.get("id"), str) or not ID_PATTERN.match(b["id"]):
                    found.append(f"{where}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
                elif b["id"] in seen_ids:
                    found.append(f"{where}: `tool_use` ids must be unique")
                else:
                    seen_ids.add(b["id"])
                    open_calls.append(b["id"])
                if not isinstance(b.get("input"), dict):
                    found.append(f"{where}.input: Input should be a valid dictionary")
            elif kind == "thinking":
                if role != "assistant" or b.get("signature") != signature_for(str(b.get("thinking") or "")):
                    found.append(f"{where}: Invalid `signature` in `thinking` block")
            elif kind == "redacted_thinking":
                if not str(b.get("data") or "").startswith("redacted-"):
                    found.append(f"{where}: Invalid `data` in `redacted_thinking` block")
            elif kind not in ("text", "tool_result"):
                found.append(f"{where}: unknown content block type {kind!r}")
    if open_calls:
        found.append("the last message has `tool_use` blocks without `tool_result` blocks after them")
    if found:
        return found
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        last_user = messages[-1]
        only_results = isinstance(last_user.get("content"), list) and all(
            b.get("type") == "tool_result" for b in last_user["content"])
        if only_results and len(messages) >= 2:
            first = messages[-2]["content"][0] if isinstance(messages[-2]["content"], list) else {"type": "text"}
            if first.get("type") not in ("thinking", "redacted_thinking"):
                found.append(f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                             f"but found `{first.get('type')}`. When `thinking` is enabled, a final `assistant` message "
                             "must start with a thinking block")
    return found


class _AnthropicHandler(_Handler):
    server: "_HTTPServer"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        owner: AnthropicServer = self.server.owner  # type: ignore[assignment]
        req = self._record(body, publish=False)
        if not req.path.split("?", 1)[0].rstrip("/").endswith("/v1/messages"):
            owner._publish(req)
            self._send_json(404, _anthropic_error("not_found_error", f"no route for POST {req.path}"))
            return
        if owner.key is not None and req.header("x-api-key") != owner.key:
            req.refused = 401
            owner._publish(req)
            self._send_json(401, _anthropic_error("authentication_error", "invalid x-api-key"))
            return
        behaviour, queued = owner._next_behaviour(req)
        found = violations(req.body, req.headers) if owner.strict and behaviour.get("strict", True) else []
        req.violations = found
        if found:
            req.refused = 400
            owner._publish(req)
            if queued:
                owner._unshift(behaviour)
            self._send_json(400, _anthropic_error("invalid_request_error", found[0]))
            return
        owner._publish(req)
        try:
            self._answer(behaviour, req)
        except _Stop:
            self.close_connection = True
        except OSError:
            self.close_connection = True

    def _answer(self, b: Behaviour, req: RecordedRequest) -> None:
        kind = b.get("kind", "message")
        if kind == "hang" or b.get("hold_before"):
            self.server.owner._hold(b.get("gate", "default"), req)
            if kind == "hang":
                self.close_connection = True
                return
        if kind == "error":
            b = dict(b)
            b.setdefault("body", _anthropic_error(b.get("error_type", "api_error"), str(b.get("message", "error"))))
            self._error(b, req)
        elif kind == "message":
            self._send_events(b, req, self._message_events(b, req))
        else:
            self._send_json(500, _anthropic_error("api_error", f"anthropic_server: unknown behaviour kind {kind!r}"))

    @staticmethod
    def _message_events(b: Behaviour, req: RecordedRequest) -> list[tuple[str, dict[str, Any]]]:
        model = (req.body or {}).get("model", "claude-test") if isinstance(req.body, dict) else "claude-test"
        prompt_tokens = max(1, len(json.dumps((req.body or {}).get("messages") or [])) // 4)
        usage = {"input_tokens": prompt_tokens, "output_tokens": 1, **(b.get("usage") or {})}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": {
            "id": f"msg_test_{req.n}", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1,
                                           **({"cache_read_input_tokens": usage["cache_read_input_tokens"]}
                                              if "cache_read_input_tokens" in usage else {})}}})]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
            events.extend(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                          for d in deltas)
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1

        if b.get("redacted"):
            block({"type": "redacted_thinking", "data": "redacted-" + str(b["redacted"])}, [])
        thinking = str(b.get("thinking") or "")
        if thinking:
            pieces = _split(thinking, int(b.get("thinking_chunks", 1)))
            signature = b.get("signature", signature_for(thinking))
            block({"type": "thinking", "thinking": "", "signature": ""},
                  [{"type": "thinking_delta", "thinking": p} for p in pieces]
                  + [{"type": "signature_delta", "signature": signature}])
        text = str(b.get("text") or "")
        if text:
            block({"type": "text", "text": ""}, [{"type": "text_delta", "text": p}
                                                 for p in _split(text, int(b.get("chunks", 1)))])
        calls = b.get("tool_use") or []
        for i, call in enumerate(calls):
            raw = call.get("input", {})
            raw = raw if isinstance(raw, str) else json.dumps(raw)
            block({"type": "tool_use", "id": call.get("id", f"toolu_{req.n}_{i}"), "name": call["name"], "input": {}},
                  [{"type": "input_json_delta", "partial_json": p} for p in _split(raw, int(b.get("arg_chunks", 3)))])
        stop = b.get("stop_reason", "tool_use" if calls else "end_turn")
        out_tokens = max(1, (len(text) + len(thinking)) // 4)
        delta_usage = {"output_tokens": usage.get("output_tokens") if b.get("usage") else out_tokens}
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": delta_usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _send_events(self, b: Behaviour, req: RecordedRequest, events: list[tuple[str, dict[str, Any]]]) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        delay = float(b.get("delay_ms", 0)) / 1000.0
        fragment = int(b.get("fragment", 0))
        hold_after, close_after, error_after = b.get("hold_after"), b.get("close_after"), b.get("error_after")
        if b.get("ping", True):
            events = events[:1] + [("ping", {"type": "ping"})] + events[1:]
        for sent, (name, data) in enumerate(events):
            if hold_after is not None and sent == int(hold_after):
                owner._hold(b.get("gate", "default"), req)
            if close_after is not None and sent == int(close_after):
                self._cut()
            if error_after is not None and sent == int(error_after):
                payload = _anthropic_error(b.get("error_type", "overloaded_error"), b.get("error_message", "Overloaded"))
                self._chunk(f"event: error\ndata: {json.dumps(payload)}\n\n".encode(), fragment)
                break
            if sent and delay:
                time.sleep(delay)
            self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode(), fragment)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class AnthropicServer(OpenAIServer):
    """A scripted Anthropic-Messages streaming server on 127.0.0.1 (see the module docstring)."""

    def __init__(self, *args: Any, key: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key = key
        if self.default.get("kind") == "error" and "openai_server" in str(self.default.get("message")):
            self.default = error(500, "anthropic_server: script exhausted", error_type="api_error")

    def start(self) -> "AnthropicServer":
        import threading

        httpd = _HTTPServer((self._host, self._port), _AnthropicHandler)
        httpd.owner = self  # type: ignore[assignment]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    @property
    def base_url(self) -> str:
        """What to give the provider / CAIRN_BASE_URL (the provider appends /v1/messages)."""
        return self.url


if "pytest" in sys.modules:
    import pytest

    @pytest.fixture
    def anthropic_server():
        """An empty, started AnthropicServer; `push()` behaviours onto it."""
        with AnthropicServer() as server:
            yield server


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Scripted Anthropic-Messages streaming server for tests.")
    parser.add_argument("--script", help="JSON file: a list of behaviours or {responses: [...], default: {...}}")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--marker-file", help="append a JSON line per request received / hold reached")
    parser.add_argument("--release-file", help="holds end once this file exists")
    parser.add_argument("--requests-file", help="append every recorded request as a JSON line")
    parser.add_argument("--key", help="require this x-api-key")
    parser.add_argument("--no-strict", action="store_true")
    args = parser.parse_args(argv)
    script, default = load_script(args.script) if args.script else ([], None)
    server = AnthropicServer(script, default=default, marker_file=args.marker_file, release_file=args.release_file,
                             requests_file=args.requests_file, strict=not args.no_strict and _script_strict(args.script),
                             key=args.key).start()
    return serve_until_signalled(server, args.port_file, "anthropic_server")


if __name__ == "__main__":
    sys.exit(main())
