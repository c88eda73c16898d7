"""The sessions screen: every session with first prompt, cwd, updated time, events and status; open (resume) one,
start a new one, or inspect one read-only. A live session (locked by another process) is listed but cannot be opened for
writing."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label, Static

from ..render import first_line, format_time, human_size
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text
from .confirm import ConfirmDialog
from cairn.persistence.store import SessionStore, SessionSummary


@dataclass(frozen=True)
class SessionChoice:
    action: str  # "open" or "new"
    session_id: str | None = None


class SessionsScreen(Screen[SessionChoice | None]):
    CSS_PATH = "sessions.tcss"

    heading = getters.query_one("#title", Label)

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
        yield QuietFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        widths = self.column_widths()
        for name, width in widths.items():
            table.add_column(name, width=width)
        for s in self.summaries:
            status = s.status  # the words `cairn sessions` prints (SPEC rev 2)
            if s.id == self.current:
                status = "open here"
            cells = {"id": s.id, "first prompt": first_line(s.first_prompt, widths["first prompt"]) or "—",
                     "status": status, "size": human_size(s.size) if s.size is not None else "?",
                     "updated": self._updated(s.updated), "events": str(s.events), "cwd": s.cwd}
            # Text: a prompt's `[/x]` is not markup; safe_text: nor is its ESC a terminal escape
            table.add_row(*(Text(safe_text(cells[name]), no_wrap=True, overflow="ellipsis") for name in widths),
                          key=s.id)
        table.focus()

    # What `cairn resume ID` needs comes first, then the prompt that says which session it is; events and cwd (the
    # longest) are last and scroll into view on a narrow terminal.
    COLUMNS = ("id", "first prompt", "status", "size", "updated", "events", "cwd")

    def _updated(self, ms: int) -> str:
        return format_time(ms) if self.app.size.width >= 100 else format_time(ms)[5:]  # no year at 80 columns

    def column_widths(self) -> dict[str, int]:
        """Whole ids always; the first prompt gets what id, status, size and updated leave (at least 16), and the
        whole width left over when events and cwd fit too, so long prompts use a wide terminal."""
        inner = self.app.size.width - 4 - 2  # the screen's padding and the table's scrollbar
        widest = {h: max([len(h), *(len(c) for c in cells)]) for h, cells in (
            ("id", [s.id for s in self.summaries]),
            ("status", ["open here" if s.id == self.current else s.status for s in self.summaries]),
            ("size", [human_size(s.size) if s.size is not None else "?" for s in self.summaries]),
            ("updated", [self._updated(s.updated) for s in self.summaries]),
            ("events", [str(s.events) for s in self.summaries]),
            ("cwd", [s.cwd for s in self.summaries]))}
        longest = max([len("first prompt"), *(len(first_line(s.first_prompt, 1_000)) for s in self.summaries)])
        first = ("id", "status", "size", "updated")
        left = inner - sum(widest[h] + 2 for h in first) - 2
        rest = sum(widest[h] + 2 for h in ("events", "cwd"))
        prompt = min(longest, left - rest) if left - rest >= 40 else min(longest, left)
        widths = {h: widest[h] for h in first}
        widths["first prompt"] = max(16, prompt)
        widths.update((h, widest[h]) for h in ("events", "cwd"))
        return {h: widths[h] for h in self.COLUMNS}

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
            self.heading.update(f"Sessions ({len(self.summaries)})")
            self.notify(safe_text(f"Deleted session {chosen.id}."), markup=False)

        prompt = first_line(chosen.first_prompt, 60) or "(no prompt)"
        self.app.push_screen(ConfirmDialog(f"Delete session {chosen.id} ({prompt})? Its log is removed for good.",
                                           yes="Delete", no="Keep"), answered)

    def action_back(self) -> None:
        self.dismiss(None)
