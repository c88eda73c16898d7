"""What a model provider is to the loop: something that turns a request into a stream of text deltas and a final list of
tool calls. Providers never see the session; the loop records what they produce.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Protocol

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


class ProviderError(Exception):
    """A provider failed (HTTP status, timeout, malformed stream). The message is one readable line with no secrets.

    `retryable`: the same request may succeed if sent again (a retryable HTTP status, a connection failure) — the loop
    retries only when no delta of the answer had arrived. `retry_after`: seconds the server asked us to wait.
    `server_codes`: the identifiers the server's error body gave beside its message (OpenAI's `code`, llama.cpp's
    `type`: `context_length_exceeded`, `exceed_context_size_error`), which say what happened as surely as its words.
    """

    def __init__(
        self, message: str, code: str = "PROVIDER_ERROR", retryable: bool = False, retry_after: float | None = None,
        server_codes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
        self.server_codes = server_codes

    def says(self, *words: str) -> bool:
        """Whether the message or one of the server's codes contains one of `words` (lower case)."""
        said = " ".join((str(self), *self.server_codes)).lower()
        return any(word in said for word in words)


class Provider(Protocol):
    name: str  # "openai", "demo", "script"
    model: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Stream the answer: any number of TextDelta / ReasoningDelta, then exactly one StreamEnd. Raise ProviderError on failure.

        Calling this must not contact anything: work starts on first iteration (the pre-request barrier relies on it).
        """
        ...

    async def aclose(self) -> None: ...


class UnavailableProvider:
    """Stands in for a provider that cannot be built (no key, no script, a server not named): the TUI still opens a
    session, shows what was interrupted and takes verdicts — none of that needs a model — and says `reason` when a
    prompt would need one. It never contacts anything."""

    def __init__(self, name: str, model: str, reason: str) -> None:
        self.name, self.model, self.unavailable = name, model, reason

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        raise ProviderError(self.unavailable, "PROVIDER_UNAVAILABLE")
        yield  # pragma: no cover - (an async generator, like every provider's stream)

    async def aclose(self) -> None:
        pass
