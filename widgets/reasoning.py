"""The model's reasoning for one step: a dimmed block above that step's answer, collapsed to one line by default.

While it streams, the title counts characters ("thinking… 1,234 chars"); the text itself reaches widgets only while the
block is expanded, so a long reasoning stream that nobody looks at costs one title update per frame. Expanded, the text
is kept as sealed pieces plus one live tail (as the transcript does for answers): only the tail is re-laid out per frame.
Text is made terminal-safe on the way in (`safe_text`) and shown as plain text, never as markup or Markdown.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Collapsible, Static

from cairn.widgets.terminal_text import safe_text

SEAL_AFTER = 4000  # characters of the live tail before its finished lines are sealed into their own widget


def format_count(n: int) -> str:
    return f"{n:,} char{'s' if n != 1 else ''}"


class ReasoningPiece(Static):
    """A piece of reasoning text: plain (markup=False), so `[b]` in a model's thought is shown as written."""

    DEFAULT_CSS = "ReasoningPiece { color: $text-muted; text-style: italic; }"

    def __init__(self, text: str = "") -> None:
        super().__init__(text, markup=False)


class ReasoningBlock(Collapsible):
    """Its title is a Tab stop: Enter or Space opens and folds it (Ctrl+T does it for the latest block)."""

    BINDINGS = [Binding("space", "toggle_fold", show=False)]

    DEFAULT_CSS = """
    ReasoningBlock { background: transparent; border-top: none; padding: 0; margin: 0 0 0 1; color: $text-muted; }
    ReasoningBlock > CollapsibleTitle { color: $text-muted; text-style: italic; padding: 0; width: 1fr; }
    ReasoningBlock > Contents { padding: 0 0 0 2; }
    """
    # The title takes the whole line (1fr), not the width of its text. With `auto`, on a busy event loop, the title
    # measured as "thinking… 0 chars" sometimes kept that width for good (19 cells while its text grew to 22): the
    # layout its later titles asked for never came, and the final title stayed cut short on screen.

    def __init__(self, text: str = "", *, streaming: bool = False, note: str = "") -> None:
        self._tail = ReasoningPiece()
        self.text = safe_text(text)
        self.streaming = streaming
        self.note = note  # e.g. "cut off by a crash"
        self._shown = 0  # characters of `text` already in the widgets
        self._tail_text = ""
        super().__init__(self._tail, title=self._title_text(), collapsed=True)

    def _title_text(self) -> str:
        count = format_count(len(self.text))
        if self.streaming:
            return f"thinking… {count}"
        return f"reasoning · {count}" + (f" · {self.note}" if self.note else "")

    async def append(self, delta: str) -> None:
        self.text += safe_text(delta)
        self.title = self._title_text()
        if not self.collapsed:
            await self._sync()

    async def finish(self, text: str | None = None, note: str = "") -> None:
        """The step's reasoning is complete (its answer started, or its message arrived): final title. `text`
        is the stored reasoning when known; it replaces what was streamed if they differ."""
        if text is not None and safe_text(text) != self.text:
            self.text = safe_text(text)
            await self._reset_body()
        self.streaming = False
        self.note = note or self.note
        self.title = self._title_text()  # folded unless the operator opened it (Ctrl+T): then it stays open

    def action_toggle_fold(self) -> None:
        self.collapsed = not self.collapsed

    async def watch_collapsed(self, collapsed: bool) -> None:
        if not collapsed:
            await self._sync()

    async def _sync(self) -> None:
        """Bring the expanded body up to date: new text goes into the tail; a long tail seals its finished lines."""
        if not self.is_attached or self._shown == len(self.text):
            return
        self._tail_text += self.text[self._shown :]
        self._shown = len(self.text)
        if len(self._tail_text) > SEAL_AFTER:
            cut = self._tail_text.rfind("\n")
            if cut > 0:
                await self.query_one(Collapsible.Contents).mount(ReasoningPiece(self._tail_text[:cut]),
                                                                 before=self._tail)
                self._tail_text = self._tail_text[cut + 1 :]
        self._tail.update(self._tail_text)

    async def _reset_body(self) -> None:
        if self.is_attached:
            for piece in list(self.query(ReasoningPiece)):
                if piece is not self._tail:
                    await piece.remove()
        self._shown, self._tail_text = 0, ""
        self._tail.update("")
        if not self.collapsed:
            await self._sync()
