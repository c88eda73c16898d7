"""The chat's rewind flow (SPEC §9 rev 3): `/rewind` and Esc Esc open the dialog, the engine restores what was chosen,
and a rewind a crash interrupted is finished or abandoned before the next turn. While any of it runs the chat sends no
prompt (`rewinding`).

The rewind engine and its dialogs are imported only when a rewind is asked for or a session has one pending (P8)."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from cairn.widgets.terminal_text import safe_text

if TYPE_CHECKING:
    from textual.app import App
    from textual.worker import Worker

    from cairn.persistence.blobs import BlobStore
    from cairn.persistence.session import LiveSession
    from cairn.widgets.prompt_input import PromptInput

    from ..agent.snapshots import ShadowRepo
    from ..compose import Agent
    from ..config.resolver import Config
    from .rewind import RewindChoice
    from .typeahead import KeyRouter

ESC_ESC = 0.6  # seconds: two Esc presses on an empty prompt this close together open the rewind dialog


class RewindHost(Protocol):
    """What the rewind flow needs from the chat it runs in."""

    @property
    def app(self) -> App[Any]: ...
    @property
    def is_attached(self) -> bool: ...
    @property
    def session(self) -> LiveSession: ...
    @property
    def config(self) -> Config: ...
    @property
    def agent(self) -> Agent | None: ...
    @property
    def keys(self) -> KeyRouter: ...
    @property
    def resume_pending(self) -> bool: ...
    @property
    def prompt_input(self) -> PromptInput: ...

    def idle(self) -> bool: ...

    async def say(self, text: str, kind: str = "") -> None: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, name: str | None = "", group: str = "default",
                   exclusive: bool = False) -> Worker[None]: ...


class RewindFlow:
    def __init__(self, chat: RewindHost) -> None:
        self.chat = chat
        self.rewinding = False  # the rewind dialog is open or a rewind runs: no prompt is sent meanwhile
        self._escaped = 0.0  # when Esc was last pressed on an empty prompt with no turn running (Esc Esc: /rewind)
        self._blobs: BlobStore | None = None

    def close(self) -> None:
        if self._blobs is not None:
            blobs, self._blobs = self._blobs, None
            blobs.close()

    def _snapshots(self) -> ShadowRepo | None:
        """The workspace's shadow repository the agent snapshots into (None: off, no git, or not built yet)."""
        return self.chat.agent.loop.snapshots if self.chat.agent is not None else None

    def _blob_store(self) -> BlobStore | None:
        if self._blobs is None:
            from cairn.persistence.blobs import blob_store_for

            self._blobs = blob_store_for(self.chat.app.store.backend)  # type: ignore[attr-defined]
        return self._blobs

    def escape_pressed(self) -> None:
        """Esc on an empty prompt with no turn running: a second Esc within ESC_ESC seconds opens the rewind dialog."""
        now = time.monotonic()
        if now - self._escaped <= ESC_ESC:
            self._escaped = 0.0
            self.chat.run_worker(self.open(), name="open-rewind", exclusive=True, group="open-rewind")
        else:
            self._escaped = now

    def settle_interrupted(self) -> None:
        """A rewind a crash interrupted: say what was and was not restored, and finish or abandon it before the next
        turn (the prompt sends nothing meanwhile)."""
        from cairn.persistence.events import RewindPlan

        if not any(isinstance(e, RewindPlan) for e in self.chat.session.events):
            return  # nearly always: the rewind engine and its dialog are imported only when needed (start-up, P8)
        from ..agent.rewind import pending_rewind
        from .rewind import PendingRewindScreen

        pending = pending_rewind(self.chat.session.events)
        if pending is None:
            return
        self.rewinding = True

        def settled(how: str | None) -> None:
            self.chat.run_worker(self._settle(how or "abandon"), name="rewind", exclusive=True, group="rewind")

        self.chat.app.push_screen(PendingRewindScreen(*pending, typist=self.chat.keys), settled)

    async def _settle(self, how: str) -> None:
        from ..agent.rewind import RewindRefused, abandon_rewind, describe, finish_rewind

        chat = self.chat
        try:
            if how == "finish":
                outcome = await finish_rewind(chat.session, chat.config.workspace, self._blob_store(),
                                              repo=self._snapshots())
                lines = describe(outcome)
            else:
                plan = await abandon_rewind(chat.session)
                lines = [f"abandoned the interrupted rewind to before turn {plan.to_turn}: files and conversation "
                         "stay as they are now"]
            await chat.say("\n".join(lines))
        except RewindRefused as e:
            await chat.say(str(e), "-warning")
        finally:
            self.rewinding = False
            chat.prompt_input.focus()

    async def open(self) -> None:
        """`/rewind` (and Esc Esc): the dialog, then the engine — only while no turn runs."""
        from ..agent.rewind import pending_rewind
        from .rewind import RewindScreen

        chat = self.chat
        if not chat.idle():
            await chat.say("Rewind works between turns: wait for this one to end (or Esc to cancel it).", "-warning")
            return
        if chat.resume_pending or self.rewinding:
            return
        if pending_rewind(chat.session.events) is not None:
            self.settle_interrupted()
            return
        self.rewinding = True

        def chosen(choice: RewindChoice | None) -> None:
            if choice is None:
                self.rewinding = False
                chat.prompt_input.focus()
                return
            chat.run_worker(self._rewind(choice), name="rewind", exclusive=True, group="rewind")

        chat.app.push_screen(RewindScreen(chat.session.events, chat.config.workspace, self._blob_store(),
                                          self._snapshots(), typist=chat.keys), chosen)

    async def _rewind(self, choice: RewindChoice) -> None:
        from ..agent.rewind import RewindRefused, describe, rewind, undo_rewind

        chat = self.chat
        try:
            if not chat.idle():
                await chat.say("A turn started meanwhile: nothing was rewound.", "-warning")
                return
            try:
                if choice.undo:
                    outcome = await undo_rewind(chat.session, chat.config.workspace, self._blob_store(),
                                                force=choice.force, repo=self._snapshots())
                else:
                    outcome = await rewind(chat.session, chat.config.workspace, self._blob_store(), choice.to_turn,
                                           choice.scope, force=choice.force, repo=self._snapshots())
            except RewindRefused as e:
                if not e.changed or choice.force:
                    await chat.say(f"Nothing was rewound: {e}", "-warning")
                    return
                # changed outside Cairn after the dialog looked: ask again (never overwrite without a yes)
                from dataclasses import replace

                from .confirm import ConfirmDialog

                question = ("Changed outside Cairn since Cairn last wrote it: " + ", ".join(e.changed)
                            + f". Restoring to before turn {choice.to_turn} overwrites what is there now. Overwrite?")
                if await chat.app.push_screen_wait(ConfirmDialog(safe_text(question), yes="Overwrite",
                                                                 no="Leave it (rewind nothing)", typist=chat.keys)):
                    await self._rewind(replace(choice, force=True))
                else:
                    await chat.say("Nothing was rewound: " + ", ".join(e.changed) + " changed outside Cairn.",
                                   "-warning")
                return
            await chat.say("\n".join(describe(outcome)), "-warning" if outcome.skipped else "")
            if outcome.conversation and not outcome.undo:
                self._repropose(choice.to_turn)
        finally:
            self.rewinding = False
            if chat.is_attached:
                chat.prompt_input.focus()

    def _repropose(self, turn: int) -> None:
        """After a conversation rewind, the rewound turn's prompt waits in an empty prompt: send, edit or drop it."""
        from ..agent.rewind_plan import prompts

        prompt = self.chat.prompt_input
        text = dict(prompts(self.chat.session.events)).get(turn)
        if text and not prompt.text.strip():
            prompt.insert(text)
