"""The full-screen Textual app. The CLI opens (or repairs) the session before the app starts, so a locked or corrupt
session is a one-line error, not a broken screen. Choosing another session in the sessions screen ends this app after
an ordered shutdown; the CLI then starts it again on the chosen session.

The app also hands every key to the chat's key router first, so that a dialog Cairn raised while the operator was
typing never takes a decision from it (SPEC §11; see `screens/typeahead.py`), offers the slash commands in the command
palette (Ctrl+P) beside Textual's own (themes among them), and remembers the theme chosen in `CAIRN_HOME/tui.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from functools import partial
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

from cairn.persistence.locks import ensure_private_dir
from cairn.persistence.session import LiveSession
from cairn.persistence.store import OpenedSession, SessionStore
from cairn.widgets.terminal_text import safe_text

from . import quiet_gc
from .config.provider import make_provider
from .config.resolver import Config
from .screens.chat import ChatScreen
from .slash_commands import COMMANDS
from .tools.file_writes import atomic_write

if TYPE_CHECKING:  # screens other than the chat are imported when first shown (start-up, P8)
    from .screens.sessions import SessionChoice

SETTINGS_FILE = "tui.json"


class SlashCommandsProvider(Provider):
    """The slash commands in the palette; each runs exactly as if typed (those taking an argument show its use)."""

    def _commands(self) -> list[tuple[str, str, Any]]:
        app = self.app
        assert isinstance(app, CairnApp)
        return [(f"/{c.name}", c.help, partial(app.run_slash, c.name)) for c in COMMANDS]

    async def discover(self) -> Hits:
        for name, help_text, run in self._commands():
            yield DiscoveryHit(name, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, run in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), run, help=help_text)


class CairnApp(App["SessionChoice | None"]):
    TITLE = "Cairn"
    CSS_PATH = ChatScreen.CSS_PATH  # Textual reads the default screen's CSS_PATH nowhere: the chat's comes with the app
    COMMANDS = App.COMMANDS | {SlashCommandsProvider}

    def __init__(self, config: Config, opened: OpenedSession | None, store: SessionStore,
                 unavailable: str | None = None, notice: str | None = None, provider: Any = None) -> None:
        super().__init__()
        self.config = config
        self.store = store
        self.session = LiveSession(opened) if opened is not None else None
        self.notice = notice  # one line to show on the first screen (a session the sessions screen could not open)
        self.provider: Any = None
        if opened is not None and unavailable is not None:
            from .config.resumed import last_request_header
            from .providers.base import UnavailableProvider

            header = last_request_header(opened.events)
            self.provider = UnavailableProvider(header.provider if header else config.provider,
                                                header.model if header else (config.model or "?"), unavailable)
        elif opened is not None:
            self.provider = provider if provider is not None else make_provider(config)  # (the CLI built it once)
        self.chat: ChatScreen | None = None
        self._shutting_down = False
        theme = self._settings().get("theme")
        if isinstance(theme, str) and theme in self.available_themes:
            self.theme = theme

    # -- settings ---------------------------------------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        try:
            value = json.loads((self.config.home / SETTINGS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _remember_theme(self, theme: Any) -> None:
        settings = self._settings()
        settings["theme"] = getattr(theme, "name", str(theme))
        path = self.config.home / SETTINGS_FILE
        try:  # whole or absent after a power cut (SPEC §12): synced, renamed into place, its directory synced
            ensure_private_dir(path.parent)
            home = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                atomic_write(home, SETTINGS_FILE, json.dumps(settings).encode(), 0o600)
            finally:
                os.close(home)
        except OSError:
            pass  # a theme is not worth an error

    # -- lifecycle --------------------------------------------------------------------------------------------------

    def on_unmount(self) -> None:
        quiet_gc.release_full_collections()

    def get_default_screen(self) -> Screen[Any]:
        """The chat is the app's first screen, laid out once inside the app's start-up (pushed from `on_mount` it was
        laid out twice, the first thrown away: P8); with no session, the sessions screen is pushed over a blank one."""
        if self.session is None:
            return super().get_default_screen()
        assert self.provider is not None
        self.chat = ChatScreen(self.session, self.config, self.provider)
        return self.chat

    def on_ready(self) -> None:
        """The first frame is out (Textual's `Ready`, through the app's own queue: a screen's queue can be held by a
        prompt waiting for the agent, and a callback after a refresh goes to whichever screen is on top then)."""
        quiet_gc.hold_full_collections()  # full collections at quiet moments only
        if self.chat is not None:
            self.chat.first_frame_drawn()

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._handle_signals()
        if self.notice:
            self.notify(safe_text(self.notice), severity="error", timeout=12, markup=False)
        if self.session is None:
            from .screens.sessions import SessionsScreen

            self.push_screen(SessionsScreen(self.store), self._chosen)

    async def on_event(self, event: events.Event) -> None:
        """Input first to the chat's key router (`screens/typeahead.py`): a dialog Cairn raised while the operator was
        typing leaves the keys in the prompt until Tab (Ctrl+Q still quits)."""
        if (isinstance(event, (events.Key, events.MouseDown, events.MouseUp, events.Paste)) and not event.is_forwarded
                and self.chat is not None and self.chat.keys.route(self.screen, event)):
            return
        await super().on_event(event)

    async def run_slash(self, name: str) -> None:
        if self.chat is not None and self.chat.is_attached:
            await self.chat.run_slash(name, "")

    def action_open_sessions(self) -> None:
        from .screens.sessions import SessionsScreen

        current = self.session.id if self.session else None
        self.push_screen(SessionsScreen(self.store, current), self._chosen)

    def action_new_session(self) -> None:
        from .screens.sessions import SessionChoice

        self._chosen(SessionChoice("new"))

    def _chosen(self, choice: SessionChoice | None) -> None:
        if choice is None and self.chat is not None:
            return  # back to the chat
        if self.chat is not None and self.chat.turn_running:
            def answered(leave: bool | None) -> None:
                if leave:
                    self.run_worker(self.shutdown(choice), name="shutdown")

            from .screens.confirm import ConfirmDialog

            self.push_screen(ConfirmDialog("A turn is running. Leaving this session cancels it: its closing events "
                                           "are written, and a command it is running is stopped. Leave?"), answered)
            return
        self.run_worker(self.shutdown(choice), name="shutdown")

    async def action_quit(self) -> None:
        await self.shutdown(None)

    def _handle_signals(self) -> None:
        """SIGHUP (the terminal closed), SIGTERM and SIGINT from outside do what Ctrl+Q does: cancel the turn, stop its
        command, write the real closing events, final flush, unlock. A second signal exits at once; the log is still
        repairable."""
        loop = asyncio.get_running_loop()

        async def hang_up() -> None:
            await self.shutdown(None)
            os._exit(129)  # the session is closed; the terminal is gone, so restoring it could only block

        def on_signal(signum: int) -> None:
            if self._shutting_down:
                os._exit(130)
            work = hang_up() if signum == signal.SIGHUP else self.shutdown(None)
            self.run_worker(work, name="shutdown-on-signal")

        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests), or no signals here
                return

    async def shutdown(self, result: SessionChoice | None) -> None:
        if self._shutting_down:
            return
        self._shutting_down = True
        if self.chat is not None:
            await self.chat.shutdown()
        if self.provider is not None:
            await self.provider.aclose()
        self.exit(result)

    def close_if_still_open(self) -> None:
        """After `run()` returns: if the app ended without its ordered shutdown (a crash in the UI), still make what
        was appended durable and release the lock."""
        if self.session is not None and self.session.live:
            self.session.close_now()
