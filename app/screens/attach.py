"""`cairn attach ID` (SPEC §13 rev 4): the chat view of a session another process is writing, read-only.

The session is shown as it stands with the chat's own `Transcript`, then followed through `inspect/follow.py`'s tail
(PostgreSQL wakes on the writer's notification, files are looked at every few tens of milliseconds): the answer grows as
its chunks are committed, tool cards appear and finish, and an `approval/asked` without its decision says where it
waits. Nothing here decides it, locks or writes (SPEC §11): the keys only scroll, leave, and — once nobody holds the
session — hand it to the normal chat (`r`), which `cairn resume` opens: repaired, with the resume screen when calls were
recovered. The banner names the writer (`host:pid`; `pid N` on a backend without hosts) and what became of it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from rich.text import Text
from textual import getters
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker

from cairn.persistence.errors import CorruptLog, PersistenceError
from cairn.persistence.events import (
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    ReasoningChunk,
    ToolCall,
    ToolResult,
    TurnEnd,
)
from cairn.persistence.store import SessionStore, ending_status
from cairn.widgets.quiet_footer import QuietFooter
from cairn.widgets.terminal_text import safe_text
from cairn.widgets.transcript import Notice, Transcript

from ..exit_codes import EXIT_OK, EXIT_USAGE, fail

WAKE = 0.25  # seconds: the longest wait between two looks at the tail (a notification or new bytes end it sooner)
RETRY = 1.0  # seconds before looking again after the store could not be read
RESUME = "resume"  # what the screen is dismissed with when the operator chose to continue the session here


def writer_name(host: str | None, pid: int | None) -> str:
    """`host:pid`, or `pid N` where the backend knows no host (`pid unknown`: a live lock without its pid)."""
    shown = str(pid) if pid else "unknown"
    return f"{safe_text(host)}:{shown}" if host else f"pid {shown}"


def split_streaming(events: list[AnyEvent]) -> int:
    """Where the chunks of an answer still streaming begin: history is read up to there, and those chunks are applied
    as live ones (history keeps chunks aside until their message comes, which for a live answer is not yet)."""
    k = len(events)
    while k and isinstance(events[k - 1], (AssistantChunk, ReasoningChunk)):
        k -= 1
    return k


class AttachScreen(Screen[str | None]):
    """One session followed read-only; dismissed with RESUME (continue it here) or None (leave)."""

    CSS_PATH = "attach.tcss"

    banner = getters.query_one("#banner", Static)
    transcript = getters.query_one(Transcript)

    BINDINGS = [
        Binding("r", "resume", "Resume here"),
        Binding("q,escape", "leave", "Leave"),
        Binding("f1", "help", "Help"),
        # (priority: before the focused transcript's own, so that End follows again and Home reveals all history)
        Binding("end", "follow", "Follow", show=False, priority=True),
        Binding("home", "top", "Top", show=False, priority=True),
        Binding("pageup", "scroll('page_up')", "Scroll", show=False, priority=True),
        Binding("pagedown", "scroll('page_down')", "Scroll", show=False, priority=True),
    ]

    def __init__(self, store: SessionStore, session_id: str, events: list[AnyEvent], holder: int | None,
                 tail: Any = None, writer: int | None = None) -> None:
        super().__init__()
        self.store = store
        self.session_id = session_id
        self.events = events
        self.holder = holder  # the writer's pid while it holds the session (0: unknown pid); None once nobody does
        self.writer = holder if writer is None else writer  # the pid last seen holding it (None: never live here)
        self.host: str | None = getattr(tail, "host", None)
        self.tail = tail
        self.error = ""
        self.asked: dict[str, Notice] = {}  # call id -> the "waiting for approval" line of a call not decided yet
        self._follower: Worker[None] | None = None

    @classmethod
    def load(cls, store: SessionStore, session_id: str) -> "AttachScreen":
        """The session as it stands, and a tail after it when it is live (raises the store's errors: the caller
        reports them). The first look at the tail is taken here, so the first frame names the writer's host."""
        inspection = store.inspect(session_id)
        events, holder = list(inspection.events), inspection.live_pid
        tail = None
        if holder is not None:
            from ..inspect.follow import open_tail

            tail = open_tail(store, session_id, len(events))
            try:
                new, holder = tail.poll()
                events += new + (tail.last() if holder is None else [])
            except BaseException:
                tail.close()
                raise
            if holder is None:  # it ended between the two looks
                tail.close()
                return cls(store, session_id, events, None, writer=inspection.live_pid)
        return cls(store, session_id, events, holder, tail)

    @property
    def live(self) -> bool:
        return self.holder is not None

    def compose(self) -> ComposeResult:
        yield Static("", id="banner")
        transcript = Transcript(id="transcript")
        yield transcript
        yield transcript.new_output
        yield QuietFooter()

    async def on_mount(self) -> None:
        transcript = self.transcript
        split = split_streaming(self.events)  # (a log a crash cut mid-answer: that answer is shown as it was cut)
        await transcript.load_history(self.events[:split])
        if self.events[split:]:
            await transcript.apply_many(self.events[split:])
        await self._track_approvals(self.events)
        if not self.events:
            await transcript.mount(Notice("Nothing written yet.", markup=False))
        elif not self.live and self._ending() == "interrupted":
            await self._writer_gone()
        transcript.scroll_end(animate=False)
        transcript.focus()
        self._show_banner()
        if self.tail is not None:
            self._follower = self.run_worker(self._follow(), name="attach-follow", exit_on_error=False)

    # -- following ----------------------------------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Look at the tail until its writer is gone; closes the tail however it ends (leaving the screen cancels this,
        once the look in progress, at most WAKE seconds, is over)."""
        import anyio
        import anyio.to_thread

        tail = self.tail
        try:
            while True:
                try:
                    new, holder = await anyio.to_thread.run_sync(tail.poll)
                    if holder is None:
                        new += await anyio.to_thread.run_sync(tail.last)
                except (PersistenceError, OSError) as e:
                    if str(e) != self.error:
                        self.error = str(e)
                        self._show_banner()
                    if isinstance(e, CorruptLog):  # it will not heal: said, and no longer followed
                        return
                    await anyio.sleep(RETRY)
                    continue
                await self._arrived(new, holder, getattr(tail, "host", None))
                if holder is None:
                    return
                await anyio.to_thread.run_sync(tail.wait, WAKE)
        finally:
            self.tail = None
            tail.close()

    async def _arrived(self, new: list[AnyEvent], holder: int | None, host: str | None) -> None:
        changed = bool(new) or holder != self.holder or host != self.host or bool(self.error)
        self.error = ""
        self.holder, self.host = holder, host or self.host
        self.writer = self.writer if holder is None else holder
        if new:
            self.events += new
            await self.transcript.apply_many(new)
            await self._track_approvals(new)
        if holder is None:
            await self._writer_gone()
        if changed:
            self._show_banner()

    async def _track_approvals(self, events: list[AnyEvent]) -> None:
        """An `approval/asked` gets a line under the transcript until its decision (or its call's end) comes: the
        operator at the writer decides it, not this view."""
        waiting = dict.fromkeys(self.asked)
        for event in events:
            if isinstance(event, ApprovalAsked):
                waiting[event.call_id] = None
            elif isinstance(event, (ApprovalDecided, ToolCall, ToolResult)):
                waiting.pop(event.call_id, None)
            elif isinstance(event, TurnEnd):
                waiting.clear()
        for call_id in [c for c in self.asked if c not in waiting]:
            await self.asked.pop(call_id).remove()
        for call_id in [c for c in waiting if c not in self.asked]:
            self.asked[call_id] = Notice(self._waiting_line(), markup=False, classes="-warning waiting")
            await self.transcript.mount(self.asked[call_id])

    def _waiting_line(self) -> str:
        where = safe_text(self.host) if self.host else f"the writer ({writer_name(None, self.holder)})"
        return f"⏸ waiting for approval on {where} — it is decided there; this view is read-only"

    async def _writer_gone(self) -> None:
        for notice in self.asked.values():
            notice.update("⊘ the writer ended before this approval was decided")
        self.asked.clear()
        how = self._ending()
        cards = self.transcript.cards.values()
        open_calls = sum(card.status in ("queued", "running", "awaiting approval") for card in cards)
        calls = f" with {open_calls} tool call(s) in flight, which resuming checks first" if open_calls else ""
        await self.transcript.mount(Notice(f"■ the writer stopped here: the session is {how}{calls} — r resumes it here",
                                           markup=False, classes="-error" if how == "interrupted" else "-warning"))
        self.refresh_bindings()

    def _ending(self) -> str:
        """`interrupted` when the last turn has no end, else `ended` (its last turn ended: completed, cancelled, …)."""
        return "interrupted" if ending_status(self.events) == "interrupted" else "ended"

    # -- the banner ---------------------------------------------------------------------------------------------------

    def banner_text(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        if self.live:
            text.append(f"● watching {writer_name(self.host, self.holder)} — read-only", "bold")
            if self.asked:
                text.append(" · ⏸ waiting for approval", "bold")
        elif self.writer is not None:
            text.append(f"■ writer {writer_name(self.host, self.writer)} gone: session {self._ending()}", "bold")
            text.append(" — r resumes here, q leaves")
        else:
            text.append(f"■ not live ({ending_status(self.events)})", "bold")
            text.append(" — r resumes here, q leaves")
        text.append(f" · {safe_text(self.session_id)}", "dim")
        if self.error:
            text.append(f" · {safe_text(self.error)}", "bold")
        return text

    def _show_banner(self) -> None:
        banner = self.banner
        banner.update(self.banner_text())
        banner.set_class(self.live, "-live")
        banner.set_class(not self.live and self._ending() == "interrupted", "-interrupted")
        banner.set_class(not self.live and self._ending() == "ended", "-ended")

    # -- keys ---------------------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "resume":
            return not self.live  # hidden while another process writes the session
        return True

    def action_resume(self) -> None:
        if not self.live:
            self.dismiss(RESUME)

    def action_leave(self) -> None:
        self.dismiss(None)

    def action_help(self) -> None:
        from .help import HelpScreen

        self.app.push_screen(HelpScreen())

    def action_follow(self) -> None:
        self.transcript.follow()
        self.transcript.scroll_end(animate=False)

    async def action_top(self) -> None:
        await self.transcript.scroll_to_start()

    def action_scroll(self, how: str) -> None:
        getattr(self.transcript, f"scroll_{how}")(animate=False)

    def on_unmount(self) -> None:
        if self.tail is not None and self._follower is None:  # (a follower, once started, closes its tail itself)
            self.tail.close()
            self.tail = None


class AttachApp(App[str | None]):
    """`cairn attach`: the attach screen alone; it ends with the screen's answer (RESUME or None)."""

    TITLE = "Cairn attach"

    def __init__(self, screen: AttachScreen) -> None:
        super().__init__()
        self.attach = screen

    def on_mount(self) -> None:
        self.push_screen(self.attach, self.exit)


def attach_command(args: argparse.Namespace, config: Any, resume: Callable[[], int]) -> int:
    """`cairn attach SESSION_ID`: the session is read before the app starts, so an unknown id or an unreadable log is
    one line and an exit code (raised to the CLI), never a broken screen. `r` ends this app and calls `resume`, which
    opens the session as `cairn resume SESSION_ID` does (the lock is taken there: another process first is exit 3)."""
    store = SessionStore(config.home, config.backend, getattr(config, "database_url", None))
    screen = AttachScreen.load(store, args.session_id)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        if screen.tail is not None:
            screen.tail.close()
        return fail(f"cairn attach needs a terminal (for a log or a script: cairn show {args.session_id} --follow)",
                    EXIT_USAGE)
    return resume() if AttachApp(screen).run() == RESUME else EXIT_OK
