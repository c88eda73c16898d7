"""Approval modal for side-effecting and idempotent tools: allow once / allow for this session / deny."""

from __future__ import annotations

import json

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from ..approval import ApprovalRequest
from ..terminal_text import safe_text


class ApprovalModal(ModalScreen[str]):
    """Returns a decision: allowed_once, allowed_session or denied."""

    DEFAULT_CSS = """
    ApprovalModal { align: center middle; }
    ApprovalModal > Vertical { width: 80; height: auto; max-height: 80%; border: thick $warning; background: $surface;
                               padding: 1 2; }
    ApprovalModal #arguments { height: auto; max-height: 12; margin: 1 0; color: $text-muted; }
    ApprovalModal Horizontal { height: auto; align: center middle; }
    ApprovalModal Button { margin: 0 1; }
    """

    BINDINGS = [
        Binding("a", "decide('allowed_once')", "Allow once"),
        Binding("s", "decide('allowed_session')", "Allow for session"),
        Binding("d,escape", "decide('denied')", "Deny"),
    ]

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__()
        self.request = request

    def compose(self) -> ComposeResult:
        r = self.request
        with Vertical():
            # the name and arguments come from the model: made terminal-safe, and the name escaped inside the markup
            yield Label(f"Allow [b]{escape(safe_text(r.name))}[/b]? ({r.safety.replace('_', '-')})")
            yield Static(safe_text(json.dumps(r.arguments, indent=2, ensure_ascii=False)), id="arguments",
                         markup=False)
            with Horizontal():
                yield Button(r"Allow once \[a]", id="allowed_once", variant="primary")
                yield Button(r"Allow for session \[s]", id="allowed_session")
                yield Button(r"Deny \[d]", id="denied", variant="error")

    def on_mount(self) -> None:
        self.query_one("#allowed_once", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "denied")

    def action_decide(self, decision: str) -> None:
        self.dismiss(decision)
