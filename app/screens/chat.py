"""The chat screen: transcript, prompt, queue, status bar, and the persistence-service widget that owns the session.

The agent (policy + loop, mounted by the same `mount_agent` every face uses) runs in a Textual worker on the app's
event loop. Its barriers reach the service widget as messages; its events reach this screen as messages, in order, and
the transcript applies them exactly as it applies history.

Beside the chat, each in its own module: the agent's start-up and ordered stop (`agent_lifetime.py`), its approval
modals (`modal_approver.py`), the prompts typed ahead (`prompt_queue.py`), what the slash commands do
(`chat_commands.py`), the review of recovered calls (`call_review.py`) and the rewind flow (`rewind_flow.py`). Its
styles are in `chat.tcss`.
"""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
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
    StepEnd,
    TurnEnd,
    TurnStart,
)
from cairn.persistence.session import LiveSession
from cairn.widgets.persistence_service import PersistenceService
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.status_bar import StatusBar, TokenTotals, format_tokens
from cairn.widgets.terminal_text import safe_text
from cairn.widgets.transcript import AssistantText, Notice, Transcript

from .. import quiet_gc, slash_commands
from ..agent.notices import Compacting, TurnFinished, TurnResult, Waiting
from ..agent.notices import Notice as LoopNotice
from ..config.resolver import Config
from ..config.resumed import RESUMED_WORKSPACE
from ..history import PromptHistory, history_path
from ..providers.base import limits_of
from . import chat_commands
from .agent_lifetime import AgentLifetime
from .call_review import CallReview
from .mention_completion import MentionCompletion
from .modal_approver import ModalApprover
from .prompt_queue import PromptQueue, is_command
from .rewind_flow import RewindFlow
from .typeahead import Dialog, KeyRouter

if TYPE_CHECKING:  # the agent stack (loop, tools, providers, MCP) is imported after the first frame (P8)
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
ANSWER_STARTED = (AssistantChunk, ReasoningChunk, AssistantMessage, TurnEnd)  # `sending…` ends with the first of these
UI_SHARE = 8  # frames are spaced at least this many times their cost: drawing takes at most ~1/8 of the event loop


def builtin_safety_if_loaded(name: str) -> str:
    """A built-in tool's safety class for a card drawn before its `tool/call` says it ("?" until the tools are
    imported with the agent stack: history cards take it from their `tool/call` anyway)."""
    registry = sys.modules.get("cairn.app.tools.registry")
    return (registry.builtin_safety(name) if registry is not None else None) or "?"


