"""The prompt box: multi-line, Enter sends, Ctrl+J (or Alt+Enter) inserts a newline, ↑/↓ walk the history.

↑ on the first line recalls older prompts (a queued prompt first: the screen takes it out of the queue to be edited),
↓ on the last line newer ones and finally the draft that was there before. `take_typed` replays keys that the approval
modal refused to take as a decision, so type-ahead lands here, in order, as if the modal had not been there.
"""

from __future__ import annotations

from typing import Callable

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    DEFAULT_CSS = "PromptInput { height: auto; max-height: 8; min-height: 3; border: tall $primary 50%; }"

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class RecallQueued(Message):
        """↑ in an empty prompt while prompts wait in the queue: the screen hands the last one back for editing."""

    class HelpRequested(Message):
        """`?` typed into an empty prompt."""

    class ScrollRequested(Message):
        """Home/End in an empty prompt: the transcript's top or bottom (there is no cursor to move)."""

        def __init__(self, how: str) -> None:
            super().__init__()
            self.how = how

    def __init__(self, **kwargs: object) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)  # type: ignore[arg-type]
        self.prompt_history: list[str] = []
        self.has_queued: Callable[[], bool] = lambda: False
        self._browsing: int | None = None  # index into history while ↑/↓ browse it
        self._draft = ""
        self.completion = ""  # what Tab completes a `/word` to (set by the screen's completion popup)

    def set_text(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    def _submit(self) -> None:
        text = self.text.strip()
        if text:
            self._browsing = None
            self.post_message(self.Submitted(text))
            self.clear()

    def _recall(self, step: int) -> bool:
        """Move through the history; False when there is nowhere to go (the key then does what it normally does)."""
        if not self.prompt_history:
            return False
        if self._browsing is None:
            if step > 0:
                return False
            self._draft = self.text
            self._browsing = len(self.prompt_history) - 1
        else:
            at = self._browsing + step
            if at < 0:
                return True  # stay on the oldest
            if at >= len(self.prompt_history):
                self._browsing = None
                self.set_text(self._draft)
                return True
            self._browsing = at
        self.set_text(self.prompt_history[self._browsing])
        return True

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self._submit()
            return
        if key in ("ctrl+j", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if key == "question_mark" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.HelpRequested())
            return
        if key == "tab" and self.completion and self.completion != self.text:
            event.stop()
            event.prevent_default()
            self.set_text(self.completion + " ")
            return
        if key in ("home", "end") and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.ScrollRequested(key))
            return
        row = self.cursor_location[0]
        if key == "up" and row == 0:
            if not self.text and self._browsing is None and self.has_queued():
                event.stop()
                event.prevent_default()
                self.post_message(self.RecallQueued())
                return
            if self._recall(-1):
                event.stop()
                event.prevent_default()
                return
        if key == "down" and row == self.document.line_count - 1 and self._browsing is not None:
            event.stop()
            event.prevent_default()
            self._recall(1)
            return
        await super()._on_key(event)

    def take_typed(self, key: str, character: str | None) -> None:
        """Apply one key the approval modal passed back: text, Backspace, Enter (send), Ctrl+J, cursor left/right.
        Other keys (Esc, function keys) are dropped: they were never going to decide the modal either."""
        if key == "enter":
            self._submit()
        elif key in ("ctrl+j", "alt+enter"):
            self.insert("\n")
        elif key == "backspace":
            self.action_delete_left()
        elif key == "left":
            self.action_cursor_left()
        elif key == "right":
            self.action_cursor_right()
        elif character is not None and character.isprintable():
            self.insert(character)
