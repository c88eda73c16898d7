"""The chat transcript, derived from session events: user prompts, the model's reasoning, streamed assistant Markdown,
tool-call cards.

History and live updates go through the same `apply()`, so what a resumed session shows is exactly what was seen live.
Answers are `AssistantText` columns of sealed pieces plus one small live piece (see `answer_text`): the cost of a chunk
does not grow with the answer, and sealed and live parts are drawn by the same renderer. Reasoning streams into a
collapsed `ReasoningBlock` above the step's answer; in history it comes from `assistant/message.reasoning`.

History opens at the tail (`load_history`): only the last turns that fill a few screenfuls become widgets and are
mounted; older turns stay events, and are built and mounted (whole widgets, or the hidden pieces of a long answer) as
the view nears the top. Follow mode is Textual's anchor: the view stays at the end while it is there; scrolling up
releases it (nothing pulls the view back) and a "↓ new output" line says when more arrived below; End or a click on
that line follows again.

Every text that reaches a widget here came from outside (model, tools, prompts, the session file) and passes through
`safe_text` first: an ESC or OSC sequence is shown as a visible symbol, never acted on by the terminal. Plain texts are
given to widgets with markup off, so `[b]` in a prompt or a tool's output is shown as written.
"""

from __future__ import annotations

from typing import Callable

from textual import events
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from cairn.widgets.attachment_line import attachments_line
from cairn.widgets.terminal_text import safe_text
from cairn.persistence.events import (
    MAX_TOKENS,
    AnyEvent,
    ApprovalAsked,
    AssistantChunk,
    AssistantMessage,
    ContextCompaction,
    ContextInstructions,
    ConversationRewind,
    OperatorCommand,
    OperatorResult,
    ReasoningChunk,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)

from .answer_text import AssistantText
from .reasoning import ReasoningBlock
from .operator_card import OperatorCard
from .tool_card import ToolCard

__all__ = ["AssistantText", "Notice", "Transcript", "UserPrompt", "turn_notice"]

class UserPrompt(Static):
    DEFAULT_CSS = "UserPrompt { margin: 1 0 0 0; padding: 0 1; background: $boost; color: $text; text-style: bold; }"


class Notice(Static):
    DEFAULT_CSS = """
    Notice { margin: 0 0 1 0; padding: 0 1; color: $text-muted; }
    Notice.-error { color: $error; }
    Notice.-warning { color: $warning; }
    Notice.-superseded { text-style: dim; }
    """


class VerdictNotice(Notice):
    """An operator's verdict in the chat; marked superseded (dimmed, and said) once a later verdict on its call is
    shown."""

    def __init__(self, verdict: RecoveryVerdict, superseded: bool = False) -> None:
        super().__init__(verdict_line(verdict, superseded), markup=False, classes="-superseded" if superseded else "")
        self.verdict = verdict

    def supersede(self) -> None:
        self.update(verdict_line(self.verdict, superseded=True))
        self.add_class("-superseded")


def verdict_line(event: RecoveryVerdict, superseded: bool = False) -> str:
    """How an operator's verdict reads in the chat; one a later verdict on the same call supersedes (SPEC §11: the
    model is told only the newest) says so."""
    note = f" — {event.note}" if event.note else ""
    later = "  (superseded by a later verdict)" if superseded else ""
    return safe_text(f"verdict on {event.call_id}: {event.verdict}{note}{later}")


class NewOutput(Static):
    """The "↓ new output" line: shown under the view while it does not follow and more arrived below. A row of its
    own under the transcript (the screen places it), never drawn over the transcript's last line."""

    DEFAULT_CSS = """
    NewOutput { width: auto; height: 1; margin: 0 2; padding: 0 1; display: none;
                background: $accent; color: $text; text-style: bold; }
    NewOutput.-visible { display: block; }
    """

    def __init__(self, transcript: "Transcript") -> None:
        super().__init__("↓ new output (End)", markup=False)
        self.transcript = transcript

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.transcript.follow()


HISTORY_SCREENS = 2  # screenfuls of history mounted at open (enough that the view opens a screen above the top,
# so nothing more is mounted until it scrolls up); more as the view nears the top. 3 cost P8 a third more widgets
MIN_HISTORY_LINES = 60