class ChatScreen(Screen[None]):
    # the prompt has the focus from the start: focusing the transcript first (Textual's default, the first focusable
    # widget) and moving it to the prompt in on_mount restyled the whole history once more (P8)
    AUTO_FOCUS = "#prompt"
    # (Textual reads a pushed screen's CSS_PATH, not the default screen's: the app loads this one too, see tui.py)
    CSS_PATH = Path(__file__).with_name("chat.tcss")

    BINDINGS = [
        Binding("escape", "cancel_turn", "Cancel turn"),
        Binding("escape", "escape_idle", "Rewind (Esc Esc)", show=False),  # when no turn runs: Esc Esc opens /rewind
        Binding("f1", "help", "Help"),
        Binding("ctrl+t", "toggle_thinking", "Thinking"),
        Binding("ctrl+o", "sessions", "Sessions"),
        Binding("ctrl+g", "copy_answer", "Copy answer", show=False),  # (OSC 52: copy.py)
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
        Binding("pageup", "scroll_transcript('page_up')", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll_transcript('page_down')", "Scroll", show=False, priority=True),
    ]

    transcript = getters.query_one(Transcript)
    status_bar = getters.query_one(StatusBar)
    prompt_input = getters.query_one(PromptInput)
    queue_view = getters.query_one("#queue", Static)
    slash_popup = getters.query_one("#slash", OptionList)

    class EventsReady(Message):
        """New session events wait in `_incoming`; one message however many arrived (coalesced)."""

    def __init__(self, session: LiveSession, config: Config, provider: Provider) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.provider = provider
        self.host_suffix = ""  # ` @host` when the session opened on a server other than its recorded one
        self.service = PersistenceService(session)
        self.agent_lifetime = AgentLifetime(build=self._mount_agent, ready=self._listen_to)
        self.prompt_queue = PromptQueue(loop=lambda: self.agent.loop if self.agent else None,
                                        editing=self._editing_queued)
        self.rewind_flow = RewindFlow(self)
        self.call_review = CallReview(self)
        self.mentions = MentionCompletion(lambda: self.agent.loop.workspace if self.agent else Path(config.workspace))
        self._resumed_once = False
        self._compacting = False  # a summary request runs (context compaction): the status bar says so
        self._waited: float | None = None
        self._incoming: list[AnyEvent] = []
        self._drain_posted = False
        self._failure_shown = False
        self.fenced = False  # another writer (another host) took the session over: this screen writes nothing more
        self._frame = UI_FRAME
        self._due = 0.0
        self._drawn = 0.0  # seconds spent laying out and drawing this screen since the last drain
        self.turn_tokens = TokenTotals()
        self.session_tokens = TokenTotals()
        secrets = tuple(x for x in (config.api_key,) if x)
        self.history = PromptHistory(history_path(config.home, config.workspace), secrets)
        # the app hands it every key first: a dialog Cairn raises while the operator types waits for Tab (SPEC §11)
        self.keys = KeyRouter(self, lambda: next(iter(self.query(PromptInput)), None) if self.is_attached else None)

    @property
    def agent(self) -> Agent | None:
        return self.agent_lifetime.agent

    @property
    def pending(self) -> list[str]:
        """Prompts typed while a turn runs, waiting (editable) until the loop is free."""
        return self.prompt_queue.pending

    @property
    def resume_pending(self) -> bool:
        """Recovered calls are being reviewed: no prompt is sent meanwhile."""
        return self.call_review.reviewing

    @property
    def rewinding(self) -> bool:
        """The rewind dialog is open or a rewind runs: no prompt is sent meanwhile."""
        return self.rewind_flow.rewinding

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
        status = self.status_bar
        status.session_id = self.session.id
        status.workspace = str(self.config.workspace) if self.works_elsewhere else ""
        self.host_suffix = self._other_host()  # as the session opened; a later /model switch names its own server
        status.provider = self._provider_label()
        status.backend = self.config.backend
        status.show_durability("durable", self.session.coordinator.durable_seq)
        prompt = self.prompt_input
        prompt.prompt_history = self.history.entries
        prompt.queue = self.pending  # the prompt edits queued prompts in place (↑ walks back through them)
        transcript = self.transcript
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
        self.agent_lifetime.start(self)
        self.call_after_refresh(self.first_frame_drawn)  # (a chat mounted after the app's first frame)
        await self.call_review.at_start()

    @property
    def works_elsewhere(self) -> bool:
        """A resumed session of another directory runs in its own (SPEC §10): the status bar and resume screen say so."""
        return self.config.sources.get("workspace") == RESUMED_WORKSPACE

    def _provider_label(self) -> str:
        """`provider/model`, the other host if any, and the context window when the server said it (`ctx 8.2k
        (server)`: SPEC §7 rev 3)."""
        label = f"{self.provider.name}/{self.provider.model}" + self.host_suffix
        known = self.agent.loop.known_window if self.agent is not None else None
        if known is not None and known[1].startswith("server"):  # a configured or family window is no news
            label += f" · ctx {format_tokens(known[0])} (server)"
        return label

    def refresh_provider(self) -> None:
        if self.is_attached:
            self.status_bar.provider = self._provider_label()

    def _other_host(self) -> str:
        """` @host` when the operator named a server other than the one this session's last request went to (SPEC §6
        rev 3: their choice, and visible), else ""."""
        from ..config.resumed import last_request_header

        from urllib.parse import urlsplit

        header = last_request_header(self.session.events)
        now = limits_of(self.provider).endpoint
        if header is None or not header.endpoint or not now or urlsplit(now).netloc == urlsplit(header.endpoint).netloc:
            return ""  # the same server (a provider switch on resume changes only the path)
        return f" @{urlsplit(now).netloc}"

    # -- the agent: built by `agent_lifetime` after the first frame; what the chat hears from it ---------------------

    async def _mount_agent(self, stack: AsyncExitStack) -> Agent:
        from ..compose import mount_agent

        return await mount_agent(
            stack, self.session, self.provider, self.config, report=self.report, mcp_background=True,
            mcp_waiting=self._waiting_for_mcp,
            approver=ModalApprover(self, self.config.workspace, self.keys, decided=self.refresh_activity),
        )

    def _listen_to(self, agent: Agent) -> None:
        if agent.mcp is not None:  # servers come up while the operator types: the status bar says so
            agent.mcp.on_change.append(self.refresh_activity)
            self.refresh_activity()
        agent.loop.notices.append(self._on_notice)
        agent.loop.report = self.tell  # the loop's lines (a refused mention, a cut AGENTS.md) are not failures

    def first_frame_drawn(self) -> None:
        self.agent_lifetime.first_frame_drawn()

    def _waiting_for_mcp(self, names: list[str]) -> None:
        """A prompt reached its first request before the MCP servers were up: it waits for them only, visibly."""
        if self.is_attached and names:
            self.run_worker(self.say(f"Waiting for MCP server{'s' if len(names) > 1 else ''} {', '.join(names)} to "
                                     "start, so that the model sees their tools (Esc cancels)."),
                            exit_on_error=False)

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        """The first resume does not restyle the screen: every widget was styled as it was mounted, just before, and
        nothing changed since (it was ~half of the style work before the first frame: P8). Later resumes do."""
        if not self._resumed_once:
            self._resumed_once = True
            event.refresh_styles = False
        super()._on_screen_resume(event)

    # -- what the chat says -----------------------------------------------------------------------------------------

    def _toast(self, text: str, *, severity: SeverityLevel = "information", timeout: float | None = None,
               title: str = "") -> None:
        """A toast, or, while a dialog is up, a line in the transcript instead: nothing covers a dialog's choices (a
        toast over the approval hid its last line at 80×24). The dialog hides toasts already shown; they come back
        when it closes."""
        if isinstance(self.app.screen, Dialog):
            kind = {"error": "-error", "warning": "-warning"}.get(severity, "")
            self.run_worker(self.say(f"{title}: {text}" if title else text, kind), exit_on_error=False)
            return
        self.notify(text, title=title, severity=severity, timeout=timeout, markup=False)

    async def say(self, text: str, kind: str = "") -> None:
        """A line in the transcript (`kind`: "-warning", "-error" or "")."""
        transcript = self.transcript
        await transcript.mount(Notice(safe_text(text), markup=False, classes=kind))
        transcript.scroll_end(animate=False)

    def idle(self) -> bool:
        return not self.turn_running and not self.prompt_queue.in_loop and not (
            self.agent is not None and self.agent.loop.busy)

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
        if self.prompt_queue.sending and any(isinstance(e, ANSWER_STARTED) for e in events):
            self.prompt_queue.sending = False
            self.refresh_activity()
        if any(isinstance(e, (TurnStart, TurnEnd, ApprovalDecided)) for e in events):
            self.refresh_activity()  # ApprovalDecided: a session grant shows in the status bar
        if any(isinstance(e, (StepEnd, TurnEnd)) for e in events):
            self.call_after_refresh(quiet_gc.collect_now)  # the stream has ended: a full collection stalls nothing

    def _count_tokens(self, events: list[AnyEvent]) -> None:
        """Usage reported on `assistant/message`, summed for the current (or last) turn and the whole session."""
        changed = False
        for event in events:
            if isinstance(event, TurnStart):
                self.turn_tokens = TokenTotals()
                changed = True
            elif isinstance(event, AssistantMessage) and event.usage is not None:
                self.turn_tokens.add(event.usage)
                self.session_tokens.add(event.usage)
                changed = True
        if changed:
            self.status_bar.show_usage(self.turn_tokens, self.session_tokens)

    @on(PersistenceService.DurabilityChanged)
    def show_durability(self, message: PersistenceService.DurabilityChanged) -> None:
        self.status_bar.show_durability(message.state, message.durable_seq, message.error)
        if message.fenced and not self.fenced:
            self.fenced = True
            self._toast(safe_text(f"{message.error}. This window no longer writes to it: quit, then `cairn show "
                                  f"{self.session.id}` to read it."), title="Session taken over", severity="error",
                        timeout=60)
        elif message.state == "failed" and not self.fenced:
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
        self.status_bar.failed = True

    def tell(self, text: str) -> None:
        """The loop's one-line notices to the operator: a warning, not a failure (the status bar stays as it is)."""
        if self.is_attached:
            self._toast(safe_text(text), severity="warning", timeout=8)

    def _on_notice(self, notice: LoopNotice) -> None:
        """What the loop tells besides the session's events (in the loop's task)."""
        if isinstance(notice, TurnFinished):
            self._turn_finished(notice.result)
        elif isinstance(notice, Compacting):
            self._compacting = notice.active
            self.refresh_activity()
        elif isinstance(notice, Waiting):
            self._waited = notice.seconds  # how long the server has kept this request waiting (None: it answered)
            self.refresh_activity()
        else:
            self.refresh_provider()  # the context window is known or changed

    def _turn_finished(self, result: TurnResult) -> None:
        """After each queued turn: hand the next waiting prompt to the loop, keeping their order."""
        self.prompt_queue.turn_finished()
        if result.reason == "error" and self.is_attached:
            self._toast("The turn ended in an error: ↑ in the prompt brings your prompt back to send it again.",
                        severity="warning", timeout=8)
        self.refresh_activity()

    def _editing_queued(self) -> int | None:
        prompt = next(iter(self.query(PromptInput)), None) if self.is_attached else None
        return prompt.queue_at if prompt is not None else None

    def refresh_activity(self) -> None:
        """The status bar's activity and grants, and the queue above the prompt."""
        if not self.is_attached:  # a turn's result can arrive while the exiting app takes the screen apart
            return
        try:
            status = self.status_bar
        except NoMatches:  # attached, but its children already removed by the exiting app
            return
        loop = self.agent.loop if self.agent else None
        queued = self.prompt_queue
        doing = "● compacting…" if self._compacting else ("● sending…" if queued.sending else "● running")
        running = self.turn_running or queued.sending
        if self._waited is not None and running:
            doing = f"● waiting for the server: {self._waited:.0f} s"
        status.activity = (doing if running else "idle") + queued.count()
        starting = self.agent.mcp.starting if self.agent is not None and self.agent.mcp is not None else []
        if starting:
            status.activity += f" · MCP starting: {', '.join(starting)}"
        status.grants = ", ".join(loop.grants.labels()) if loop is not None else ""
        view = self.queue_view
        view.update(queued.view())
        view.set_class(bool(queued.pending), "-visible")
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
            return (prompt is not None and not prompt.text and self._editing_queued() is None and self.idle()
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
        if self.fenced:  # the writer is fenced: a turn could only fail; say why instead
            self.history.add(message.text)
            self._toast("Another writer took this session over: this window no longer writes to it.", severity="error")
            return
        if self.rewinding:
            self._toast("A rewind is being settled: the prompt is sent after it (↑ brings it back).",
                        severity="warning")
            self.history.add(message.text)
            return
        unavailable = limits_of(self.provider).unavailable
        if unavailable:  # the session opened without a usable provider: say what continuing needs, send nothing
            self.history.add(message.text)
            self._toast(safe_text(f"Cannot continue this session here: {unavailable} (↑ brings your prompt back)"),
                        severity="error", timeout=12)
            return
        text = message.text[1:] if message.text.startswith("//") else message.text
        self.history.add(text)
        if self.prompt_queue.empty and not is_command(text):  # (`!cmd`: the operator's shell command, no request)
            self.prompt_queue.sending = True  # said at once, before the request leaves (cleared when the answer starts)
            self.refresh_activity()
        await self.agent_lifetime.wanted()
        self.prompt_queue.send(text)
        self.refresh_activity()

    @on(PromptInput.SendQueued)
    def send_queued(self) -> None:
        self.prompt_queue.go_on()
        self.refresh_activity()

    @on(PromptInput.QueueChanged)
    def queue_changed(self) -> None:
        """A queued prompt was opened, put back, edited or removed: show it, and send the head if the loop is free."""
        self.prompt_queue.send_next()
        self.refresh_activity()

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
        popup = self.slash_popup
        again = lambda: self._show_completions(self.prompt_input.text)  # noqa: E731  (the file list arrived)
        if self.mentions.show(text, popup, self.prompt_input, again):
            return  # an `@path` at the cursor: the workspace's files instead (mention_completion.py)
        found = slash_commands.matches(text)
        if found or popup.option_count:  # (typing plain text: nothing to rebuild, key after key)
            popup.clear_options()
            popup.add_options([Option(f"{c.usage:<34} {c.help}", id=c.name) for c in found])
        popup.set_class(bool(found), "-visible")
        self.prompt_input.completion = f"/{found[0].name}" if found else ""

    async def run_slash(self, name: str, argument: str) -> None:
        await chat_commands.run_slash(self, name, argument)

    def action_scroll_transcript(self, how: str) -> None:
        """PageUp/PageDown scroll the transcript wherever the focus is (Home/End too, from an empty prompt)."""
        transcript = self.transcript
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
            self.prompt_queue.turn_cancelled()
            self.agent.loop.cancel()
            self.refresh_activity()

    def action_escape_idle(self) -> None:
        """Esc on an empty prompt with no turn running: Esc Esc opens the rewind dialog."""
        self.rewind_flow.escape_pressed()

    def action_toggle_thinking(self) -> None:
        """Expand or fold the latest reasoning block (a click or Enter on a block's title does it for any block)."""
        blocks = self.transcript.reasoning_blocks
        if blocks:
            blocks[-1].collapsed = not blocks[-1].collapsed

    def action_sessions(self) -> None:
        self.app.action_open_sessions()  # type: ignore[attr-defined]

    def action_copy_answer(self) -> None:
        from .copy import copy_last_answer

        self.run_worker(copy_last_answer(self.app, self.session.events), exit_on_error=False)

    @on(AssistantText.CopyRequested)
    def copy_block(self, message: AssistantText.CopyRequested) -> None:
        from .copy import copy_text

        self.run_worker(copy_text(self.app, message.text, message.what), exit_on_error=False)

    # -- ordered shutdown -------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel the running turn, wait until the loop is idle (its real closing events are written), remove the
        policy, then final flush and close the store. Safe to call twice."""
        await self.agent_lifetime.stop()
        await self.service.close()
        self.rewind_flow.close()
