"""The verdict dialog: the operator's answer about an OUTCOME_UNKNOWN call (happened / did not happen / unknown), with
an optional note for the model.

A verdict is what the operator chose (SPEC §11 rev 4): nothing is preselected; `h` / `n` / `u` (or ↑↓ on the list)
choose, and choosing with a letter moves the keys to the note, so that what is typed next is the note's. Letters typed
into the note are text and never choose (a note "found nothing" once turned `happened` into `did_not_happen` and was
lost); a letter that is not a choice, typed on the list, starts the note. ↑↓ change the answer from anywhere, Tab /
Shift+Tab move between the list and the note, Enter records the chosen answer with the note as typed, Esc cancels.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from rich.text import Text
from textual import events, getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option

from cairn.widgets.terminal_text import safe_text

from .typeahead import Dialog, Typist

VERDICTS = (("happened", "It happened"), ("did_not_happen", "It did not happen"), ("unknown", "Leave it unknown"))
KEYS = "hnu"
KEYS_TEXT = "h / n / u or ↑↓ choose · Tab list ⇄ note · Enter records · Esc cancels"


class VerdictDialog(Dialog[tuple[str, str] | None]):
    """Returns (verdict, note), or None when dismissed without a choice. With `save`, the verdict is made durable
    before the dialog closes (SPEC §2 rev 3: an operator's decision is never held only in memory). Opened with `v` it
    takes keys at once; given a `typist` (raised by Cairn) it waits for Tab while the operator types."""

    CSS_PATH = "verdict.tcss"

    note = getters.query_one("#note", Input)
    chosen = getters.query_one("#chosen", Label)
    hint = getters.query_one("#hint", Label)

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("h", "pick(0)", "Happened", show=False),
        Binding("n", "pick(1)", "Did not happen", show=False),
        Binding("u", "pick(2)", "Unknown", show=False),
        Binding("up", "move(-1)", "Previous", show=False),
        Binding("down", "move(1)", "Next", show=False),
    ]
    DIALOG_KEYS = frozenset({*KEYS, "escape", "enter", "up", "down"})
    KEYS_TEXT = KEYS_TEXT

    def __init__(self, call_id: str, tool: str,
                 save: Callable[[str, str, str], Awaitable[None]] | None = None, typist: Typist | None = None) -> None:
        super().__init__(typist=typist)
        self.call_id = call_id
        self.tool = tool
        self.save = save
        self._saving = False

    def compose(self) -> ComposeResult:
        with Vertical():
            # escaped: a call id comes from the model, and `[/x]` in it would be taken for markup
            tool, call_id = escape(safe_text(self.tool)), escape(safe_text(self.call_id))
            yield Label(f"Did [b]{tool}[/b] ({call_id}) take effect?")
            yield OptionList(*(Option(Text(f"{key}  {label}"), id=value) for (value, label), key in zip(VERDICTS, KEYS)),
                             id="verdict")
            yield Label(self._chosen_text(), id="chosen")
            # (select_on_focus off: coming back to the note must not make the next key replace it)
            yield Input(placeholder="what you checked", id="note", select_on_focus=False)
            yield Label("", id="hint")
            yield self.guard_line()
            with Horizontal():
                yield Button(r"Record \[enter]", id="record", variant="primary", compact=True)
                yield Button(r"Cancel \[esc]", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.note.border_title = "note for the model (optional)"
        options = self.query_one(OptionList)
        options.highlighted = None
        options.focus()

    # -- the choice -------------------------------------------------------------------------------------------------

    @property
    def choice(self) -> int | None:
        return self.query_one(OptionList).highlighted

    def _chosen_text(self) -> str:
        index = self.choice if self.is_mounted else None
        return f"Your answer: {VERDICTS[index][1]}" if index is not None else "Your answer: — (h / n / u)"

    @on(OptionList.OptionHighlighted)
    def _highlighted(self) -> None:
        self.chosen.update(self._chosen_text())
        self.hint.update("")

    def action_pick(self, index: int) -> None:
        """A choice's letter, on the list: that answer, and the keys move on to the note."""
        note = self.note
        if note.has_focus:
            return  # (the note takes its letters as text; this is a guard, not the path)
        self.query_one(OptionList).highlighted = index
        note.focus()

    def action_move(self, step: int) -> None:
        """↑↓ from the note change the answer (they are not text); on the list the list moves itself."""
        options = self.query_one(OptionList)
        index = options.highlighted
        options.highlighted = (0 if step > 0 else len(VERDICTS) - 1) if index is None else (
            (index + step) % len(VERDICTS))

    def on_key(self, event: events.Key) -> None:
        """A letter that is no choice, typed on the list, is the start of the note: it goes there, with the keys."""
        options = self.query_one(OptionList)
        if options.has_focus and event.is_printable and event.character and event.key not in KEYS:
            event.stop()
            event.prevent_default()
            note = self.note
            note.focus()
            note.insert_text_at_cursor(event.character)

    # -- recording --------------------------------------------------------------------------------------------------

    @on(OptionList.OptionSelected)
    def selected(self) -> None:
        self.record()

    @on(Button.Pressed, "#record")
    @on(Input.Submitted)
    def record(self) -> None:
        index = self.choice
        if index is None:
            self.hint.update("Choose an answer first (h / n / u, or ↑↓), then Enter.")
            self.query_one(OptionList).focus()
            return
        verdict = VERDICTS[index][0]
        value = self.note.value
        note = value if value.strip() else ""  # kept as typed
        if self.save is None:
            self.dismiss((verdict, note))
        elif not self._saving:
            self._saving = True
            self.hint.update("Saving…")
            self.run_worker(self._save(verdict, note), exclusive=True)

    async def _save(self, verdict: str, note: str) -> None:
        from cairn.persistence.errors import CheckpointFailed

        assert self.save is not None
        try:
            await self.save(self.call_id, verdict, note)
        except CheckpointFailed as e:
            below = self.app.screen_stack[-2] if len(self.app.screen_stack) > 1 else self.app.screen
            self.dismiss((verdict, note))
            below.notify(f"Verdict recorded but not durable yet ({e.cause}); Cairn tries to write it again at the "
                         "next checkpoint.", severity="warning")
            return
        self.dismiss((verdict, note))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if not self._saving:
            self.dismiss(None)
