"""One step's model exchange (SPEC §2, §7): the request built from the transcript, sent through the hooks'
around_stream chain, retried while a server may answer next time, watched while it stays silent, kept inside the
context window (compacting first, or after a length refusal) and its answer recorded as chunks and one
`assistant/message`.

It appends events but never chooses a barrier: the pre-request barrier is the policy's wrapper on `around_stream`.
The loop owns the turn and step; it hands each step's `Streamed` in and gets the answer's calls back. What is transient
(a summary request running, a silent server, the window learnt) is told on `notices` (notices.py), never logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, cast

import anyio

from cairn.persistence.events import (
    AssistantChunk,
    AssistantMessage,
    ContextCompaction,
    ReasoningChunk,
    RequestHeader,
    RequestRetry,
    StepEnd,
    ToolCallRequest,
    TurnStart,
    Usage,
    UserMessage,
)
from cairn.persistence.session import LiveSession

from ..providers.base import (
    HTTPStatusError,
    MalformedStream,
    ModelRequest,
    Provider,
    ProviderError,
    ProviderLimits,
    NO_LIMITS,
    ProviderTimeout,
    ReasoningDelta,
    StreamEnd,
    StreamItem,
    TextDelta,
)
from ..tools.registry import ToolRegistry
from .compaction import (
    COMPACT_AT,
    MIN_PIECE_TOKENS,
    CompactionFailed,
    carried_facts,
    context_window_for,
    estimate_tokens,
    halve_piece,
    is_context_overflow,
    summary_messages,
    summary_pieces,
    window_named_in,
)
from .hooks import Hooks, StreamContext
from .notices import Compacting, OnNotice, Waiting, WindowKnown, tell
from .project_context import SystemPrompt
from .text_form import as_text_form, refuses_tool_role
from .tool_calls import CallIds, parse_arguments
from .transcript import Transcript

log = logging.getLogger("cairn.loop")
MAX_TIMEOUT_RETRIES = 1  # SPEC §7 rev 3: a timed-out attempt is retried at most once
MAX_RETRY_DELAY = 60.0  # seconds; also the cap on a server's Retry-After
SUMMARY_SHARE = 0.5  # of the window, per piece of history a summary request carries (a summary always fits)
WAIT_REPORT_EVERY = 10.0  # seconds between "still waiting for the server" reports while no answer has come
FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "other"})
FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "other"]


@dataclass
class Streamed:
    """What the model has sent of the current step's answer; the loop closes one cut short as `interrupted`."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    open: bool = False  # chunks appended, assistant/message not yet

    @property
    def started(self) -> bool:
        """A delta of this answer arrived: it is not sent again (SPEC §7 rev 2)."""
        return bool(self.text or self.reasoning)


@dataclass
class Answer:
    """A recorded answer: its calls as they run (`requests`) and as stored, secrets masked (`shown`)."""

    text: str
    requests: list[ToolCallRequest]
    shown: list[ToolCallRequest]
    finish: FinishReason


