"""The verdict dialog: the operator's answer about an OUTCOME_UNKNOWN call (happened / did not happen / unknown)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet

from ..terminal_text import safe_text

VERDICTS = (("happened", "It happened"), ("did_not_happen", "It did not happen"), ("unknown", "Leave it unknown"))


class VerdictDialog(ModalScreen[tuple[str, str] | None]):
    """Returns (verdict, note), or None when dismissed without a choice."""

    DEFAULT_CSS = """
    VerdictDialog { align: center middle; }
    VerdictDialog > Vertical { width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    VerdictDialog RadioSet { width: 100%; margin: 1 0; }
    VerdictDialog Horizontal { height: auto; align: center middle; margin-top: 1; }
    VerdictDialog Button { margin: 0 1; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, call_id: str, tool: str) -> None:
        super().__init__()
        self.call_id = call_id
        self.tool = tool

    def compose(self) -> ComposeResult:
        with Vertical():
            # escaped: a call id comes from the model, and `[/x]` in it would be taken for markup
            tool, call_id = escape(safe_text(self.tool)), escape(safe_text(self.call_id))
            yield Label(f"Did [b]{tool}[/b] ({call_id}) take effect?")
            with RadioSet(id="verdict"):
                for i, (value, label) in enumerate(VERDICTS):
                    yield RadioButton(label, value=(i == 0), id=value)
            yield Input(placeholder="optional note for the model (what you checked)", id="note")
            with Horizontal():
                yield Button(r"Record \[enter]", id="record", variant="primary")
                yield Button(r"Cancel \[esc]", id="cancel")

    def on_mount(self) -> None:
        self.query_one(RadioSet).focus()

    @on(Button.Pressed, "#record")
    @on(Input.Submitted)
    def record(self) -> None:
        pressed = self.query_one(RadioSet).pressed_button
        verdict = pressed.id if pressed is not None and pressed.id else "unknown"
        self.dismiss((verdict, self.query_one("#note", Input).value.strip()))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
