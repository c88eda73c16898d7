"""A tool-call card: name, arguments summary, safety class and a live status, with the output expandable.

Name, arguments and output come from the model and the tools: they are made terminal-safe (`safe_text`) and given to
widgets as `Text` or with markup off, never parsed as markup.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Collapsible, Static

from cairn.app.render import summarize_arguments
from cairn.app.terminal_text import safe_text

STATUS_LABELS = {
    "queued": "… queued",
    "awaiting approval": "⏸ awaiting approval",
    "running": "⟳ running",
    "done": "✔ done",
    "error": "✘ error",
    "denied": "✘ denied",
    "aborted": "⊘ aborted",
    "not started": "⊘ NOT_STARTED",
    "outcome unknown": "⚠ OUTCOME_UNKNOWN",
    "truncated": "✂ TRUNCATED, not run",
}

ERROR_STATUS = {
    "TOOL_NOT_STARTED": "not started",
    "TOOL_OUTCOME_UNKNOWN": "outcome unknown",
    "ABORTED_BEFORE_DISPATCH": "aborted",
    "DENIED": "denied",
    "TRUNCATED": "truncated",
}


def status_for(error_code: str | None) -> str:
    if error_code is None:
        return "done"
    return ERROR_STATUS.get(error_code, "error")


class ToolCard(Vertical):
    DEFAULT_CSS = """
    ToolCard { height: auto; border: round $primary 40%; padding: 0 1; margin: 0 0 1 2; }
    ToolCard .title { height: 1; }
    ToolCard.-done { border: round $success 50%; }
    ToolCard.-error, ToolCard.-denied, ToolCard.-aborted { border: round $error 60%; }
    ToolCard.-not-started, ToolCard.-outcome-unknown, ToolCard.-truncated { border: round $warning; }
    ToolCard Collapsible { padding: 0; border: none; }
    """

    status: reactive[str] = reactive("running")

    def __init__(self, call_id: str, name: str, arguments: object, safety: str) -> None:
        super().__init__(id=None)
        self.call_id = call_id
        self.tool_name = name
        self.arguments = arguments
        self.safety = safety
        self._title = Static(classes="title")
        self._output = Static("", markup=False)
        self._collapsible = Collapsible(self._output, title="output", collapsed=True)

    def compose(self) -> ComposeResult:
        yield self._title
        yield self._collapsible

    def on_mount(self) -> None:
        self._collapsible.display = False
        self._refresh_title()

    def watch_status(self, old: str, new: str) -> None:
        self.remove_class(f"-{old.replace(' ', '-')}")
        self.add_class(f"-{new.replace(' ', '-')}")
        if self.is_mounted:
            self._refresh_title()

    def _refresh_title(self) -> None:
        from rich.text import Text

        title = Text()
        title.append(safe_text(self.tool_name), style="bold")
        title.append(f"({safe_text(summarize_arguments(self.arguments, 60))})")
        title.append(f"  [{safe_text(self.safety)}]  ", style="dim")
        title.append(STATUS_LABELS.get(self.status, self.status))
        self._title.update(title)

    def set_safety(self, safety: str) -> None:
        self.safety = safety
        self._refresh_title()

    def set_result(self, content: str, error_code: str | None) -> None:
        self.status = status_for(error_code)
        self._output.update(safe_text(content))
        self._collapsible.display = bool(content)
        lines = content.count("\n") + 1
        self._collapsible.title = f"output ({lines} line{'s' if lines != 1 else ''})"
