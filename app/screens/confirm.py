"""A yes/no question that defaults to no: leaving a running turn (another session, a new one) cancels it and stops
its command, overwriting a file someone else changed loses their change — neither may happen by a stray Enter.

Keys: `y` yes, `n` or Esc no, Enter presses the focused button (No at first). Raised by Cairn itself (a rewind that
found a path changed meanwhile) it is given the chat's `typist`: keys typed while the operator was typing when it
opened go to the prompt until Tab (`typeahead.Dialog`)."""

from __future__ import annotations

from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.markup import escape
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from cairn.widgets.quiet_footer import QuietFooter

from .typeahead import Dialog, Typist


class ConfirmDialog(Dialog[bool]):
    CSS_PATH = "confirm.tcss"

    no_button = getters.query_one("#no", Button)

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    DIALOG_KEYS = frozenset({"y", "n", "escape", "enter", "left", "right"})
    KEYS_TEXT = "y yes · n or Esc no · Enter the highlighted button"

    def __init__(self, question: str, yes: str = "Leave and cancel the turn", no: str = "Stay",
                 typist: Typist | None = None, by_key: bool = False) -> None:
        super().__init__(typist=typist, by_key=by_key)
        self.question = question
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, markup=False)
            with Horizontal():
                yield Button(f"{escape(self.no)} \\[n]", id="no", variant="primary")
                yield Button(f"{escape(self.yes)} \\[y]", id="yes", variant="error")
            yield self.guard_line()
        yield QuietFooter()

    def on_mount(self) -> None:
        self.no_button.focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
