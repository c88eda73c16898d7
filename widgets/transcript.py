"""The chat transcript, derived from session events: user prompts, the model's reasoning, streamed assistant Markdown,
tool-call cards.

History and live updates go through the same `apply()`, so what a resumed session shows is exactly what was seen live.
Streaming writes go to Textual's MarkdownStream, which batches fragments while a render is in flight, so a fast model
does not re-render the document once per token. Reasoning streams into a collapsed `ReasoningBlock` above the step's
answer; in history it comes from `assistant/message.reasoning`.

Every text that reaches a widget here came from outside (model, tools, prompts, the session file) and passes through
`safe_text` first: an ESC or OSC sequence is shown as a visible symbol, never acted on by the terminal. Plain texts are
given to widgets with markup off, so `[b]` in a prompt or a tool's output is shown as written.
"""

from __future__ import annotations

from typing import Callable

from rich.markdown import Markdown as RichMarkdown
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Markdown, Static

from cairn.app.terminal_text import safe_text
from cairn.persistence.events import (
    MAX_TOKENS,
    AnyEvent,
    ApprovalAsked,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)

from .reasoning import ReasoningBlock
from .tool_card import ToolCard


class UserPrompt(Static):
    DEFAULT_CSS = "UserPrompt { margin: 1 0 0 0; padding: 0 1; background: $boost; color: $text; text-style: bold; }"


class Notice(Static):
    DEFAULT_CSS = """
    Notice { margin: 0 0 1 0; padding: 0 1; color: $text-muted; }
    Notice.-error { color: $error; }
    Notice.-warning { color: $warning; }
    """


class AssistantText(Markdown):
    DEFAULT_CSS = "AssistantText { margin: 0 0 0 0; padding: 0 1; background: transparent; }"


class SealedText(Static):
    """Finished paragraphs of a long answer, rendered once by Rich (see Transcript._seal)."""

    DEFAULT_CSS = "SealedText { padding: 0 1; }"

    def __init__(self, markdown: str) -> None:
        super().__init__(RichMarkdown(markdown))


SEAL_AFTER = 4000  # characters of live Markdown before the finished paragraphs are sealed


class Transcript(VerticalScroll):
    DEFAULT_CSS = "Transcript { height: 1fr; padding: 0 1; }"

    def __init__(self, safety_of: Callable[[str], str] = lambda name: "?", **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.safety_of = safety_of  # a tool's safety class before its tool/call says it
        self.cards: dict[str, ToolCard] = {}
        self._assistant: AssistantText | None = None
        self._stream = None  # MarkdownStream of the answer being streamed
        self._streamed = ""
        self._segment = ""  # the part of the answer still in the live Markdown widget
        self._answer_start: Widget | None = None  # the first widget of the step's answer (reasoning goes above it)
        self._reasoning: ReasoningBlock | None = None  # the step's reasoning block, once mounted
        self._reasoned = ""  # reasoning chunks read from history (their assistant/message holds the whole text)

    @property
    def reasoning_blocks(self) -> list[ReasoningBlock]:
        return list(self.query(ReasoningBlock))

    async def apply_many(self, events: list[AnyEvent]) -> None:
        """Apply a batch of live events; consecutive chunks of one kind become one write, and the view scrolls once.
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
        self.scroll_end(animate=False)

    async def _write_run(self, kind: type | None, deltas: list[str]) -> None:
        if kind is ReasoningChunk:
            await self._write_reasoning("".join(deltas))
        else:
            await self._write_delta("".join(deltas))

    async def _write_reasoning(self, text: str) -> None:
        if self._reasoning is None:
            self._reasoning = ReasoningBlock(streaming=True)
            await self._mount_above_answer(self._reasoning)
        await self._reasoning.append(text)

    async def _mount_above_answer(self, widget: Widget) -> None:
        if self._answer_start is not None and self._answer_start.parent is self:
            await self.mount(widget, before=self._answer_start)
        else:
            await self.mount(widget)

    async def _write_delta(self, text: str) -> None:
        text = safe_text(text)
        if self._stream is None:
            if self._reasoning is not None and self._reasoning.streaming:
                await self._reasoning.finish()  # the answer starts: the thinking folds away
            self._assistant = AssistantText()
            await self.mount(self._assistant)
            self._answer_start = self._answer_start or self._assistant
            self._stream = Markdown.get_stream(self._assistant)
            self._segment = ""
        self._streamed += text
        self._segment += text
        await self._stream.write(text)
        if len(self._segment) > SEAL_AFTER:
            await self._seal()

    async def _seal(self) -> None:
        """Move the finished paragraphs of a long streaming answer into one pre-rendered widget.

        Textual lays out every Markdown block on each refresh, so a long answer streamed into one Markdown widget
        makes every frame dearer (P6). Sealed text is laid out as a single widget; only the last paragraphs stay live.
        """
        cut = self._segment.rfind("\n\n")
        head = self._segment[:cut]
        if cut <= 0 or head.count("```") % 2:  # never split inside a code fence
            return
        tail = self._segment[cut + 2 :]
        assert self._stream is not None and self._assistant is not None
        await self._stream.stop()
        sealed = SealedText(head)
        await self.mount(sealed, before=self._assistant)
        if self._answer_start is self._assistant:
            self._answer_start = sealed
        await self._assistant.remove()
        self._assistant = AssistantText()
        await self.mount(self._assistant)
        self._stream = Markdown.get_stream(self._assistant)
        self._segment = tail
        await self._stream.write(tail)

    async def apply(self, event: AnyEvent, live: bool = True, scroll: bool = True) -> None:
        if isinstance(event, UserMessage):
            await self.mount(UserPrompt(f"> {safe_text(event.text)}", markup=False))
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
                await self.mount(card)
            card.set_safety(event.safety)
            card.status = "running"
        elif isinstance(event, ToolResult):
            card = self.cards.get(event.call_id)
            if card is not None:
                card.set_result(event.content, event.error_code)
        elif isinstance(event, RecoveryVerdict):
            note = f" — {event.note}" if event.note else ""
            await self.mount(Notice(safe_text(f"verdict on {event.call_id}: {event.verdict}{note}"), markup=False))
        elif isinstance(event, TurnEnd):
            await self._finish_answer(None)
            if event.reason != "completed":
                await self.mount(turn_notice(event))
        if live and scroll:
            self.scroll_end(animate=False)

    async def _finish_answer(self, message: AssistantMessage | None) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        await self._finish_reasoning(message)
        if message is not None:
            text = safe_text(message.text) + (" *(interrupted)*" if message.interrupted else "")
            if self._assistant is None and text.strip():
                await self.mount(AssistantText(text))
            elif self._assistant is not None and message.interrupted:
                await self._assistant.append(" *(interrupted)*")
            for call in message.tool_calls:
                card = ToolCard(call.call_id, call.name, call.arguments, self.safety_of(call.name))
                card.status = "queued"
                self.cards[call.call_id] = card
                await self.mount(card)
        elif self._streamed and self._assistant is None:
            # chunks that never got their assistant/message (a crash mid-stream)
            await self.mount(AssistantText(self._streamed + " *(cut off by a crash)*"))
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
            await self._mount_above_answer(ReasoningBlock(stored))
        elif message is None and self._reasoned:
            await self._mount_above_answer(ReasoningBlock(self._reasoned, note="cut off by a crash"))
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
