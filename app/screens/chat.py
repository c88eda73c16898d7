"""The chat screen: transcript, prompt, queue, status bar, and the persistence-service widget that owns the session.

The agent (policy + loop, mounted by the same `mount_agent` every face uses) runs in a Textual worker on the app's
event loop. Its barriers reach the service widget as messages; its events reach this screen as messages, in order, and
the transcript applies them exactly as it applies history.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widget import MountError
from textual.widgets import Footer, Static

from ..approval import ApprovalRequest
from ..compose import Agent, mount_agent
from ..config import Config
from ..loop import TurnResult
from ..providers.base import Provider
from ..terminal_text import safe_text
from ..tools.registry import builtin_safety
from cairn.persistence.events import AnyEvent, AssistantMessage, RecoveryVerdict, TurnEnd, TurnStart
from cairn.persistence.repair import calls_awaiting_verdict
from cairn.persistence.session import LiveSession
from cairn.widgets.persistence_service import PersistenceService
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.status_bar import StatusBar, TokenTotals
from cairn.widgets.transcript import Notice, Transcript

from .approval import ApprovalModal
from .resume import ResumeScreen, recovered_from


WELCOME = (
    "New session {id} ({provider}). Type a prompt: Enter sends, Ctrl+J adds a line, Esc cancels a running turn, "
    "Ctrl+O lists sessions, Ctrl+Q quits."
)
DEMO_HINT = " The offline demo model understands: list files · read README.md · write notes.txt: hello · run ls"


# Events reach the screen at most this often (seconds): a fast stream then costs one render per frame, not per token,
# so drawing never slows the model's stream down (P6 in docs/benchmarks.md).
UI_FRAME = 1 / 25
MAX_FRAME = 0.5


class ChatScreen(Screen[None]):
    DEFAULT_CSS = """
    ChatScreen #queue { height: auto; color: $text-muted; padding: 0 2; display: none; }
    ChatScreen #queue.-visible { display: block; }
    """

    BINDINGS = [
        Binding("escape", "cancel_turn", "Cancel turn"),
        Binding("ctrl+t", "toggle_thinking", "Thinking"),
        Binding("ctrl+o", "sessions", "Sessions"),
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
    ]

    class EventsReady(Message):
        """New session events wait in `_incoming`; one message however many arrived (coalesced)."""

    def __init__(self, session: LiveSession, config: Config, provider: Provider) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.provider = provider
        self.agent: Agent | None = None
        self.service = PersistenceService(session)
        self.resume_pending = False
        self._stop = asyncio.Event()
        self._agent_ready = asyncio.Event()
        self._worker: Any = None
        self._incoming: list[AnyEvent] = []
        self._drain_posted = False
        self._failure_shown = False
        self._frame = UI_FRAME
        self._due = 0.0
        self._turn_tokens = TokenTotals()
        self._session_tokens = TokenTotals()

    def compose(self) -> ComposeResult:
        yield Transcript(safety_of=lambda name: builtin_safety(name) or "?", id="transcript")
        yield Static("", id="queue", markup=False)
        yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield self.service
        yield Footer()

    async def on_mount(self) -> None:
        status = self.query_one(StatusBar)
        status.session_id = self.session.id
        status.provider = f"{self.provider.name}/{self.provider.model}"
        status.backend = self.config.backend
        status.show_durability("durable", self.session.coordinator.durable_seq)
        transcript = self.query_one(Transcript)
        for event in self.session.events:
            await transcript.apply(event, live=False)
        self._count_tokens(self.session.events)
        if not self.session.events:
            hint = DEMO_HINT if self.provider.name == "demo" else ""
            welcome = WELCOME.format(id=self.session.id, provider=self.provider.name) + hint
            await transcript.mount(Notice(welcome, markup=False))
        transcript.scroll_end(animate=False)
        self.session.subscribe(self._on_session_event)
        self._worker = self.run_worker(self._run_agent(), name="agent", exit_on_error=True)
        if self.session.repaired or calls_awaiting_verdict(self.session.events):
            self.resume_pending = True
            calls, prompt, text = recovered_from(self.session.events)
            self.app.push_screen(ResumeScreen(self.session.id, calls, prompt, text), self._resumed)
        else:
            self.query_one(PromptInput).focus()

    async def _run_agent(self) -> None:
        async with AsyncExitStack() as stack:
            self.agent = await mount_agent(
                stack, self.session, self.provider, self.config, approver=self.ask_approval, report=self.report
            )
            self.agent.loop.on_turn_result.append(self._turn_finished)
            self._agent_ready.set()
            await self._stop.wait()
        # leaving the stack: the loop cancelled its turn and wrote the real closing events; the policy is removed

    def _resumed(self, calls: Any) -> None:
        for call in calls or []:
            if call.verdict:
                self.session.append(RecoveryVerdict(call_id=call.call_id, verdict=call.verdict, note=call.note))
        self.resume_pending = False
        self.query_one(PromptInput).focus()

    # -- events -----------------------------------------------------------------------------------------------------

    def _on_session_event(self, event: AnyEvent) -> None:
        """Session listener (runs in the agent worker): queue the event; one message per frame drains the batch."""
        self._incoming.append(event)
        if not self._drain_posted:
            self._drain_posted = True
            self._due = time.perf_counter() + self._frame
            self.set_timer(self._frame, lambda: self.post_message(self.EventsReady()))

    @on(EventsReady)
    async def show_events(self) -> None:
        self._drain_posted = False
        events, self._incoming = self._incoming, []
        # The ordered quit's closing events can reach the screen while the exiting app takes it apart (before or
        # during this drain): they are on disk already; there is nothing left to show them on.
        transcript = next(iter(self.query(Transcript)), None)
        if transcript is None or not transcript.is_attached:
            return
        started = time.perf_counter()
        try:
            await transcript.apply_many(events)
        except MountError:
            if transcript.is_attached:
                raise
            return
        self._pace_frames(lateness=started - self._due, cost=time.perf_counter() - started)
        self._count_tokens(events)
        if any(isinstance(e, (TurnStart, TurnEnd)) for e in events):
            self._refresh_activity()

    def _count_tokens(self, events: list[AnyEvent]) -> None:
        """Usage reported on `assistant/message`, summed for the current (or last) turn and the whole session."""
        changed = False
        for event in events:
            if isinstance(event, TurnStart):
                self._turn_tokens = TokenTotals()
                changed = True
            elif isinstance(event, AssistantMessage) and event.usage is not None:
                self._turn_tokens.add(event.usage)
                self._session_tokens.add(event.usage)
                changed = True
        if changed:
            self.query_one(StatusBar).show_usage(self._turn_tokens, self._session_tokens)

    @on(PersistenceService.DurabilityChanged)
    def show_durability(self, message: PersistenceService.DurabilityChanged) -> None:
        self.query_one(StatusBar).show_durability(message.state, message.durable_seq, message.error)
        if message.state == "failed":
            if not self._failure_shown:  # one toast per run of failures, so the red status bar stays readable
                self._failure_shown = True
                self.notify(safe_text(str(message.error)), title="Checkpoint failed", severity="error", timeout=8,
                            markup=False)
        elif message.state == "durable":
            self._failure_shown = False

    def _pace_frames(self, lateness: float, cost: float) -> None:
        """A long transcript makes each frame dearer (Textual's layout grows with it), and that shows as this drain
        running late: space frames out by as much, so drawing never crowds out the model's stream and the tools."""
        self._frame = min(MAX_FRAME, max(UI_FRAME, 2 * (max(0.0, lateness) + cost)))

    def report(self, text: str) -> None:
        """The policy's channel for failures it contains (a turn-end barrier that did not make it)."""
        if not self.is_attached:
            return
        self.notify(safe_text(text), severity="error", timeout=8, markup=False)
        self.query_one(StatusBar).failed = True

    def _turn_finished(self, result: TurnResult) -> None:
        self._refresh_activity()

    def _refresh_activity(self) -> None:
        if not self.is_attached:  # a turn's result can arrive while the exiting app takes the screen apart
            return
        loop = self.agent.loop if self.agent else None
        queued = loop.queued if loop else []
        running = loop is not None and loop.busy and (self.session.events and not isinstance(self.session.events[-1], TurnEnd))
        status = self.query_one(StatusBar)
        status.activity = ("● running" if running else "idle") + (f" · {len(queued)} queued" if queued else "")
        queue = self.query_one("#queue", Static)
        queue.update(safe_text("\n".join(f"queued: {q}" for q in queued)))
        queue.set_class(bool(queued), "-visible")

    # -- input ------------------------------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def submit(self, message: PromptInput.Submitted) -> None:
        if self.resume_pending:
            self.notify("Review the recovered calls first.", severity="warning")
            return
        await self._agent_ready.wait()
        assert self.agent is not None
        self.agent.loop.submit(message.text)
        self._refresh_activity()

    def action_cancel_turn(self) -> None:
        if self.agent is not None and self.agent.loop.busy:
            self.agent.loop.cancel()

    def action_toggle_thinking(self) -> None:
        """Expand or fold the latest reasoning block (a click or Enter on a block's title does it for any block)."""
        blocks = self.query_one(Transcript).reasoning_blocks
        if blocks:
            blocks[-1].collapsed = not blocks[-1].collapsed

    def action_sessions(self) -> None:
        self.app.action_open_sessions()  # type: ignore[attr-defined]

    async def ask_approval(self, request: ApprovalRequest) -> str:
        """The TUI's approver: a modal; the loop waits on a future its dismissal resolves."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def decided(decision: str | None) -> None:
            if not future.done():
                future.set_result(decision or "denied")

        modal = ApprovalModal(request)
        self.app.push_screen(modal, decided)
        try:
            return await future
        except asyncio.CancelledError:
            if modal.is_attached and self.app.screen is modal:
                modal.dismiss("cancelled")
            raise

    # -- ordered shutdown -------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel the running turn, wait until the loop is idle (its real closing events are written), remove the
        policy, then final flush and close the store. Safe to call twice."""
        self._stop.set()
        if self._worker is not None:
            await self._worker.wait()
        await self.service.close()
