"""A yes/no question that defaults to no: leaving a running turn (another session, a new one) cancels it and stops
its command, which must never happen by a stray Enter."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.markup import escape
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from cairn.widgets.quiet_footer import QuietFooter


class ConfirmDialog(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmDialog { align: center middle; }
    ConfirmDialog > Vertical { width: 70; max-width: 96%; height: auto; border: thick $warning; background: $surface;
                               padding: 1 2; }
    ConfirmDialog Horizontal { height: auto; align: center middle; margin-top: 1; }
    ConfirmDialog Button { margin: 0 1; }
    """

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, yes: str = "Leave and cancel the turn", no: str = "Stay") -> None:
        super().__init__()
        self.question = question
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, markup=False)
            with Horizontal():
                yield Button(f"{escape(self.no)} \\[n]", id="no", variant="primary")
                yield Button(f"{escape(self.yes)} \\[y]", id="yes", variant="error")
        yield QuietFooter()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
