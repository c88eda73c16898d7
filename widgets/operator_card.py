"""The card of the operator's own `!command` in the chat: the command line, its status, and its output shown open.

Not a `ToolCard`: no model call, no safety class, no approval — and its output is what the operator asked to see, so
it is shown at once rather than folded. A command whose turn a crash closed (no `operator/result`) says its outcome is
unknown, as `cairn show` does. Command and output are outside text: terminal-safe, never parsed as markup.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from .terminal_text import safe_text

STATUS = {
    "running": ("⟳ running", "bold"),
    "done": ("✔ exit 0", "$success"),
    "failed": ("✘ exit {code}", "bold $error"),
    "stopped": ("⊘ stopped", "bold $warning"),
    "unknown": ("⚠ outcome unknown (Cairn stopped while it ran)", "bold $error"),
}


class OperatorCard(Vertical):
    DEFAULT_CSS = """
    OperatorCard { height: auto; border: round $primary 40%; padding: 0 1; margin: 1 0 1 0; }
    OperatorCard.-done { border: round $success 50%; }
    OperatorCard.-failed, OperatorCard.-unknown { border: round $error 60%; }
    OperatorCard .title { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    OperatorCard .output { color: $text-muted; }
    """

    def __init__(self, turn: int, command: str) -> None:
        super().__init__(classes="-running")
        self.turn = turn
        self.command = command
        self.status = "running"
        self.exit_code: int | None = None
        self.output = ""
        self._title = Static(classes="title")
        self._output = Static("", markup=False, classes="output")

    def compose(self) -> ComposeResult:
        yield self._title
        yield self._output

    def on_mount(self) -> None:
        self._show()

    def set_result(self, exit_code: int | None, output: str) -> None:
        self.exit_code = exit_code
        self.output = output
        self._set_status("stopped" if exit_code is None else "done" if exit_code == 0 else "failed")

    def set_unknown(self) -> None:
        self._set_status("unknown")

    def _set_status(self, status: str) -> None:
        self.remove_class(f"-{self.status}")
        self.status = status
        self.add_class(f"-{status}")
        if self.is_mounted:
            self._show()

    def _show(self) -> None:
        label, style = STATUS[self.status]
        self._title.update(Content.assemble((label.format(code=self.exit_code), style), "  ",
                                            ("!", "bold $accent"), (safe_text(self.command), "bold")))
        self._output.update(safe_text(self.output.rstrip("\n")))
        self._output.display = bool(self.output.strip())
