"""The full-screen Textual app. The CLI opens (or repairs) the session before the app starts, so a locked or corrupt
session is a one-line error, not a broken screen. Choosing another session in the sessions screen ends this app after
an ordered shutdown; the CLI then starts it again on the chosen session."""

from __future__ import annotations

from textual.app import App

from .config import Config, make_provider
from .screens.chat import ChatScreen
from .screens.sessions import SessionChoice, SessionsScreen
from cairn.persistence.session import LiveSession
from cairn.persistence.store import OpenedSession, SessionStore


class CairnApp(App[SessionChoice | None]):
    TITLE = "Cairn"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, config: Config, opened: OpenedSession | None, store: SessionStore) -> None:
        super().__init__()
        self.config = config
        self.store = store
        self.session = LiveSession(opened) if opened is not None else None
        self.provider = make_provider(config) if opened is not None else None
        self.chat: ChatScreen | None = None
        self._shutting_down = False

    def on_mount(self) -> None:
        if self.session is None:
            self.push_screen(SessionsScreen(self.store), self._chosen)
        else:
            assert self.provider is not None
            self.chat = ChatScreen(self.session, self.config, self.provider)
            self.push_screen(self.chat)

    def action_open_sessions(self) -> None:
        current = self.session.id if self.session else None
        self.push_screen(SessionsScreen(self.store, current), self._chosen)

    def _chosen(self, choice: SessionChoice | None) -> None:
        if choice is None and self.chat is not None:
            return  # back to the chat
        self.run_worker(self.shutdown(choice), name="shutdown")

    async def action_quit(self) -> None:
        await self.shutdown(None)

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