class ModelExchange:
    def __init__(self, session: LiveSession, provider: Provider, tools: ToolRegistry, hooks: Hooks,
                 transcript: Transcript, system_prompt: str, params: dict[str, Any], *, max_retries: int,
                 retry_base_delay: float, context_window: int | None, profile: str | None, text_form: bool) -> None:
        self.session = session
        self.provider = provider
        self.tools = tools
        self.hooks = hooks
        self.transcript = transcript
        # the base prompt, then the environment and instructions as the log records them (project_context.py)
        self.prompt = SystemPrompt(system_prompt, session)
        self.params = params
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        # tokens the model accepts per request (None: its family's default); compaction keeps requests inside it
        self.context_window = context_window
        self.profile = profile  # recorded in each request/header, so a resumed session can name it
        self.compact_next = False  # `/compact`: compact before the next request whatever its size
        # what faces hear that is not in the log (notices.py): a summary request, a silent server, the window learnt
        self.notices: list[OnNotice] = []
        self.known_window: tuple[int, str] | None = None
        self.refused_window: int | None = None  # the window a length refusal named, when smaller than the one assumed
        self.output_limit: int | None = None  # the output-token limit requests send (within the latest window)
        self.wait_report_every = WAIT_REPORT_EVERY
        # every top-level call id the session has used: a provider that repeats one gets a unique variant (SPEC §2)
        self.call_ids = CallIds(c.call_id for e in session.events if isinstance(e, AssistantMessage)
                                for c in e.tool_calls)
        # text form (SPEC §7 rev 3): this endpoint and model refused the tool role once; kept for the session, and
        # taken up again from the log when the session is resumed on the same endpoint and model
        self.text_form = text_form or self.text_form_recorded()

    @property
    def system_prompt(self) -> str:
        return self.prompt.text

    @property
    def provider(self) -> Provider:
        return self._provider

    @provider.setter
    def provider(self, provider: Provider) -> None:
        """(Faces switch it between turns: `/model`, ACP's session mode.)"""
        self._provider = provider
        self._declares = isinstance(provider, Provider)  # (asked once: a protocol check is slow on Python 3.11)

    @property
    def limits(self) -> ProviderLimits:
        return self._provider.limits if self._declares else NO_LIMITS

    def text_form_recorded(self) -> bool:
        """Whether the latest request was sent in text form to this endpoint and model."""
        endpoint = self.limits.endpoint
        for event in reversed(self.session.events):
            if isinstance(event, RequestHeader):
                return (event.params.get("transcript") == "text" and event.model == self.provider.model
                        and event.endpoint == endpoint)
        return False

    # -- one step's answer ------------------------------------------------------------------------------------------

    async def answer(self, turn: int, step: int, streamed: Streamed) -> Answer:
        """Compact first when the request would outgrow the context window; when the server still refuses it for its
        length, compact (once) and send it again with a new `request/header`."""
        await self._compact_if_needed(turn, step, force=self.compact_next)
        request = self._build_request(turn, step)
        try:
            return await self._request(turn, step, streamed, request)
        except ProviderError as e:
            if streamed.started:
                raise
            if refuses_tool_role(e) and not self.text_form:
                streamed.open = False
                log.info("the server's chat template refused the tool role (%s); sending in text form", e)
                self.text_form = True
                return await self.answer(turn, step, streamed)
            if not is_context_overflow(e):
                raise
            named = window_named_in(e)
            if named and named < await self.window():
                self.refused_window = named  # the server's own number: the summary pieces must fit it
            streamed.open = False
            log.info("the server refused the request for its length (%s); compacting", e)
            if not await self._compact_if_needed(turn, step, force=True):
                raise
        return await self._request(turn, step, streamed, self._build_request(turn, step))

    def _messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt}, *self.transcript.messages]

    def _build_request(self, turn: int, step: int) -> ModelRequest:
        messages = self._messages()
        request = ModelRequest(
            messages=as_text_form(messages) if self.text_form else messages, tools=self.tools.schemas(),
            model=self.provider.model, params=dict(self.params), turn=turn, step=step, max_tokens=self.output_limit,
        )
        self._announce(request, "turn")
        return request

    def _announce(self, request: ModelRequest, purpose: Literal["turn", "compaction"]) -> None:
        """The request's `request/header`; the pre-request barrier in the around_stream chain makes it durable before
        the request leaves. Every request has one, summary requests included."""
        params = {**request.params, "transcript": "text"} if self.text_form else request.params
        self.session.append(
            RequestHeader(
                turn=request.turn, step=request.step, provider=self.provider.name, model=self.provider.model,
                params=params, tools=[t.name for t in request.tools], message_count=len(request.messages),
                profile=self.profile, purpose=purpose, endpoint=self.limits.endpoint,
            )
        )

    async def _open_stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """Open the provider's stream through the around_stream chain (the pre-request barrier, failpoints)."""

        async def open_stream() -> AsyncIterator[StreamItem]:
            return self.provider.stream(request)

        stream: AsyncIterator[StreamItem] = await self.hooks.run(
            "around_stream", StreamContext(self.session, request.turn, request.step, request), open_stream)
        return stream

    async def _request(self, turn: int, step: int, streamed: Streamed, request: ModelRequest) -> Answer:
        """Send the request and consume the answer, retrying what a server may answer next time (SPEC §7 rev 2):
        only while no delta of this answer has arrived, at most `max_retries` times, `request/retry` appended first.
        Each attempt goes through the around_stream chain again, so its pre-request barrier makes that record durable
        before the request is sent again."""
        attempt = 1
        timeouts = 0
        while True:
            try:
                return await self._consume(turn, step, streamed, await self._open_stream(request))
            except ProviderError as e:
                timeouts += isinstance(e, ProviderTimeout)
                if not e.retryable or streamed.started or attempt > self.max_retries:
                    raise
                if timeouts > MAX_TIMEOUT_RETRIES:  # a stalled server: one more wait of the full limit, not four
                    raise
                streamed.open = False
                delay = self._retry_delay(attempt, e.retry_after)
                attempt += 1
                reason = f"HTTP {e.status}" if isinstance(e, HTTPStatusError) else e.code
                self.session.append(RequestRetry(turn=turn, step=step, attempt=attempt, reason=reason,
                                                 delay_ms=round(delay * 1000)))
                log.info("retrying request (attempt %d) in %.2fs after %s", attempt, delay, e)
                await anyio.sleep(delay)

    def _retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """The server's Retry-After when it sent one, else exponential backoff with jitter; capped either way."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, MAX_RETRY_DELAY)
        backoff = self.retry_base_delay * 2 ** (attempt - 1)
        return min(backoff * (0.5 + random.random() / 2), MAX_RETRY_DELAY)

    async def _consume(self, turn: int, step: int, streamed: Streamed, stream: AsyncIterator[StreamItem]) -> Answer:
        end: StreamEnd | None = None
        watch = _WaitWatch(asyncio.get_running_loop(), self.wait_report_every, self.notices) if self.notices \
            else _NO_WATCH
        async with aclosing(stream):  # type: ignore[type-var]  # (every provider's stream is an async generator)
            streamed.open = True
            try:
                item = await anext(stream, None)  # (a stalled server is reported meanwhile)
                while item is not None:
                    watch.progress()
                    if isinstance(item, TextDelta):
                        if item.text:
                            streamed.text.append(item.text)
                            self.session.append(AssistantChunk(turn=turn, step=step, delta=item.text))
                    elif isinstance(item, ReasoningDelta):
                        if item.text:
                            streamed.reasoning.append(item.text)
                            self.session.append(ReasoningChunk(turn=turn, step=step, delta=item.text))
                    elif isinstance(item, StreamEnd):
                        end = item
                    item = await anext(stream, None)
            finally:
                watch.stop()
        if end is None or end.finish_reason is None:
            what = "a final message" if end is None else "a finish reason"
            raise MalformedStream(f"{self.provider.name}: the stream ended without {what}")
        finish = cast(FinishReason, end.finish_reason if end.finish_reason in FINISH_REASONS else "other")
        requests = [
            ToolCallRequest(self.call_ids.unique(c.call_id, turn, step, i), str(c.name), parse_arguments(c.arguments))
            for i, c in enumerate(end.tool_calls, 1)
        ]
        text = "".join(streamed.text)
        # the event gets copies: appending masks secrets in place, and a call runs as written, never as masked
        shown = [ToolCallRequest(r.call_id, r.name, r.arguments) for r in requests]
        self.session.append(
            AssistantMessage(
                turn=turn, step=step, text=text, tool_calls=shown, interrupted=False,
                reasoning="".join(streamed.reasoning) or None, reasoning_meta=end.reasoning_meta, finish_reason=finish,
                usage=end.usage,
            )
        )
        streamed.open = False
        return Answer(text, requests, shown, finish)

    # -- the context window -----------------------------------------------------------------------------------------

    async def window(self) -> int:
        """The context window requests must fit: configured, else what the server says (llama.cpp `/props`, asked
        once per provider), else the model family's (SPEC §7 rev 3). It also sets the output limit requests send."""
        window, source = self.context_window, "configured"
        if self.refused_window and (not window or self.refused_window < window):
            window, source = self.refused_window, "server (its refusal)"
        if not window:
            served = await self._provider.served_window() if self._declares else None
            window, source = served if served else (None, "server")
        if not window:
            window, source = context_window_for(self.provider.model, {}), "model family"
        self.output_limit = self.limits.output_tokens(window)
        if (window, source) != self.known_window:
            self.known_window = (window, source)
            tell(self.notices, WindowKnown(window, source))
        return window

    async def _compact_if_needed(self, turn: int, step: int, force: bool = False) -> bool:
        """Append a `context/compaction` when the next request would pass COMPACT_AT of the window (or when forced).
        Returns whether it compacted. The summary comes from the same provider, inside the turn's cancel scope."""
        window = await self.window()
        if not force and estimate_tokens(self._messages(), self.tools.schemas()) < COMPACT_AT * window:
            return False
        through = self._compaction_point(turn)
        if through is None:
            return False
        reason: Literal["operator", "length"] = "operator" if self.compact_next else "length"
        self.compact_next = False
        earlier = Transcript(self.session.events)
        earlier.extend([e for e in self.session.events if e.seq <= through])
        summary, usage = "", None
        tell(self.notices, Compacting(True))
        try:
            # half the window per piece: room for the summary so far, the instructions and the answer
            pieces = deque(summary_pieces(earlier.messages, int(window * SUMMARY_SHARE)))
            while pieces:
                piece = pieces.popleft()
                request = ModelRequest(messages=summary_messages(piece, summary), tools=[], model=self.provider.model,
                                       params=dict(self.params), turn=turn, step=step, max_tokens=self.output_limit)
                try:
                    summary, usage = await self._summarise(request)
                except ProviderError as e:
                    if not is_context_overflow(e):
                        raise
                    halves = halve_piece(piece)
                    if halves is None:
                        raise CompactionFailed(
                            f"the server refused even a {MIN_PIECE_TOKENS}-token piece of history for its length "
                            f"({e}); set CAIRN_CONTEXT_WINDOW to the model's real window"
                        ) from e
                    # the estimate was wrong for this text: the server is the judge (issue 44)
                    log.info("the server refused a summary request for its length (%s); sending half the piece", e)
                    pieces.extendleft(reversed(halves))
        finally:
            tell(self.notices, Compacting(False))
        if not summary:
            raise CompactionFailed("the model returned an empty summary; the conversation was not compacted")
        self.session.append(ContextCompaction(
            summary=summary, through_seq=through, model=self.provider.model, usage=usage,
            carried=carried_facts(self.session.events, through), reason=reason,
        ))
        return True

    async def _summarise(self, request: ModelRequest) -> tuple[str, Usage | None]:
        """One summary request, with its own durable `request/header` first: (the summary, its usage)."""
        parts: list[str] = []
        usage = None
        self._announce(request, "compaction")
        async with aclosing(await self._open_stream(request)) as stream:  # type: ignore[type-var]
            async for item in stream:
                if isinstance(item, TextDelta):
                    parts.append(item.text)
                elif isinstance(item, StreamEnd):
                    usage = item.usage
        return "".join(parts).strip(), usage

    def _compaction_point(self, turn: int) -> int | None:
        """The last event the summary replaces: the end of the previous turn when earlier turns hold anything not yet
        compacted, else the end of this turn's latest finished step (a single long turn); None if nothing can go."""
        events = self.session.events
        done = max((e.through_seq for e in events if isinstance(e, ContextCompaction)), default=-1)
        turn_start = next((e.seq for e in reversed(events) if isinstance(e, TurnStart) and e.turn == turn), None)
        if turn_start is not None and any(isinstance(e, UserMessage) and done < e.seq < turn_start for e in events):
            return turn_start - 1
        step_ends = [e.seq for e in events if isinstance(e, StepEnd) and e.turn == turn and e.seq > done]
        return step_ends[-1] if step_ends else None


class _NoWatch:
    """Nobody listens to the loop's notices: nothing is timed."""

    def progress(self) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_WATCH = _NoWatch()


class _WaitWatch:
    """How long the server has sent nothing — before the first byte and between later ones — reported every `every`
    seconds while it stays silent; None once bytes come again and when the attempt ends. A timer on the event loop:
    no task, nothing to cancel into the stream; the stream's consumer only notes the time of each item."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float, listeners: list[OnNotice]) -> None:
        self.loop, self.every, self.listeners = loop, every, listeners
        self.last = time.monotonic()
        self.shown = False
        self.handle: asyncio.TimerHandle | None = loop.call_later(every, self._tick)

    def _tick(self) -> None:
        idle = time.monotonic() - self.last
        if idle >= self.every * 0.95:
            self.shown = True
            tell(self.listeners, Waiting(idle))
            delay = self.every
        else:
            delay = self.every - idle
        self.handle = self.loop.call_later(delay, self._tick)

    def progress(self) -> None:
        self.last = time.monotonic()
        if self.shown:
            self.shown = False
            tell(self.listeners, Waiting(None))

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            tell(self.listeners, Waiting(None))
