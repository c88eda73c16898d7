"""What a model provider is to the loop: something that turns a request into a stream of text deltas and a final list of
tool calls. Providers never see the session; the loop records what they produce.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Protocol, Sequence, runtime_checkable

import msgspec

from cairn.persistence.events import Usage

from ..config.checks import nested_deeper_than

MAX_JSON_NESTING = 64  # levels of arrays/objects in anything a server or model sends (a chunk nests about 7)


class NestedTooDeeply(ValueError):
    """JSON from outside nests its arrays or objects deeper than MAX_JSON_NESTING (or than Python can parse)."""

    def __init__(self) -> None:
        super().__init__(f"arrays or objects nested more than {MAX_JSON_NESTING} levels deep")


def parse_json(text: str | bytes | bytearray) -> Any:
    """`json.loads` for what a server or a model sends: a ValueError for whatever is malformed, including JSON nested
    so deeply that Python's parser would raise RecursionError (100,000 `[` in one chunk), or nested deeper than
    MAX_JSON_NESTING (a value that only just parsed could still overflow the stack later, when it is checked, encoded
    or sent back). Callers treat it like any malformed JSON: a malformed stream, or invalid tool arguments."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestedTooDeeply() from None
    if isinstance(value, (list, dict)):
        opened = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
        if opened > MAX_JSON_NESTING and nested_deeper_than(value, MAX_JSON_NESTING):  # (cheap bound first)
            raise NestedTooDeeply()
    return value


_ENCODER = msgspec.json.Encoder()


def encode_json(value: Any) -> bytes:
    """A request body as UTF-8 JSON. msgspec: ~30x faster than `json.dumps` on a long conversation, which every request
    carries whole (P14); what msgspec refuses (keys that are neither strings nor numbers) goes through `json.dumps` as
    before. Non-finite floats become null. A TypeError or ValueError for what neither can encode."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, RecursionError):
        return json.dumps(value, ensure_ascii=False).encode("utf-8")


class ToolSchema(msgspec.Struct, frozen=True):
    """A tool as the model sees it (OpenAI function-calling shape)."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object


class ModelRequest(msgspec.Struct):
    messages: list[dict[str, Any]]  # OpenAI chat messages (role/content/tool_calls/tool_call_id)
    tools: list[ToolSchema]
    model: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)  # e.g. temperature; recorded in request/header
    turn: int = 0
    step: int = 0
    max_tokens: int | None = None  # the output-token limit for this request (None: the provider's own)


class TextDelta(msgspec.Struct, frozen=True):
    text: str


class ReasoningDelta(msgspec.Struct, frozen=True):
    """A piece of the model's reasoning (DeepSeek `reasoning_content`, `reasoning`, Anthropic thinking)."""

    text: str


class RawToolCall(msgspec.Struct, frozen=True):
    """A complete tool call. `arguments` is the raw JSON text the model produced (it may be invalid JSON)."""

    call_id: str
    name: str
    arguments: str


class StreamEnd(msgspec.Struct, frozen=True):
    tool_calls: list[RawToolCall]
    # stop | tool_calls | length | content_filter | other (providers map their own words onto these); None means the
    # stream never said why it ended, which the loop treats as a malformed stream.
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning_meta: dict[str, Any] | None = None  # what the provider needs sent back with the reasoning


StreamItem = TextDelta | ReasoningDelta | StreamEnd

# HTTP statuses worth another attempt when no delta of the answer has arrived yet (SPEC §7 rev 2)
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MIN_OUTPUT_TOKENS = 256  # a window-derived output limit never goes below this


