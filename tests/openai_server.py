"""A real local HTTP server speaking the OpenAI Chat Completions streaming protocol, for tests.

In process (pytest)::

    from openai_server import OpenAIServer, text, tool_calls, error, hang

    with OpenAIServer([text("Hello world", chunks=3)]) as server:
        provider = OpenAIProvider("m", base_url=server.base_url, api_key="sk-test")
        ...
        req = server.wait_for_requests(1)        # the first RecordedRequest (blocks until it arrived)
        assert req.body["stream"] is True and req.header("authorization") == "Bearer sk-test"

Out of process (a subprocess test or the crash harness)::

    python tests/openai_server.py --script script.json --port-file port.txt \
        [--marker-file markers.jsonl] [--release-file release.flag] [--requests-file requests.jsonl] [--no-strict]

`script.json` is a list of behaviours or `{"responses": [...], "default": {...}, "strict": true}`. The bound port is
written (atomically) to the port file once the server listens; then point `CAIRN_BASE_URL` at `http://127.0.0.1:<port>/v1`.
The server runs until SIGTERM/SIGINT.

Test modules import it as `openai_server` (pytest puts tests/ on sys.path); `from openai_server import openai_server`
brings in a fixture yielding a started, empty server.

Strict mode (on by default)
---------------------------
Every POST to `.../chat/completions` has its `messages` checked with `conversation_violations()` from
`tests/conversation_rules.py`, and a conversation the strictest real servers would refuse is refused the way they do it
(only the first violation is reported, as they do):

- `first_not_user`, `alternation` → 400 "Conversation roles must alternate user/assistant/user/assistant/..."
  (llama.cpp / Jinja chat templates);
- `bad_arguments` → 500 "Failed to parse tool call arguments as JSON" (llama.cpp);
- `unanswered_tool_call`, `orphan_tool_message`, `duplicate_id` → 400 "An assistant message with 'tool_calls' must be
  followed by tool messages responding to each 'tool_call_id'. …" (OpenAI);
- `missing_reasoning` → 400 "Missing `reasoning_content` field in the assistant message at message index N"
  (DeepSeek thinking mode; checked only when the answer that would be given has `require_reasoning: true`);
- `bad_content` → 400 "Invalid value for 'messages[N].content' …"; a body without a `messages` list → 400.

A refused request is still recorded (`RecordedRequest.refused` = the status, `.violations` = what was found;
`server.refusals` lists them), and it does not use up the scripted answer: the next request gets it. Turn strict mode
off with `OpenAIServer(strict=False)`, `--no-strict`, `"strict": false` in a script file, or per answer with
`"strict": false` in that behaviour (the check then never runs for the request that takes it).

Behaviours
----------
A behaviour is a JSON-able dict (the helpers below build them). Each POST to `.../chat/completions` takes the next one
from the queue (`server.push(...)` adds more; a queue entry may also be a callable `fn(RecordedRequest) -> dict`, in
process only). When the queue is empty the `default` behaviour answers (by default: HTTP 500 "script exhausted").
A server's limit probes use no queue and are counted in `probes` rather than recorded: `GET .../models` answers
`models` (constructor; vLLM, llama.cpp and LM Studio put the context size there), `GET /props` answers `props` like
llama-server (also counted in `props_asked`), `POST /api/show` answers `ollama_show` like Ollama (404 while None);
other paths answer 404. Every other request is recorded.

`kind`:
- `text`: `text`, split into `chunks` pieces (or explicit `deltas`: list of strings); `finish_reason` (default "stop").
- `tool_calls`: optional `text` first, then `tool_calls`: `[{"id": "call_1" | None (omitted), "name": ...,
  "arguments": str | object}]`, each call's arguments split into `arg_chunks` pieces (default 3); `interleave`:
  `"sequential"` (call 0 fully, then call 1 — what OpenAI does), `"round_robin"` (pieces alternate between calls) or
  `"same_chunk"` (each chunk carries one piece of every call); `finish_reason` default "tool_calls".
- `error`: HTTP `status` with a JSON body `{"error": {"message", "type", "code"}}` built from `message`, or a given
  `body` (JSON) or `body_text` (raw); `echo_auth: true` appends the request's Authorization header to the message (to
  test that clients scrub secrets); `headers`: extra response headers.
- `hang`: read the request, then send nothing and hold the connection until released (or the server stops), then
  close it without an answer.
- `raw`: send `lines` (strings, each followed by "\\n") as the body of a 200 response (`content_type`, default
  text/event-stream); nothing is added (`done` defaults to false here).
- `malformed`: a `raw` stream whose data line is not JSON (or give your own `lines`).
- `close`: stream like `text`, but after `after` data events close the connection abruptly (the chunked body is never
  terminated, so the client sees the peer vanish mid-stream).

Helpers for the rev 2 cases: `reasoning` (option below), `cut_off(calls, keep)` (a `tool_calls` answer stopped by the
token limit inside the arguments), `failing(status, times, then, retry_after=…)` (a list: `times` error answers with a
`Retry-After` header, then `then`; push it with `server.push(*failing(...))`), `stream_error(text, after=…)` (an error
object in the stream after some deltas). Repeated tool call ids are given as they are (`tool_calls([{"id": "c"},
{"id": "c"}])`).

Options for the streaming kinds (`text`, `tool_calls`, `raw`, `malformed`, `close`):
- `delay_ms`: pause between data events;
- `fragment`: write each event in pieces of this many bytes, flushed separately with a short pause, so a JSON payload
  reaches the client split across TCP reads;
- `hold_after`: after that many data events (0 = right after the response headers), hold until released;
- `hold_before`: hold after reading the request, before sending anything (`hang` is this, with no answer after);
- `gate`: the name of the gate a hold waits on (default "default");
- `done`: send `data: [DONE]` at the end (default true, false for raw/malformed); `finish_reason: null` sends no
  finish reason;
- `role_chunk`: send a first `{"role": "assistant", "content": ""}` delta (default true); `model`: the model echoed in
  chunks (default: the request's); `comments`: send an SSE comment and an `event:` line first (default false).

Options for `text`, `tool_calls` and `close`:
- `reasoning`: text streamed first as reasoning deltas, in `reasoning_chunks` pieces (default 1) or explicit
  `reasoning_deltas`; `reasoning_field`: `"reasoning_content"` (DeepSeek, vLLM, llama.cpp; default) or `"reasoning"`
  (OpenRouter, Ollama);
- usage: when the request has `stream_options.include_usage` true, every chunk carries `"usage": null` and a last
  chunk `{"choices": [], "usage": {...}}` follows the finish chunk, as OpenAI does. `usage`: the usage object to send
  (default: counts estimated from the sizes, 4 characters a token); `usage: false` never sends one;
  `usage_in_finish: true` puts it on the finish chunk instead (some servers do);
- `truncate_args` (`tool_calls` only): the answer stops after that many characters of arguments (counted over the calls
  in order; later calls never start) with `finish_reason: "length"`;
- `error_after`: after that many data events send `data: {"error": {"message": error_message, "code": error_status}}`
  (default 503) and end the body without `[DONE]`;
- `require_reasoning`: strict mode also refuses assistant messages without `reasoning_content` (DeepSeek thinking);
- `strict`: false skips strict mode for the request this answers.

Hooks for "request received" / "held mid-stream"
-----------------------------------------------
- `server.requests` (list of RecordedRequest: method, path, headers (lower-cased names), body (parsed JSON or None),
  raw bytes, n (1-based)); `server.wait_for_requests(n, timeout)` blocks until n requests arrived and returns the n-th;
  `server.request_received` is a threading.Event set at every request (clear it yourself to wait for the next).
- `server.wait_for_hold(n, timeout)`: blocks until n handlers have reached a hold point (i.e. headers and the first
  `hold_after` events have been sent and flushed); `server.held` is the matching Event.
- `server.release(gate="default")` opens a gate (it stays open; `server.close_gate(gate)` closes it again). Stopping the
  server releases every hold and closes every open connection.
- `marker_file` (constructor / `--marker-file`): a JSON line `{"event": "request", "n", "path", "time"}` is appended
  when a request arrives and `{"event": "held", "n", "gate", "time"}` when a handler holds — for harnesses in another
  process.
- `release_file` (constructor / `--release-file`): a hold also ends once this file exists.
- `requests_file` (constructor / `--requests-file`): every recorded request appended as a JSON line (headers included,
  so the Authorization header too — this is a test server).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

Behaviour = dict[str, Any]
ScriptEntry = Behaviour | Callable[["RecordedRequest"], Behaviour]

# --------------------------------------------------------------------------- behaviour helpers


def text(text: str, chunks: int = 1, **options: Any) -> Behaviour:
    return {"kind": "text", "text": text, "chunks": chunks, **options}


def tool_calls(calls: list[dict[str, Any]], text: str = "", arg_chunks: int = 3, **options: Any) -> Behaviour:
    return {"kind": "tool_calls", "tool_calls": calls, "text": text, "arg_chunks": arg_chunks, **options}


def error(status: int, message: str = "error", **options: Any) -> Behaviour:
    return {"kind": "error", "status": status, "message": message, **options}


def hang(**options: Any) -> Behaviour:
    return {"kind": "hang", **options}


def raw(lines: list[str], **options: Any) -> Behaviour:
    return {"kind": "raw", "lines": lines, **options}


def malformed(**options: Any) -> Behaviour:
    return {"kind": "malformed", **options}


def close(text: str, chunks: int = 4, after: int = 2, **options: Any) -> Behaviour:
    return {"kind": "close", "text": text, "chunks": chunks, "after": after, **options}


def cut_off(calls: list[dict[str, Any]], keep: int, text: str = "", **options: Any) -> Behaviour:
    """A tool-call answer stopped by the output-token limit after `keep` characters of arguments."""
    return tool_calls(calls, text=text, truncate_args=keep, **options)


def failing(status: int, times: int, then: Behaviour, retry_after: str | float | None = None,
            message: str = "temporarily unavailable", **options: Any) -> list[Behaviour]:
    """`times` answers with HTTP `status` (and `Retry-After: retry_after` when given), then `then`."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return [error(status, message, headers=headers, **options) for _ in range(times)] + [then]


