"""The chat screen: transcript, prompt, queue, status bar, and the persistence-service widget that owns the session.

The agent (policy + loop, mounted by the same `mount_agent` every face uses) runs in a Textual worker on the app's
event loop. Its barriers reach the service widget as messages; its events reach this screen as messages, in order, and
the transcript applies them exactly as it applies history.
"""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import MountError
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from cairn.persistence.events import (
    AnyEvent,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    RecoveryVerdict,
    RewindPlan,
    StepEnd,
    TurnEnd,
    TurnStart,
)
from cairn.persistence.repair import calls_awaiting_verdict
from cairn.persistence.session import LiveSession
from cairn.widgets.persistence_service import PersistenceService
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.status_bar import StatusBar, TokenTotals, format_tokens
from cairn.widgets.terminal_text import safe_text
from cairn.widgets.transcript import Notice, Transcript

from .. import quiet_gc, slash_commands
from ..config.resolver import RESUMED_WORKSPACE, Config
from ..history import PromptHistory, history_path
from .typeahead import Dialog, KeyRouter

if TYPE_CHECKING:  # the agent stack (loop, tools, providers, MCP) is imported after the first frame (P8)
    from ..agent.approval import ApprovalAnswer, ApprovalRequest
    from ..agent.loop import TurnResult
    from ..compose import Agent
    from ..providers.base import Provider

WELCOME = (
    "New session {id} ({provider}). Type a prompt: Enter sends, Ctrl+J adds a line, ↑ recalls earlier prompts, "
    "/ lists commands, F1 (or ? in an empty prompt) shows every key, Ctrl+Q quits."
)
DEMO_HINT = " The offline demo model understands: list files · read README.md · write notes.txt: hello · run ls"


# Events reach the screen at most this often (seconds): a fast stream then costs one render per frame, not per token,
# so drawing never slows the model's stream down (P6 in docs/benchmarks.md).
UI_FRAME = 1 / 25
MAX_FRAME = 0.5
ESC_ESC = 0.6  # seconds: two Esc presses on an empty prompt this close together open the rewind dialog
ANSWER_STARTED = (AssistantChunk, ReasoningChunk, AssistantMessage, TurnEnd)  # `sending…` ends with the first of these
UI_SHARE = 8  # frames are spaced at least this many times their cost: drawing takes at most ~1/8 of the event loop
AFTER_FIRST_FRAME = 0.15  # seconds between the first frame and building the agent stack (a prompt sent sooner waits)
SLICE_PAUSE = 0.004  # seconds the event loop is let go between two of the agent stack's imports


# Imported after the first frame one module at a time, leaves first, with the event loop let go between two: each is
# a few milliseconds, so keys typed meanwhile are echoed at once instead of after the whole stack (P8). The agent stack
# (loop, policy, tools, providers; the approval dialog) and the Markdown renderer the first answer needs. A module left
# out of this list is simply imported with the first one that needs it; a package comes whole (markdown_it's
# __init__ imports all of it: ~25 ms that cannot be cut smaller).
AGENT_STACK = (
    "html.entities", "markdown_it", "pygments.lexer", "rich.syntax", "rich.markdown",
    "cairn.widgets.answer_markdown", "anyio._backends._asyncio", "cairn.app.agent.hooks", "cairn.app.providers.base",
    "cairn.app.agent.compaction", "anyio.lowlevel", "ctypes", "cairn.app.tools.base", "cairn.app.tools.files",
    "cairn.app.tools.command", "cairn.app.agent.loop", "cairn.app.compose", "cairn.app.agent.approval",
    "cairn.app.screens.approval",
)


async def load_agent_stack() -> None:
    """Import the agent stack after the first frame, on the event loop's own thread: importing in a worker thread while
    this thread imports cairn modules too (a screen, the rewind engine) can hand one of them a half-initialised module
    (seen in a fresh install: ApprovalModal missing, so no approval could open). A test seam: hold it to keep the TUI
    without an agent."""
    import importlib

    for name in AGENT_STACK:
        if name not in sys.modules:
            importlib.import_module(name)
            # long enough for a key typed meanwhile to go all the way through (app, screen, prompt, update timer: a
            # few hops of the event loop each), not just one turn of the loop
            await asyncio.sleep(SLICE_PAUSE)


def builtin_safety_if_loaded(name: str) -> str:
    """A built-in tool's safety class for a card drawn before its `tool/call` says it ("?" until the tools are
    imported with the agent stack: history cards take it from their `tool/call` anyway)."""
    registry = sys.modules.get("cairn.app.tools.registry")
    return (registry.builtin_safety(name) if registry is not None else None) or "?"