def estimated_lines(widget: Widget) -> int:
    """A cheap guess of a widget's height before it is laid out (deciding how much history to mount)."""
    if isinstance(widget, AssistantText):
        return widget.estimated_lines()
    if isinstance(widget, ToolCard):
        return 4
    return 2


def estimated_event_lines(event: AnyEvent) -> int:
    """A cheap guess of the lines an event adds to the transcript, before any widget exists (how many turns of
    history to build at open)."""
    if isinstance(event, UserMessage):
        return 2 + event.text.count("\n") + bool(event.attachments)
    if isinstance(event, AssistantMessage):
        return 2 + event.text.count("\n") + 4 * len(event.tool_calls)
    if isinstance(event, OperatorCommand):
        return 4
    if isinstance(event, (RecoveryVerdict, ContextCompaction, ConversationRewind)):
        return 2
    if isinstance(event, ToolCall) and event.parent_call_id is not None:
        return 4  # a nested call's card (top-level calls are counted with their assistant message)
    if isinstance(event, TurnEnd):
        return 0 if event.reason == "completed" else 2
    return 0


def split_turns(events: list[AnyEvent]) -> list[list[AnyEvent]]:
    """Events cut before each `turn/start` (what comes before the first turn goes with it)."""
    turns: list[list[AnyEvent]] = []
    for event in events:
        if isinstance(event, TurnStart) or not turns:
            turns.append([])
        turns[-1].append(event)
    return turns


