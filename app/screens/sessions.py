"""The sessions screen: every session with first prompt, cwd, updated time, events and status; open (resume) one,
start a new one, or inspect one read-only. A live session (locked by another process) is listed but cannot be opened for
writing; on PostgreSQL its host column says which machine and process write it (SPEC §13), and `h` narrows the list to
one host's sessions at a time, to see a fleet machine by machine."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label, Static

from ..commands.sessions import writer_label
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
        Binding("h", "next_host", "Host"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, store: SessionStore, current: str | None = None, summaries: list[SessionSummary] | None = None):
        super().__init__()
        self.store = store
        self.current = current
        self.summaries = summaries if summaries is not None else store.list_sessions()
        self.host: str | None = None  # the host the list is narrowed to (`h`); None: every session
        self.shown = self.summaries
        # the host column only where a writer's host is known (PostgreSQL, a session live): a JSONL or SQLite home is
        # one machine's, and a column of `-` would only take the prompt's width
        self.with_host = any(s.host for s in self.summaries)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title(), id="title")
            yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
            yield Static("enter: open/resume · n: new · i: inspect · x: delete · h: host · esc: back",
                         id="hint")
        yield QuietFooter()

    def _title(self) -> str:
        if self.host is None:
            return f"Sessions ({len(self.summaries)})"
        return safe_text(f"Sessions on {self.host} ({len(self.shown)} of {len(self.summaries)})")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self.widths = self.column_widths()
        for name, width in self.widths.items():
            table.add_column(name, width=width)
        self._fill()
        table.focus()

    def _fill(self) -> None:
        """The rows of the sessions shown (every one, or the chosen host's)."""
        table, widths = self.query_one(DataTable), self.widths
        table.clear()
        for s in self.shown:
            status = s.status  # the words `cairn sessions` prints (SPEC rev 2)
            if s.id == self.current:
                status = "open here"
            cells = {"id": s.id, "first prompt": first_line(s.first_prompt, widths["first prompt"]) or "—",
                     "status": status, "size": human_size(s.size) if s.size is not None else "?",
                     "updated": self._updated(s.updated), "events": str(s.events), "cwd": s.cwd,
                     "host": writer_label(s)}
            # Text: a prompt's `[/x]` is not markup; safe_text: nor is its ESC a terminal escape
            table.add_row(*(Text(safe_text(cells[name]), no_wrap=True, overflow="ellipsis") for name in widths),
                          key=s.id)

    def action_next_host(self) -> None:
        """Narrow the list to the next host that writes a live session, and after the last back to every session."""
        hosts = sorted({s.host for s in self.summaries if s.status == "live" and s.host})
        if not hosts:
            self.notify("No live session names its host (hosts are known on PostgreSQL).", markup=False)
            return
        at = hosts.index(self.host) + 1 if self.host in hosts else 0
        self.host = hosts[at] if at < len(hosts) else None
        self.shown = [s for s in self.summaries if self.host is None or (s.status == "live" and s.host == self.host)]
        self.heading.update(Text(self._title()))  # a host name is outside text: never markup
        self._fill()

    # What `cairn resume ID` needs comes first, then the prompt that says which session it is; the writer's host (when
    # one is known) gets its width before the prompt does (from 120 columns it is in view), events and cwd (the
    # longest) are last and scroll into view on a narrow terminal, like the host at 80.
    COLUMNS = ("id", "first prompt", "status", "size", "updated", "host", "events", "cwd")

    def _updated(self, ms: int) -> str:
        return format_time(ms) if self.app.size.width >= 100 else format_time(ms)[5:]  # no year at 80 columns

    def column_widths(self) -> dict[str, int]:
        """Whole ids always; the first prompt gets what id, status, size, updated and host leave (at least 16), and the
        whole width left over when events and cwd fit too, so long prompts use a wide terminal."""
        inner = self.app.size.width - 4 - 2  # the screen's padding and the table's scrollbar
        widest = {h: max([len(h), *(len(c) for c in cells)]) for h, cells in (
            ("id", [s.id for s in self.summaries]),
            ("status", ["open here" if s.id == self.current else s.status for s in self.summaries]),
            ("size", [human_size(s.size) if s.size is not None else "?" for s in self.summaries]),
            ("updated", [self._updated(s.updated) for s in self.summaries]),
            ("events", [str(s.events) for s in self.summaries]),
            ("host", [writer_label(s) for s in self.summaries]),
            ("cwd", [s.cwd for s in self.summaries]))}
        longest = max([len("first prompt"), *(len(first_line(s.first_prompt, 1_000)) for s in self.summaries)])
        first = ("id", "status", "size", "updated", "host") if self.with_host else ("id", "status", "size", "updated")
        left = inner - sum(widest[h] + 2 for h in first) - 2
        rest = sum(widest[h] + 2 for h in ("events", "cwd"))
        prompt = min(longest, left - rest) if left - rest >= 40 else min(longest, left)
        widths = {h: widest[h] for h in first}
        widths["first prompt"] = max(16, prompt)
        widths.update((h, widest[h]) for h in ("events", "cwd"))
        return {h: widths[h] for h in self.COLUMNS if h in widths}

    def _selected(self) -> SessionSummary | None:
        table = self.query_one(DataTable)
        if not self.shown:
            return None
        return self.shown[table.cursor_row]

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
            self.shown = [s for s in self.shown if s.id != chosen.id]
            self.heading.update(Text(self._title()))
            self.notify(safe_text(f"Deleted session {chosen.id}."), markup=False)

        prompt = first_line(chosen.first_prompt, 60) or "(no prompt)"
        self.app.push_screen(ConfirmDialog(f"Delete session {chosen.id} ({prompt})? Its log is removed for good.",
                                           yes="Delete", no="Keep"), answered)

    def action_back(self) -> None:
        self.dismiss(None)