class ChatScreen(Screen[None]):
    # the prompt has the focus from the start: focusing the transcript first (Textual's default, the first focusable
    # widget) and moving it to the prompt in on_mount restyled the whole history once more (P8)
    AUTO_FOCUS = "#prompt"
    DEFAULT_CSS = """
    ChatScreen #queue { height: auto; color: $text-muted; padding: 0 2; display: none; }
    ChatScreen #queue.-visible { display: block; }
    ChatScreen #slash { height: auto; max-height: 9; display: none; border: round $primary 50%; margin: 0 1; }
    ChatScreen #slash.-visible { display: block; }
    """

    BINDINGS = [
        Binding("escape", "cancel_turn", "Cancel turn"),
        Binding("escape", "escape_idle", "Rewind (Esc Esc)", show=False),  # when no turn runs: Esc Esc opens /rewind
        Binding("f1", "help", "Help"),
        Binding("ctrl+t", "toggle_thinking", "Thinking"),
        Binding("ctrl+o", "sessions", "Sessions"),
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
        Binding("pageup", "scroll_transcript('page_up')", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_transcript('page_down')", "Scroll", show=False, priority=True),
    ]

    class EventsReady(Message):
        """New session events wait in `_incoming`; one message however many arrived (coalesced)."""

    def __init__(self, session: LiveSession, config: Config, provider: Provider) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.provider = provider
        self._host_suffix = ""  # ` @host` when the session opened on a server other than its recorded one
        self.agent: Agent | None = None
        self.service = PersistenceService(session)
        self.resume_pending = False
        self._stop = asyncio.Event()
        self._agent_ready = asyncio.Event()
        self._agent_wanted = asyncio.Event()  # a prompt waits for the agent: build it now, not a moment later
        self._frame_drawn = asyncio.Event()  # the first frame is out: the agent stack may be built a moment later
        self._worker: Any = None
        self._resumed_once = False
        self._compacting = False  # a summary request runs (context compaction): the status bar says so
        self._sending = False  # a prompt was handed over and no answer has started yet: the status bar says `sending…`
        self._incoming: list[AnyEvent] = []
        self._drain_posted = False
        self._failure_shown = False
        self._frame = UI_FRAME
        self._due = 0.0
        self._drawn = 0.0  # seconds spent laying out and drawing this screen since the last drain
        self._turn_tokens = TokenTotals()
        self._session_tokens = TokenTotals()
        # prompts typed while a turn runs wait here (not in the loop) so they can be taken back and edited
        self.pending: list[str] = []
        self._in_loop = 0  # prompts handed to the loop whose turn has not reported its result yet
        self._paused = False  # Esc cancelled a turn: the queue waits for the operator (send, edit or drop)
        self._waited: float | None = None
        self._escaped = 0.0  # when Esc was last pressed on an empty prompt with no turn running (Esc Esc: /rewind)
        self.rewinding = False  # the rewind dialog is open or a rewind runs: no prompt is sent meanwhile
        self._blobs: Any = None
        secrets = tuple(x for x in (config.api_key,) if x)
        self.history = PromptHistory(history_path(config.home, config.workspace), secrets)
        # the app hands it every key first: a dialog Cairn raises while the operator types waits for Tab (SPEC §11)
        self.keys = KeyRouter(self, lambda: next(iter(self.query(PromptInput)), None) if self.is_attached else None)

    def compose(self) -> ComposeResult:
        transcript = Transcript(safety_of=builtin_safety_if_loaded, id="transcript")
        yield transcript
        yield transcript.new_output  # "↓ new output (End)": a row of its own under the transcript when shown
        yield Static("", id="queue", markup=False)
        yield OptionList(id="slash")
        yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield self.service
        yield QuietFooter()

    async def on_mount(self) -> None:
        status = self.query_one(StatusBar)
        status.session_id = self.session.id
        status.workspace = str(self.config.workspace) if self.works_elsewhere else ""
        self._host_suffix = self._other_host()  # as the session opened; a later /model switch names its own server
        status.provider = self._provider_label()
        status.backend = self.config.backend
        status.show_durability("durable", self.session.coordinator.durable_seq)
        prompt = self.query_one(PromptInput)
        prompt.prompt_history = self.history.entries
        prompt.queue = self.pending  # the prompt edits queued prompts in place (↑ walks back through them)
        transcript = self.query_one(Transcript)
        await transcript.load_history(self.session.events)  # the tail only: older turns mount as the view nears them
        self._count_tokens(self.session.events)
        if not self.session.events:
            hint = DEMO_HINT if self.provider.name == "demo" else ""
            welcome = WELCOME.format(id=self.session.id, provider=self.provider.name) + hint
            await transcript.mount(Notice(welcome, markup=False))
        transcript.scroll_end(animate=False)
        self.session.subscribe(self._on_session_event)
        # the agent stack after the first frame: usable first (P8). Its worker starts now and waits for that frame (the
        # app says so) or for a prompt, whichever comes first: a prompt sent before the first frame holds this
        # screen's queue while it waits for the agent, so the worker must not need that queue to begin
        self._start_agent()
        self.call_after_refresh(self.first_frame_drawn)  # (a chat mounted after the app's first frame)
        calls: list[Any] = []
        if self.session.repaired or calls_awaiting_verdict(self.session.events):
            from .resume import recovered_from  # (imported only when there may be calls to show: start-up, P8)

            calls, first_prompt, text = recovered_from(self.session.events)
        if calls:
            self.resume_pending = True
            self.app.push_screen(self._resume_screen(calls, first_prompt, text, raised=True), self._resumed)
        else:
            if self.session.repaired:
                await transcript.mount(Notice("This session was interrupted; no tool call was in flight, so nothing "
                                              "needs checking.", markup=False, classes="-warning"))
                transcript.scroll_end(animate=False)
            prompt.focus()
            self._settle_interrupted_rewind()

    @property
    def works_elsewhere(self) -> bool:
        """A resumed session of another directory runs in its own (SPEC §10): the status bar and resume screen say so."""
        return self.config.sources.get("workspace") == RESUMED_WORKSPACE

    def _provider_label(self) -> str:
        """`provider/model`, the other host if any, and the context window when the server said it (`ctx 8.2k
        (server)`: SPEC §7 rev 3)."""
        label = f"{self.provider.name}/{self.provider.model}" + self._host_suffix
        known = self.agent.loop.known_window if self.agent is not None else None
        if known is not None and known[1].startswith("server"):  # a configured or family window is no news
            label += f" · ctx {format_tokens(known[0])} (server)"
        return label

    def _refresh_provider(self) -> None:
        if self.is_attached:
            self.query_one(StatusBar).provider = self._provider_label()

    def _other_host(self) -> str:
        """` @host` when the operator named a server other than the one this session's last request went to (SPEC §6
        rev 3: their choice, and visible), else ""."""
        from ..config.resolver import last_request_header

        header = last_request_header(self.session.events)
        now = getattr(self.provider, "recorded_endpoint", None)
        if header is None or not header.endpoint or not now or now == header.endpoint:
            return ""
        from urllib.parse import urlsplit

        return f" @{urlsplit(now).netloc}"

    def _resume_screen(self, calls: Any, prompt: str, text: str, raised: bool = False) -> Screen[Any]:
        """`raised`: Cairn opens it by itself (a session reopened with calls to review), so keys typed meanwhile wait
        in the prompt until Tab; from `/verdict` it takes keys at once."""
        from .resume import ResumeScreen, ended_by_cancel

        return ResumeScreen(self.session.id, calls, prompt, text, workspace=self.config.workspace,
                            elsewhere=self.works_elsewhere, cancelled=ended_by_cancel(self.session.events),
                            save_verdict=self._save_verdict, typist=self.keys, raised=raised)

    async def _save_verdict(self, call_id: str, verdict: str, note: str) -> None:
        """An operator's verdict, durable before its dialog closes (SPEC §2 rev 3); raises CheckpointFailed."""
        self.session.append(RecoveryVerdict(call_id=call_id, verdict=verdict, note=note))  # type: ignore[arg-type]
        await self.session.flush()

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        """The first resume does not restyle the screen: every widget was styled as it was mounted, just before, and
        nothing changed since (it was ~half of the style work before the first frame: P8). Later resumes do."""
        if not self._resumed_once:
            self._resumed_once = True
            event.refresh_styles = False
        super()._on_screen_resume(event)

    def first_frame_drawn(self) -> None:
        self._frame_drawn.set()

    def _start_agent(self) -> None:
        """The worker that builds the agent stack (loop, tools, providers, MCP servers) right after the first frame, so
        the screen is drawn first. A prompt sent before it is ready waits for it."""
        if self._worker is None and not self._stop.is_set():
            self._worker = self.run_worker(self._run_agent(), name="agent", exit_on_error=True)

    async def _run_agent(self) -> None:
        # a moment after the first frame (keys typed right after the screen appears are echoed before the imports
        # begin, P8), at once if a prompt is already waiting. Waited here, in the worker: a Textual timer would reach
        # this screen through its message queue, which a prompt waiting for the agent holds (a deadlock)
        wanted, drawn, stop = (asyncio.ensure_future(e.wait()) for e in (self._agent_wanted, self._frame_drawn,
                                                                           self._stop))
        try:
            await asyncio.wait((wanted, drawn, stop), return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait((wanted, stop), timeout=AFTER_FIRST_FRAME, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (wanted, drawn, stop):
                waiting.cancel()
        if self._stop.is_set():
            return  # the app closes before the agent was ever needed
        await load_agent_stack()
        from ..compose import mount_agent

        async with AsyncExitStack() as stack:
            self.agent = await mount_agent(
                stack, self.session, self.provider, self.config, approver=self.ask_approval, report=self.report,
                mcp_background=True, mcp_waiting=self._waiting_for_mcp,
            )
            if self.agent.mcp is not None:  # servers come up while the operator types: the status bar says so
                self.agent.mcp.on_change.append(self._refresh_activity)
                self._refresh_activity()
            self.agent.loop.on_turn_result.append(self._turn_finished)
            self.agent.loop.on_compacting.append(self._set_compacting)
            self.agent.loop.on_waiting.append(self._set_waiting)
            self.agent.loop.on_window.append(lambda *_: self._refresh_provider())
            self._agent_ready.set()
            await self._stop.wait()
        # leaving the stack: the loop cancelled its turn and wrote the real closing events; the policy is removed

    def _waiting_for_mcp(self, names: list[str]) -> None:
        """A prompt reached its first request before the MCP servers were up: it waits for them only, visibly."""
        if self.is_attached and names:
            self.run_worker(self._say(f"Waiting for MCP server{'s' if len(names) > 1 else ''} {', '.join(names)} to "
                                      "start, so that the model sees their tools (Esc cancels)."),
                            exit_on_error=False)

    def _resumed(self, calls: Any) -> None:
        # each verdict was appended and made durable when its dialog closed (_save_verdict)
        self.resume_pending = False
        self.query_one(PromptInput).focus()
        self._settle_interrupted_rewind()

    # -- rewind (SPEC §9 rev 3) ---------------------------------------------------------------------------------------

    def _snapshots(self) -> Any:
        """The workspace's shadow repository the agent snapshots into (None: off, no git, or not built yet)."""
        return self.agent.loop.snapshots if self.agent is not None else None

    def _blob_store(self) -> Any:
        if self._blobs is None:
            from cairn.persistence.blobs import blob_store_for

            self._blobs = blob_store_for(self.app.store.backend)  # type: ignore[attr-defined]
        return self._blobs

    def _toast(self, text: str, *, severity: SeverityLevel = "information", timeout: float | None = None,
               title: str = "") -> None:
        """A toast, or, while a dialog is up, a line in the transcript instead: nothing covers a dialog's choices (a
        toast over the approval hid its last line at 80×24). The dialog hides toasts already shown; they come back
        when it closes."""
        if isinstance(self.app.screen, Dialog):
            kind = {"error": "-error", "warning": "-warning"}.get(severity, "")
            self.run_worker(self._say(f"{title}: {text}" if title else text, kind), exit_on_error=False)
            return
        self.notify(text, title=title, severity=severity, timeout=timeout, markup=False)

    async def _say(self, text: str, kind: str = "") -> None:
        transcript = self.query_one(Transcript)
        await transcript.mount(Notice(safe_text(text), markup=False, classes=kind))
        transcript.scroll_end(animate=False)

    def _idle(self) -> bool:
        return not self.turn_running and not self._in_loop and not (self.agent is not None and self.agent.loop.busy)

    def _settle_interrupted_rewind(self) -> None:
        """A rewind a crash interrupted: say what was and was not restored, and finish or abandon it before the next
        turn (the prompt sends nothing meanwhile)."""
        if not any(isinstance(e, RewindPlan) for e in self.session.events):
            return  # nearly always: the rewind engine and its dialog are imported only when needed (start-up, P8)
        from ..agent.rewind import pending_rewind
        from .rewind import PendingRewindScreen

        pending = pending_rewind(self.session.events)
        if pending is None:
            return
        self.rewinding = True

        def settled(how: str | None) -> None:
            self.run_worker(self._settle(how or "abandon"), name="rewind", exclusive=True, group="rewind")

        self.app.push_screen(PendingRewindScreen(*pending, typist=self.keys), settled)

    async def _settle(self, how: str) -> None:
        from ..agent.rewind import RewindRefused, abandon_rewind, describe, finish_rewind

        try:
            if how == "finish":
                outcome = await finish_rewind(self.session, self.config.workspace, self._blob_store(),
                                              repo=self._snapshots())
                lines = describe(outcome)
            else:
                plan = await abandon_rewind(self.session)
                lines = [f"abandoned the interrupted rewind to before turn {plan.to_turn}: files and conversation "
                         "stay as they are now"]
            await self._say("\n".join(lines))
        except RewindRefused as e:
            await self._say(str(e), "-warning")
        finally:
            self.rewinding = False
            self.query_one(PromptInput).focus()

    async def open_rewind(self) -> None:
        """`/rewind` (and Esc Esc): the dialog, then the engine — only while no turn runs."""
        from ..agent.rewind import pending_rewind
        from .rewind import RewindScreen

        if not self._idle():
            await self._say("Rewind works between turns: wait for this one to end (or Esc to cancel it).", "-warning")
            return
        if self.resume_pending or self.rewinding:
            return
        if pending_rewind(self.session.events) is not None:
            self._settle_interrupted_rewind()
            return
        self.rewinding = True

        def chosen(choice: Any) -> None:
            if choice is None:
                self.rewinding = False
                self.query_one(PromptInput).focus()
                return
            self.run_worker(self._rewind(choice), name="rewind", exclusive=True, group="rewind")

        self.app.push_screen(RewindScreen(self.session.events, self.config.workspace, self._blob_store(),
                                          self._snapshots(), typist=self.keys), chosen)

    async def _rewind(self, choice: Any) -> None:
        from ..agent.rewind import RewindRefused, describe, rewind, undo_rewind

        try:
            if not self._idle():
                await self._say("A turn started meanwhile: nothing was rewound.", "-warning")
                return
            try:
                if choice.undo:
                    outcome = await undo_rewind(self.session, self.config.workspace, self._blob_store(),
                                                force=choice.force, repo=self._snapshots())
                else:
                    outcome = await rewind(self.session, self.config.workspace, self._blob_store(), choice.to_turn,
                                           choice.scope, force=choice.force, repo=self._snapshots())
            except RewindRefused as e:
                if not e.changed or choice.force:
                    await self._say(f"Nothing was rewound: {e}", "-warning")
                    return
                # changed outside Cairn after the dialog looked: ask again (never overwrite without a yes)
                from dataclasses import replace

                from .confirm import ConfirmDialog

                question = ("Changed outside Cairn since Cairn last wrote it: " + ", ".join(e.changed)
                            + f". Restoring to before turn {choice.to_turn} overwrites what is there now. Overwrite?")
                if await self.app.push_screen_wait(ConfirmDialog(safe_text(question), yes="Overwrite",
                                                                 no="Leave it (rewind nothing)", typist=self.keys)):
                    await self._rewind(replace(choice, force=True))
                else:
                    await self._say("Nothing was rewound: " + ", ".join(e.changed) + " changed outside Cairn.",
                                    "-warning")
                return
            await self._say("\n".join(describe(outcome)), "-warning" if outcome.skipped else "")
            if outcome.conversation and not outcome.undo:
                self._repropose(choice.to_turn)
        finally:
            self.rewinding = False
            if self.is_attached:
                self.query_one(PromptInput).focus()

    def _repropose(self, turn: int) -> None:
        """After a conversation rewind, the rewound turn's prompt waits in an empty prompt: send, edit or drop it."""
        from ..agent.rewind import prompts

        prompt = self.query_one(PromptInput)
        text = dict(prompts(self.session.events)).get(turn)
        if text and not prompt.text.strip():
            prompt.insert(text)

    def action_escape_idle(self) -> None:
        """Esc on an empty prompt with no turn running: a second Esc within ESC_ESC seconds opens the rewind dialog."""
        now = time.monotonic()
        if now - self._escaped <= ESC_ESC:
            self._escaped = 0.0
            self.run_worker(self.open_rewind(), name="open-rewind", exclusive=True, group="open-rewind")
        else:
            self._escaped = now

    # -- events -----------------------------------------------------------------------------------------------------

    def _on_session_event(self, event: AnyEvent) -> None:
        """Session listener (runs in the agent worker): queue the event; one message per frame drains the batch."""
        self._incoming.append(event)
        if not self._drain_posted:
            self._drain_posted = True
            now = time.perf_counter()
            if now - self._due > MAX_FRAME:  # after a quiet spell, what was drawn meanwhile (typing, a blinking
                self._drawn = 0.0  # cursor) is not the cost of a frame of events
            self._due = now + self._frame
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
        self._pace_frames(lateness=started - self._due, cost=time.perf_counter() - started + self._drawn)
        self._drawn = 0.0
        self._count_tokens(events)
        if self._sending and any(isinstance(e, ANSWER_STARTED) for e in events):
            self._sending = False
            self._refresh_activity()
        if any(isinstance(e, (TurnStart, TurnEnd, ApprovalDecided)) for e in events):
            self._refresh_activity()  # ApprovalDecided: a session grant shows in the status bar
        if any(isinstance(e, (StepEnd, TurnEnd)) for e in events):
            self.call_after_refresh(quiet_gc.collect_now)  # the stream has ended: a full collection stalls nothing

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
                self._toast(safe_text(str(message.error)), title="Checkpoint failed", severity="error", timeout=8)
        elif message.state == "durable":
            self._failure_shown = False

    def _pace_frames(self, lateness: float, cost: float) -> None:
        """Space the next frame by what this one cost (applying events, then Textual's layout and drawing) and by how
        late this drain ran (the loop was busy), so drawing never crowds out the model's stream and the tools: on a
        dear frame (a live table or code block, a slow machine) the screen updates less often, the stream does not
        slow down."""
        self._frame = min(MAX_FRAME, max(UI_FRAME, max(0.0, lateness) + UI_SHARE * cost))

    def _on_timer_update(self) -> None:
        """Textual's screen update (layout, then drawing): timed, so frame pacing counts it (pinned Textual's hook)."""
        started = time.perf_counter()
        try:
            super()._on_timer_update()
        finally:
            self._drawn += time.perf_counter() - started

    def report(self, text: str) -> None:
        """The policy's channel for failures it contains (a turn-end barrier that did not make it)."""
        if not self.is_attached:
            return
        self._toast(safe_text(text), severity="error", timeout=8)
        self.query_one(StatusBar).failed = True

    def _turn_finished(self, result: TurnResult) -> None:
        """After each turn (in the loop's task): hand the next waiting prompt to the loop, keeping their order."""
        self._in_loop = max(0, self._in_loop - 1)
        self._sending = False
        self._send_next()
        if getattr(result, "reason", "") == "error" and self.is_attached:
            self._toast("The turn ended in an error: ↑ in the prompt brings your prompt back to send it again.",
                        severity="warning", timeout=8)
        self._refresh_activity()

    def _send_next(self) -> None:
        """Hand the head of the queue to a free loop, unless a queued prompt is open for editing: the queue is held
        until Enter, Ctrl+R or Esc ends the edit, so the loop never sends the version being changed."""
        if not self.pending or self._in_loop or self.agent is None or self._editing_queued() is not None:
            return
        if self._paused:
            return
        self._in_loop += 1
        self._sending = True
        self.agent.loop.submit(self.pending.pop(0))

    def _editing_queued(self) -> int | None:
        prompt = next(iter(self.query(PromptInput)), None) if self.is_attached else None
        return prompt.queue_at if prompt is not None else None

    def _set_compacting(self, active: bool) -> None:
        self._compacting = active
        self._refresh_activity()

    def _set_waiting(self, seconds: float | None) -> None:
        self._waited = seconds  # how long the server has kept this request waiting (None: it answered)
        self._refresh_activity()

    def _refresh_activity(self) -> None:
        if not self.is_attached:  # a turn's result can arrive while the exiting app takes the screen apart
            return
        loop = self.agent.loop if self.agent else None
        queued = self.pending
        running = self.turn_running
        status = self.query_one(StatusBar)
        doing = "● compacting…" if self._compacting else ("● sending…" if self._sending else "● running")
        running = running or self._sending
        if self._waited is not None and running:
            doing = f"● waiting for the server: {self._waited:.0f} s"
        waiting = "paused" if self._paused else "queued"
        status.activity = (doing if running else "idle") + (f" · {len(queued)} {waiting}" if queued else "")
        starting = self.agent.mcp.starting if self.agent is not None and self.agent.mcp is not None else []
        if starting:
            status.activity += f" · MCP starting: {', '.join(starting)}"
        status.grants = ", ".join(loop.grants.labels()) if loop is not None else ""
        queue = self.query_one("#queue", Static)
        editing = self._editing_queued()
        if editing is None and self._paused and queued:
            queue.update(safe_text("\n".join(f"paused: {q}" for q in queued)
                                   + "  (Esc paused the queue: Enter in an empty prompt sends it · ↑ edits or drops)"))
        elif editing is None:
            hint = "  (↑ in an empty prompt takes the last one back to edit or drop)" if queued else ""
            queue.update(safe_text("\n".join(f"queued: {q}" for q in queued) + hint))
        else:  # the one in the box stands out, and the keys that end the edit are spelled out
            lines = Text()
            for i, q in enumerate(queued):
                lines.append(("✎ editing: " if i == editing else "queued: ") + safe_text(q) + "\n",
                             style="bold" if i == editing else "")
            lines.append(f"prompt {editing + 1} of {len(queued)}: Enter puts it back · Ctrl+R removes it · Esc leaves "
                         "it as it was · ↑↓ other prompts · the queue waits meanwhile", style="italic")
            queue.update(lines)
        queue.set_class(bool(queued), "-visible")
        self.refresh_bindings()

    @property
    def turn_running(self) -> bool:
        loop = self.agent.loop if self.agent else None
        return loop is not None and loop.busy and bool(self.session.events) and not isinstance(
            self.session.events[-1], TurnEnd)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer hints that are true: "Cancel turn" only while there is a turn to cancel."""
        if action == "cancel_turn":  # (Esc leaves a queued prompt open for editing first)
            return self._editing_queued() is None and (self.turn_running or bool(self.agent and self.agent.loop.busy))
        if action == "escape_idle":  # Esc Esc opens the rewind dialog: only on an empty prompt between turns
            prompt = next(iter(self.query(PromptInput)), None)
            return (prompt is not None and not prompt.text and self._editing_queued() is None and self._idle()
                    and not self.resume_pending and not self.rewinding)
        return True

    # -- input ------------------------------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def submit(self, message: PromptInput.Submitted) -> None:
        self._show_completions("")
        command = slash_commands.parse(message.text)
        if command is not None:
            self.history.add(message.text)
            await self.run_slash(*command)
            return
        if self.resume_pending:
            self.history.add(message.text)
            self._toast("Review the recovered calls first (↑ brings your prompt back).", severity="warning")
            return
        if self.rewinding:
            self._toast("A rewind is being settled: the prompt is sent after it (↑ brings it back).",
                        severity="warning")
            self.history.add(message.text)
            return
        unavailable = getattr(self.provider, "unavailable", None)
        if unavailable:  # the session opened without a usable provider: say what continuing needs, send nothing
            self.history.add(message.text)
            self._toast(safe_text(f"Cannot continue this session here: {unavailable} (↑ brings your prompt back)"),
                        severity="error", timeout=12)
            return
        text = message.text[1:] if message.text.startswith("//") else message.text
        self.history.add(text)
        if not self._in_loop and not self.pending:
            self._sending = True  # said at once, before the request leaves (cleared when the answer starts)
            self._refresh_activity()
        self._agent_wanted.set()
        await self._agent_ready.wait()
        assert self.agent is not None
        if self._in_loop or self.pending:
            self.pending.append(text)
            self._paused = False  # a new prompt after Esc: the operator goes on, queued prompts first
            self._send_next()
        else:
            self._in_loop += 1
            self.agent.loop.submit(text)
        self._refresh_activity()

    @on(PromptInput.SendQueued)
    def send_queued(self) -> None:
        self._paused = False
        self._send_next()
        self._refresh_activity()

    @on(PromptInput.QueueChanged)
    def queue_changed(self) -> None:
        """A queued prompt was opened, put back, edited or removed: show it, and send the head if the loop is free."""
        self._send_next()
        self._refresh_activity()

    @on(PromptInput.HelpRequested)
    def action_help(self) -> None:
        from .help import HelpScreen

        if not isinstance(self.app.screen, HelpScreen):
            self.app.push_screen(HelpScreen())

    @on(PromptInput.Changed)
    def prompt_changed(self, event: PromptInput.Changed) -> None:
        self._show_completions(event.text_area.text)

    def _show_completions(self, text: str) -> None:
        """The completion popup: the commands matching a `/word` being typed; Tab takes the first."""
        popup = self.query_one("#slash", OptionList)
        found = slash_commands.matches(text)
        if found or popup.option_count:  # (typing plain text: nothing to rebuild, key after key)
            popup.clear_options()
            popup.add_options([Option(f"{c.usage:<34} {c.help}", id=c.name) for c in found])
        popup.set_class(bool(found), "-visible")
        self.query_one(PromptInput).completion = f"/{found[0].name}" if found else ""

    async def _switch_profile(self, name: str, say: Any) -> bool:
        """`/model PROFILE`: the config file's profile from the next turn (provider, endpoint, model), recorded in the
        next request/header. False when `name` is no profile (it is then a model name)."""
        from ..config.resolver import ConfigError, make_provider
        from ..config.resolver import provider_secrets as secrets_of
        from ..slash_commands import profile_config

        try:
            config = profile_config(self.config, name)
            if config is None:
                return False
            provider = make_provider(config)
        except ConfigError as e:
            await say(f"Profile {name} cannot be used: {e}", "-error")
            return True
        old, self.provider, self.config = self.provider, provider, config
        if self.agent is not None:
            self.session.add_secrets(secrets_of(provider))
            loop = self.agent.loop
            loop.provider = self.agent.provider = provider
            loop.profile = name
            from ..agent.compaction import configured_window

            loop.context_window = config.context_window or configured_window()
            loop.known_window = None  # asked again of the new endpoint before the next request
            self._host_suffix = ""
            loop.text_form = config.transcript == "text" or loop._text_form_recorded()
            self.agent.config = config
        self.run_worker(old.aclose(), exit_on_error=False)
        self._refresh_provider()
        await say(f"From the next turn on: profile {name}, {provider.name} {provider.model}.")
        return True

    async def run_slash(self, name: str, argument: str) -> None:
        transcript = self.query_one(Transcript)

        async def say(text: str, kind: str = "") -> None:
            await transcript.mount(Notice(safe_text(text), markup=False, classes=kind))
            transcript.scroll_end(animate=False)

        loop = self.agent.loop if self.agent else None
        if name == "help":
            self.action_help()
        elif name == "new":
            self.app.action_new_session()  # type: ignore[attr-defined]
        elif name == "sessions":
            self.action_sessions()
        elif name == "quit":
            await self.app.action_quit()
        elif name == "model":
            if argument and self.turn_running:
                await say("The model is switched between turns: wait for this one to end (or Esc).", "-warning")
            elif argument and await self._switch_profile(argument, say):
                pass
            elif argument:
                self.provider.model = argument
                self._refresh_provider()
                await say(f"From the next request on, the model is {argument} ({self.provider.name}).")
            else:  # the profiles, the one in use marked, and how to switch
                from ..slash_commands import model_listing

                await say(model_listing(self.config, self.provider, loop.profile if loop else self.config.profile))
        elif name == "permissions":
            await say(self._permissions(argument))
            self._refresh_activity()
        elif name == "mcp":
            from ..slash_commands import mcp_summary

            await say(mcp_summary(self.agent.mcp if self.agent else None))
        elif name == "compact":
            if loop is None:
                await say("Nothing to compact yet.")
            else:
                loop.compact_next = True
                await say("The conversation will be compacted before the next request: earlier turns become a "
                          "summary, and calls whose outcome is unknown are kept verbatim.")
        elif name == "usage":
            from cairn.widgets.status_bar import usage_text

            await say(usage_text(self._turn_tokens, self._session_tokens) or "The provider has reported no usage yet.")
        elif name == "rewind":
            await self.open_rewind()
        elif name == "verdict":
            from .resume import recovered_from

            calls = [c for c in recovered_from(self.session.events)[0] if c.status == "OUTCOME_UNKNOWN"]
            waiting = {r.call_id for r in calls_awaiting_verdict(self.session.events)}
            calls = [c for c in calls if c.call_id in waiting]
            if not calls:
                await say("No OUTCOME_UNKNOWN call is waiting for a verdict.")
            elif self.turn_running:
                await say("Verdicts are recorded between turns: wait for this one to end (or Esc).", "-warning")
            else:
                _, first_prompt, text = recovered_from(self.session.events)
                self.resume_pending = True
                self.app.push_screen(self._resume_screen(calls, first_prompt, text), self._resumed)
        else:
            known = ", ".join(c.usage.split()[0] for c in slash_commands.COMMANDS)
            await say(f"Unknown command /{name}. Commands: {known}. (Start with // to send a / to the model.)",
                      "-warning")

    def _permissions(self, argument: str) -> str:
        loop = self.agent.loop if self.agent else None
        if loop is None:
            return "The agent is not ready yet."
        grants = loop.grants
        labels = grants.labels()
        word, _, rest = argument.partition(" ")
        if word == "clear":
            grants.clear()
            return f"Revoked {len(labels)} grant(s): every tool asks again."
        if word == "revoke":
            rest = rest.strip()
            label = labels[int(rest) - 1] if rest.isdigit() and 0 < int(rest) <= len(labels) else rest
            if grants.revoke(label):
                return f"Revoked: {label}. It asks again."
            return f"No grant {rest!r}. /permissions lists them."
        if not labels:
            return "Nothing is allowed for this session: every side effect asks."
        listed = "  ".join(f"{i}. {label}" for i, label in enumerate(labels, 1))
        return f"Allowed for this session: {listed}   (/permissions revoke N, /permissions clear)"

    def action_scroll_transcript(self, how: str) -> None:
        """PageUp/PageDown scroll the transcript wherever the focus is (Home/End too, from an empty prompt)."""
        transcript = self.query_one(Transcript)
        if how == "home":  # the whole history first: it is mounted from the tail
            self.call_later(transcript.scroll_to_start)
            return
        {"page_up": transcript.scroll_page_up, "page_down": transcript.scroll_page_down,
         "end": transcript.scroll_end}[how](animate=False)

    @on(PromptInput.ScrollRequested)
    def scroll_from_prompt(self, message: PromptInput.ScrollRequested) -> None:
        self.action_scroll_transcript(message.how)

    def action_cancel_turn(self) -> None:
        if self.agent is not None and self.agent.loop.busy:
            self._paused = bool(self.pending)  # the prompts typed ahead wait: they were written for the turn cancelled
            self.agent.loop.cancel()
            self._refresh_activity()

    def action_toggle_thinking(self) -> None:
        """Expand or fold the latest reasoning block (a click or Enter on a block's title does it for any block)."""
        blocks = self.query_one(Transcript).reasoning_blocks
        if blocks:
            blocks[-1].collapsed = not blocks[-1].collapsed

    def action_sessions(self) -> None:
        self.app.action_open_sessions()  # type: ignore[attr-defined]

    async def ask_approval(self, request: ApprovalRequest) -> ApprovalAnswer:
        """The TUI's approver: a modal; the loop waits on a future its dismissal resolves."""
        from ..agent.approval import ApprovalAnswer
        from .approval import ApprovalModal

        future: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()

        def decided(answer: ApprovalAnswer | None) -> None:
            if not future.done():
                future.set_result(answer or ApprovalAnswer("denied"))
            self._refresh_activity()  # a session grant shows in the status bar

        modal = ApprovalModal(request, self.config.workspace, typist=self.keys)
        self.app.push_screen(modal, decided)
        try:
            return await future
        except asyncio.CancelledError:
            if modal.is_attached and self.app.screen is modal:
                modal.dismiss(ApprovalAnswer("cancelled"))
            raise

    # -- ordered shutdown -------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel the running turn, wait until the loop is idle (its real closing events are written), remove the
        policy, then final flush and close the store. Safe to call twice."""
        self._stop.set()
        if self._worker is not None:
            await self._worker.wait()
        await self.service.close()
        if self._blobs is not None:
            blobs, self._blobs = self._blobs, None
            blobs.close()