class Transcript(VerticalScroll):
    DEFAULT_CSS = "Transcript { height: 1fr; padding: 0 1; }"

    def __init__(self, safety_of: Callable[[str], str] = lambda name: "?", **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.safety_of = safety_of  # a tool's safety class before its tool/call says it
        self.cards: dict[str, ToolCard] = {}
        self.new_output = NewOutput(self)  # the screen yields it right under the transcript
        self._assistant: AssistantText | None = None
        self._streamed = ""
        self._answer_start: Widget | None = None  # the first widget of the step's answer (reasoning goes above it)
        self._reasoning: ReasoningBlock | None = None  # the step's reasoning block, once mounted
        self._reasoned = ""  # reasoning chunks read from history (their assistant/message holds the whole text)
        self._sink: list[Widget] | None = None  # while history is read: widgets collect here instead of mounting
        self.older: list[Widget] = []  # history widgets not mounted yet, oldest first
        self.older_turns: list[list[AnyEvent]] = []  # history turns not even built yet, oldest first
        self._revealing = False
        # call id -> (seq, notice) of the newest verdict shown on it: an earlier one is marked superseded, in
        # whichever order they are built (history is built from the tail, older turns later)
        self._verdicts: dict[str, tuple[int, VerdictNotice]] = {}
        self._safety_seen: dict[str, str] = {}  # tool name -> the safety its latest applied tool/call recorded
        self._history: list[AnyEvent] = []  # the events history was loaded from (looked up for a call's safety)
        self._operators: dict[int, OperatorCard] = {}  # turn -> the card of its `!command` while it has no result

    def on_mount(self) -> None:
        self.anchor()

    @property
    def reasoning_blocks(self) -> list[ReasoningBlock]:
        return [w for w in self.older if isinstance(w, ReasoningBlock)] + list(self.query(ReasoningBlock))

    # -- follow mode ------------------------------------------------------------------------------------------------

    @property
    def following(self) -> bool:
        return self._anchored and not self._anchor_released

    def follow(self) -> None:
        """Back to the end, and stay there as output arrives (End, or a click on "↓ new output")."""
        self.anchor()
        self.new_output.set_class(False, "-visible")

    def scroll_end(self, *args, **kwargs):
        self.new_output.set_class(False, "-visible")
        return super().scroll_end(*args, **kwargs)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.following:
            self.new_output.set_class(False, "-visible")
        if self.older_remaining and new_value < max(4, self.size.height) and not self._revealing:
            self._revealing = True
            self.call_after_refresh(self._reveal_more)

    def _content_arrived(self) -> None:
        if not self.following:
            self.new_output.set_class(True, "-visible")

    # -- history from the tail --------------------------------------------------------------------------------------

    async def load_history(self, events: list[AnyEvent]) -> None:
        """Show the session's events as `apply(live=False)` would, from the tail: only the last turns that fill about
        HISTORY_SCREENS screenfuls become widgets, and only those are mounted; older widgets wait in `older` (and in
        the hidden pieces of the first answer shown), older turns wait as events in `older_turns` until the view
        nears them. Opening a long session costs its last screenfuls, not its length."""
        self._history = events
        turns = split_turns(events)
        budget = max(MIN_HISTORY_LINES, HISTORY_SCREENS * (self.size.height or 24))
        first, lines = len(turns), 0
        while first > 0 and lines < budget:
            first -= 1
            lines += sum(map(estimated_event_lines, turns[first]))
        self.older_turns = turns[:first]
        built = await self._build([event for turn in turns[first:] for event in turn])
        index, lines = len(built), 0
        while index > 0 and lines < budget:
            index -= 1
            widget = built[index]
            if isinstance(widget, AssistantText) and widget.finished:
                lines += widget.hide_older(budget - lines)
            else:
                lines += estimated_lines(widget)
        self.older = built[:index]
        if built[index:]:
            await self.mount_all(built[index:])
        self.anchor()

    async def _build(self, events: list[AnyEvent]) -> list[Widget]:
        """The widgets history events make, collected instead of mounted."""
        self._sink = []
        try:
            for event in events:
                await self.apply(event, live=False)
        finally:
            built, self._sink = self._sink, None
        return built

    async def _build_older_turn(self) -> None:
        """The next older turn's widgets into `older`, built apart from the state of a turn that may be streaming.
        Applying history never suspends (nothing is mounted), so a live batch cannot run in between and land here."""
        saved = (self._assistant, self._streamed, self._answer_start, self._reasoning, self._reasoned)
        self._assistant, self._streamed, self._answer_start, self._reasoning, self._reasoned = None, "", None, None, ""
        try:
            self.older = await self._build(self.older_turns.pop()) + self.older
        finally:
            self._assistant, self._streamed, self._answer_start, self._reasoning, self._reasoned = saved

    @property
    def older_remaining(self) -> bool:
        first = self._first_content()
        return bool(self.older or self.older_turns) or (isinstance(first, AssistantText) and first.hidden > 0)

    def _first_content(self) -> Widget | None:
        return next(iter(self.children), None)

    async def reveal_older(self, lines: int | None = None) -> None:
        """Mount about `lines` more lines of history above what is shown (all of it when None), keeping what is on
        screen where it is."""
        budget = lines if lines is not None else 1 << 60
        before_height = self.virtual_size.height
        shown = 0
        while shown < budget and self.older_remaining and self.is_attached:  # (not while the app is closing)
            first = self._first_content()
            if isinstance(first, AssistantText) and first.hidden:
                await first.reveal_older(budget - shown)
                shown += budget if lines is not None else 0
                continue
            if not self.older:
                await self._build_older_turn()
                continue
            widget = self.older.pop()
            if isinstance(widget, AssistantText) and lines is not None:
                widget.hide_older(budget - shown)
            shown += estimated_lines(widget)
            await self.mount(widget, before=first)
        if lines is not None and not self.following:
            y = self.scroll_y

            def keep_place() -> None:
                self.scroll_to(y=y + self.virtual_size.height - before_height, animate=False, immediate=True,
                               release_anchor=False)

            self.call_after_refresh(keep_place)

    async def _reveal_more(self) -> None:
        try:
            await self.reveal_older(max(MIN_HISTORY_LINES, 2 * self.size.height))
        finally:
            self._revealing = False

    async def scroll_to_start(self) -> None:
        """Home: the whole history, from its first line."""
        await self.reveal_older(None)
        self.release_anchor()
        self.call_after_refresh(lambda: self.scroll_home(animate=False))

    # -- applying events --------------------------------------------------------------------------------------------

    async def _put(self, widget: Widget, before: Widget | None = None) -> None:
        """Mount (live) or collect (history) a widget, at the end or before another one."""
        if self._sink is not None:
            index = self._sink.index(before) if before is not None and before in self._sink else len(self._sink)
            self._sink.insert(index, widget)
        elif before is not None and before.parent is self:
            await self.mount(widget, before=before)
        else:
            await self.mount(widget)

    async def apply_many(self, events: list[AnyEvent]) -> None:
        """Apply a batch of live events; consecutive chunks of one kind become one write.
        When the model streams faster than the screen renders, batches grow and the cost per token shrinks."""
        run: list[str] = []
        run_kind: type | None = None
        for event in events:
            kind = type(event) if isinstance(event, (AssistantChunk, ReasoningChunk)) else None
            if run and kind is not run_kind:
                await self._write_run(run_kind, run)
                run = []
            if kind is not None:
                run_kind = kind
                run.append(event.delta)  # type: ignore[union-attr]
                continue
            await self.apply(event, live=True, scroll=False)
        if run:
            await self._write_run(run_kind, run)
        self._content_arrived()

    async def _write_run(self, kind: type | None, deltas: list[str]) -> None:
        if kind is ReasoningChunk:
            await self._write_reasoning("".join(deltas))
        else:
            await self._write_delta("".join(deltas))

    async def _write_reasoning(self, text: str) -> None:
        if self._reasoning is None:
            self._reasoning = ReasoningBlock(streaming=True)
            await self._put(self._reasoning, before=self._answer_start)
        await self._reasoning.append(text)

    async def _write_delta(self, text: str) -> None:
        if self._assistant is None:
            if self._reasoning is not None and self._reasoning.streaming:
                await self._reasoning.finish()  # the answer starts: the thinking folds away
            self._assistant = AssistantText()
            await self._put(self._assistant)
            self._answer_start = self._answer_start or self._assistant
        await self._assistant.write(safe_text(text))

    async def apply(self, event: AnyEvent, live: bool = True, scroll: bool = True) -> None:
        if isinstance(event, UserMessage):
            attached = attachments_line(event.attachments)  # the `@path` files sent with it, one line under it
            shown = f"> {event.text}" + (f"\n  {attached}" if attached else "")
            await self._put(UserPrompt(safe_text(shown), markup=False))
        elif isinstance(event, AssistantChunk):
            if live:
                await self._write_delta(event.delta)
            else:
                self._streamed += safe_text(event.delta)
        elif isinstance(event, ReasoningChunk):
            if live:
                await self._write_reasoning(event.delta)
            else:
                self._reasoned += event.delta
        elif isinstance(event, AssistantMessage):
            await self._finish_answer(event)
        elif isinstance(event, ApprovalAsked):
            card = self.cards.get(event.call_id)
            if card is not None:
                card.status = "awaiting approval"
        elif isinstance(event, ToolCall):
            card = self.cards.get(event.call_id)
            if card is None:  # a nested call: not in the assistant message
                card = ToolCard(event.call_id, event.name, event.arguments, event.safety)
                self.cards[event.call_id] = card
                await self._put(card)
            card.set_safety(event.safety)
            card.status = "running"
            self._safety_seen[event.name] = event.safety
        elif isinstance(event, ToolResult):
            card = self.cards.get(event.call_id)
            if card is not None:
                if not card.safety_known:  # no tool/call (NOT_STARTED, denied, …): what its other calls recorded
                    card.set_safety(self._recorded_safety(card.tool_name))
                card.set_result(event.content, event.error_code)
        elif isinstance(event, RecoveryVerdict):
            newest = self._verdicts.get(event.call_id)
            older = newest is not None and newest[0] > event.seq  # an older turn's verdict, built after the newer
            notice = VerdictNotice(event, superseded=older)
            if not older:
                if newest is not None:
                    newest[1].supersede()
                self._verdicts[event.call_id] = (event.seq, notice)
            await self._put(notice)
        elif isinstance(event, OperatorCommand):  # the operator's own `!command` (a turn of its own)
            self._operators[event.turn] = OperatorCard(event.turn, event.command)
            await self._put(self._operators[event.turn])
        elif isinstance(event, OperatorResult) and event.turn in self._operators:
            self._operators.pop(event.turn).set_result(event.exit_code, event.output)
        elif isinstance(event, TurnEnd):
            if event.turn in self._operators:  # no result: Cairn stopped while it ran
                self._operators.pop(event.turn).set_unknown()
            await self._finish_answer(None)
            if event.reason != "completed":
                await self._put(turn_notice(event))
        elif isinstance(event, ContextCompaction):
            await self._put(compaction_block(event))
        elif isinstance(event, ContextInstructions):  # (the environment lines are not shown: `cairn show` has them)
            await self._put(Notice(safe_text(instructions_line(event)), markup=False))
        elif isinstance(event, ConversationRewind):  # the log keeps the turns above; the model no longer sees them
            await self._put(Notice(f"⟲ rewound: the conversation continues from before turn {event.to_turn} — the "
                                   f"model no longer sees turn {event.to_turn} or later (they stay in the log above)",
                                   markup=False, classes="-warning"))
        if live and scroll:
            self._content_arrived()

    def _recorded_safety(self, name: str) -> str:
        """The safety class a `tool/call` of `name` recorded in this session ("?" if none did): the calls applied so
        far, else the history (built from its tail, so an earlier call may not be applied yet). Asked only for a
        call without a `tool/call` of its own whose tool is not a built-in one."""
        found = self._safety_seen.get(name)
        if found is None:
            found = next((e.safety for e in reversed(self._history) if isinstance(e, ToolCall) and e.name == name), "?")
            self._safety_seen[name] = found
        return found

    async def _finish_answer(self, message: AssistantMessage | None) -> None:
        await self._finish_reasoning(message)
        if message is not None:
            if self._assistant is None:
                text = safe_text(message.text) + (" *(interrupted)*" if message.interrupted else "")
                if text.strip():
                    await self._put(AssistantText(text))
            else:
                await self._assistant.finish(" *(interrupted)*" if message.interrupted else "")
            for call in message.tool_calls:
                card = ToolCard(call.call_id, call.name, call.arguments, self.safety_of(call.name))
                card.status = "queued"
                self.cards[call.call_id] = card
                await self._put(card)
        elif self._assistant is not None:
            await self._assistant.finish()
        elif self._streamed:
            # chunks that never got their assistant/message (a crash mid-stream)
            await self._put(AssistantText(self._streamed + " *(cut off by a crash)*"))
        self._assistant = None
        self._streamed = ""
        self._answer_start = None

    async def _finish_reasoning(self, message: AssistantMessage | None) -> None:
        """Close the step's reasoning: the block streamed live gets its final text; history (or an answer whose
        reasoning never streamed) gets a collapsed block above the answer; reasoning chunks whose message never came
        (a crash mid-stream) are shown as cut off."""
        stored = message.reasoning if message is not None else None
        if self._reasoning is not None:
            cut_off = message is None and self._reasoning.streaming
            await self._reasoning.finish(stored, note="cut off" if cut_off else "")
        elif stored:
            await self._put(ReasoningBlock(stored), before=self._answer_start)
        elif message is None and self._reasoned:
            await self._put(ReasoningBlock(self._reasoned, note="cut off by a crash"), before=self._answer_start)
        self._reasoning = None
        self._reasoned = ""


def turn_notice(event: TurnEnd) -> Notice:
    """The line a turn that did not complete leaves in the chat. A MAX_TOKENS error also shows its code; its message
    (from the loop) names the limit and how to raise it."""
    detail = f": {event.error.message}" if event.error else ""
    if event.error is not None and event.error.code == MAX_TOKENS:
        detail = f" ({MAX_TOKENS}){detail}"
    notice = Notice(safe_text(f"turn {event.turn} {event.reason}{detail}"), markup=False)
    notice.add_class("-error" if event.reason == "error" else "-warning")
    return notice


def instructions_line(event: ContextInstructions) -> str:
    """`instructions: AGENTS.md, sub/AGENTS.md (cut)` — what the system prompt tells from this turn on."""
    names = [f.path + (" (not read)" if f.error else " (cut)" if f.truncated else "") for f in event.files]
    return "≡ instructions: " + (", ".join(names) or "none") + (f" — {len(event.notices)} notice(s), see /instructions"
                                                             if event.notices else "")


def compaction_block(event: ContextCompaction) -> Widget:
    """Where the conversation was compacted: one folded line (a Tab stop: Enter or Space opens it); expanded, the
    summary the model now reads instead of the turns above, and the recovery facts carried verbatim."""
    from textual.binding import Binding
    from textual.widgets import Collapsible

    class CompactionBlock(Collapsible):
        BINDINGS = [Binding("space", "toggle_fold", show=False)]

        def action_toggle_fold(self) -> None:
            self.collapsed = not self.collapsed

    carried = f", {len(event.carried)} recovery fact(s) kept verbatim" if event.carried else ""
    title = f"context compacted: the model now reads a summary of the turns above{carried}"
    body = Static(safe_text(event.summary), markup=False, classes="compaction-summary")
    return CompactionBlock(body, title=safe_text(title), collapsed=True, classes="compaction")
