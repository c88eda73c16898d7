"""The resume screen: shown before the next turn when a reopened session had interrupted tool calls.

It lists every recovered call (tool, arguments, safety, NOT_STARTED / OUTCOME_UNKNOWN, what the model will be told), lets
the operator record a verdict on OUTCOME_UNKNOWN calls, and shows the interrupted prompt and last text for context.
Dismissing it returns the verdicts chosen; the app appends them as `recovery/verdict` before any new `turn/start`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Label, Static

from ..render import summarize_arguments
from ..terminal_text import safe_text
from cairn.persistence.events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnStart,
    UserMessage,
)
from ..tools.registry import builtin_safety
from cairn.persistence.repair import recovered_calls

from .verdict import VerdictDialog



@dataclass
class RecoveredCall:
    call_id: str
    tool: str
    arguments: object
    safety: str
    status: str  # NOT_STARTED | OUTCOME_UNKNOWN
    told: str  # what the model will be told
    verdict: str = ""
    note: str = ""


def recovered_from(events: list[AnyEvent]) -> tuple[list[RecoveredCall], str, str]:
    """The recovered calls of the last interrupted turn, its prompt and its last assistant text."""
    results = recovered_calls(events)
    start = max((i for i, e in enumerate(events) if isinstance(e, TurnStart)), default=0)
    turn = events[start:]
    requests: dict[str, ToolCallRequest] = {}
    calls: dict[str, ToolCall] = {}
    prompt, text, chunks = "", "", ""
    for e in turn:
        if isinstance(e, UserMessage):
            prompt = e.text
        elif isinstance(e, AssistantMessage):
            text, chunks = e.text or text, ""
            requests.update((c.call_id, c) for c in e.tool_calls)
        elif isinstance(e, AssistantChunk):
            chunks += e.delta
        elif isinstance(e, ToolCall):
            calls[e.call_id] = e
    rows = []
    for r in results:
        request, call = requests.get(r.call_id), calls.get(r.call_id)
        rows.append(RecoveredCall(
            call_id=r.call_id,
            tool=call.name if call else (request.name if request else "?"),
            arguments=call.arguments if call else (request.arguments if request else {}),
            safety=call.safety if call else (builtin_safety(request.name if request else "") or "—"),
            status="OUTCOME_UNKNOWN" if r.error_code == TOOL_OUTCOME_UNKNOWN else "NOT_STARTED",
            told=r.content.split(": ", 1)[-1],
        ))
    return rows, prompt, chunks or text


class ResumeScreen(ModalScreen[list[RecoveredCall]]):
    DEFAULT_CSS = """
    ResumeScreen { align: center middle; }
    ResumeScreen > Vertical { width: 95%; height: 90%; border: thick $warning; background: $surface; padding: 1 2; }
    ResumeScreen #title { text-style: bold; color: $warning; }
    ResumeScreen #context { height: auto; max-height: 6; margin: 1 0; color: $text-muted; }
    ResumeScreen DataTable { height: 1fr; }
    ResumeScreen #told { height: auto; max-height: 5; margin-top: 1; }
    ResumeScreen #continue { margin-top: 1; }
    """

    BINDINGS = [
        Binding("v", "verdict", "Record verdict"),
        Binding("c", "continue", "Continue"),
    ]

    def __init__(self, session_id: str, calls: list[RecoveredCall], prompt: str, last_text: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.calls = calls
        self.prompt = prompt
        self.last_text = last_text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Session {escape(safe_text(self.session_id))} was interrupted — {len(self.calls)} tool call(s) "
                        "recovered", id="title")
            context = f"Interrupted prompt: {self.prompt or '—'}\nLast text: {(self.last_text or '—')[:300]}"
            yield Static(safe_text(context), id="context", markup=False)
            yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
            yield Static("", id="told", markup=False)
            yield Button(r"Continue to the chat \[c]", id="continue", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        keys = table.add_columns("tool", "arguments", "safety", "status", "verdict", "call id")
        self._verdict_column = keys[4]
        for call in self.calls:
            table.add_row(*self._cells(call), key=call.call_id)
        table.focus()
        self._show_told(0)

    @staticmethod
    def _cells(call: RecoveredCall) -> tuple[Text, ...]:
        """As terminal-safe `Text`, never markup: a plain string cell would be parsed as markup, and arguments from the
        model (`ls [/tmp]`) would be mangled or crash the screen; an ESC in them would reach the terminal."""
        verdict = call.verdict or ("— (press v)" if call.status == "OUTCOME_UNKNOWN" else "")
        cells = (call.tool, summarize_arguments(call.arguments, 28), call.safety, call.status, verdict, call.call_id)
        return tuple(Text(safe_text(cell)) for cell in cells)

    def _show_told(self, row: int) -> None:
        if 0 <= row < len(self.calls):
            self.query_one("#told", Static).update(safe_text(f"The model will be told: {self.calls[row].told}"))

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_told(event.cursor_row)

    def action_verdict(self) -> None:
        table = self.query_one(DataTable)
        if not self.calls:
            return
        call = self.calls[table.cursor_row]
        if call.status != "OUTCOME_UNKNOWN":
            self.notify("Only OUTCOME_UNKNOWN calls take a verdict: a NOT_STARTED call never ran.")
            return

        def record(result: tuple[str, str] | None) -> None:
            if result is None:
                return
            call.verdict, call.note = result
            table.update_cell(call.call_id, self._verdict_column, Text(safe_text(call.verdict)))

        self.app.push_screen(VerdictDialog(call.call_id, call.tool), record)

    @on(Button.Pressed, "#continue")
    def action_continue(self) -> None:
        self.dismiss(self.calls)
