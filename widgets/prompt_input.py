"""The prompt box: multi-line, Enter sends, Ctrl+J (or Alt+Enter) inserts a newline, ↑/↓ walk the queue and history.

↑ on the first line walks back through the prompts still queued (newest first), then through the history; ↓ on the last
line walks forward and finally back to the draft that was there before. A queued prompt is edited where it stands:
Enter puts the text back in its place in the queue, Ctrl+R (or Enter on an emptied box) removes it, Esc leaves it as it
was; while one is open the screen holds the queue, so the version being edited is never sent behind your back.
`take_typed` replays the keys a dialog Cairn raised while the operator was typing did not take (SPEC §11,
`app/screens/typeahead.py`), so type-ahead lands here, in order, as if the dialog had not been there.
Tab completes what the screen's popup offers: a `/command` (the whole text, `completion`) or the `@word` under the
cursor (`mention`, set by `app/screens/mention_completion.py`), replaced in place. Tab is not typing: while a dialog
Cairn raised waits for it, Tab goes to the dialog and never reaches the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


@dataclass(frozen=True)
class MentionEdit:
    """What Tab does to an `@word`: the text from `start` to `end` (row, column) becomes `text`."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str


class PromptInput(TextArea):
    DEFAULT_CSS = "PromptInput { height: auto; max-height: 8; min-height: 3; border: tall $primary 50%; }"

    class SendQueued(Message):
        """Enter on an empty prompt while prompts are queued (after Esc paused them): send the queue on."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class QueueChanged(Message):
        """A queued prompt was opened for editing, put back, edited or removed: the screen redraws the queue line and
        sends the head once nothing is open and the loop is free."""

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
        # the screen's queue of prompts waiting for the loop (the same list, edited in place)
        self.queue: list[str] = []
        self._browsing: int | None = None  # index into history while ↑/↓ browse it
        self.queue_at: int | None = None  # index into the queue of the prompt open for editing
        self._draft = ""
        self.completion = ""  # what Tab completes a `/word` to (set by the screen's completion popup)
        self.mention: MentionEdit | None = None  # what Tab does to the `@word` at the cursor (set by the popup too)
        # the own time of the last Enter that sent a prompt: the keys up to it were that prompt, not typing (SPEC §11)
        self.sent_at: float | None = None

    def set_text(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    def _submit(self, at: float | None = None) -> None:
        """Enter: send the prompt (`at`: the Enter's own time), put a queued one back, or send the queue on."""
        text = self.text.strip()
        if self.queue_at is not None:
            self._put_back(text or None)
            return
        if text:
            self._browsing = None
            if at is not None:
                self.sent_at = at
            self.post_message(self.Submitted(text))
            self.clear()
        elif self.queue:
            self.post_message(self.SendQueued())  # an empty Enter with prompts waiting: send them

    def _put_back(self, text: str | None) -> None:
        """End the edit of the open queued prompt: `text` replaces it in its place, None removes it; the draft
        that was in the box before ↑ comes back."""
        at = self.queue_at
        if at is not None and at < len(self.queue):
            if text is None:
                del self.queue[at]
            else:
                self.queue[at] = text
        self._leave_queue()

    def _leave_queue(self) -> None:
        self.queue_at = self._browsing = None
        self.set_text(self._draft)
        self.post_message(self.QueueChanged())

    def _recall(self, step: int) -> bool:
        """Move through the queue (newest first), then the history; False when there is nowhere to go (the key then
        does what it normally does). Edits of a queued or earlier prompt are kept only by Enter."""
        queue, history = self.queue, self.prompt_history
        was_queued = self.queue_at is not None
        if self.queue_at is None and self._browsing is None:
            if step > 0 or not (queue or history):
                return False
            self._draft = self.text
            if queue:
                self.queue_at = len(queue) - 1
            else:
                self._browsing = len(history) - 1
        elif self.queue_at is not None:
            at = self.queue_at + step
            if at >= len(queue):
                self.queue_at = None
            elif at >= 0:
                self.queue_at = at
            elif history:
                self.queue_at, self._browsing = None, len(history) - 1
            else:
                return True  # stay on the oldest queued one
        elif self._browsing is not None:  # (the one case left: browsing the history)
            at = self._browsing + step
            if at < 0:
                return True  # stay on the oldest
            if at >= len(history):
                self._browsing = None
                self.queue_at = 0 if queue else None  # back to the oldest queued one, the next above the history
            else:
                self._browsing = at
        if self.queue_at is not None:
            self.set_text(queue[self.queue_at])
        elif self._browsing is not None:
            self.set_text(history[self._browsing])
        else:
            self.set_text(self._draft)
        if was_queued or self.queue_at is not None:
            self.post_message(self.QueueChanged())
        return True

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self._submit(event.time)
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
        if key == "tab" and self.mention is not None:
            event.stop()
            event.prevent_default()
            edit, self.mention = self.mention, None
            self.move_cursor(self.replace(edit.text, edit.start, edit.end).end_location)
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
        if self.queue_at is not None and key in ("escape", "ctrl+r"):
            event.stop()
            event.prevent_default()
            if key == "escape":
                self._leave_queue()  # left as it was
            else:
                self._put_back(None)
            return
        row = self.cursor_location[0]
        if key == "up" and row == 0 and self._recall(-1):
            event.stop()
            event.prevent_default()
            return
        if key == "down" and row == self.document.line_count - 1 and (
                self._browsing is not None or self.queue_at is not None):
            event.stop()
            event.prevent_default()
            self._recall(1)
            return
        await super()._on_key(event)

    def take_typed(self, key: str, character: str | None, at: float | None = None) -> None:
        """Apply one key a dialog passed back: text, Backspace/Delete, Enter (send), Ctrl+J, the cursor keys of a line.
        Other keys (Esc, function keys, ↑↓) are dropped: they were never going to decide the dialog either. `at`: the
        key's own time."""
        if key == "enter":
            self._submit(at)
        elif key in ("ctrl+j", "alt+enter"):
            self.insert("\n")
        elif key == "backspace":
            self.action_delete_left()
        elif key == "delete":
            self.action_delete_right()
        elif key == "left":
            self.action_cursor_left()
        elif key == "right":
            self.action_cursor_right()
        elif key == "home":
            self.action_cursor_line_start()
        elif key == "end":
            self.action_cursor_line_end()
        elif character is not None and character.isprintable():
            self.insert(character)
