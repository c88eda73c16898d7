"""The session inspector: a session's event history at a glance, live or recovered (`cairn inspect`, `i` on the
sessions screen and the resume screen). Read-only: it never takes the lock and never writes.

The table is a Line API widget (`ScrollView`): it renders only the rows on screen, so 100k events cost what 30 do.
Columns: barrier mark (the margin), seq, time since the previous event and since the turn started, type, turn.step,
call id (when the terminal is wide enough), and a one-line summary; colours by kind (request, tool, result, error,
recovery). Separator lines show each turn's start, where the log ended in a crash, and a torn tail. What the rows mean is
computed in `app/inspect/model.py` (no Textual there); following a live session in `app/inspect/follow.py`.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Group
from rich.json import JSON
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import getters, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static

from cairn.persistence.errors import PersistenceError
from cairn.persistence.store import SessionStore
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text

from ..inspect.model import Filter, FilterError, InspectorModel, View, format_delta, parse_filter

KIND_STYLES = {
    "boundary": Style(bold=True),
    "prompt": Style(color="#5fd7d7"),
    "request": Style(color="#5fafff"),
    "tool": Style(color="#d7af5f"),
    "result": Style(color="#87d787"),
    "error": Style(color="#ff5f5f", bold=True),
    "recovery": Style(color="#d787ff", bold=True),
    "other": Style(dim=True),
}
BARRIER_MARKS = {"pre-step": "◆ step", "pre-request": "◆ req", "pre-tool": "◆ tool", "turn-end": "◆ end"}
BARRIER_STYLE = Style(color="#ffd75f")
SEPARATOR_STYLES = {
    "turn": Style(bold=True, dim=True),
    "crash": Style(color="#ffffff", bgcolor="#870000", bold=True),
    "torn": Style(color="#ffd75f", italic=True),
}
CURSOR = Style(bgcolor="#264f78")
DIM = Style(dim=True)
MARGIN = 8  # "✚ repair"
POLL_SECONDS = 0.2  # follow: new events appear within 0.5 s


class Columns:
    """Cell widths for a table `width` cells wide; the summary takes what is left."""

    def __init__(self, width: int, last_seq: int) -> None:
        self.seq = max(3, len(str(max(last_seq, 0))))
        self.delta = 6
        self.type = 17
        self.turn = 5
        fixed = MARGIN + self.seq + 2 * self.delta + self.type + self.turn + 6  # six single spaces between columns
        self.call = 14 if width - fixed >= 14 + 1 + 40 else 0
        self.summary = max(10, width - fixed - (self.call + 1 if self.call else 0))

    def header(self) -> list[tuple[str, int]]:
        cols = [("barrier", MARGIN), ("seq", -self.seq), ("+prev", -self.delta), ("+turn", -self.delta),
                ("type", self.type), ("t.s", self.turn)]
        if self.call:
            cols.append(("call id", self.call))
        cols.append(("summary", self.summary))
        return cols


def cell(text: str, width: int, right: bool = False) -> str:
    text = safe_text(text).replace("\n", " ").replace("\t", " ")
    if cell_len(text) > width:
        return set_cell_size(text[: width * 2], width - 1) + "…" if width > 1 else set_cell_size(text, width)
    return text.rjust(width) if right else set_cell_size(text, width)


class EventTable(ScrollView, can_focus=True):
    """The virtual event table. `cursor` is a position in `view.lines`; it never rests on a separator line."""

    DEFAULT_CSS = "EventTable { height: 1fr; overflow-x: hidden; }"
    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,g", "edge(-1)", "First", show=False),
        Binding("end,G", "edge(1)", "Last", show=False),
    ]

    cursor: reactive[int] = reactive(0, always_update=True, init=False)

    class Highlighted(Message):
        def __init__(self, index: int | None) -> None:
            super().__init__()
            self.index = index  # event index, None when the view is empty

    def __init__(self, model: InspectorModel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.view = model.view()
        self.show_vertical_scrollbar = True

    # -- data ---------------------------------------------------------------------------------------------------------

    def set_view(self, view: View, keep: int | None = None, to_end: bool = False) -> None:
        """Show `view`, keeping the cursor on event `keep` (or the nearest row after it), or at the end."""
        self.view = view
        self.virtual_size = Size(0, len(view.lines) + 1)
        if to_end or keep is None:
            position = len(view.lines) - 1 if to_end else 0
        else:
            position = view.line_of(keep)
        self._settle(max(position, 0), 1 if not to_end else -1)
        self.refresh()

    def on_resize(self) -> None:
        self.virtual_size = Size(0, len(self.view.lines) + 1)

    @property
    def index(self) -> int | None:
        """The event under the cursor."""
        lines = self.view.lines
        if 0 <= self.cursor < len(lines) and lines[self.cursor] >= 0:
            return lines[self.cursor]
        return None

    @property
    def position(self) -> int:
        """The cursor's position among the view's events (for jumps and search)."""
        index = self.index
        return -1 if index is None else bisect.bisect_left(self.view.indices, index)

    def go_to_event(self, index: int) -> None:
        self._settle(self.view.line_of(index), 1)

    def _settle(self, position: int, direction: int) -> None:
        """Move off separator lines, preferring `direction`."""
        lines = self.view.lines
        if not lines:
            self.cursor = 0
            return
        p = max(0, min(position, len(lines) - 1))
        for d in (direction, -direction):
            q = p
            while 0 <= q < len(lines) and lines[q] < 0:
                q += d
            if 0 <= q < len(lines):
                self.cursor = q
                return
        self.cursor = p

    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_to_cursor()
        self.call_after_refresh(self._scroll_to_cursor)  # again once a grown table can scroll (its scrollbar is laid out)
        self.refresh()
        self.post_message(self.Highlighted(self.index))

    def _scroll_to_cursor(self) -> None:
        # line 0 of the widget is the header: line p of the view is drawn at y = p + 1 - scroll_y
        new = self.cursor
        top, height = int(self.scroll_y), max(1, self.size.height - 1)
        if new == self._first_event_line():  # separators above the first row stay in sight
            self.scroll_to(y=0, animate=False, immediate=True)
        elif new < top or new >= top + height:  # a jump: show some of what came before
            self.scroll_to(y=max(0, new - height // 3), animate=False, immediate=True)

    def _first_event_line(self) -> int:
        return next((p for p, line in enumerate(self.view.lines) if line >= 0), 0)

    # -- keys ---------------------------------------------------------------------------------------------------------

    def action_move(self, delta: int) -> None:
        self._settle(self.cursor + delta, 1 if delta > 0 else -1)

    def action_page(self, direction: int) -> None:
        self._settle(self.cursor + direction * max(1, self.size.height - 1), direction)

    def action_edge(self, direction: int) -> None:
        self._settle(0 if direction < 0 else len(self.view.lines) - 1, -direction)

    def on_click(self, event: Any) -> None:
        y = event.y + int(self.scroll_y) - 1  # the header row is line 0 of the widget
        if 0 <= y < len(self.view.lines):
            self._settle(y, 1)

    # -- rendering ----------------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        model = self.model
        cols = Columns(width, len(model) - 1)
        if y == 0:  # a fixed header row
            parts = [cell(name, w if w > 0 else -w, right=w < 0) for name, w in cols.header()]
            return Strip([Segment(" ".join(parts), Style(bold=True, underline=True))]).crop_extend(0, width, None)
        position = int(self.scroll_y) + y - 1
        lines = self.view.lines
        if position >= len(lines):
            return Strip.blank(width)
        line = lines[position]
        if line < 0:
            what, text = self.view.separators[-line - 1]
            shown = f"── {text} " if what == "turn" else f"✖ {text} " if what == "crash" else f"⚠ {text} "
            shown = cell(shown, width) if cell_len(shown) > width else shown
            fill = ("─" if what == "turn" else " ") * max(0, width - cell_len(shown))
            return Strip([Segment(shown + fill, SEPARATOR_STYLES[what])])
        return self._row(line, cols, position == self.cursor, width)

    def _row(self, i: int, cols: Columns, selected: bool, width: int) -> Strip:
        model = self.model
        kind = model.kind(i)
        style = KIND_STYLES[kind]
        repair = model.is_repair(i)
        barrier = model.barrier(i)
        margin = "✚ repair" if repair else BARRIER_MARKS.get(barrier or "", "")
        margin_style = KIND_STYLES["recovery"] if repair else BARRIER_STYLE
        pending = model.is_pending(i)
        seq_style = DIM + Style(italic=True) if pending else DIM
        type_name = model.type_of(i)
        row_style = style if kind in ("error", "recovery", "boundary") else Style()
        segments = [
            Segment(cell(margin, MARGIN) + " ", margin_style),
            Segment(cell(str(model.events[i].seq), cols.seq, right=True) + " ", seq_style),
            Segment(cell(format_delta(model.since_prev(i)), cols.delta, right=True) + " ", DIM),
            Segment(cell(format_delta(model.since_turn(i)), cols.delta, right=True) + " ", DIM),
            Segment(cell(type_name, cols.type) + " ", style),
            Segment(cell(model.turn_step(i), cols.turn) + " ", DIM),
        ]
        if cols.call:
            segments.append(Segment(cell(model.call_id(i), cols.call) + " ", DIM))
        segments.append(Segment(cell(model.summary(i, cols.summary + 10), cols.summary), row_style))
        strip = Strip(segments).crop_extend(0, width, None)
        return strip.apply_style(CURSOR) if selected else strip


class InspectorScreen(Screen[None]):
    """Read-only event history of one session; with `follow`, new events from the writing process appear live."""

    CSS_PATH = "inspector.tcss"

    head = getters.query_one("#head", Static)
    detail = getters.query_one("#detail", Static)
    detail_box = getters.query_one("#detail-box", VerticalScroll)
    query_input = getters.query_one("#query", Input)

    BINDINGS = [
        Binding("escape,q", "back", "Back"),
        Binding("f", "ask('filter')", "Filter"),
        Binding("slash", "ask('search')", "Search"),
        Binding("n", "search_again(1)", "Next match", show=False),
        Binding("N", "search_again(-1)", "Previous match", show=False),
        Binding("e", "jump('error', 1)", "Next error"),
        Binding("E", "jump('error', -1)", "Previous error", show=False),
        Binding("r", "jump('recovered', 1)", "Next recovered"),
        Binding("R", "jump('recovered', -1)", "Previous recovered", show=False),
        Binding("shift+pagedown", "scroll_detail(1)", "Scroll detail", show=False),
        Binding("shift+pageup", "scroll_detail(-1)", "Scroll detail", show=False),
    ]

    def __init__(self, model: InspectorModel, store: SessionStore | None = None, follow: bool = False) -> None:
        super().__init__()
        self.model = model
        self.store = store
        self.follow = follow and store is not None
        self.filter = Filter()
        self.filter_text = ""
        self.search_text = ""
        self.asking = ""
        self._tail: Any = None
        self._polling = False
        self._follow_error = ""
        self.detail_text = ""

    @classmethod
    def load(cls, store: SessionStore, session_id: str, follow: bool = False) -> "InspectorScreen":
        """Read the session (raises the store's errors: the caller reports them)."""
        inspection = store.inspect(session_id)
        model = InspectorModel.from_inspection(session_id, inspection, getattr(store.backend, "name", ""))
        return cls(model, store, follow)

    def compose(self) -> ComposeResult:
        yield Static(self._headline(), id="head")
        yield EventTable(self.model, id="events")
        with VerticalScroll(id="detail-box"):
            yield Static("", id="detail")
        yield Input(id="query")
        yield QuietFooter()

    def on_mount(self) -> None:
        table = self.query_one(EventTable)
        table.set_view(table.view, to_end=False)
        crash = self.model.crash_ends()
        if self.follow:  # at the tail, which the cursor then follows
            table.action_edge(1)
        elif crash:  # open where the story is: the last crash
            table.go_to_event(crash[-1])
        table.focus()
        if self.follow:
            self.model.following = True
            self.set_interval(POLL_SECONDS, self._poll)

    # -- header and detail ----------------------------------------------------------------------------------------

    def _headline(self) -> Text:
        m = self.model
        state = m.state()
        if state == "ended" and m.pending:
            state = "ended — interrupted, not resumed yet"
        elif state == "ended" and m.repair_blocks:
            state = "ended — recovered"
        elif state in ("live", "idle") and m.live_pid == os.getpid():
            state = "open here"
        elif state in ("live", "idle") and m.live_pid:
            state = f"{state} (pid {m.live_pid})"
        colour = {"live": "#87d787", "idle": "#ffd75f"}.get(m.state(), "#d787ff" if m.pending else "")
        text = Text(overflow="ellipsis", no_wrap=True)
        text.append(safe_text(m.session_id), Style(bold=True))
        text.append(f" · {len(m.stored):,} events")
        if m.backend:
            text.append(f" · {m.backend}")
        text.append(" · ")
        text.append(state, Style(color=colour or None, bold=True))
        if self.follow:
            text.append(" · following")
        if self.filter_text:
            text.append(f" · filter: {safe_text(self.filter_text)}", Style(color="#5fafff"))
        text.append(" · read-only", DIM)
        if self._follow_error:
            text.append(f" · {safe_text(self._follow_error)}", Style(color="#ff5f5f"))
        return text

    def _refresh_head(self) -> None:
        self.head.update(self._headline())

    @on(EventTable.Highlighted)
    def show_detail(self, message: EventTable.Highlighted) -> None:
        detail = self.detail
        i = message.index
        if i is None:
            self.detail_text = "No event matches." if self.filter_text else "No events yet."
            detail.update(Text(self.detail_text, style=DIM))
            return
        m = self.model
        facts = [f"seq {m.events[i].seq}", m.type_of(i)]
        if m.turn_step(i):
            facts.append(f"turn.step {m.turn_step(i)}")
        if m.call_id(i):
            facts.append(f"call {m.call_id(i)}")
        barrier = m.barrier(i)
        if barrier:
            facts.append(f"◆ {barrier} barrier after this event")
        if m.is_repair(i):
            facts.append("repair would append this (not written)" if m.is_pending(i) else "appended by repair")
        if i in m.crash_ends():
            facts.append("the log ended here (crash or kill)")
        found = m.evidence_for(m.call_id(i)) if m.is_recovered_call(i) else None
        if found is not None:  # what Cairn checked about this call after the crash (SPEC §9)
            facts.append(f"evidence: {found.finding} — {found.detail}")
        head = Text(safe_text(" · ".join(facts)), style=KIND_STYLES[m.kind(i)])
        json_text = safe_text(m.detail(i))
        self.detail_text = f"{head.plain}\n{json_text}"  # what the pane says, as plain text
        body = JSON(json_text, indent=2, ensure_ascii=False)
        detail.update(Group(head, body))
        self.detail_box.scroll_home(animate=False)

    def action_scroll_detail(self, direction: int) -> None:
        box = self.detail_box
        (box.scroll_page_down if direction > 0 else box.scroll_page_up)(animate=False)

    # -- filter and search --------------------------------------------------------------------------------------------

    def action_ask(self, what: str) -> None:
        self.asking = what
        query = self.query_input
        if what == "filter":
            query.placeholder = "filter: type:tool/result turn:2 call:call_1 kind:error (empty: show all)"
            query.value = self.filter_text
        else:
            query.placeholder = "search the events' JSON (n / N: next / previous match)"
            query.value = self.search_text
        query.add_class("shown")
        query.focus()

    def _close_query(self) -> None:
        self.asking = ""
        self.query_input.remove_class("shown")
        self.query_one(EventTable).focus()

    @on(Input.Submitted, "#query")
    def submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if self.asking == "filter":
            try:
                self.apply_filter(text)
            except FilterError as e:
                self.notify(safe_text(str(e)), severity="warning", markup=False)
                return
            self._close_query()
        else:
            self._close_query()
            self.search_text = text
            if text:
                self.action_search_again(1, from_current=True)

    def apply_filter(self, text: str) -> None:
        """Raises FilterError for a term it cannot use (the filter then stays as it was)."""
        new = parse_filter(text)
        table = self.query_one(EventTable)
        keep = table.index
        self.filter, self.filter_text = new, text
        table.set_view(self.model.view(new), keep=keep)
        self._refresh_head()
        if table.index is None:
            self.show_detail(EventTable.Highlighted(None))

    def action_search_again(self, direction: int, from_current: bool = False) -> None:
        if not self.search_text:
            self.action_ask("search")
            return
        table = self.query_one(EventTable)
        start = table.position - (direction if from_current else 0)
        found = self.model.next_where(table.view.indices, start, self.model.search_predicate(self.search_text),
                                      direction)
        if found is None:
            self.notify(safe_text(f"no event contains {self.search_text!r}"), markup=False)
        else:
            table.go_to_event(table.view.indices[found])

    def action_jump(self, what: str, direction: int) -> None:
        table = self.query_one(EventTable)
        m = self.model
        predicate = m.is_error if what == "error" else m.is_recovered_call
        found = m.next_where(table.view.indices, table.position, predicate, direction)
        if found is None:
            self.notify("no errors here" if what == "error" else "no recovered calls here")
        else:
            table.go_to_event(table.view.indices[found])

    def action_back(self) -> None:
        if self.asking:
            self._close_query()
            return
        self.dismiss(None)

    # -- following ----------------------------------------------------------------------------------------------------

    async def _poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        try:
            await self._poll_once()
        finally:
            self._polling = False

    async def _poll_once(self) -> None:
        import anyio.to_thread

        assert self.store is not None
        m = self.model
        try:
            if self._tail is None:
                from ..inspect.follow import open_tail

                self._tail = await anyio.to_thread.run_sync(open_tail, self.store, m.session_id, len(m.stored))
            new, holder = await anyio.to_thread.run_sync(self._tail.poll)
        except (PersistenceError, OSError) as e:
            if str(e) != self._follow_error:
                self._follow_error = str(e)
                self._refresh_head()
            return
        self._follow_error = ""
        state = (m.live_pid, len(m.pending))
        m.live_pid = holder
        if new:
            m.extend(new)
        m.recompute_pending()
        if not new and state == (m.live_pid, len(m.pending)):
            return
        table = self.query_one(EventTable)
        at_end = table.index is None or table.position >= len(table.view.indices) - 1
        table.set_view(m.view(self.filter), keep=table.index, to_end=at_end)
        self._refresh_head()

    def on_unmount(self) -> None:
        if self._tail is not None:
            self._tail.close()


def open_inspector(app: App, store: SessionStore, session_id: str, follow: bool = False) -> None:
    """Push the inspector over the current screen; a session that cannot be read is one notice, not a crash."""
    try:
        screen = InspectorScreen.load(store, session_id, follow)
    except PersistenceError as e:
        app.notify(safe_text(str(e)), severity="error", markup=False)
        return
    app.push_screen(screen)


class InspectorApp(App[None]):
    """`cairn inspect`: the inspector alone; leaving it ends the app."""

    TITLE = "Cairn inspector"

    def __init__(self, screen: InspectorScreen) -> None:
        super().__init__()
        self.inspector = screen

    def on_mount(self) -> None:
        self.push_screen(self.inspector, lambda _: self.exit())


def inspect_command(args: Any, config: Any) -> int:
    """`cairn inspect SESSION_ID [--follow]`: the session is read before the app starts, so an unknown id, a corrupt
    log or an unreadable file is one line and an exit code (raised to the CLI), never a broken screen."""
    store = SessionStore(config.home, config.backend, getattr(config, "database_url", None))
    screen = InspectorScreen.load(store, args.session_id, args.follow)
    InspectorApp(screen).run()
    return 0


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m cairn.app.screens.inspector HOME SESSION_ID
    import sys

    InspectorApp(InspectorScreen.load(SessionStore(sys.argv[1]), sys.argv[2], "--follow" in sys.argv)).run()
