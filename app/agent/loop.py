"""The agent loop: turns of steps, each step one model request and the tool calls it asks for (SPEC §2).

Everything the loop does is recorded as events on the live session, in SPEC §2's order. It never chooses a barrier:
the hooks around it do (see policy.py). One turn runs at a time; prompts submitted meanwhile wait in a queue.
Faces hear about a turn through the session's events, and what is never logged through the loop's `notices`
(notices.py): a queued turn's result, a summary request running, a silent server, the context window.
The model exchange of each step (request, retries, the context window, compaction) is `exchange.py`; the evidence
gathered around tool calls (fingerprints, before-images, workspace snapshots) is the `evidence.py` plug-in.

Cancellation can arrive at any await. The turn body runs inside its own cancel scope; whatever it left open is closed
afterwards by synchronous appends (no await can be interrupted there): a cut stream becomes an `interrupted`
`assistant/message`, every call without a result gets one (ABORTED_BEFORE_DISPATCH if its body never started,
TOOL_OUTCOME_UNKNOWN if it was running), then `step/end` and `turn/end` with reason `cancelled`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar, cast

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
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantMessage,
    InvalidEvent,
    NonFiniteNumber,
    RecoveryVerdict,
    RewindEnd,
    RewindPlan,
    StepEnd,
    StepStart,
    ToolCall,
    ToolProgress,
    ToolResult,
    TurnEnd,
    TurnError,
    TurnStart,
    UserMessage,
)
from cairn.persistence.session import LiveSession

from ..providers.base import Provider, ProviderError
from ..tools.base import RESULT_LIMIT, ToolContext, ToolFailure, truncate_output
from ..tools.file_writes import Fingerprint
from ..tools.registry import ToolRegistry
from .approval import ApprovalAnswer, ApprovalRequest, Approver, Grants, as_answer, headless_approver, needs_approval
from .evidence import Evidence
from .exchange import ModelExchange, Streamed
from .hooks import Hooks, StepContext, ToolOutcome, ToolRunContext, TurnContext, nothing
from .mentions import attach_mentions
from .notices import OnNotice, TurnFinished, TurnResult, tell
from .operator_command import OperatorCommandRequest, TurnInput, run_operator_turn
from .project_context import ProjectContext, context_wanted
from .tool_calls import bad_arguments
from .turn_state import CallState, TurnFailure, TurnState
from .transcript import Transcript

log = logging.getLogger("cairn.loop")

SYSTEM_PROMPT = (
    "You are Cairn, a careful coding agent working in the workspace {workspace}. Use the tools to inspect and change "
    "files and run commands there. Before repeating a side effect whose outcome is unknown, verify the current state."
)
REWIND_PENDING = "REWIND_PENDING"  # a turn refused because an interrupted rewind is not settled (SPEC §10)
MAX_STEPS = "MAX_STEPS"  # a turn stopped after `max_steps` steps without a final answer
T = TypeVar("T")


class _ExchangeSetting(Generic[T]):
    """A setting of the loop's exchange that faces and tests read and set on the loop itself."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, loop: "AgentLoop", owner: type | None = None) -> T:
        return cast(T, getattr(loop.exchange, self.name))  # (a fixed name, not a probe)

    def __set__(self, loop: "AgentLoop", value: T) -> None:
        setattr(loop.exchange, self.name, value)


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
        evidence: Evidence | None = None,
        report: Callable[[str], None] | None = None,
        project_context: bool | None = None,
    ) -> None:
        self.session = session
        self.tools = tools
        self.workspace = Path(workspace).resolve()
        self.approver = approver or headless_approver(False)
        self.hooks = hooks or Hooks()
        self.max_steps = max_steps
        self.grants = Grants()  # what the operator allowed for this session (tools, run_command prefixes)
        self.transcript = Transcript(session.events)
        self.exchange = ModelExchange(
            session, provider, tools, self.hooks, self.transcript,
            (system_prompt or SYSTEM_PROMPT).format(workspace=self.workspace), dict(params or {}),
            max_retries=max_retries, retry_base_delay=retry_base_delay, context_window=context_window,
            profile=profile, text_form=text_form,
        )
        # fingerprints of file tools at least; before-images and snapshots when the composition gives their stores
        self.evidence = evidence or Evidence(session, self.workspace)
        # what faces hear besides the session's events (notices.py): the exchange's summary requests, silent server
        # and context window, and each queued turn's result
        self.notices: list[OnNotice] = self.exchange.notices
        self.report = report or log.warning  # one line for the operator (stderr headless, a notice in the TUI)
        # the instructions and environment recorded for the system prompt at each turn's start (None: not read);
        # faces pass the configured setting, a loop built directly follows CAIRN_PROJECT_CONTEXT
        wanted = context_wanted() if project_context is None else project_context
        tell = lambda line: self.report(line)  # noqa: E731 (read when told: a face may set `report` later)
        self.project_context = ProjectContext(session, self.workspace, tell) if wanted else None
        self.transcript.extend(session.events)
        self._unsubscribe = session.subscribe(self.transcript.add)
        self._next_turn = 1 + max((e.turn for e in session.events if isinstance(e, TurnStart)), default=0)
        self._scope: anyio.CancelScope | None = None
        self._turn_lock = anyio.Lock()
        self._queue: list[TurnInput] = []  # prompts, and the operator's `!command`s (operator_command.py)
        self._queue_wake = anyio.Event()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._idle = anyio.Event()
        self._idle.set()
        self._open_nested: dict[str, tuple[ToolRunContext, int]] = {}  # nested calls without a result yet
        self._open_rewinds: dict[str, RewindPlan] = {}  # rewind plans without their end, as of `_rewinds_seen`
        self._rewinds_seen = 0

    # -- the exchange's settings, changed on the loop by faces between turns (`/model`, `/compact`, ACP modes) -----

    provider = _ExchangeSetting[Provider]()
    profile = _ExchangeSetting[str | None]()
    context_window = _ExchangeSetting[int | None]()
    known_window = _ExchangeSetting[tuple[int, str] | None]()
    text_form = _ExchangeSetting[bool]()
    compact_next = _ExchangeSetting[bool]()
    max_retries = _ExchangeSetting[int]()
    retry_base_delay = _ExchangeSetting[float]()
    wait_report_every = _ExchangeSetting[float]()

    @property
    def output_limit(self) -> int | None:
        """The output-token limit the latest request sent (None: the provider sends none)."""
        return self.exchange.output_limit

    @property
    def blobs(self) -> Callable[[], Any] | None:
        return self.evidence.blobs

    @property
    def snapshots(self) -> Any:
        return self.evidence.snapshots

    # -- public surface ---------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    @property
    def queued(self) -> list[str]:
        return [str(item) for item in self._queue]

    async def run_turn(self, prompt: TurnInput) -> TurnResult:
        """Run one turn to its end (after any turn already running). Cancel it with `cancel()`."""
        self._mark_busy()
        try:
            async with self._turn_lock:
                return await self._turn(prompt)
        finally:
            self._mark_idle_if_done()

    def submit(self, prompt: TurnInput) -> None:
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
                tell(self.notices, TurnFinished(result))
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

    async def _turn(self, prompt: TurnInput) -> TurnResult:
        pending = self.pending_rewind()
        if pending is not None:  # refused before anything is appended: the turn never starts
            what = "an undo of a rewind" if pending.undo_of else f"a rewind to before turn {pending.to_turn}"
            message = (f"{what} was interrupted and is not settled: finish it or abandon it first "
                       f"(cairn rewind {self.session.id} --finish | --abandon; /rewind in the TUI and ACP)")
            self.report(message)
            return TurnResult(self._next_turn, "error", TurnError(REWIND_PENDING, message), "")
        st = TurnState(turn=self._next_turn)
        self._next_turn += 1
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                if isinstance(prompt, OperatorCommandRequest):  # the operator's own shell command: a turn of its own
                    await run_operator_turn(self.session, self.evidence, self.workspace, st, prompt)
                else:
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

    async def _turn_body(self, st: TurnState, prompt: str) -> None:
        attached = await attach_mentions(self.workspace, prompt)  # `@path` files, read before the turn's first event
        for line in attached.notices:
            self.report(line)
        append = self.session.append
        append(TurnStart(turn=st.turn))
        # the project context is read while the turn-start snapshot is taken (two git runs that overlap, P14); both
        # are recorded in this order
        context = self.project_context
        reading = context.start_reading() if context is not None else None
        try:
            await self.evidence.turn_started(st.turn)
        except BaseException:
            if reading is not None:
                reading.cancel()
            raise
        if context is not None:
            await context.turn_started(st.turn, reading)
        step = 0
        while True:
            step += 1
            if step > self.max_steps:
                raise TurnFailure(MAX_STEPS, f"stopped after {self.max_steps} steps without a final answer")
            st.step, st.calls, st.streamed = step, [], Streamed()
            append(StepStart(turn=st.turn, step=step))
            if step == 1:
                append(UserMessage(turn=st.turn, step=step, text=prompt, attachments=attached.attachments))
            await self.hooks.run("before_step", StepContext(self.session, st.turn, step), nothing)
            answer = await self.exchange.answer(st.turn, step, st.streamed)
            st.last_text = answer.text
            st.calls = [CallState(r, s) for r, s in zip(answer.requests, answer.shown)]
            if answer.finish == "length":
                self._truncated(st)
            if not answer.requests:
                append(StepEnd(turn=st.turn, step=step))
                st.step = 0
                await self.evidence.turn_completed(st.turn)
                return
            await self._run_calls(st)
            append(StepEnd(turn=st.turn, step=step))
            st.step = 0

    def _truncated(self, st: TurnState) -> None:
        """An answer cut off at the output limit: none of its calls runs (their arguments may be cut too), and the
        turn ends in error so nobody mistakes it for a finished answer."""
        limit = self.exchange.output_limit
        named = f"max_tokens={limit}" if limit else "the provider's output limit"
        for call in st.calls:
            self._append_result(st, call, ToolOutcome(
                f"Not run: the answer was cut off at the output limit ({named}) while this call was being written.",
                TRUNCATED,
            ))
        raise TurnFailure(MAX_TOKENS, f"the answer hit the output limit ({named}); raise it with --max-tokens "
                                      "or CAIRN_MAX_TOKENS, or ask for a shorter answer")

    # -- tools ------------------------------------------------------------------------------------------------------

    def _parallel(self, call: CallState) -> bool:
        tool = self.tools.get(call.request.name)
        return tool is not None and tool.safety == "read_only" and isinstance(call.request.arguments, dict)

    async def _run_calls(self, st: TurnState) -> None:
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

    async def _after_tool(self, st: TurnState, call: CallState) -> None:
        if self.hooks.chains["after_tool"]:
            run = call.run or ToolRunContext(self.session, st.turn, st.step, call.request.call_id,
                                             call.request.name, {}, "side_effecting", None)
            await self.hooks.run("after_tool", run, nothing)

    async def _run_call(self, st: TurnState, call: CallState) -> None:
        request = call.request
        tool = self.tools.get(request.name)
        if tool is None:
            known = ", ".join(self.tools.names())
            self._append_result(st, call, ToolOutcome(f"Unknown tool `{request.name}`. Available: {known}.", UNKNOWN_TOOL))
            return
        problem = bad_arguments(request.arguments)
        if problem is not None:
            self._record_call(st, call)
            self._append_result(st, call, ToolOutcome(problem, BAD_ARGUMENTS))
            return
        granted = self.grants.covering(tool.name, request.arguments) if needs_approval(tool.safety) else None
        if granted is not None:  # ran without asking: the log still says which decision let it run
            self.session.append(ApprovalDecided(turn=st.turn, step=st.step, call_id=request.call_id,
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
        prints = await self.evidence.before_call(tool, st.turn, request.call_id, request.arguments)
        run = self._record_call(st, call, prints)
        self._append_result(st, call, await self._execute(run))

    async def _ask(self, st: TurnState, call: CallState, safety: str) -> ApprovalAnswer:
        r = call.request
        self.session.append(ApprovalAsked(turn=st.turn, step=st.step, call_id=r.call_id))
        call.asked = True
        answer = as_answer(await self.approver(
            ApprovalRequest(r.call_id, r.name, call.shown.arguments, safety, st.turn, st.step)))
        call.asked = False
        scope = answer.command_prefix if answer.decision == "allowed_prefix" else None
        self.session.append(ApprovalDecided(turn=st.turn, step=st.step, call_id=r.call_id,
                                            decision=answer.decision, scope=scope))
        if answer.decision == "cancelled":  # the operator cancelled the turn from the approval prompt
            self.cancel()
            await anyio.lowlevel.checkpoint()
        return answer

    def _record_call(self, st: TurnState, call: CallState, fingerprint: Fingerprint | None = None) -> ToolRunContext:
        r = call.request
        tool = self.tools.get(r.name)
        safety = tool.safety if tool else "side_effecting"
        event = self.session.append(
            ToolCall(turn=st.turn, step=st.step, call_id=r.call_id, name=r.name, arguments=r.arguments,
                     safety=safety, parent_call_id=None,
                     before_sha256=fingerprint.before_sha256 if fingerprint else None,
                     after_sha256=fingerprint.after_sha256 if fingerprint else None)
        )
        call.call_seq = event.seq
        args = r.arguments if isinstance(r.arguments, dict) else {}
        call.run = ToolRunContext(self.session, st.turn, st.step, r.call_id, r.name, args, safety, None,
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
            self.evidence.body_starting(run)
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

    def _append_result(self, st: TurnState, call: CallState, outcome: ToolOutcome) -> None:
        call.result = self.session.append(  # type: ignore[assignment]
            ToolResult(turn=st.turn, step=st.step, call_id=call.request.call_id, is_error=outcome.is_error,
                       content=outcome.content, error_code=outcome.error_code, source_seq=call.call_seq)
        )

    # -- closing ----------------------------------------------------------------------------------------------------

    def _close_turn(self, st: TurnState, reason: str) -> None:
        """Append whatever the interrupted body left open, then `turn/end`. Synchronous: nothing here can be cut.

        It must not fail either: an append it cannot make (the session was closed under it) is logged and skipped, and
        the turn still returns; whatever did not reach the log is what repair reconstructs on the next open."""
        append = self._append_closing
        if st.step:
            if st.streamed.open:
                st.last_text = "".join(st.streamed.text)
                append(AssistantMessage(turn=st.turn, step=st.step, text=st.last_text, tool_calls=[], interrupted=True,
                                        reasoning="".join(st.streamed.reasoning) or None))
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
                call.result = append(ToolResult(
                    turn=st.turn, step=st.step, call_id=call.request.call_id, is_error=True, content=outcome.content,
                    error_code=outcome.error_code, source_seq=call.call_seq))
            append(StepEnd(turn=st.turn, step=st.step))
            st.step = 0
        append(TurnEnd(turn=st.turn, reason=reason, error=st.error if reason == "error" else None))  # type: ignore[arg-type]

    def _append_closing(self, event: AnyEvent) -> Any:
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
