"""The `openai` provider: Chat Completions with `stream: true` over httpx.

Works with any OpenAI-compatible server (OpenAI, DeepSeek, Ollama, vLLM, llama.cpp server). Decisions worth knowing:

- `stream()` is an async generator: calling it contacts nothing; the HTTP request starts on first iteration (the
  pre-request barrier relies on this).
- The API key is sent only as `Authorization: Bearer <key>` (no header when there is no key, as local servers need
  none) and is scrubbed (replaced by `***`) from every error message, since servers may echo request details.
- Streamed tool-call deltas are assembled by `index`; the id and name arrive in the first delta of an index, the
  `function.arguments` text in pieces. A call without an id gets a generated `call_<hex>` id. A call whose arguments
  are empty (some servers send nothing for a no-argument call) gets `"{}"`; otherwise the raw text is kept as sent, even
  when it is not valid JSON (the loop decides what to do with it).
- The stream ends at `data: [DONE]`. A stream that ends without `[DONE]` is accepted only if a `finish_reason` was seen;
  otherwise it is a malformed stream. A chunk carrying `{"error": ...}` ends the stream with that error.
- A server that ignores `stream: true` and answers one `application/json` completion is accepted too.
- Every failure is a `ProviderError` with one readable line and a `code`: `HTTP_<status>`, `TIMEOUT`, `CONNECT`,
  `CONNECTION_LOST` (the server closed the connection mid-stream), `MALFORMED_STREAM`, `STREAM_ERROR` (an error
  object inside the stream), `NETWORK` (any other transport failure).
- Timeouts: `timeout` is a number of seconds (read/write/pool; connect is capped at 10 s; None or <= 0 means no limit
  but the 10 s connect limit) or an `httpx.Timeout`. The read timeout applies to each wait for bytes, so a server that
  hangs (before or during the stream) ends the stream with a `TIMEOUT` error. The caller reads `CAIRN_TIMEOUT`; this
  module reads no environment.
"""

from __future__ import annotations

import json
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator

import httpx

from .base import ModelRequest, ProviderError, RawToolCall, StreamEnd, StreamItem, TextDelta

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT = 120.0  # seconds to wait for the next bytes of an answer
DEFAULT_CONNECT_TIMEOUT = 10.0
MAX_MESSAGE_CHARS = 300  # the part of an error message taken from the server
MAX_ERROR_BODY_BYTES = 64 * 1024


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _make_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    seconds = None if timeout is None else float(timeout)
    if seconds is None or seconds <= 0:  # None / 0 / negative: no limit on waiting for the answer
        return httpx.Timeout(None, connect=DEFAULT_CONNECT_TIMEOUT)
    return httpx.Timeout(seconds, connect=min(seconds, DEFAULT_CONNECT_TIMEOUT))


def _seconds(value: float | None) -> str:
    if value is None:
        return "no limit"
    return f"{value:g}s"


class _ToolCallSlot:
    __slots__ = ("call_id", "name", "parts")

    def __init__(self) -> None:
        self.call_id = ""
        self.name = ""
        self.parts: list[str] = []


