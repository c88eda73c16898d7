"""The agent loop: turns of steps, each step one model request and the tool calls it asks for (SPEC §2).

Everything the loop does is recorded as events on the live session, in SPEC §2's order. It never chooses a barrier:
the hooks around it do (see policy.py). One turn runs at a time; prompts submitted meanwhile wait in a queue.

Cancellation can arrive at any await. The turn body runs inside its own cancel scope; whatever it left open is closed
afterwards by synchronous appends (no await can be interrupted there): a cut stream becomes an `interrupted`
`assistant/message`, every call without a result gets one (ABORTED_BEFORE_DISPATCH if its body never started,
TOOL_OUTCOME_UNKNOWN if it was running), then `step/end` and `turn/end` with reason `cancelled`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import random
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.abc
import anyio.lowlevel

from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import (
    ABORTED_BEFORE_DISPATCH,
    BAD_ARGUMENTS,
    DENIED,
    MAX_TOKENS,
    TOOL_ERROR,
    TOOL_OUTCOME_UNKNOWN,
    TRUNCATED,
    UNKNOWN_TOOL,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ContextCompaction,
    InvalidEvent,
    NonFiniteNumber,
    ReasoningChunk,
    RecoveryVerdict,
    RequestHeader,
    RequestRetry,
    RewindEnd,
    RewindPlan,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolProgress,
    ToolResult,
    TurnEnd,
    TurnError,
    TurnStart,
    UserMessage,
    WorkspaceSnapshot,
)
from cairn.persistence.blobs import MAX_BEFORE_IMAGE, BlobStore
from cairn.persistence.session import LiveSession

from ..providers.base import (
    MAX_JSON_NESTING,
    ModelRequest,
    NestedTooDeeply,
    Provider,
    ProviderError,
    RawToolCall,
    ReasoningDelta,
    StreamEnd,
    TextDelta,
    parse_json,
)
from ..tools.base import RESULT_LIMIT, ToolContext, ToolFailure, truncate_output
from ..tools.command import run_command
from ..tools.files import Fingerprint, edit_file, fingerprint, write_file
from .snapshots import ShadowRepo, Snapshot, SnapshotUnavailable
from ..tools.registry import ToolRegistry
from .approval import ApprovalAnswer, ApprovalRequest, Approver, Grants, as_answer, headless_approver, needs_approval
from .compaction import (
    COMPACT_AT,
    CompactionFailed,
    carried_facts,
    context_window_for,
    window_named_in,
    estimate_tokens,
    is_context_overflow,
    summary_messages,
    summary_pieces,
)
from .hooks import Hooks, StepContext, StreamContext, ToolOutcome, ToolRunContext, TurnContext, nothing
from .text_form import as_text_form, refuses_tool_role
from .transcript import Transcript

log = logging.getLogger("cairn.loop")
MAX_TIMEOUT_RETRIES = 1  # SPEC §7 rev 3: a timed-out attempt is retried at most once
SUMMARY_SHARE = 0.5  # of the window, per piece of history a summary request carries (a summary always fits)
WAIT_REPORT_EVERY = 10.0  # seconds between "still waiting for the server" reports while no answer has come

SYSTEM_PROMPT = (
    "You are Cairn, a careful coding agent working in the workspace {workspace}. Use the tools to inspect and change "
    "files and run commands there. Before repeating a side effect whose outcome is unknown, verify the current state."
)


FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "other"})
MAX_RETRY_DELAY = 60.0  # seconds; also the cap on a server's Retry-After


@dataclass
class TurnResult:
    turn: int
    reason: str  # completed | cancelled | error
    error: TurnError | None
    text: str  # the last assistant text of the turn


REWIND_PENDING = "REWIND_PENDING"  # a turn refused because an interrupted rewind is not settled (SPEC §10)


class TurnFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _CallState:
    request: ToolCallRequest  # as the model wrote it: what runs (SPEC §10 rev 4)
    shown: ToolCallRequest  # the same with secrets masked, as stored: what an approval shows
    asked: bool = False  # approval/asked appended, approval/decided not yet
    call_seq: int | None = None  # seq of its tool/call
    run: ToolRunContext | None = None
    result: ToolResult | None = None


@dataclass
class _TurnState:
    turn: int
    step: int | None = None  # the open step
    streaming: bool = False  # chunks appended, assistant/message not yet
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[_CallState] = field(default_factory=list)
    last_text: str = ""
    error: TurnError | None = None


MAX_ARGUMENT_BYTES = 1_000_000  # SPEC §5 rev 3: larger arguments are not run, and stored cut
CUT_ARGUMENTS = "cairn_cut"  # the one key of arguments stored cut: {"cairn_cut": {"bytes", "sha256", "head"}}


def parse_arguments(raw: str) -> Any:
    """The parsed JSON object, or the raw string when the model sent something that is not valid JSON. Arguments
    over MAX_ARGUMENT_BYTES become `{"cairn_cut": {…}}` (their size, sha256 and first characters): the call is refused
    as BAD_ARGUMENTS, and the log does not carry megabytes twice per step."""
    if len(raw) * 4 > MAX_ARGUMENT_BYTES:  # (cheap bound first: a character is at most 4 bytes)
        data = raw.encode("utf-8", "surrogatepass")
        if len(data) > MAX_ARGUMENT_BYTES:
            digest = hashlib.sha256(data).hexdigest()
            return {CUT_ARGUMENTS: {"bytes": len(data), "sha256": digest, "head": raw[:500]}}
    if not raw.strip():
        return {}
    try:
        value = parse_json(raw)  # (nested over MAX_JSON_NESTING, or past Python's parser, is invalid too)
    except ValueError:
        return raw
    if _has_non_finite(value):
        return raw  # NaN/Infinity are not JSON; keep exactly what the model sent
    return value


def _too_deep(raw: str) -> bool:
    """Whether arguments that did not parse failed for their nesting alone (for the message to the model)."""
    try:
        parse_json(raw)
    except NestedTooDeeply:
        return True
    except ValueError:
        return False
    return False


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


class AgentLoop:
    def __init__(
        self,
        session: LiveSession,
        provider: Provider,
        tools: ToolRegistry,
        workspace: Path,
        approver: Approver | None = None,
        hooks: Hooks | None = None,
        params: dict[str, Any] | None = None,
        max_steps: int = 50,
        system_prompt: str | None = None,
        max_retries: int = 4,
        retry_base_delay: float = 0.5,
        context_window: int | None = None,
        profile: str | None = None,
        text_form: bool = False,
        blobs: Callable[[], BlobStore] | None = None,
        snapshots: ShadowRepo | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self.provider = provider
        self.tools = tools
        self.workspace = Path(workspace).resolve()
        self.approver = approver or headless_approver(False)
        self.hooks = hooks or Hooks()
        self.params = dict(params or {})
        self.max_steps = max_steps
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        # every top-level call id the session has used: a provider that repeats one gets a unique variant (SPEC §2)
        self._call_ids = {c.call_id for e in session.events if isinstance(e, AssistantMessage) for c in e.tool_calls}
        self.system_prompt = (system_prompt or SYSTEM_PROMPT).format(workspace=self.workspace)
        self.grants = Grants()  # what the operator allowed for this session (tools, run_command prefixes)
        self.transcript = Transcript(session.events)
        # tokens the model accepts per request (None: its family's default); compaction keeps requests inside it
        self.context_window = context_window
        self.compact_next = False  # `/compact`: compact before the next request whatever its size
        self.on_compacting: list[Any] = []  # callbacks(bool): a summary request started (True) or ended (False)
        # callbacks(seconds or None): how long a request has waited for its first byte, every WAIT_REPORT_EVERY
        # seconds (a stalled server is visible); None once the answer starts or the attempt ends
        self.on_waiting: list[Any] = []
        # called with (tokens, where the window came from) whenever it is first known or changes: the TUI shows it
        self.on_window: list[Any] = []
        self.known_window: tuple[int, str] | None = None
        self.refused_window: int | None = None  # the window a length refusal named, when smaller than the one assumed
        self.wait_report_every = WAIT_REPORT_EVERY
        self.profile = profile  # recorded in each request/header, so a resumed session can name it
        # text form (SPEC §7 rev 3): this endpoint and model refused the tool role once; kept for the session, and
        # taken up again from the log when the session is resumed on the same endpoint and model
        self.text_form = text_form or self._text_form_recorded()
        self.blobs = blobs  # the before-image store beside the session (built on first use); None: none kept
        self.snapshots = snapshots  # the workspace's shadow git repository (None: snapshots off or no git)
        self._last_shot: Any = None  # this session's latest workspace/snapshot event
        self._touched = False  # a tool with an effect ran since that snapshot
        self._told_left_out: set[str] = set()  # paths the operator was told were left out of snapshots
        self.report = report or log.warning  # one line for the operator (stderr headless, a notice in the TUI)
        self.transcript.extend(session.events)
        self._unsubscribe = session.subscribe(self.transcript.add)
        self._next_turn = 1 + max((e.turn for e in session.events if isinstance(e, TurnStart)), default=0)
        self._scope: anyio.CancelScope | None = None
        self._turn_lock = anyio.Lock()
        self._queue: list[str] = []
        self._queue_wake = anyio.Event()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._idle = anyio.Event()
        self._idle.set()
        self._open_nested: dict[str, tuple[ToolRunContext, int]] = {}  # nested calls without a result yet
        self.on_turn_result: list[Any] = []  # callbacks(TurnResult) for queued turns
        self._open_rewinds: dict[str, RewindPlan] = {}  # rewind plans without their end, as of `_rewinds_seen`
        self._rewinds_seen = 0

    # -- public surface ---------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    @property
    def queued(self) -> list[str]:
        return list(self._queue)

    async def run_turn(self, prompt: str) -> TurnResult:
        """Run one turn to its end (after any turn already running). Cancel it with `cancel()`."""
        self._mark_busy()
        try:
            async with self._turn_lock:
                return await self._turn(prompt)
        finally:
            self._mark_idle_if_done()

    def submit(self, prompt: str) -> None:
        """Queue a prompt; the loop's own task runs queued prompts one turn at a time (needs `async with loop`)."""
        self._queue.append(prompt)
        self._mark_busy()
        self._queue_wake.set()

    def cancel(self) -> None:
        """Cancel the running turn (if any). Queued prompts stay queued."""
        if self._scope is not None:
            self._scope.cancel()

    async def wait_idle(self) -> None:
        """Return when no turn runs and none is queued."""
        await self._idle.wait()

    def record_verdict(self, call_id: str, verdict: str, note: str = "") -> None:
        """An operator's answer about an OUTCOME_UNKNOWN call; only between turns (before the next turn/start)."""
        if self._scope is not None:
            raise RuntimeError("verdicts are recorded between turns, not while one runs")
        self.session.append(RecoveryVerdict(call_id=call_id, verdict=verdict, note=note))  # type: ignore[arg-type]

    def _mark_busy(self) -> None:
        if self._idle.is_set():
            self._idle = anyio.Event()

    def _mark_idle_if_done(self) -> None:
        if not self._queue and not self._turn_lock.locked():
            self._idle.set()

    async def __aenter__(self) -> "AgentLoop":
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._serve_queue)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Ordered stop: drop queued prompts, cancel the running turn, wait until its closing events are written."""
        self._queue.clear()
        self.cancel()
        with anyio.CancelScope(shield=True):
            async with self._turn_lock:
                pass
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()
            await self._tasks.__aexit__(None, None, None)
            self._tasks = None
        self._unsubscribe()
        self._idle.set()

    async def _serve_queue(self) -> None:
        while True:
            await self._queue_wake.wait()
            self._queue_wake = anyio.Event()
            while self._queue:
                async with self._turn_lock:
                    prompt = self._queue.pop(0)
                    result = await self._turn(prompt)
                for callback in self.on_turn_result:
                    callback(result)
            self._mark_idle_if_done()

    # -- one turn ---------------------------------------------------------------------------------------------------

    def pending_rewind(self) -> RewindPlan | None:
        """A rewind plan without its end (a crash, or a failure in this process): nothing else runs until it is
        finished or abandoned (SPEC §10). Looks only at the events appended since it last looked."""
        events = self.session.events
        for e in events[self._rewinds_seen:]:
            if isinstance(e, RewindPlan):
                self._open_rewinds[e.rewind_id] = e
            elif isinstance(e, RewindEnd):
                self._open_rewinds.pop(e.rewind_id, None)
        self._rewinds_seen = len(events)
        return next(reversed(self._open_rewinds.values()), None)

    async def _turn(self, prompt: str) -> TurnResult:
        pending = self.pending_rewind()
        if pending is not None:  # refused before anything is appended: the turn never starts
            what = "an undo of a rewind" if pending.undo_of else f"a rewind to before turn {pending.to_turn}"
            message = (f"{what} was interrupted and is not settled: finish it or abandon it first "
                       f"(cairn rewind {self.session.id} --finish | --abandon; /rewind in the TUI and ACP)")
            self.report(message)
            return TurnResult(self._next_turn, "error", TurnError(REWIND_PENDING, message), "")
        st = _TurnState(turn=self._next_turn)
        self._next_turn += 1
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                await self._turn_body(st, prompt)
            except CheckpointFailed as e:
                st.error = TurnError("CHECKPOINT_FAILED", str(e))
            except ProviderError as e:
                st.error = TurnError(e.code, str(e))
            except TurnFailure as e:
                st.error = TurnError(e.code, str(e))
            except (NonFiniteNumber, InvalidEvent) as e:
                st.error = TurnError("BAD_MODEL_OUTPUT", str(e))
            except Exception as e:  # a bug: end the turn honestly rather than leave it open
                log.exception("turn %d failed", st.turn)
                st.error = TurnError("INTERNAL_ERROR", f"{type(e).__name__}: {e}")
        self._scope = None
        reason = "cancelled" if scope.cancelled_caught else ("error" if st.error else "completed")
        self._close_turn(st, reason)
        with anyio.CancelScope(shield=True):
            await self.hooks.run("after_turn", TurnContext(self.session, st.turn, reason), nothing)
        return TurnResult(st.turn, reason, st.error if reason == "error" else None, st.last_text)

    async def _turn_body(self, st: _TurnState, prompt: str) -> None:
        append = self.session.append
        append(TurnStart(turn=st.turn))
        await self._snapshot(st, "turn-start")
        step = 0
        while True:
            step += 1
            if step > self.max_steps:
                raise TurnFailure("MAX_STEPS", f"stopped after {self.max_steps} steps without a final answer")
            st.step, st.calls, st.text, st.reasoning = step, [], [], []
            append(StepStart(turn=st.turn, step=step))
            if step == 1:
                append(UserMessage(turn=st.turn, step=step, text=prompt))
            await self.hooks.run("before_step", StepContext(self.session, st.turn, step), nothing)
            raw_calls = await self._request_within_context(st)
            if not raw_calls:
                append(StepEnd(turn=st.turn, step=step))
                st.step = None
                await self._snapshot(st, "turn-end")
                return
            await self._run_calls(st)
            append(StepEnd(turn=st.turn, step=step))
            st.step = None

    def _build_request(self, st: _TurnState) -> ModelRequest:
        messages = [{"role": "system", "content": self.system_prompt}, *self.transcript.messages]
        request = ModelRequest(
            messages=as_text_form(messages) if self.text_form else messages,
            tools=self.tools.schemas(),
            model=self.provider.model,
            params=dict(self.params),
            turn=st.turn,
            step=st.step or 0,
        )
        self._announce(request, "turn")
        return request

    def _text_form_recorded(self) -> bool:
        endpoint = getattr(self.provider, "recorded_endpoint", None)
        for event in reversed(self.session.events):
            if isinstance(event, RequestHeader):
                return (event.params.get("transcript") == "text" and event.model == self.provider.model
                        and event.endpoint == endpoint)
        return False

    def _announce(self, request: ModelRequest, purpose: str) -> None:
        """The request's `request/header`; the pre-request barrier in the around_stream chain makes it durable before
        the request leaves. Every request has one, summary requests included."""
        params = {**request.params, "transcript": "text"} if self.text_form else request.params
        self.session.append(
            RequestHeader(
                turn=request.turn, step=request.step, provider=self.provider.name, model=self.provider.model,
                params=params, tools=[t.name for t in request.tools], message_count=len(request.messages),
                profile=self.profile, purpose=purpose,
                endpoint=getattr(self.provider, "recorded_endpoint", None),
            )
        )

    async def _open_stream(self, st: _TurnState, request: ModelRequest) -> AsyncIterator[Any]:
        """Open the provider's stream through the around_stream chain (the pre-request barrier, failpoints)."""

        async def open_stream() -> AsyncIterator[Any]:
            return self.provider.stream(request)

        return await self.hooks.run("around_stream", StreamContext(self.session, st.turn, st.step or 0, request),
                                    open_stream)

    async def _request_within_context(self, st: _TurnState) -> list[RawToolCall]:
        """Compact first when the request would outgrow the context window; when the server still refuses it for its
        length, compact (once) and send it again with a new `request/header`."""
        await self._compact_if_needed(st, force=self.compact_next)
        request = self._build_request(st)
        try:
            return await self._request(st, request)
        except ProviderError as e:
            if st.text or st.reasoning:
                raise
            if refuses_tool_role(e) and not self.text_form:
                st.streaming = False
                log.info("the server's chat template refused the tool role (%s); sending in text form", e)
                self.text_form = True
                return await self._request_within_context(st)
            if not is_context_overflow(e):
                raise
            named = window_named_in(e)
            if named and named < await self.window():
                self.refused_window = named  # the server's own number: the summary pieces must fit it
            st.streaming = False
            log.info("the server refused the request for its length (%s); compacting", e)
            if not await self._compact_if_needed(st, force=True):
                raise
        return await self._request(st, self._build_request(st))

    async def _compact_if_needed(self, st: _TurnState, force: bool = False) -> bool:
        """Append a `context/compaction` when the next request would pass COMPACT_AT of the window (or when forced).
        Returns whether it compacted. The summary comes from the same provider, inside the turn's cancel scope."""
        window = await self.window()
        messages = [{"role": "system", "content": self.system_prompt}, *self.transcript.messages]
        if not force and estimate_tokens(messages, self.tools.schemas()) < COMPACT_AT * window:
            return False
        through = self._compaction_point(st)
        if through is None:
            return False
        reason = "operator" if self.compact_next else "length"
        self.compact_next = False
        earlier = Transcript(self.session.events)
        earlier.extend([e for e in self.session.events if e.seq <= through])
        summary, usage = "", None
        for callback in self.on_compacting:
            callback(True)
        try:
            # half the window per piece: room for the summary so far, the instructions and the answer
            for piece in summary_pieces(earlier.messages, int(window * SUMMARY_SHARE)):
                request = ModelRequest(messages=summary_messages(piece, summary), tools=[], model=self.provider.model,
                                       params=dict(self.params), turn=st.turn, step=st.step or 0)
                summary, usage = await self._summarise(st, request)
        finally:
            for callback in self.on_compacting:
                callback(False)
        if not summary:
            raise CompactionFailed("the model returned an empty summary; the conversation was not compacted")
        self.session.append(ContextCompaction(
            summary=summary, through_seq=through, model=self.provider.model, usage=usage,
            carried=carried_facts(self.session.events, through), reason=reason,
        ))
        return True

    async def _summarise(self, st: _TurnState, request: ModelRequest) -> tuple[str, Any]:
        """One summary request, with its own durable `request/header` first: (the summary, its usage)."""
        parts: list[str] = []
        usage = None
        self._announce(request, "compaction")
        async with aclosing(await self._open_stream(st, request)) as stream:  # type: ignore[type-var]
            async for item in stream:
                if isinstance(item, TextDelta):
                    parts.append(item.text)
                elif isinstance(item, StreamEnd):
                    usage = item.usage
        return "".join(parts).strip(), usage

    async def window(self) -> int:
        """The context window requests must fit: configured, else what the server says (llama.cpp `/props`, asked
        once per provider), else the model family's (SPEC §7 rev 3)."""
        window, source = self.context_window, "configured"
        if self.refused_window and (not window or self.refused_window < window):
            window, source = self.refused_window, "server (its refusal)"
        if not window:
            ask = getattr(self.provider, "server_context_window", None)
            window = await ask() if ask is not None else None
            source = getattr(self.provider, "served_window_source", None) or "server"
        if not window:
            window, source = context_window_for(self.provider.model, {}), "model family"
        keep = getattr(self.provider, "keep_output_within", None)
        if keep is not None:
            keep(window)
        if (window, source) != self.known_window:
            self.known_window = (window, source)
            for callback in self.on_window:
                callback(window, source)
        return window

    def _compaction_point(self, st: _TurnState) -> int | None:
        """The last event the summary replaces: the end of the previous turn when earlier turns hold anything not yet
        compacted, else the end of this turn's latest finished step (a single long turn); None if nothing can go."""
        events = self.session.events
        done = max((e.through_seq for e in events if isinstance(e, ContextCompaction)), default=-1)
        turn_start = next((e.seq for e in reversed(events) if isinstance(e, TurnStart) and e.turn == st.turn), None)
        if turn_start is not None and any(isinstance(e, UserMessage) and done < e.seq < turn_start for e in events):
            return turn_start - 1
        step_ends = [e.seq for e in events if isinstance(e, StepEnd) and e.turn == st.turn and e.seq > done]
        return step_ends[-1] if step_ends else None

    async def _request(self, st: _TurnState, request: ModelRequest) -> list[RawToolCall]:
        """Send the request and consume the answer, retrying what a server may answer next time (SPEC §7 rev 2):
        only while no delta of this answer has arrived, at most `max_retries` times, `request/retry` appended first.
        Each attempt goes through the around_stream chain again, so its pre-request barrier makes that record durable
        before the request is sent again."""
        attempt = 1
        timeouts = 0
        while True:
            try:
                return await self._consume(st, await self._open_stream(st, request))
            except ProviderError as e:
                timeouts += e.code == "TIMEOUT"
                if not e.retryable or st.text or st.reasoning or attempt > self.max_retries:
                    raise
                if timeouts > MAX_TIMEOUT_RETRIES:  # a stalled server: one more wait of the full limit, not four
                    raise
                st.streaming = False
                delay = self._retry_delay(attempt, e.retry_after)
                attempt += 1
                reason = e.code.replace("HTTP_", "HTTP ") if e.code.startswith("HTTP_") else e.code
                self.session.append(RequestRetry(turn=st.turn, step=st.step or 0, attempt=attempt, reason=reason,
                                                 delay_ms=round(delay * 1000)))
                log.info("retrying request (attempt %d) in %.2fs after %s", attempt, delay, e)
                await anyio.sleep(delay)

    def _retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """The server's Retry-After when it sent one, else exponential backoff with jitter; capped either way."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, MAX_RETRY_DELAY)
        backoff = self.retry_base_delay * 2 ** (attempt - 1)
        return min(backoff * (0.5 + random.random() / 2), MAX_RETRY_DELAY)

    def _watch_waiting(self) -> "_WaitWatch | _NoWatch":
        """A watch that tells `on_waiting` how long the server has sent nothing — before the first byte and between
        later ones — every `wait_report_every` seconds (a timer on the event loop: no task, nothing to cancel into the
        stream; the stream's consumer only notes the time of each item)."""
        if not self.on_waiting:
            return _NO_WATCH
        return _WaitWatch(asyncio.get_running_loop(), self.wait_report_every, self.on_waiting)

    async def _consume(self, st: _TurnState, stream: AsyncIterator[Any]) -> list[RawToolCall]:
        end: StreamEnd | None = None
        watch = self._watch_waiting()
        async with aclosing(stream):  # type: ignore[type-var]
            st.streaming = True
            try:
                item = await anext(stream, None)  # (a stalled server is reported meanwhile)
                while item is not None:
                    watch.progress()
                    if isinstance(item, TextDelta):
                        if item.text:
                            st.text.append(item.text)
                            self.session.append(AssistantChunk(turn=st.turn, step=st.step or 0, delta=item.text))
                    elif isinstance(item, ReasoningDelta):
                        if item.text:
                            st.reasoning.append(item.text)
                            self.session.append(ReasoningChunk(turn=st.turn, step=st.step or 0, delta=item.text))
                    elif isinstance(item, StreamEnd):
                        end = item
                    item = await anext(stream, None)
            finally:
                watch.stop()
        if end is None or end.finish_reason is None:
            what = "a final message" if end is None else "a finish reason"
            raise ProviderError(f"{self.provider.name}: the stream ended without {what}", "MALFORMED_STREAM")
        finish = end.finish_reason if end.finish_reason in FINISH_REASONS else "other"
        requests = [
            ToolCallRequest(self._unique_call_id(c.call_id, st, i), str(c.name), parse_arguments(c.arguments))
            for i, c in enumerate(end.tool_calls, 1)
        ]
        st.last_text = "".join(st.text)
        # the event gets copies: appending masks secrets in place, and a call runs as written, never as masked
        shown = [ToolCallRequest(r.call_id, r.name, r.arguments) for r in requests]
        self.session.append(
            AssistantMessage(
                turn=st.turn, step=st.step or 0, text=st.last_text, tool_calls=shown, interrupted=False,
                reasoning="".join(st.reasoning) or None, reasoning_meta=end.reasoning_meta, finish_reason=finish,
                usage=end.usage,
            )
        )
        st.streaming = False
        st.calls = [_CallState(r, s) for r, s in zip(requests, shown)]
        if finish == "length":
            self._truncated(st)
        return end.tool_calls

    def _unique_call_id(self, call_id: Any, st: _TurnState, position: int) -> str:
        """The id the log, the model and repair use for this call: the provider's, unless it is missing or was
        already used in this session (some servers and local models repeat ids), then a deterministic variant."""
        base = call_id if isinstance(call_id, str) and call_id else f"call_{st.turn}_{st.step or 0}_{position}"
        unique, n = base, 1
        while unique in self._call_ids:
            unique = f"{base}-dup" if n == 1 else f"{base}-dup#{n}"
            n += 1
        self._call_ids.add(unique)
        return unique

    def _truncated(self, st: _TurnState) -> None:
        """An answer cut off at the output limit: none of its calls runs (their arguments may be cut too), and the
        turn ends in error so nobody mistakes it for a finished answer."""
        limit = getattr(self.provider, "max_tokens", None)
        named = f"max_tokens={limit}" if limit else "the provider's output limit"
        for call in st.calls:
            self._append_result(st, call, ToolOutcome(
                f"Not run: the answer was cut off at the output limit ({named}) while this call was being written.",
                TRUNCATED,
            ))
        raise TurnFailure(MAX_TOKENS, f"the answer hit the output limit ({named}); raise it with --max-tokens "
                                      "or CAIRN_MAX_TOKENS, or ask for a shorter answer")

    # -- tools ------------------------------------------------------------------------------------------------------

    def _parallel(self, call: _CallState) -> bool:
        tool = self.tools.get(call.request.name)
        return tool is not None and tool.safety == "read_only" and isinstance(call.request.arguments, dict)

    async def _run_calls(self, st: _TurnState) -> None:
        """Consecutive read-only calls run together (their barriers join one fsync); every other call runs alone.
        Results are appended in the model's order either way."""
        i = 0
        while i < len(st.calls):
            j = i + 1
            if self._parallel(st.calls[i]):
                while j < len(st.calls) and self._parallel(st.calls[j]):
                    j += 1
            batch = st.calls[i:j]
            if len(batch) == 1:
                await self._run_call(st, batch[0])
                await self._after_tool(st, batch[0])
            else:
                runs = [self._record_call(st, c) for c in batch]
                outcomes: list[ToolOutcome | None] = [None] * len(batch)

                async def run(k: int) -> None:
                    outcomes[k] = await self._execute(runs[k])

                async with anyio.create_task_group() as tg:
                    for k in range(len(batch)):
                        tg.start_soon(run, k)
                for call, outcome in zip(batch, outcomes):
                    assert outcome is not None
                    self._append_result(st, call, outcome)
                for call in batch:
                    await self._after_tool(st, call)
            i = j

    async def _after_tool(self, st: _TurnState, call: _CallState) -> None:
        if self.hooks.chains["after_tool"]:
            run = call.run or ToolRunContext(self.session, st.turn, st.step or 0, call.request.call_id,
                                             call.request.name, {}, "side_effecting", None)
            await self.hooks.run("after_tool", run, nothing)

    async def _run_call(self, st: _TurnState, call: _CallState) -> None:
        request = call.request
        tool = self.tools.get(request.name)
        if tool is None:
            known = ", ".join(self.tools.names())
            self._append_result(st, call, ToolOutcome(f"Unknown tool `{request.name}`. Available: {known}.", UNKNOWN_TOOL))
            return
        if not isinstance(request.arguments, dict):
            self._record_call(st, call)
            what = "not valid JSON" if isinstance(request.arguments, str) else "not a JSON object"
            if isinstance(request.arguments, str) and _too_deep(request.arguments):
                what = f"nested more than {MAX_JSON_NESTING} levels deep"
            self._append_result(st, call, ToolOutcome(f"The arguments are {what}; send a JSON object.", BAD_ARGUMENTS))
            return
        if CUT_ARGUMENTS in request.arguments:
            self._record_call(st, call)
            size = request.arguments[CUT_ARGUMENTS].get("bytes", 0)
            self._append_result(st, call, ToolOutcome(
                f"The arguments are {size:,} bytes, over the {MAX_ARGUMENT_BYTES:,}-byte limit; the call did not run. "
                "Send smaller arguments (for a large file, write it in parts).", BAD_ARGUMENTS))
            return
        granted = self.grants.covering(tool.name, request.arguments) if needs_approval(tool.safety) else None
        if granted is not None:  # ran without asking: the log still says which decision let it run
            self.session.append(ApprovalDecided(turn=st.turn, step=st.step or 0, call_id=request.call_id,
                                                decision="granted", scope=granted))
        elif needs_approval(tool.safety):
            answer = await self._ask(st, call, tool.safety)
            if answer.decision == "allowed_session":
                self.grants.add(tool.name)
            elif answer.decision == "allowed_prefix":
                self.grants.add(tool.name, answer.command_prefix)
            elif answer.decision != "allowed_once":
                note = f" The operator's note: {answer.note}" if answer.note else ""
                self._append_result(st, call, ToolOutcome(f"The operator denied this call; it did not run.{note}", DENIED))
                return
        prints = await self._fingerprint(request.name, request.arguments)
        if tool.body is run_command and tool.safety == "side_effecting":
            await self._snapshot(st, "command", request.call_id)  # recorded before this call's pre-tool barrier
        run = self._record_call(st, call, prints)
        self._append_result(st, call, await self._execute(run))

    async def _snapshot(self, st: _TurnState, at: str, call_id: str | None = None) -> None:
        """The workspace as a tree in the shadow repository, recorded (SPEC §9 rev 3). A snapshot git cannot take in
        its time budget turns snapshots off for the rest of the session, with one line saying so."""
        repo = self.snapshots
        if repo is None:
            return
        if at == "command" and not self._touched and self._last_shot is not None and self._last_shot.turn == st.turn:
            # nothing with an effect ran since this turn's last snapshot: the command starts from that tree
            shot = Snapshot(self._last_shot.tree, [(path, "") for path in self._last_shot.left_out],
                            self._last_shot.manifest)
        else:
            try:
                shot = await anyio.to_thread.run_sync(repo.snapshot)
            except SnapshotUnavailable as e:
                self.snapshots = None
                self.report(str(e))
                return
        self._touched = False
        self._last_shot = self.session.append(WorkspaceSnapshot(
            turn=st.turn, at=at, tree=shot.tree, call_id=call_id, left_out=[path for path, _ in shot.left_out],
            manifest=shot.manifest, workspace=str(repo.workspace)))
        news = [(path, why) for path, why in shot.left_out if why and path not in self._told_left_out]
        if news:  # once a session per path, not at every snapshot
            self._told_left_out.update(path for path, _ in news)
            shown = ", ".join(f"{path} ({why})" for path, why in news[:5])
            more = f" and {len(news) - 5} more" if len(news) > 5 else ""
            self.report(f"left out of workspace snapshots (not restorable): {shown}{more}")

    async def _fingerprint(self, name: str, arguments: dict[str, Any]) -> Fingerprint | None:
        """A file tool's fingerprint, with its before-image stored durably — both before its `tool/call` is appended,
        so the pre-tool barrier that follows covers a call whose image is already on disk (SPEC §9 rev 3)."""
        tool = self.tools.get(name)
        if tool is None or tool.body not in (write_file, edit_file):  # Cairn's own file tools only
            return None
        found = await anyio.to_thread.run_sync(fingerprint, name, arguments, self.workspace, MAX_BEFORE_IMAGE)
        if found is not None and found.before is not None and self.session.holds_secret(found.before):
            log.info("%s holds a configured secret: its before-image is not kept (not restorable)", name)
            found = dataclasses.replace(found, before=None)
        if found is not None and found.before is not None and self.blobs is not None:
            await anyio.to_thread.run_sync(self.blobs().put, found.before)
        elif found is not None and found.before is None and found.before_sha256 is not None:
            log.info("%s is over %d bytes: its before-image is not kept (not restorable)", name, MAX_BEFORE_IMAGE)
        return found

    async def _ask(self, st: _TurnState, call: _CallState, safety: str) -> ApprovalAnswer:
        r = call.request
        self.session.append(ApprovalAsked(turn=st.turn, step=st.step or 0, call_id=r.call_id))
        call.asked = True
        answer = as_answer(await self.approver(
            ApprovalRequest(r.call_id, r.name, call.shown.arguments, safety, st.turn, st.step or 0)))
        call.asked = False
        scope = answer.command_prefix if answer.decision == "allowed_prefix" else None
        self.session.append(ApprovalDecided(turn=st.turn, step=st.step or 0, call_id=r.call_id,
                                            decision=answer.decision, scope=scope))
        if answer.decision == "cancelled":  # the operator cancelled the turn from the approval prompt
            self.cancel()
            await anyio.lowlevel.checkpoint()
        return answer

    def _record_call(self, st: _TurnState, call: _CallState, fingerprint: Fingerprint | None = None) -> ToolRunContext:
        r = call.request
        tool = self.tools.get(r.name)
        safety = tool.safety if tool else "side_effecting"
        event = self.session.append(
            ToolCall(turn=st.turn, step=st.step or 0, call_id=r.call_id, name=r.name, arguments=r.arguments,
                     safety=safety, parent_call_id=None,
                     before_sha256=fingerprint.before_sha256 if fingerprint else None,
                     after_sha256=fingerprint.after_sha256 if fingerprint else None)
        )
        call.call_seq = event.seq
        args = r.arguments if isinstance(r.arguments, dict) else {}
        call.run = ToolRunContext(self.session, st.turn, st.step or 0, r.call_id, r.name, args, safety, None,
                                  fingerprint=fingerprint)
        return call.run

    async def _execute(self, run: ToolRunContext) -> ToolOutcome:
        """Run the body through the around_tool chain; turn a tool's failure into an error outcome."""
        tool = self.tools.get(run.name)
        assert tool is not None
        nested = 0

        async def dispatch(name: str, arguments: dict[str, Any]) -> str:
            nonlocal nested
            nested += 1
            return await self._dispatch_nested(run, f"{run.call_id}.{nested}", name, arguments)

        async def body() -> ToolOutcome:
            run.body_started = True
            self._touched = self._touched or run.safety != "read_only"  # the next command snapshot looks again
            ctx = ToolContext(self.workspace, run.call_id, run.turn, run.step, run.parent_call_id, dispatch,
                              progress=lambda pid, started: self._progress(run, pid, started),
                              fingerprint=run.fingerprint)
            try:
                return ToolOutcome(truncate_output(await tool.body(run.arguments, ctx), RESULT_LIMIT))
            except ToolFailure as e:
                return ToolOutcome(truncate_output(str(e), RESULT_LIMIT), e.code)
            except Exception as e:
                log.exception("tool %s failed", run.name)
                return ToolOutcome(f"{run.name} failed: {type(e).__name__}: {e}", TOOL_ERROR)

        return await self.hooks.run("around_tool", run, body)

    def _progress(self, run: ToolRunContext, pid: int, started: int) -> None:
        self.session.append(ToolProgress(turn=run.turn, step=run.step, call_id=run.call_id, pid=pid, started=started))

    async def _dispatch_nested(self, parent: ToolRunContext, call_id: str, name: str, arguments: dict[str, Any]) -> str:
        """A tool calling another tool: recorded with parent_call_id, no barrier of its own (the parent's covers it)."""
        tool = self.tools.get(name)
        if tool is None:
            raise ToolFailure(f"unknown tool `{name}`")
        call = self.session.append(
            ToolCall(turn=parent.turn, step=parent.step, call_id=call_id, name=name, arguments=arguments,
                     safety=tool.safety, parent_call_id=parent.call_id)
        )
        run = ToolRunContext(self.session, parent.turn, parent.step, call_id, name, arguments, tool.safety, parent.call_id)
        self._open_nested[call_id] = (run, call.seq)
        outcome = await self._execute(run)
        del self._open_nested[call_id]
        self._append_nested_result(run, call.seq, outcome)
        if outcome.is_error:
            raise ToolFailure(outcome.content)
        return outcome.content

    def _append_nested_result(self, run: ToolRunContext, call_seq: int, outcome: ToolOutcome) -> None:
        self.session.append(
            ToolResult(turn=run.turn, step=run.step, call_id=run.call_id, is_error=outcome.is_error,
                       content=outcome.content, error_code=outcome.error_code, source_seq=call_seq)
        )

    def _append_result(self, st: _TurnState, call: _CallState, outcome: ToolOutcome) -> None:
        call.result = self.session.append(  # type: ignore[assignment]
            ToolResult(turn=st.turn, step=st.step or 0, call_id=call.request.call_id, is_error=outcome.is_error,
                       content=outcome.content, error_code=outcome.error_code, source_seq=call.call_seq)
        )

    # -- closing ----------------------------------------------------------------------------------------------------

    def _close_turn(self, st: _TurnState, reason: str) -> None:
        """Append whatever the interrupted body left open, then `turn/end`. Synchronous: nothing here can be cut.

        It must not fail either: an append it cannot make (the session was closed under it) is logged and skipped, and
        the turn still returns; whatever did not reach the log is what repair reconstructs on the next open."""
        append = self._append_closing
        if st.step is not None:
            if st.streaming:
                st.last_text = "".join(st.text)
                append(AssistantMessage(turn=st.turn, step=st.step, text=st.last_text, tool_calls=[], interrupted=True,
                                        reasoning="".join(st.reasoning) or None))
            for call in st.calls:
                if call.result is not None:
                    continue
                if call.asked:
                    append(ApprovalDecided(turn=st.turn, step=st.step, call_id=call.request.call_id, decision="cancelled"))
                for nested_id, (run, call_seq) in list(self._open_nested.items()):
                    if run.parent_call_id == call.request.call_id:
                        outcome = _cut_short(run, reason)
                        append(ToolResult(turn=run.turn, step=run.step, call_id=run.call_id, is_error=True,
                                          content=outcome.content, error_code=outcome.error_code, source_seq=call_seq))
                        del self._open_nested[nested_id]
                outcome = _cut_short(call.run, reason)
                call.result = append(ToolResult(  # type: ignore[assignment]
                    turn=st.turn, step=st.step, call_id=call.request.call_id, is_error=True, content=outcome.content,
                    error_code=outcome.error_code, source_seq=call.call_seq))
            append(StepEnd(turn=st.turn, step=st.step))
            st.step = None
        append(TurnEnd(turn=st.turn, reason=reason, error=st.error if reason == "error" else None))  # type: ignore[arg-type]

    def _append_closing(self, event: Any) -> Any:
        try:
            return self.session.append(event)
        except Exception:
            log.exception("could not append %s while closing turn", type(event).__name__)
            return None


def _cut_short(run: ToolRunContext | None, reason: str) -> ToolOutcome:
    """The result of a call the turn's end overtook: unknown if its body had started, aborted otherwise."""
    if run is not None and run.body_started:
        return ToolOutcome(
            f"Cancelled while `{run.name}` was running: it may have partly taken effect. Verify before repeating it.",
            TOOL_OUTCOME_UNKNOWN,
        )
    why = "the turn was cancelled" if reason == "cancelled" else "the turn ended with an error"
    return ToolOutcome(f"Not run: {why} before this call was dispatched.", ABORTED_BEFORE_DISPATCH)


class _NoWatch:
    """Nobody listens for waiting reports: nothing is timed."""

    def progress(self) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_WATCH = _NoWatch()


class _WaitWatch:
    """How long the server has sent nothing, reported every `every` seconds while it stays silent; None once bytes
    come again and when the attempt ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float, callbacks: list[Any]) -> None:
        self.loop, self.every, self.callbacks = loop, every, callbacks
        self.last = time.monotonic()
        self.shown = False
        self.handle: asyncio.TimerHandle | None = loop.call_later(every, self._tick)

    def _tick(self) -> None:
        idle = time.monotonic() - self.last
        if idle >= self.every * 0.95:
            self.shown = True
            for callback in self.callbacks:
                callback(idle)
            delay = self.every
        else:
            delay = self.every - idle
        self.handle = self.loop.call_later(delay, self._tick)

    def progress(self) -> None:
        self.last = time.monotonic()
        if self.shown:
            self.shown = False
            for callback in self.callbacks:
                callback(None)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            for callback in self.callbacks:
                callback(None)
