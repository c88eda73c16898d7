"""One ACP session: a Cairn session composed exactly as every other face composes it, plus the bridge to the client.

The pieces form one ordered unit, entered in the session's own task and torn down in reverse (an AsyncExitStack):

    enter:  update pump  →  persistence → policy → loop (`open_agent`)  →  bridge attached to the loop's events
    leave:  the bridge refuses new prompts; the loop drops queued prompts, cancels the running turn and waits until
            its real `step/end` and `turn/end` are written; the policy's hooks are removed; persistence flushes,
            closes and unlocks the log; prompts that never ran are answered `cancelled`; the pump sends the last
            updates (those describing the cancelled turn) and stops.

The pump is outermost because it only talks to the client: the updates that describe the closing events must go out
after those events exist, and nothing it does touches the log.

Why a task per session: the loop and the pump own task groups, which must be left in the task that entered them, while
protocol handlers run in short-lived tasks of the connection. So the session lives in a host task of its own
(`SessionHost.serve`) and handlers talk to it.

Why turns run on the loop's own queue (`loop.submit`) and not inside the `session/prompt` handler: the connection
cancels its handler tasks when the client goes away, and a turn cancelled that way (a bare task cancellation, not the
loop's cancel scope) would skip the loop's closing events. Here every turn ends through `loop.cancel()` or by itself, so
a disconnect ends it exactly as `session/cancel` or the TUI's cancel key does: `turn/end` with reason `cancelled`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from acp import update_agent_message_text
from acp.schema import AllowedOutcome, PermissionOption, SessionMode, SessionModeState, ToolCallUpdate, Usage

from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import AnyEvent, AssistantMessage, Decision, RecoveryVerdict, ToolCall, TurnStart
from cairn.persistence.evidence import evidence_by_call
from cairn.persistence.repair import calls_awaiting_verdict
from cairn.persistence.store import OpenedSession

from ..agent.approval import ApprovalRequest
from ..agent.notices import Notice, TurnFinished, TurnResult
from ..compose import Agent, open_agent
from ..config.resolver import Config
from ..render import first_line
from .updates import LiveView, call_content, repaired_results, tool_kind, tool_locations, tool_title, wire

log = logging.getLogger("cairn.acp")

CLOSE_GRACE = 5.0  # seconds the pump may spend sending the last updates at shutdown (a client may have stopped reading)

PERMISSION_OPTIONS = [
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Allow for this session", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Deny", kind="reject_once"),
]
DECISIONS: dict[str, Decision] = {"allow_once": "allowed_once", "allow_always": "allowed_session",
                                  "reject_once": "denied"}

# Approval modes, offered as ACP session modes. Per connection, like the editor's own choice: not written to the log
# (the decisions they make are: approval/decided `allowed_once`, exactly as if the operator had clicked).
MODES = [
    SessionMode(id="ask", name="Ask", description="Ask before every command and file change"),
    SessionMode(id="accept-edits", name="Accept edits",
                description="Apply write_file and edit_file without asking; still ask before commands"),
    SessionMode(id="bypass", name="Bypass", description="Run every tool call without asking"),
]
EDIT_TOOLS = ("write_file", "edit_file")
VERDICTS = ("happened", "did_not_happen", "unknown")


def pending_text(plan: Any, done: set[str]) -> str:
    """What an operator reads about a rewind a crash interrupted (SPEC §9: never a half-restored workspace with no
    record), and how to settle it."""
    left = [f.path for f in plan.files if f.path not in done]
    return (f"A rewind to before turn {plan.to_turn} was interrupted (restored: {', '.join(sorted(done)) or 'none'}; "
            f"not yet: {', '.join(left) or 'none'}). Send `/rewind --finish` to complete it or `/rewind --abandon` "
            "to leave the files as they are.")


def mode_state(current: str) -> SessionModeState:
    return SessionModeState(current_mode_id=current, available_modes=MODES)


class UpdatePump:
    """Sends one session's updates to the client, in order, from one task.

    Event listeners are synchronous, so they queue updates here; `drain()` then promises "everything queued so far has
    reached the connection" where order matters: before a prompt is answered, before a permission request about a tool
    call the client must already know, and after a load's replay. Once the client is gone, updates are dropped.
    """

    def __init__(self, conn: Any, session_id: str) -> None:
        self.conn, self.session_id = conn, session_id
        self._send, self._receive = anyio.create_memory_object_stream[Any](math.inf)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._finished = anyio.Event()
        self._client_gone = False
        self._open = anyio.Event()  # held shut while the client cannot know the session yet (see `hold`)
        self._open.set()

    def hold(self) -> None:
        """Keep updates queued until `release()`: a new session's first updates must follow the `session/new`
        answer that tells the client its id (a client drops updates for a session it does not know)."""
        self._open = anyio.Event()

    def release(self) -> None:
        self._open.set()

    def put(self, update: Any) -> None:
        try:
            self._send.send_nowait(update)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is closing and its pump has stopped

    async def drain(self) -> None:
        done = anyio.Event()
        try:
            self._send.send_nowait(done)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        await done.wait()

    async def _run(self) -> None:
        try:
            async for item in self._receive:
                await self._open.wait()
                if isinstance(item, anyio.Event):
                    item.set()
                elif not self._client_gone:
                    try:
                        await self.conn.session_update(session_id=self.session_id, update=item)
                    except Exception as e:  # ConnectionError once the client has gone away
                        self._client_gone = True
                        log.info("session %s: the client no longer receives updates (%s)", self.session_id, e)
        finally:
            self._finished.set()
            while True:  # cut short: release anyone still waiting in drain()
                try:
                    item = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                if isinstance(item, anyio.Event):
                    item.set()

    async def __aenter__(self) -> "UpdatePump":
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._run)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._tasks is not None
        self._send.close()
        self.release()
        with anyio.move_on_after(CLOSE_GRACE):
            await self._finished.wait()
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(None, None, None)


@dataclass
class _Waiter:
    """A `session/prompt` waiting for its turn's result (None: the session closed before the turn ran)."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: TurnResult | None = None


