"""The `openai` provider: Chat Completions with `stream: true` over httpx.

Works with any OpenAI-compatible server (OpenAI, DeepSeek, OpenRouter, Azure, Ollama, vLLM, llama.cpp server, LiteLLM).
Decisions worth knowing:

- `stream()` is an async generator: calling it contacts nothing; the HTTP request starts on first iteration (the
  pre-request barrier relies on this). The `httpx.AsyncClient` is built in the constructor, because building it (TLS
  context, certificates) cost the first request of a session ~40 ms; building it opens no connection. Its TLS context
  is the process's one (`tls.py`): loading the certificates again for every session cost each one ~50 ms.
- The API key is sent only as `Authorization: Bearer <key>`, or as the raw key in the header `api_key_header` names
  (Azure's `api-key`); no header when there is no key, as local servers need none. The key is scrubbed (replaced
  by `***`) from every error message, since servers may echo request details.
  Credentials inside the base URL (userinfo, key-like query parameters) are used as given (httpx sends userinfo as
  Basic auth) but never shown: `redact_url()` hides them in every message and in `repr`, and `secrets` lists every
  secret string so the composition can scrub them from the log too.
- Body: only the parameters that are set are sent (`max_tokens` defaults to 8192); `tool_choice` and
  `parallel_tool_calls` only with tools, as OpenAI refuses them otherwise. Precedence, lowest first: the named
  constructor arguments, `params`, `extra_body`, the request's own params; `model`, `messages`, `tools` and `stream`
  always come from the request. `stream_options: {"include_usage": true}` is sent unless `include_usage=False`.
- Streamed tool-call deltas are assembled by `index`; the id and name arrive in the first delta of an index, the
  `function.arguments` text in pieces. A call without an id gets a generated `call_<hex>` id. A call whose arguments
  are empty (some servers send nothing for a no-argument call) gets `"{}"`; otherwise the raw text is kept as sent, even
  when it is not valid JSON (the loop decides what to do with it). Repeated ids are passed on as sent: the loop makes
  them unique.
- Reasoning arrives as `reasoning_content` (DeepSeek, vLLM, llama.cpp) or `reasoning` (OpenRouter, Ollama) and is
  yielded as `ReasoningDelta`; when a delta carries both, `reasoning_content` wins (some servers mirror one into the
  other). Usage comes from any chunk's `usage` (usually a last chunk with `choices: []`).
- `finish_reason` is normalised onto stop | tool_calls | length | content_filter | other. The stream ends at
  `data: [DONE]`; one that ends with `[DONE]` but no finish reason yields `StreamEnd(finish_reason=None)`, which the
  loop treats as malformed. A stream that ends with neither is a `MALFORMED_STREAM` error. A chunk carrying
  `{"error": ...}` ends the stream with that error.
- A server that ignores `stream: true` and answers one `application/json` completion is accepted too.
- Every failure is a `ProviderError` with one readable line and a `code`: `HTTP_<status>`, `TIMEOUT`, `CONNECT`,
  `CONNECTION_LOST` (the server closed the connection), `MALFORMED_STREAM`, `STREAM_ERROR` (an error object inside the
  stream), `NETWORK` (any other transport failure). `retryable` is set for the statuses in `RETRYABLE_STATUSES`, and
  for connection failures, timeouts and lost connections before the first chunk of the answer (nothing was shown, so
  sending the request again duplicates nothing). `retry_after` comes from `Retry-After` (seconds or an HTTP date) or
  `retry-after-ms`, capped at 60 s. The retry loop itself lives in `app/agent/exchange.py`.
- Timeouts: `timeout` is a number of seconds (read/write/pool; connect is capped at 10 s; None or <= 0 means no limit
  but the 10 s connect limit) or an `httpx.Timeout`. The read timeout applies to each wait for bytes, so a server that
  hangs (before or during the stream) ends the stream with a `TIMEOUT` error. The caller reads `CAIRN_TIMEOUT`; this
  module reads no environment.
"""

from __future__ import annotations

import json
import uuid
from contextlib import aclosing
from typing import Any, AsyncGenerator, AsyncIterator, cast
from urllib.parse import urlsplit, urlunsplit

import httpx

