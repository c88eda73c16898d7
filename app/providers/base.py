"""What a model provider is to the loop: something that turns a request into a stream of text deltas and a final list of
tool calls. Providers never see the session; the loop records what they produce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol


@dataclass(frozen=True)
class ToolSchema:
    """A tool as the model sees it (OpenAI function-calling shape)."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object


@dataclass
class ModelRequest:
    messages: list[dict[str, Any]]  # OpenAI chat messages (role/content/tool_calls/tool_call_id)
    tools: list[ToolSchema]
    model: str
    params: dict[str, Any] = field(default_factory=dict)  # e.g. temperature; recorded in request/header
    turn: int = 0
    step: int = 0


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class RawToolCall:
    """A complete tool call. `arguments` is the raw JSON text the model produced (it may be invalid JSON)."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class StreamEnd:
    tool_calls: list[RawToolCall]
    finish_reason: str | None = None


StreamItem = TextDelta | StreamEnd


class ProviderError(Exception):
    """A provider failed (HTTP status, timeout, malformed stream). The message is one readable line with no secrets."""

    def __init__(self, message: str, code: str = "PROVIDER_ERROR") -> None:
        super().__init__(message)
        self.code = code


class Provider(Protocol):
    name: str  # "openai", "demo", "script"
    model: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Stream the answer: any number of TextDelta, then exactly one StreamEnd. Raise ProviderError on failure.

        Calling this must not contact anything: work starts on first iteration (the pre-request barrier relies on it).
        """
        ...

    async def aclose(self) -> None: ...
