"""The sessions screen: every session with first prompt, cwd, updated time, events and status; open (resume) one,
start a new one, or inspect one read-only. A live session (locked by another process) is listed but cannot be opened for
writing."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from ..render import first_line, format_time
from cairn.widgets.terminal_text import safe_text
from .confirm import ConfirmDialog
from cairn.persistence.store import SessionStore, SessionSummary


@dataclass(frozen=True)
class SessionChoice:
    action: str  # "open" or "new"
    session_id: str | None = None


class SessionsScreen(Screen[SessionChoice | None]):
    DEFAULT_CSS = """
    SessionsScreen > Vertical { padding: 1 2; }
    SessionsScreen #title { text-style: bold; margin-bottom: 1; }
    SessionsScreen DataTable { height: 1fr; }
    SessionsScreen #hint { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [
        Binding("enter", "open", "Open / resume"),
        Binding("n", "new", "New session"),
        Binding("i", "inspect", "Inspect read-only"),
        Binding("delete,x", "delete", "Delete"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, store: SessionStore, current: str | None = None, summaries: list[SessionSummary] | None = None):
        super().__init__()
        self.store = store
        self.current = current
        self.summaries = summaries if summaries is not None else store.list_sessions()

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Sessions ({len(self.summaries)})", id="title")
            yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
            yield Static("enter: open or resume · n: new session · i: inspect read-only · x/del: delete · esc: back",
                         id="hint")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("first prompt", "status", "events", "updated", "id", "cwd")  # cwd last: the longest
        width = self._prompt_width()
        for s in self.summaries:
            status = s.status  # the words `cairn sessions` prints (SPEC rev 2)
            if s.id == self.current:
                status = "open here"
            prompt = first_line(s.first_prompt, width) or "—"
            cells = (prompt, status, str(s.events), format_time(s.updated), s.id, s.cwd)
            # Text: a prompt's `[/x]` is not markup; safe_text: nor is its ESC a terminal escape
            table.add_row(*(Text(safe_text(cell)) for cell in cells), key=s.id)
        table.focus()

    def _prompt_width(self) -> int:
        """The first prompt gets what status, events, updated and id leave (at most 36), so the id column stays on
        screen at 80 columns; cwd, the longest, is last and scrolls into view."""
        others = [max([len(h), *(len(c) for c in cells)]) + 2 for h, cells in (
            ("status", ["open here", *(s.status for s in self.summaries)]),
            ("events", [str(s.events) for s in self.summaries]),
            ("updated", [format_time(s.updated) for s in self.summaries]),
            ("id", [s.id for s in self.summaries]))]
        return max(12, min(36, self.app.size.width - 4 - 1 - sum(others) - 2))

    def _selected(self) -> SessionSummary | None:
        table = self.query_one(DataTable)
        if not self.summaries:
            return None
        return self.summaries[table.cursor_row]

    @on(DataTable.RowSelected)
    def action_open(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return
        if chosen.id == self.current:
            self.dismiss(None)
            return
        if chosen.status == "live":
            self.notify(safe_text(f"Session {chosen.id} is live in another process; it can only be inspected (i)."),
                        severity="warning", markup=False)
            return
        if chosen.status == "unreadable":
            self.notify(safe_text(f"Session {chosen.id} cannot be read: {chosen.reason}"), severity="error", markup=False)
            return
        self.dismiss(SessionChoice("open", chosen.id))

    def action_new(self) -> None:
        self.dismiss(SessionChoice("new"))

    def action_inspect(self) -> None:
        chosen = self._selected()
        if chosen is not None and chosen.status == "unreadable":
            self.notify(safe_text(f"Session {chosen.id} cannot be read: {chosen.reason}"), severity="error", markup=False)
        elif chosen is not None:
            from .inspector import open_inspector

            open_inspector(self.app, self.store, chosen.id, follow=chosen.status == "live")

    def action_delete(self) -> None:
        """Delete the selected session after a confirmation; never the one open here or one live elsewhere."""
        chosen = self._selected()
        if chosen is None:
            return
        if chosen.id == self.current or chosen.status == "live":
            where = "here" if chosen.id == self.current else "in another process"
            self.notify(safe_text(f"Session {chosen.id} is open {where}; it cannot be deleted."), severity="warning",
                        markup=False)
            return

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            from cairn.persistence.errors import PersistenceError

            try:
                self.store.delete(chosen.id)
            except PersistenceError as e:
                self.notify(safe_text(str(e)), severity="error", markup=False)
                return
            table = self.query_one(DataTable)
            table.remove_row(chosen.id)
            self.summaries = [s for s in self.summaries if s.id != chosen.id]
            self.query_one("#title", Label).update(f"Sessions ({len(self.summaries)})")
            self.notify(safe_text(f"Deleted session {chosen.id}."), markup=False)

        prompt = first_line(chosen.first_prompt, 60) or "(no prompt)"
        self.app.push_screen(ConfirmDialog(f"Delete session {chosen.id} ({prompt})? Its log is removed for good.",
                                           yes="Delete", no="Keep"), answered)

    def action_back(self) -> None:
        self.dismiss(None)