def stream_error(text: str, after: int = 2, status: int = 503, message: str = "upstream overloaded",
                 chunks: int = 4, **options: Any) -> Behaviour:
    """A `text` answer that, after `after` data events (the role chunk counts), reports an error inside the stream."""
    return {"kind": "text", "text": text, "chunks": chunks, "error_after": after, "error_status": status,
            "error_message": message, **options}


EXHAUSTED: Behaviour = {"kind": "error", "status": 500, "message": "openai_server: script exhausted"}

# --------------------------------------------------------------------------- recording


@dataclass
class RecordedRequest:
    n: int
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None
    raw: bytes = b""
    time: float = field(default_factory=time.time)
    refused: int | None = None  # the status of a strict-mode refusal
    violations: list[Any] = field(default_factory=list)  # conversation_rules.Violation items found in strict mode

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "method": self.method, "path": self.path, "headers": self.headers, "body": self.body,
                "refused": self.refused}


def _split(s: str, n: int) -> list[str]:
    """`s` in `n` nearly equal pieces (fewer when `s` is shorter; none when it is empty)."""
    if not s:
        return []
    n = max(1, min(int(n), len(s)))
    size, extra = divmod(len(s), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(s[pos : pos + step])
        pos += step
    return out


class _Stop(Exception):
    """The server is stopping (or the connection was cut on purpose): end the handler quietly."""


# --------------------------------------------------------------------------- the handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.owner._track(self.connection, add=False)

    # -- entry points

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/props" or path.endswith("/models"):  # a server's limits: counted apart from model requests
            owner = self.server.owner
            with owner._lock:
                owner.probes.append(f"GET {path}")
                owner.props_asked += path == "/props"
            if path == "/props" and owner.props is None:
                self._send_json(404, {"error": {"message": "no route for GET /props", "type": "not_found"}})
            elif path == "/props":
                self._send_json(200, owner.props)
            else:
                self._send_json(200, {"object": "list", "data": owner.models})
            return
        req = self._record(b"")
        self._send_json(404, {"error": {"message": f"no route for GET {req.path}", "type": "not_found"}})

    def _ollama_show(self) -> None:
        """Ollama's `POST /api/show`, counted apart from model requests like the other limit probes."""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        owner = self.server.owner
        with owner._lock:
            owner.probes.append("POST /api/show")
        if owner.ollama_show is None:
            self._send_json(404, {"error": "404 page not found"})
        else:
            self._send_json(200, owner.ollama_show)

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") == "/api/show":
            self._ollama_show()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        owner = self.server.owner
        req = self._record(body, publish=False)
        if not req.path.split("?", 1)[0].rstrip("/").endswith("/chat/completions"):  # Azure keeps a query
            owner._publish(req)
            self._send_json(404, {"error": {"message": f"no route for POST {req.path}", "type": "not_found"}})
            return
        behaviour, queued = owner._next_behaviour(req)
        refusal = owner._refusal(req, behaviour)
        owner._publish(req)  # after the verdict, so whoever sees the request also sees `refused`
        if refusal is not None:
            if queued:
                owner._unshift(behaviour)  # a refusal is not a scripted answer: the next request gets this one
            status, obj = refusal
            self._send_json(status, obj)
            return
        try:
            self._run(behaviour, req)
        except _Stop:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError):
            self.close_connection = True  # the client went away

    def _record(self, body: bytes, publish: bool = True) -> RecordedRequest:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        owner = self.server.owner
        req = owner._new_request(self.command, self.path, headers, parsed, body)
        if publish:
            owner._publish(req)
        return req

    # -- behaviours

    def _run(self, b: Behaviour, req: RecordedRequest) -> None:
        kind = b.get("kind", "text")
        owner = self.server.owner
        if kind == "hang" or b.get("hold_before"):
            owner._hold(b.get("gate", "default"), req)
            if kind == "hang":
                self.close_connection = True
                return
        if kind == "error":
            self._error(b, req)
        elif kind in ("text", "tool_calls", "close"):
            self._stream(b, req, self._events(b, req))
        elif kind in ("raw", "malformed"):
            lines = b.get("lines")
            if lines is None:
                lines = ['data: {"choices": [{"index": 0, "delta": {"content": "hel', ""]
            self._stream(b, req, [("raw", "".join(line + "\n" for line in lines))])
        else:
            self._send_json(500, {"error": {"message": f"openai_server: unknown behaviour kind {kind!r}"}})

    def _error(self, b: Behaviour, req: RecordedRequest) -> None:
        status = int(b.get("status", 500))
        if "body_text" in b:
            payload = str(b["body_text"]).encode()
            content_type = b.get("content_type", "text/plain")
        else:
            if "body" in b:
                obj = b["body"]
            else:
                message = str(b.get("message", "error"))
                if b.get("echo_auth"):
                    message += f" (you sent Authorization: {req.header('authorization')})"
                obj = {"error": {"message": message, "type": b.get("type", "test_error"), "code": b.get("code")}}
            payload = json.dumps(obj).encode()
            content_type = "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (b.get("headers") or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _send_json(self, status: int, obj: Any) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _events(self, b: Behaviour, req: RecordedRequest) -> list[tuple[str, Any]]:
        """The data events of a text / tool_calls / close behaviour, as ("delta", (delta, finish_reason)) items."""
        kind = b.get("kind", "text")
        events: list[tuple[str, Any]] = []
        if b.get("role_chunk", True):
            events.append(("delta", ({"role": "assistant", "content": ""}, None)))
        reasoning = b.get("reasoning_deltas")
        if reasoning is None:
            reasoning = _split(str(b.get("reasoning") or ""), int(b.get("reasoning_chunks", 1)))
        field_name = b.get("reasoning_field", "reasoning_content")
        events.extend(("delta", ({field_name: r}, None)) for r in reasoning)
        deltas = b.get("deltas")
        if deltas is None:
            deltas = _split(str(b.get("text") or ""), int(b.get("chunks", 1)))
        events.extend(("delta", ({"content": d}, None)) for d in deltas)
        args_sent = 0
        budget = b.get("truncate_args")  # characters of arguments left before the token limit cuts the answer
        if kind == "tool_calls":
            per_call: list[list[dict[str, Any]]] = []
            for i, call in enumerate(b.get("tool_calls") or []):
                if budget is not None and budget <= 0 and per_call:
                    break  # the limit was reached inside an earlier call: this one never starts
                args = call.get("arguments", {})
                if not isinstance(args, str):
                    args = json.dumps(args)
                if budget is not None:
                    args, budget = args[: max(budget, 0)], budget - len(args)
                args_sent += len(args)
                first: dict[str, Any] = {"index": call.get("index", i), "type": "function"}
                if call.get("id") is not None:
                    first["id"] = call["id"]
                first["function"] = {"name": call.get("name", ""), "arguments": ""}
                pieces = [first] + [
                    {"index": call.get("index", i), "function": {"arguments": p}}
                    for p in _split(args, int(b.get("arg_chunks", 3)))
                ]
                per_call.append(pieces)
            mode = b.get("interleave", "sequential")
            longest = max((len(p) for p in per_call), default=0)
            if mode == "same_chunk":
                for k in range(longest):
                    group = [p[k] for p in per_call if k < len(p)]
                    events.append(("delta", ({"tool_calls": group}, None)))
            else:
                if mode == "round_robin":
                    order = [p[k] for k in range(longest) for p in per_call if k < len(p)]
                else:
                    order = [d for p in per_call for d in p]
                events.extend(("delta", ({"tool_calls": [d]}, None)) for d in order)
        default_finish = "tool_calls" if kind == "tool_calls" else "stop"
        if b.get("truncate_args") is not None:
            default_finish = "length"
        finish = b.get("finish_reason", default_finish)
        usage = self._usage(b, req, sum(map(len, deltas)) + args_sent, sum(map(len, reasoning)))
        if finish is not None:
            if usage is not None and b.get("usage_in_finish"):
                events.append(("delta", ({}, finish, usage)))
                usage = None
            else:
                events.append(("delta", ({}, finish)))
        if usage is not None:
            events.append(("usage", usage))
        return events

    @staticmethod
    def _usage(b: Behaviour, req: RecordedRequest, answer_chars: int, reasoning_chars: int) -> dict[str, Any] | None:
        """The usage object to send, or None when the request did not ask for one (or the behaviour says never)."""
        body = req.body if isinstance(req.body, dict) else {}
        options = body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")) or b.get("usage") is False:
            return None
        if isinstance(b.get("usage"), dict):
            return b["usage"]
        prompt = max(1, len(json.dumps(body.get("messages") or [])) // 4)
        reasoning_tokens = reasoning_chars // 4
        return {
            "prompt_tokens": prompt,
            "completion_tokens": max(1, answer_chars // 4) + reasoning_tokens,
            "total_tokens": prompt + max(1, answer_chars // 4) + reasoning_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }

    def _stream(self, b: Behaviour, req: RecordedRequest, events: list[tuple[str, Any]]) -> None:
        owner = self.server.owner
        model = b.get("model") or (req.body.get("model") if isinstance(req.body, dict) else None) or "test-model"
        self.send_response(200)
        self.send_header("Content-Type", b.get("content_type", "text/event-stream"))
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        delay = float(b.get("delay_ms", 0)) / 1000.0
        fragment = int(b.get("fragment", 0))
        hold_after = b.get("hold_after")
        close_after = int(b["after"]) if b.get("kind") == "close" else None
        error_after = int(b["error_after"]) if b.get("error_after") is not None else None
        gate = b.get("gate", "default")
        body = req.body if isinstance(req.body, dict) else {}
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage")) and b.get("usage") is not False
        if b.get("comments"):
            self._chunk(b": keep-alive\n\nevent: message\n", 0)
        sent = 0
        for i, (what, value) in enumerate(events):
            if hold_after is not None and sent == int(hold_after):
                owner._hold(gate, req)
            if close_after is not None and sent == close_after:
                self._cut()
            if error_after is not None and sent == error_after:
                self._stream_error(b, fragment)
                return
            if i and delay:
                time.sleep(delay)
            if what == "raw":
                data = value.encode()
            else:
                chunk = {
                    "id": f"chatcmpl-test-{req.n}",
                    "object": "chat.completion.chunk",
                    "created": int(req.time),
                    "model": model,
                    "choices": [],
                }
                if what == "usage":
                    chunk["usage"] = value
                else:
                    delta, finish = value[0], value[1]
                    chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
                    if with_usage:
                        chunk["usage"] = value[2] if len(value) > 2 else None
                data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            self._chunk(data, fragment)
            sent += 1
        if hold_after is not None and sent <= int(hold_after):
            owner._hold(gate, req)
        if close_after is not None:
            self._cut()
        if error_after is not None:
            self._stream_error(b, fragment)
            return
        if b.get("done", b.get("kind") not in ("raw", "malformed")):
            self._chunk(b"data: [DONE]\n\n", fragment)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_error(self, b: Behaviour, fragment: int) -> None:
        """An error object inside a stream that already started (how OpenAI-compatible routers report a failure once
        the 200 status is out), then the end of the body without [DONE]."""
        status = int(b.get("error_status", 503))
        error_obj = {"message": str(b.get("error_message", "upstream error")), "type": "server_error", "code": status}
        self._chunk(b"data: " + json.dumps({"error": error_obj}).encode() + b"\n\n", fragment)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes, fragment: int) -> None:
        pieces = [data[i : i + fragment] for i in range(0, len(data), fragment)] if fragment > 0 else [data]
        for j, piece in enumerate(pieces):
            if j:
                time.sleep(0.005)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()

    def _cut(self) -> None:
        """Close the connection abruptly, without finishing the chunked body."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise _Stop()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: "OpenAIServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away, or a connection cut on purpose
        super().handle_error(request, client_address)


# --------------------------------------------------------------------------- the server


class OpenAIServer:
    """A scripted OpenAI-compatible streaming server on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        script: Iterable[ScriptEntry] | None = None,
        *,
        default: Behaviour | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        marker_file: str | os.PathLike[str] | None = None,
        release_file: str | os.PathLike[str] | None = None,
        requests_file: str | os.PathLike[str] | None = None,
        strict: bool = True,
        props: dict[str, Any] | None = None,
        models: list[dict[str, Any]] | None = None,
        ollama_show: dict[str, Any] | None = None,
    ) -> None:
        self.strict = strict
        self.props = props  # what GET /props answers, as llama-server does (None: 404 like other servers)
        self.props_asked = 0  # GET /props requests (kept out of `requests`, which are the model requests)
        # what GET …/models lists (vLLM-style `max_model_len`, llama.cpp `meta`, …) and Ollama's POST /api/show answers
        self.models = models if models is not None else [{"id": "test-model", "object": "model"}]
        self.ollama_show = ollama_show
        self.probes: list[str] = []  # every limit probe (GET /props, GET …/models, POST /api/show), in order
        self._queue: list[ScriptEntry] = list(script or [])
        self.default = default or EXHAUSTED
        self._host = host
        self._port = port
        self.marker_file = os.fspath(marker_file) if marker_file else None
        self.release_file = os.fspath(release_file) if release_file else None
        self.requests_file = os.fspath(requests_file) if requests_file else None
        self._lock = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._counter = 0
        self._holds = 0
        self._gates: dict[str, threading.Event] = {}
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self.request_received = threading.Event()
        self.held = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> "OpenAIServer":
        httpd = _HTTPServer((self._host, self._port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()
        with self._lock:
            for event in self._gates.values():
                event.set()
            conns = list(self._connections)
            self._lock.notify_all()
        self._httpd.shutdown()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give the provider / CAIRN_BASE_URL."""
        return f"{self.url}/v1"

    # -- script

    def push(self, *behaviours: ScriptEntry) -> None:
        with self._lock:
            self._queue.extend(behaviours)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def _next_behaviour(self, req: RecordedRequest) -> tuple[Behaviour, bool]:
        """The behaviour answering `req`, and whether it came from the queue (False: the default)."""
        with self._lock:
            queued = bool(self._queue)
            entry = self._queue.pop(0) if queued else self.default
        return (entry(req) if callable(entry) else entry), queued

    def _unshift(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._queue.insert(0, behaviour)

    # -- strict mode

    def _refusal(self, req: RecordedRequest, behaviour: Behaviour) -> tuple[int, dict[str, Any]] | None:
        """(status, JSON body) refusing `req` the way a strict real server would, or None to answer it."""
        if not self.strict or not behaviour.get("strict", True):
            return None
        body = req.body
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            req.refused = 400
            return 400, _openai_error("Missing required parameter: 'messages'.", param="messages")
        from conversation_rules import conversation_violations  # tests/ is on sys.path (pytest, or run as a script)

        found = conversation_violations(messages, require_reasoning=bool(behaviour.get("require_reasoning")))
        req.violations = list(found)
        if not found:
            return None
        status, obj = _refusal_for(found[0])
        req.refused = status
        return status, obj

    # -- recording

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def _new_request(
        self, method: str, path: str, headers: dict[str, str], body: Any, raw_body: bytes
    ) -> RecordedRequest:
        with self._lock:
            self._counter += 1
            return RecordedRequest(self._counter, method, path, headers, body, raw_body)

    def _publish(self, req: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(req)
            if self.requests_file:
                _append_line(self.requests_file, req.to_json())
            self._marker({"event": "request", "n": req.n, "path": req.path, "time": req.time})
            self.request_received.set()
            self._lock.notify_all()

    @property
    def refusals(self) -> list[RecordedRequest]:
        """The requests strict mode refused."""
        return [r for r in self.requests if r.refused is not None]

    def wait_for_requests(self, n: int = 1, timeout: float = 5.0) -> RecordedRequest:
        """Block until `n` requests have arrived; return the n-th. TimeoutError otherwise."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"openai_server: {len(self._requests)} request(s) after {timeout}s, wanted {n}")
            return self._requests[n - 1]

    # -- holds

    def _gate(self, name: str) -> threading.Event:
        with self._lock:
            event = self._gates.get(name)
            if event is None:
                event = self._gates[name] = threading.Event()
                if self._stopping.is_set():
                    event.set()
            return event

    def release(self, gate: str = "default") -> None:
        self._gate(gate).set()

    def close_gate(self, gate: str = "default") -> None:
        self._gate(gate).clear()

    def _hold(self, gate: str, req: RecordedRequest) -> None:
        event = self._gate(gate)
        with self._lock:
            self._holds += 1
            self._marker({"event": "held", "n": req.n, "gate": gate, "time": time.time()})
            self.held.set()
            self._lock.notify_all()
        while not event.wait(0.05):
            if self._stopping.is_set() or (self.release_file and os.path.exists(self.release_file)):
                break
        if self._stopping.is_set():
            raise _Stop()

    def wait_for_hold(self, n: int = 1, timeout: float = 5.0) -> None:
        """Block until `n` handlers have reached a hold point (their earlier events are sent and flushed)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._holds >= n, timeout):
                raise TimeoutError(f"openai_server: {self._holds} hold(s) after {timeout}s, wanted {n}")

    # -- connections

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _marker(self, record: dict[str, Any]) -> None:
        if self.marker_file:
            _append_line(self.marker_file, record)


def _openai_error(message: str, param: str | None = None, type: str = "invalid_request_error",
                  code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _refusal_for(v: Any) -> tuple[int, dict[str, Any]]:
    """The status and body a strict real server answers for the violation `v` (kind, index, detail)."""
    detail = f" ({v.detail})" if getattr(v, "detail", "") else ""
    if v.kind in ("first_not_user", "alternation"):  # llama.cpp's Jinja chat templates raise this
        message = "Conversation roles must alternate user/assistant/user/assistant/..."
        return 400, {"error": {"code": 400, "message": message + detail, "type": "invalid_request_error"}}
    if v.kind == "bad_arguments":  # llama.cpp parsing assistant tool calls sent back
        message = f"Failed to parse tool call arguments as JSON{detail}"
        return 500, {"error": {"code": 500, "message": message, "type": "server_error"}}
    if v.kind in ("unanswered_tool_call", "orphan_tool_message", "duplicate_id"):
        message = (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. messages[{v.index}]: {v.kind}{detail}"
        )
        return 400, _openai_error(message, param="messages")
    if v.kind == "missing_reasoning":  # DeepSeek in thinking mode
        message = f"Missing `reasoning_content` field in the assistant message at message index {v.index}"
        return 400, _openai_error(message)
    if v.kind == "bad_content":
        return 400, _openai_error(f"Invalid value for 'messages[{v.index}].content'{detail}",
                                  param=f"messages[{v.index}].content")
    return 400, _openai_error(f"Invalid 'messages[{v.index}]': {v.kind}{detail}", param="messages")


def _append_line(path: str, obj: Any) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()


# --------------------------------------------------------------------------- pytest fixture (import it to use it)

if "pytest" in sys.modules:  # not needed (nor imported) in standalone mode
    import pytest

    @pytest.fixture
    def openai_server():
        """An empty, started OpenAIServer; `push()` behaviours onto it."""
        with OpenAIServer() as server:
            yield server


# --------------------------------------------------------------------------- standalone mode


def load_script(path: str) -> tuple[list[Behaviour], Behaviour | None]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, list):
        return data, None
    return list(data.get("responses", [])), data.get("default")


def _script_strict(path: str | None) -> bool:
    if not path:
        return True
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return not (isinstance(data, dict) and data.get("strict") is False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible streaming server for tests.")
    parser.add_argument("--script", help="JSON file: a list of behaviours or {responses: [...], default: {...}}")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--marker-file", help="append a JSON line per request received / hold reached")
    parser.add_argument("--release-file", help="holds end once this file exists")
    parser.add_argument("--requests-file", help="append every recorded request as a JSON line")
    parser.add_argument("--no-strict", action="store_true", help="answer conversations strict servers would refuse")
    args = parser.parse_args(argv)

    script, default = load_script(args.script) if args.script else ([], None)
    strict = not args.no_strict and _script_strict(args.script)
    server = OpenAIServer(
        script,
        default=default,
        host=args.host,
        port=args.port,
        marker_file=args.marker_file,
        release_file=args.release_file,
        requests_file=args.requests_file,
        strict=strict,
    ).start()
    return serve_until_signalled(server, args.port_file, "openai_server")


def serve_until_signalled(server, port_file: str | None, name: str) -> int:
    """A started test server run as a process: its port written atomically to `port_file`, stopped on SIGTERM or
    SIGINT (shared by every scripted server's `main`)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if port_file:
        tmp = f"{port_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(server.port))
        os.replace(tmp, port_file)
    print(f"{name} listening on {server.base_url}", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