from cairn.persistence.events import Usage

from .base import (
    RETRYABLE_STATUSES,
    ConnectFailed,
    ConnectionLost,
    HTTPStatusError,
    MalformedStream,
    ModelRequest,
    NetworkError,
    ProviderError,
    ProviderLimits,
    ProviderTimeout,
    RawToolCall,
    ReasoningDelta,
    StreamEnd,
    ServedWindow,
    ServerReportedError,
    StreamItem,
    TextDelta,
    UnsendableRequest,
    encode_json,
    parse_json,
)
from .replies import (
    error_codes,
    error_detail,
    is_json,
    normalize_finish_reason,
    one_line,
    one_line_cut,
    parse_retry_after,
    parse_usage,
    reasoning_text,
)
from .tls import shared_ssl_context
from .urls import MIN_SECRET_CHARS, endpoint_of, is_secret_name, redact_url, url_credentials

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT = 120.0  # seconds to wait for the next bytes of an answer
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_TOKENS = 8192
MAX_ERROR_BODY_BYTES = 64 * 1024


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
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
        top_p: float | None = None,
        reasoning_effort: str | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        include_usage: bool = True,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        api_key_header: str | None = None,
    ) -> None:
        self.model = model
        # where the key goes: `Authorization: Bearer` (default), or the raw key in another header (Azure's `api-key`)
        self.api_key_header = (api_key_header or "authorization").lower()
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._shown_url = redact_url(self.base_url)
        self._api_key = api_key or None
        self.timeout = _make_timeout(timeout)
        self.params: dict[str, Any] = dict(params or {})
        self.max_tokens = max_tokens  # what a request sends unless it names its own (`ModelRequest.max_tokens`)
        self.max_tokens_explicit = False  # set by whoever built it from an explicit setting (a window never lowers it)
        self.temperature = temperature
        self.top_p = top_p
        self.reasoning_effort = reasoning_effort
        self.tool_choice = tool_choice
        self.parallel_tool_calls = parallel_tool_calls
        self.include_usage = include_usage
        self.extra_headers: dict[str, str] = dict(extra_headers or {})
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self._client: httpx.AsyncClient | None = self._new_client()  # builds, connects nothing

    def __repr__(self) -> str:  # never show the key or URL credentials
        return f"OpenAIProvider(model={self.model!r}, base_url={self._shown_url!r})"

    async def served_window(self) -> ServedWindow | None:
        """The context size a local server says it has, and where it said it (see `served_limits`), asked once per
        endpoint; None when it does not say, or for a hosted endpoint (nothing is sent there for it)."""
        from .served_limits import served_context_window

        auth = {k: v for k, v in self._headers().items() if k.lower() not in ("content-type", "accept")}
        return await served_context_window(self._get_client(), self.base_url, self.model, auth)

    @property
    def limits(self) -> ProviderLimits:
        return ProviderLimits(endpoint=self.recorded_endpoint, max_tokens=self.max_tokens,
                              max_tokens_set=self.max_tokens_explicit)

    @property
    def recorded_endpoint(self) -> str:
        """The base URL as `request/header.endpoint` records it (no credentials): where a resume sends requests."""
        return endpoint_of(self.base_url)

    # ------------------------------------------------------------------ helpers

    @property
    def endpoint(self) -> str:
        """`<base_url>/chat/completions`, keeping a query string (Azure's `?api-version=…`) after the path."""
        try:
            parts = urlsplit(self.base_url)
        except ValueError:
            parts = None
        if parts is None or not parts.query:
            if self.base_url.endswith("/chat/completions"):
                return self.base_url
            return f"{self.base_url}/chat/completions"
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path += "/chat/completions"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))

    @property
    def secrets(self) -> list[str]:
        """Every secret string this provider holds (the key, URL credentials, values of auth-like extra headers), for
        the session's scrubber. Longest first, so a scrubber replacing in order never leaves part of one behind."""
        found: list[str] = [self._api_key] if self._api_key else []
        found += [v for v in url_credentials(self.base_url) if len(v) >= MIN_SECRET_CHARS]
        for name, value in self.extra_headers.items():
            if is_secret_name(name) or "key" in name.lower() or "token" in name.lower():
                value = str(value)
                found.append(value)
                scheme, _, rest = value.partition(" ")
                if rest and scheme.lower() in ("bearer", "basic", "token"):
                    found.append(rest)
        unique = [v for v in dict.fromkeys(found) if len(v) >= MIN_SECRET_CHARS or v == self._api_key]
        return sorted(unique, key=len, reverse=True)

    def _scrub(self, text: str) -> str:
        if self.base_url != self._shown_url:
            text = text.replace(self.base_url, self._shown_url)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def _error(
        self, kind: type[ProviderError], message: str, code: str | None = None, retryable: bool = False,
        retry_after: float | None = None, server_codes: tuple[str, ...] = (),
    ) -> ProviderError:
        return kind(self._scrub(one_line(message)), code=code, retryable=retryable, retry_after=retry_after,
                    server_codes=tuple(self._scrub(c) for c in server_codes))

    def _malformed(self, detail: str) -> ProviderError:
        return self._error(MalformedStream, f"malformed stream from {self._shown_url}: {detail}")

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": "cairn",
        }
        if self._api_key and self.api_key_header == "authorization":
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._api_key:
            headers[self.api_key_header] = self._api_key
        headers.update({str(k): str(v) for k, v in self.extra_headers.items()})
        return headers

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (see the module docstring for what wins over what)."""
        body: dict[str, Any] = {}
        for name, value in (
            ("max_tokens", self.max_tokens if request.max_tokens is None else request.max_tokens),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("reasoning_effort", self.reasoning_effort),
        ):
            if value is not None:
                body[name] = value
        if request.tools:
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
            if self.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = self.parallel_tool_calls
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(self.params)
        body.update(self.extra_body)
        body.update(request.params or {})
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

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout, verify=shared_ssl_context())  # (one per process: tls.py)

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:  # closed by aclose(): a later stream() builds a new one
            self._client = self._new_client()
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # ------------------------------------------------------------------ streaming

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Any number of TextDelta / ReasoningDelta, then exactly one StreamEnd; ProviderError on failure.

        Nothing is contacted until the first iteration."""
        body = self.build_body(request)
        try:
            payload = encode_json(body)
        except (TypeError, ValueError) as exc:
            raise self._error(UnsendableRequest, f"request is not JSON-serializable: {exc}") from None
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
            raise self._error(
                ConnectFailed, f"cannot reach {self._shown_url}: {str(exc) or type(exc).__name__}", retryable=True
            ) from None
        except httpx.RemoteProtocolError as exc:
            where = "mid-stream" if state.started else "before answering"
            raise self._error(
                ConnectionLost,
                f"{self._shown_url} closed the connection {where}: {str(exc) or type(exc).__name__}",
                retryable=not state.started,
            ) from None
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise self._error(
                NetworkError,
                f"request to {self._shown_url} failed: {type(exc).__name__}: {exc}",
                retryable=isinstance(exc, httpx.NetworkError) and not state.started,
            ) from None

    def _timeout_error(self, exc: httpx.TimeoutException, state: "_StreamState") -> ProviderError:
        t = self.timeout
        url = self._shown_url
        if isinstance(exc, httpx.ConnectTimeout):
            what = f"connecting to {url} timed out after {_seconds(t.connect)}"
        elif isinstance(exc, httpx.WriteTimeout):
            what = f"sending the request to {url} timed out after {_seconds(t.write)}"
        elif isinstance(exc, httpx.PoolTimeout):
            what = f"waiting for a free connection to {url} timed out after {_seconds(t.pool)}"
        else:
            where = "in the middle of the answer" if state.started else "for an answer"
            what = f"timed out after {_seconds(t.read)} waiting {where} from {url} (read timeout)"
        return self._error(
            ProviderTimeout, f"{what}; a longer limit can be set with CAIRN_TIMEOUT", retryable=not state.started
        )

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
        detail = error_detail(text)
        status = response.status_code
        reason = response.reason_phrase or ""
        message = f"HTTP {status}{(' ' + reason) if reason else ''} from {self._shown_url}"
        if detail:
            message += f": {one_line_cut(self._scrub(detail))}"
        return self._error(
            HTTPStatusError,
            message,
            f"HTTP_{status}",
            retryable=status in RETRYABLE_STATUSES,
            retry_after=parse_retry_after(response.headers),
            server_codes=error_codes(text),
        )

    async def _non_streaming(self, response: httpx.Response, state: "_StreamState") -> AsyncGenerator[StreamItem, None]:
        raw = await response.aread()
        if raw.lstrip().startswith(b"data:"):  # an event stream mislabelled as JSON
            for item in await _collect(self._sse(_aiter(raw.decode("utf-8", "replace").splitlines()), state)):
                yield item
            return
        try:
            data = parse_json(raw)
        except ValueError:
            snippet = one_line_cut(self._scrub(raw.decode("utf-8", "replace")), 120)
            raise self._malformed(f"the answer is not JSON: {snippet}") from None
        if not isinstance(data, dict):
            raise self._malformed("the answer is not a JSON object")
        self._check_error_payload(data, state)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed("the answer has no choices")
        choice = choices[0]
        message = choice.get("message") or choice.get("delta") or {}
        if not isinstance(message, dict):
            raise self._malformed("the answer's message is not an object")
        state.started = True
        reasoning = reasoning_text(message)
        if reasoning:
            yield ReasoningDelta(reasoning)
        content = message.get("content")
        if isinstance(content, str) and content:
            yield TextDelta(content)
        self._add_tool_calls(state, message.get("tool_calls"))
        state.finish_reason = normalize_finish_reason(choice.get("finish_reason")) or state.finish_reason
        state.usage = parse_usage(data.get("usage")) or state.usage
        yield state.end()

    async def _sse(self, lines: AsyncIterator[str], state: "_StreamState") -> AsyncGenerator[StreamItem, None]:
        async with aclosing(cast(AsyncGenerator[str, None], lines)):  # (httpx's aiter_lines is an async generator)
            async for item in self._sse_events(lines, state):
                yield item

    async def _sse_events(self, lines: AsyncIterator[str], state: "_StreamState") -> AsyncGenerator[StreamItem, None]:
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
                    if is_json(pending):  # a server that omits the blank line between events
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
        yield state.end()  # [DONE] without a finish_reason: finish_reason None, the loop's call

    def _handle_event(self, data: str, state: "_StreamState") -> list[StreamItem]:
        try:
            chunk = parse_json(data)
        except ValueError:
            raise self._malformed(f"a data line is not JSON: {one_line_cut(self._scrub(data), 120)}") from None
        if not isinstance(chunk, dict):
            raise self._malformed("a chunk is not a JSON object")
        self._check_error_payload(chunk, state)
        usage = parse_usage(chunk.get("usage"))
        if usage is not None:
            state.usage = usage
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
            reasoning = reasoning_text(delta)
            if reasoning:
                out.append(ReasoningDelta(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(TextDelta(content))
            self._add_tool_calls(state, delta.get("tool_calls"))
            finish = normalize_finish_reason(choice.get("finish_reason"))
            if finish is not None:
                state.finish_reason = finish
        return out

    def _check_error_payload(self, payload: dict[str, Any], state: "_StreamState") -> None:
        """An `{"error": ...}` object in place of an answer. Retryable only when it carries a retryable status and
        no chunk of the answer came before it (OpenRouter reports upstream overloads this way)."""
        error = payload.get("error")
        if error:
            body = json.dumps({"error": error})
            detail = error_detail(body) or "unknown error"
            status = error.get("code") if isinstance(error, dict) else None
            try:
                status = int(status) if status is not None and not isinstance(status, bool) else None
            except (TypeError, ValueError):
                status = None
            raise self._error(
                ServerReportedError,
                f"{self._shown_url} reported an error: {one_line_cut(self._scrub(detail))}",
                retryable=status in RETRYABLE_STATUSES and not state.started,
                server_codes=error_codes(body),
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
        self.finish_reason: str | None = None  # normalised
        self.usage: Usage | None = None
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
        return StreamEnd(tool_calls=calls, finish_reason=self.finish_reason, usage=self.usage)


async def _aiter(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


async def _collect(items: AsyncIterator[StreamItem]) -> list[StreamItem]:
    return [item async for item in items]