class ProviderError(Exception):
    """A provider failed. The message is one readable line with no secrets; callers catch the kind they care about
    (the subclasses below, after httpx's `_exceptions.py`), and `code` is what the log and the faces write (SPEC:
    `HTTP_<status>`, `TIMEOUT`, `CONNECT`, …, unchanged strings).

    `retryable`: the same request may succeed if sent again (a retryable HTTP status, a connection failure) — the loop
    retries only when no delta of the answer had arrived. `retry_after`: seconds the server asked us to wait.
    `server_codes`: the identifiers the server's error body gave beside its message (OpenAI's `code`, llama.cpp's
    `type`: `context_length_exceeded`, `exceed_context_size_error`), which say what happened as surely as its words.

    `ProviderError(message, code)` with a known code builds that code's kind (`ProviderError(m, "HTTP_503")` is an
    `HTTPStatusError`), so an error made by code is caught by kind like one a provider raised.

    ProviderError
    ├── TransportError          the request or its answer did not get through
    │   ├── ProviderTimeout       TIMEOUT
    │   ├── ConnectFailed         CONNECT
    │   ├── ConnectionLost        CONNECTION_LOST
    │   └── NetworkError          NETWORK
    ├── HTTPStatusError         HTTP_<status> (`status`)
    ├── ServerReportedError     STREAM_ERROR: an error object where the answer should be
    ├── MalformedStream         MALFORMED_STREAM
    ├── UnsendableRequest       BAD_REQUEST: the request could not be encoded
    ├── ProviderUnavailable     PROVIDER_UNAVAILABLE: no provider could be built
    └── (agent.compaction.CompactionFailed  COMPACTION_FAILED)
    """

    default_code = "PROVIDER_ERROR"

    def __new__(cls, message: str = "", code: str | None = None, *args: Any, **kwargs: Any) -> "ProviderError":
        if cls is ProviderError and code is not None:
            cls = _kind_of(code)
        return super().__new__(cls, message)

    def __init__(
        self, message: str, code: str | None = None, retryable: bool = False, retry_after: float | None = None,
        server_codes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.code: str = code or self.default_code
        self.retryable = retryable
        self.retry_after = retry_after
        self.server_codes = server_codes

    def says(self, *words: str) -> bool:
        """Whether the message or one of the server's codes contains one of `words` (lower case)."""
        said = " ".join((str(self), *self.server_codes)).lower()
        return any(word in said for word in words)


class TransportError(ProviderError):
    """The request or its answer did not get through (nothing the server said)."""


class ProviderTimeout(TransportError):
    default_code = "TIMEOUT"


class ConnectFailed(TransportError):
    default_code = "CONNECT"


class ConnectionLost(TransportError):
    """The server closed the connection (before answering, or mid-stream)."""

    default_code = "CONNECTION_LOST"


class NetworkError(TransportError):
    default_code = "NETWORK"


class HTTPStatusError(ProviderError):
    """The server answered with an HTTP error status; `code` is `HTTP_<status>`."""

    @property
    def status(self) -> int:
        digits = self.code.removeprefix("HTTP_")
        return int(digits) if digits.isdigit() else 0


class ServerReportedError(ProviderError):
    """An error object in place of the answer (inside the stream, or as the whole answer)."""

    default_code = "STREAM_ERROR"


class MalformedStream(ProviderError):
    default_code = "MALFORMED_STREAM"


class UnsendableRequest(ProviderError):
    default_code = "BAD_REQUEST"


class ProviderUnavailable(ProviderError):
    default_code = "PROVIDER_UNAVAILABLE"


_KINDS: dict[str, type[ProviderError]] = {
    kind.default_code: kind
    for kind in (ProviderTimeout, ConnectFailed, ConnectionLost, NetworkError, ServerReportedError, MalformedStream,
                 UnsendableRequest, ProviderUnavailable)
}


def _kind_of(code: str) -> type[ProviderError]:
    if code.startswith("HTTP_"):
        return HTTPStatusError
    return _KINDS.get(code, ProviderError)


class ProviderLimits(msgspec.Struct, frozen=True):
    """What a provider declares beside streaming, as one value (nothing probes a provider for optional attributes).

    `endpoint`: where its requests go, as `request/header.endpoint` records it (no credentials; None: no server).
    `max_tokens`: the output-token limit it sends (None: it sends none). `max_tokens_set`: the operator set it, so a
    known window never lowers it. `unavailable`: why it cannot answer (no key, no script), or None."""

    endpoint: str | None = None
    max_tokens: int | None = None
    max_tokens_set: bool = False
    unavailable: str | None = None

    def output_tokens(self, window: int | None) -> int | None:
        """The output-token limit a request within `window` sends: the default one kept well inside the window (a
        quarter of it, at least MIN_OUTPUT_TOKENS), so a small model that never stops cannot fill the whole context;
        one the operator set is sent as set (SPEC §7 rev 3)."""
        if self.max_tokens_set or not self.max_tokens or not window:
            return self.max_tokens
        return max(MIN_OUTPUT_TOKENS, min(self.max_tokens, window // 4))


NO_LIMITS = ProviderLimits()
ServedWindow = tuple[int, str]  # (tokens, where the server said it), e.g. (8192, "server (GET /props)")


@runtime_checkable
class Provider(Protocol):
    """A model server as the loop sees it.

    `stream`, `name`, `model` and `aclose` are what every provider has. `limits`, `secrets` and `served_window` are
    declared by each of Cairn's providers; one that has only the first four (a test's stand-in, a Python API caller's
    own) is still accepted: `limits_of` and `secrets_of` answer for it (none), and the loop asks no served window."""

    name: str  # "openai", "anthropic", "demo", "script"
    model: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Stream the answer: any number of TextDelta / ReasoningDelta, then exactly one StreamEnd. Raise ProviderError on failure.

        Calling this must not contact anything: work starts on first iteration (the pre-request barrier relies on it).
        """
        ...

    async def aclose(self) -> None: ...

    @property
    def limits(self) -> ProviderLimits: ...

    @property
    def secrets(self) -> Sequence[str]:
        """Every secret string it holds (key, URL credentials), for the session's scrubber."""
        ...

    async def served_window(self) -> ServedWindow | None:
        """The context window its server says it has, asked once per endpoint; None when it does not say."""
        ...


def limits_of(provider: object) -> ProviderLimits:
    """The provider's declared limits; none for one that declares none."""
    return provider.limits if isinstance(provider, Provider) else NO_LIMITS


def secrets_of(provider: object) -> list[str]:
    """The secret strings the provider holds; none for one that declares none."""
    return [s for s in provider.secrets if s] if isinstance(provider, Provider) else []


class NoServer:
    """The declarations of a provider that sends nothing anywhere (demo, script): no endpoint, no output limit, no
    secrets, no served window."""

    limits = NO_LIMITS
    secrets: Sequence[str] = ()

    async def served_window(self) -> ServedWindow | None:
        return None


class UnavailableProvider(NoServer):
    """Stands in for a provider that cannot be built (no key, no script, a server not named): the TUI still opens a
    session, shows what was interrupted and takes verdicts — none of that needs a model — and says `reason` when a
    prompt would need one. It never contacts anything."""

    def __init__(self, name: str, model: str, reason: str) -> None:
        self.name, self.model, self.unavailable = name, model, reason
        self.limits = ProviderLimits(unavailable=reason)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        raise ProviderUnavailable(self.unavailable)
        yield  # pragma: no cover - (an async generator, like every provider's stream)

    async def aclose(self) -> None:
        pass