class OpenAIProvider:
    """OpenAI-compatible Chat Completions provider (streaming)."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._api_key = api_key or None
        self.timeout = _make_timeout(timeout)
        self.params: dict[str, Any] = dict(params or {})
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIProvider(model={self.model!r}, base_url={self.base_url!r})"

    # ------------------------------------------------------------------ helpers

    @property
    def endpoint(self) -> str:
        if self.base_url.endswith("/chat/completions"):
            return self.base_url
        return f"{self.base_url}/chat/completions"

    def _scrub(self, text: str) -> str:
        key = self._api_key
        if key:
            text = text.replace(key, "***")
        return text

    def _error(self, message: str, code: str) -> ProviderError:
        return ProviderError(self._scrub(_one_line(message)), code=code)

    def _malformed(self, detail: str) -> ProviderError:
        return self._error(f"malformed stream from {self.base_url}: {detail}", "MALFORMED_STREAM")

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": "cairn",
        }
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (the core keys win over params)."""
        body: dict[str, Any] = {**self.params, **(request.params or {})}
        body["model"] = request.model or self.model
        body["messages"] = request.messages
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        else:
            body.pop("tools", None)
        body["stream"] = True
        return body

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # ------------------------------------------------------------------ streaming

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Any number of TextDelta, then exactly one StreamEnd; ProviderError on failure.

        Nothing happens (no client, no connection) until the first iteration."""
        body = self.build_body(request)
        try:
            payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise self._error(f"request is not JSON-serializable: {exc}", "BAD_REQUEST") from None
        client = self._get_client()
        state = _StreamState()
        try:
            async with client.stream("POST", self.endpoint, content=payload, headers=self._headers()) as response:
                if response.status_code >= 400:
                    raise await self._http_error(response)
                content_type = response.headers.get("content-type", "").lower()
                if content_type.startswith("application/json"):
                    items = self._non_streaming(response, state)
                else:
                    items = self._sse(response.aiter_lines(), state)
                async with aclosing(items):
                    async for item in items:
                        yield item
        except ProviderError:
            raise
        except httpx.TimeoutException as exc:
            raise self._timeout_error(exc, state) from None
        except httpx.ConnectError as exc:
            raise self._error(f"cannot reach {self.base_url}: {str(exc) or type(exc).__name__}", "CONNECT") from None
        except httpx.RemoteProtocolError as exc:
            where = "mid-stream" if state.started else "before answering"
            raise self._error(
                f"{self.base_url} closed the connection {where}: {str(exc) or type(exc).__name__}", "CONNECTION_LOST"
            ) from None
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise self._error(
                f"request to {self.base_url} failed: {type(exc).__name__}: {exc}", "NETWORK"
            ) from None

    def _timeout_error(self, exc: httpx.TimeoutException, state: "_StreamState") -> ProviderError:
        t = self.timeout
        if isinstance(exc, httpx.ConnectTimeout):
            what = f"connecting to {self.base_url} timed out after {_seconds(t.connect)}"
        elif isinstance(exc, httpx.WriteTimeout):
            what = f"sending the request to {self.base_url} timed out after {_seconds(t.write)}"
        elif isinstance(exc, httpx.PoolTimeout):
            what = f"waiting for a free connection to {self.base_url} timed out after {_seconds(t.pool)}"
        else:
            where = "in the middle of the answer" if state.started else "for an answer"
            what = f"timed out after {_seconds(t.read)} waiting {where} from {self.base_url} (read timeout)"
        return self._error(f"{what}; a longer limit can be set with CAIRN_TIMEOUT", "TIMEOUT")

    async def _http_error(self, response: httpx.Response) -> ProviderError:
        raw = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                raw.extend(chunk)
                if len(raw) >= MAX_ERROR_BODY_BYTES:
                    break
        except httpx.HTTPError:
            pass  # the status is what matters; the body is a courtesy
        text = bytes(raw).decode("utf-8", errors="replace")
        detail = _error_detail(text)
        status = response.status_code
        reason = response.reason_phrase or ""
        message = f"HTTP {status}{(' ' + reason) if reason else ''} from {self.base_url}"
        if detail:
            message += f": {_truncate(self._scrub(detail))}"
        return self._error(message, f"HTTP_{status}")

    async def _non_streaming(self, response: httpx.Response, state: "_StreamState") -> AsyncIterator[StreamItem]:
        raw = await response.aread()
        if raw.lstrip().startswith(b"data:"):  # an event stream mislabelled as JSON
            for item in await _collect(self._sse(_aiter(raw.decode("utf-8", "replace").splitlines()), state)):
                yield item
            return
        try:
            data = json.loads(raw)
        except ValueError:
            snippet = _truncate(self._scrub(raw.decode("utf-8", "replace")), 120)
            raise self._malformed(f"the answer is not JSON: {snippet}") from None
        if not isinstance(data, dict):
            raise self._malformed("the answer is not a JSON object")
        self._check_error_payload(data)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed("the answer has no choices")
        choice = choices[0]
        message = choice.get("message") or choice.get("delta") or {}
        if not isinstance(message, dict):
            raise self._malformed("the answer's message is not an object")
        state.started = True
        content = message.get("content")
        if isinstance(content, str) and content:
            yield TextDelta(content)
        self._add_tool_calls(state, message.get("tool_calls"))
        state.finish_reason = choice.get("finish_reason") or state.finish_reason
        yield state.end()

    async def _sse(self, lines: AsyncIterator[str], state: "_StreamState") -> AsyncIterator[StreamItem]:
        async with aclosing(lines):
            async for item in self._sse_events(lines, state):
                yield item

    async def _sse_events(self, lines: AsyncIterator[str], state: "_StreamState") -> AsyncIterator[StreamItem]:
        data_lines: list[str] = []
        done = False
        async for line in lines:
            if line == "":
                if data_lines:
                    data, data_lines = "\n".join(data_lines), []
                    if data.strip() == "[DONE]":
                        done = True
                        break
                    for item in self._handle_event(data, state):
                        yield item
                continue
            if line.startswith(":"):
                continue  # SSE comment (keep-alive)
            field, sep, value = line.partition(":")
            if not sep:
                field, value = line, ""
            elif value.startswith(" "):
                value = value[1:]
            if field == "data":
                if data_lines:
                    pending = "\n".join(data_lines)
                    if _is_json(pending):  # a server that omits the blank line between events
                        data_lines = []
                        for item in self._handle_event(pending, state):
                            yield item
                if value.strip() == "[DONE]" and not data_lines:
                    done = True
                    break
                data_lines.append(value)
            # event:, id:, retry: and unknown fields are ignored
        if not done and data_lines:  # the last event had no blank line after it
            data = "\n".join(data_lines)
            if data.strip() == "[DONE]":
                done = True
            else:
                for item in self._handle_event(data, state):
                    yield item
        if not done and state.finish_reason is None:
            raise self._malformed("it ended before [DONE] and without a finish_reason")
        yield state.end()

    def _handle_event(self, data: str, state: "_StreamState") -> list[StreamItem]:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._malformed(f"a data line is not JSON: {_truncate(self._scrub(data), 120)}") from None
        if not isinstance(chunk, dict):
            raise self._malformed("a chunk is not a JSON object")
        self._check_error_payload(chunk)
        if "choices" not in chunk:
            if "usage" in chunk:
                return []  # a usage-only chunk
            raise self._malformed("a chunk has no choices")
        choices = chunk["choices"]
        if not isinstance(choices, list):
            raise self._malformed("choices is not a list")
        state.started = True
        out: list[StreamItem] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._malformed("a choice is not an object")
            if choice.get("index", 0) != 0:
                continue  # only the first choice is used
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise self._malformed("delta is not an object")
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(TextDelta(content))
            self._add_tool_calls(state, delta.get("tool_calls"))
            if choice.get("finish_reason"):
                state.finish_reason = str(choice["finish_reason"])
        return out

    def _check_error_payload(self, payload: dict[str, Any]) -> None:
        error = payload.get("error")
        if error:
            detail = _error_detail(json.dumps({"error": error})) or "unknown error"
            raise self._error(
                f"{self.base_url} reported an error: {_truncate(self._scrub(detail))}", "STREAM_ERROR"
            )

    def _add_tool_calls(self, state: "_StreamState", tool_calls: Any) -> None:
        if tool_calls is None:
            return
        if not isinstance(tool_calls, list):
            raise self._malformed("tool_calls is not a list")
        for tc in tool_calls:
            if not isinstance(tc, dict):
                raise self._malformed("a tool call is not an object")
            slot = state.slot_for(tc)
            call_id = tc.get("id")
            if isinstance(call_id, str) and call_id and not slot.call_id:
                slot.call_id = call_id
            function = tc.get("function") or {}
            if not isinstance(function, dict):
                raise self._malformed("a tool call has no function")
            name = function.get("name")
            if isinstance(name, str) and name and not slot.name:
                slot.name = name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                slot.parts.append(arguments)
            elif arguments is not None:  # some servers send an object instead of text
                slot.parts.append(json.dumps(arguments, ensure_ascii=False))


class _StreamState:
    def __init__(self) -> None:
        self.slots: dict[int, _ToolCallSlot] = {}
        self.finish_reason: str | None = None
        self.started = False  # a chunk (or a whole answer) has been received

    def slot_for(self, tc: dict[str, Any]) -> _ToolCallSlot:
        index = tc.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index (some servers send whole calls): a new id starts a new call, else continue the last one.
            call_id = tc.get("id")
            known = {s.call_id for s in self.slots.values()}
            if not self.slots or (call_id and call_id not in known):
                index = max(self.slots, default=-1) + 1
            else:
                index = max(self.slots)
        slot = self.slots.get(index)
        if slot is None:
            slot = self.slots[index] = _ToolCallSlot()
        return slot

    def end(self) -> StreamEnd:
        calls = []
        for index in sorted(self.slots):
            slot = self.slots[index]
            arguments = "".join(slot.parts)
            if not arguments.strip():
                arguments = "{}"
            call_id = slot.call_id or f"call_{uuid.uuid4().hex[:24]}"
            calls.append(RawToolCall(call_id=call_id, name=slot.name, arguments=arguments))
        return StreamEnd(tool_calls=calls, finish_reason=self.finish_reason)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def _aiter(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


async def _collect(items: AsyncIterator[StreamItem]) -> list[StreamItem]:
    return [item async for item in items]


def _error_detail(text: str) -> str:
    """The server's error message from an error body (`error.message`, `error` as text, `message`, `detail`), or the
    body's text itself."""
    text = text.strip()
    if not text:
        return ""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str) and message:
                return message
            return json.dumps(error, ensure_ascii=False)
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            value = data.get(key)
            if isinstance(value, str) and value:
                return value
    return text