class SessionHost:
    def __init__(self, conn: Any, config: Config, opened: OpenedSession) -> None:
        self.conn = conn
        self.config = config  # its workspace is the session's own (SPEC §10), not necessarily the client's cwd
        self.opened = opened
        self.id = opened.header.id
        self.pump = UpdatePump(conn, self.id)
        self.view = LiveView(config.workspace)
        self.mode = "ask"
        self.agent: Agent | None = None
        self.closing = False
        self.closed = anyio.Event()
        self._stop = anyio.Event()
        self._waiting: deque[_Waiter] = deque()  # in submission order, which is the loop's order

    # -- lifecycle --------------------------------------------------------------------------------------------------

    async def serve(self, *, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        """The session's whole life (see the module docstring). Reports readiness once the loop is mounted; failures
        before that are raised to whoever started it, failures after are logged (one session must not end the rest)."""
        started = False
        try:
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(self.pump)
                stack.callback(self._answer_waiting)
                agent = await stack.enter_async_context(
                    open_agent(self.config, opened=self.opened, approver=self._approve, report=self._report)
                )
                agent.session.subscribe(self._on_event)
                agent.loop.notices.append(self._on_notice)
                self.agent = agent
                task_status.started(self)
                started = True
                await self._stop.wait()
        except Exception:
            if not started:
                raise
            log.exception("session %s did not close cleanly", self.id)
        finally:
            self.closed.set()

    def stop(self) -> None:
        """Begin the ordered teardown; `closed` is set when it is complete."""
        self.closing = True
        self._stop.set()

    # -- what protocol handlers call --------------------------------------------------------------------------------

    async def run_turn(self, prompt: str) -> TurnResult | None:
        """Queue a turn, wait for its result and for the updates it caused to be sent. None: it never ran."""
        if self.closing or self.agent is None:
            return None
        self.pump.release()
        waiter = _Waiter()
        self._waiting.append(waiter)
        self.agent.loop.submit(prompt)
        await waiter.done.wait()
        await self.pump.drain()
        return waiter.result

    def turn_usage(self, turn: int) -> Usage | None:
        """The tokens the provider reported for `turn`, summed over its answers; None when none reported any. Sent as
        `PromptResponse.usage` (marked unstable in ACP; a client that does not know it ignores it)."""
        if self.agent is None:
            return None
        inputs = outputs = cached = thought = 0
        known = False
        for event in reversed(self.agent.session.events):
            if isinstance(event, TurnStart) and event.turn == turn:
                break
            if isinstance(event, AssistantMessage) and event.turn == turn and event.usage is not None:
                u = event.usage
                known = known or u.input_tokens is not None or u.output_tokens is not None
                inputs += u.input_tokens or 0
                outputs += u.output_tokens or 0
                cached += u.cached_tokens or 0
                thought += u.reasoning_tokens or 0
        if not known:
            return None
        return Usage(total_tokens=inputs + outputs, input_tokens=inputs, output_tokens=outputs,
                     cached_read_tokens=cached or None, thought_tokens=thought or None)

    def cancel(self) -> None:
        """`session/cancel`: the running turn ends `cancelled` through the loop, as in the TUI."""
        if self.agent is not None:
            self.agent.loop.cancel()

    def say(self, text: str) -> None:
        """A short agent message (command answers, notices)."""
        self.pump.put(update_agent_message_text(wire(text)))

    async def record_verdict(self, arguments: str) -> str:
        """`/verdict <call_id> happened|did_not_happen|unknown [note]`, recorded as `recovery/verdict` between turns,
        exactly as the TUI's resume screen does; the model sees it in the next request. Returns the answer to show."""
        usage = "usage: /verdict <call_id> happened|did_not_happen|unknown [note]"
        if self.agent is None:
            return "this session is closing"
        parts = arguments.split(None, 2)
        waiting = {r.call_id: r for r in calls_awaiting_verdict(self.agent.session.events)}
        listing = ", ".join(waiting) or "none"
        if len(parts) < 2 or parts[1] not in VERDICTS:
            return f"{usage}. Calls waiting for a verdict: {listing}."
        call_id, verdict, note = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
        if call_id not in waiting:
            return f"{call_id} is not a call waiting for a verdict (OUTCOME_UNKNOWN, unanswered). Waiting: {listing}."
        if self.agent.loop.busy:
            return "a turn is running; send /verdict when it has ended"
        self.agent.loop.record_verdict(call_id, verdict, note)
        events = self.agent.session.events
        evidence = evidence_by_call(events).get(call_id)
        recorded = next(e for e in reversed(events) if isinstance(e, RecoveryVerdict))
        safety = next((e.safety for e in reversed(events) if isinstance(e, ToolCall) and e.call_id == call_id), None)
        recovered = id(waiting[call_id]) in repaired_results(events)
        try:
            await self.agent.session.flush()  # an operator's decision is durable at once (SPEC §2 rev 3)
        except CheckpointFailed as e:
            self.pump.put(self.view.verdict_update(recorded, waiting[call_id], safety, evidence, recovered))
            return (f"Recorded `{call_id}` {verdict}, but it is not durable yet ({e.cause}); it is written at the next "
                    "checkpoint.")
        self.pump.put(self.view.verdict_update(recorded, waiting[call_id], safety, evidence, recovered))
        return (f"Recorded: `{call_id}` {verdict}" + (f" ({note})" if note else "")
                + ". The model will see it with your next prompt.")

    async def rewind(self, arguments: str) -> str:
        """`/rewind N [--files | --conversation] [--force] [--dry-run]` (SPEC §9 rev 3, §10 rev 4): what turns N and
        later changed goes back (files and/or the conversation), with the same crash-safe engine as `cairn rewind`. A
        path a turn changed and someone else changed after it is named and nothing is touched unless `--force`.
        `/rewind --undo` takes the most recent rewind back; `--dry-run` only shows the plan. `/rewind --finish` /
        `--abandon` settle a rewind a crash interrupted. Between turns only."""
        from ..agent.rewind import (
            RewindRefused,
            abandon_rewind,
            describe,
            finish_rewind,
            pending_rewind,
            plan_lines,
            plan_rewind,
            plan_undo,
            rewind,
            undo_rewind,
        )

        usage = ("usage: /rewind N [--files | --conversation] [--force] [--dry-run], /rewind --undo [--dry-run], "
                 "or /rewind --finish | --abandon")
        if self.agent is None:
            return "this session is closing"
        words = arguments.split()
        flags = {w for w in words if w.startswith("--")}
        numbers = [w for w in words if not w.startswith("--")]
        unknown = flags - {"--force", "--files", "--conversation", "--finish", "--abandon", "--undo", "--dry-run"}
        settle = flags & {"--finish", "--abandon", "--undo"}
        if (unknown or len(numbers) > 1 or {"--files", "--conversation"} <= flags or len(settle) > 1
                or (settle and numbers) or ("--dry-run" in flags and settle - {"--undo"})):
            return f"{usage}."
        if not settle and (not numbers or not numbers[0].isdigit()):
            from ..agent.rewind_plan import prompts

            turns = "; ".join(f"{turn}: {first_line(text, 40)}" for turn, text in prompts(self.agent.session.events))
            return f"{usage}. Turns: {turns or 'none yet'}."
        if self.agent.loop.busy:
            return "a turn is running; send /rewind when it has ended"
        session = self.agent.session
        blobs = self.agent.loop.blobs() if self.agent.loop.blobs is not None else None
        repo = self.agent.loop.snapshots
        force = "--force" in flags
        scope = "files" if "--files" in flags else "conversation" if "--conversation" in flags else "both"
        try:
            if "--abandon" in flags:
                plan = await abandon_rewind(session)
                return f"Abandoned the interrupted rewind to before turn {plan.to_turn}; files stay as they are."
            if "--finish" in flags:
                outcome = await finish_rewind(session, self.config.workspace, blobs, force=force, repo=repo)
            else:
                pending = pending_rewind(session.events)
                if pending is not None:
                    return pending_text(*pending)
                if "--dry-run" in flags:
                    import anyio.to_thread

                    if "--undo" in flags:
                        found = await anyio.to_thread.run_sync(plan_undo, session.events, self.config.workspace, repo)
                    else:
                        found = await anyio.to_thread.run_sync(
                            plan_rewind, session.events, self.config.workspace, int(numbers[0]), blobs,
                            repo if scope != "conversation" else None, force)
                    return "\n".join(plan_lines(found, "both" if "--undo" in flags else scope))  # type: ignore[arg-type]
                if "--undo" in flags:
                    outcome = await undo_rewind(session, self.config.workspace, blobs, force=force, repo=repo)
                else:
                    outcome = await rewind(session, self.config.workspace, blobs, int(numbers[0]), scope,  # type: ignore[arg-type]
                                           force=force, repo=repo)
        except RewindRefused as e:
            if e.changed:
                again = "--undo" if "--undo" in flags else (numbers[0] if numbers else "")
                return f"Nothing was rewound: {e}. Send `/rewind {again} --force` to overwrite them."
            return f"Nothing was rewound: {e}."
        except CheckpointFailed as e:
            return (f"The rewind could not be made durable ({e.cause}); Cairn tries to write it again at the next "
                    "checkpoint, and "
                    "an interrupted one can be finished with `/rewind --finish`.")
        log.info("session %s: rewound to before turn %d", self.id, outcome.to_turn)
        return "\n".join(describe(outcome))

    async def replay(self, updates: list[Any]) -> None:
        for update in updates:
            self.pump.put(update)
        await self.pump.drain()

    # -- bridge -----------------------------------------------------------------------------------------------------

    def _on_event(self, event: AnyEvent) -> None:
        for update in self.view.updates(event):
            self.pump.put(update)

    def _on_notice(self, notice: Notice) -> None:
        if isinstance(notice, TurnFinished) and self._waiting:
            waiter = self._waiting.popleft()
            waiter.result = notice.result
            waiter.done.set()

    def _answer_waiting(self) -> None:
        while self._waiting:
            self._waiting.popleft().done.set()

    async def _approve(self, request: ApprovalRequest) -> Decision:
        """Ask the client (`session/request_permission`); the loop records approval/asked and approval/decided.

        A client that dismisses the request (outcome `cancelled`) or has gone away cancels the turn, as the TUI's
        cancel does from its approval prompt; a client that answers with an error or an unknown option denies.
        The request carries everything needed to decide: the full command, or the diff of the file change.
        Modes decide without asking: `bypass` everything, `accept-edits` file changes."""
        if self.mode == "bypass" or (self.mode == "accept-edits" and request.name in EDIT_TOOLS):
            return "allowed_once"
        await self.pump.drain()  # the client has the `tool_call` this request refers to
        known = self.view.calls.get(request.call_id)
        tool_call = ToolCallUpdate(
            tool_call_id=wire(request.call_id), title=tool_title(request.name, request.arguments),
            kind=tool_kind(request.name), status="pending", raw_input=wire(request.arguments),
            content=call_content(request.name, request.arguments, known.diff if known else None),
            locations=tool_locations(request.name, request.arguments, self.config.workspace),
        )
        try:
            response = await self.conn.request_permission(
                session_id=self.id, tool_call=tool_call, options=PERMISSION_OPTIONS
            )
        except ConnectionError:
            return "cancelled"
        except Exception as e:
            log.warning("session %s: permission request for %s failed (%s); denied", self.id, request.call_id, e)
            return "denied"
        outcome = response.outcome
        if isinstance(outcome, AllowedOutcome):
            return DECISIONS.get(outcome.option_id, "denied")
        return "cancelled"

    def _report(self, message: str) -> None:
        log.warning("session %s: %s", self.id, message)
