"""The review of recovered calls (SPEC §2 rev 3): calls an interrupted turn left unresolved are shown in the resume
dialog when the session opens, and again with `/verdict` while an OUTCOME_UNKNOWN call waits for a verdict. Each verdict
is durable before its dialog closes; no prompt is sent while the review is open (`reviewing`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from cairn.persistence.events import RecoveryVerdict
from cairn.persistence.repair import calls_awaiting_verdict

if TYPE_CHECKING:
    from textual.app import App

    from cairn.persistence.session import LiveSession
    from cairn.widgets.prompt_input import PromptInput

    from ..config.resolver import Config
    from .resume import RecoveredCall
    from .rewind_flow import RewindFlow
    from .typeahead import KeyRouter


class ReviewHost(Protocol):
    """What the review needs from the chat it runs in."""

    @property
    def app(self) -> App[Any]: ...
    @property
    def session(self) -> LiveSession: ...
    @property
    def config(self) -> Config: ...
    @property
    def keys(self) -> KeyRouter: ...
    @property
    def works_elsewhere(self) -> bool: ...
    @property
    def turn_running(self) -> bool: ...
    @property
    def prompt_input(self) -> PromptInput: ...
    @property
    def rewind_flow(self) -> RewindFlow: ...

    async def say(self, text: str, kind: str = "") -> None: ...


class CallReview:
    def __init__(self, chat: ReviewHost) -> None:
        self.chat = chat
        self.reviewing = False  # the resume dialog is open: no prompt is sent meanwhile

    async def at_start(self) -> None:
        """As the session opens: the calls to review if an interrupted turn left any, else what the repair found (and
        a rewind a crash interrupted, settled before the next turn)."""
        chat = self.chat
        events = chat.session.events
        calls: list[RecoveredCall] = []
        if chat.session.repaired or calls_awaiting_verdict(events):
            from .resume import recovered_from  # (imported only when there may be calls to show: start-up, P8)

            calls, first_prompt, text = recovered_from(events)
        if calls:
            self.open(calls, first_prompt, text, raised=True)
            return
        if chat.session.repaired:
            await chat.say("This session was interrupted; no tool call was in flight, so nothing needs checking.",
                           "-warning")
        chat.prompt_input.focus()
        chat.rewind_flow.settle_interrupted()

    async def waiting_for_verdict(self) -> None:
        """`/verdict`: the OUTCOME_UNKNOWN calls still waiting for the operator's verdict."""
        from .resume import recovered_from

        chat = self.chat
        calls = [c for c in recovered_from(chat.session.events)[0] if c.status == "OUTCOME_UNKNOWN"]
        waiting = {r.call_id for r in calls_awaiting_verdict(chat.session.events)}
        calls = [c for c in calls if c.call_id in waiting]
        if not calls:
            await chat.say("No OUTCOME_UNKNOWN call is waiting for a verdict.")
        elif chat.turn_running:
            await chat.say("Verdicts are recorded between turns: wait for this one to end (or Esc).", "-warning")
        else:
            _, first_prompt, text = recovered_from(chat.session.events)
            self.open(calls, first_prompt, text)

    def open(self, calls: list[RecoveredCall], prompt: str, text: str, raised: bool = False) -> None:
        """The resume dialog over `calls`. `raised`: Cairn opens it by itself (a session reopened with calls to
        review), so keys typed meanwhile wait in the prompt until Tab; from `/verdict` it takes keys at once."""
        from .resume import ResumeScreen, ended_by_cancel

        chat = self.chat
        self.reviewing = True
        chat.app.push_screen(ResumeScreen(chat.session.id, calls, prompt, text, workspace=chat.config.workspace,
                                          elsewhere=chat.works_elsewhere, cancelled=ended_by_cancel(chat.session.events),
                                          save_verdict=self._save_verdict, typist=chat.keys, raised=raised),
                             self._closed)

    async def _save_verdict(self, call_id: str, verdict: str, note: str) -> None:
        """An operator's verdict, durable before its dialog closes (SPEC §2 rev 3); raises CheckpointFailed."""
        self.chat.session.append(RecoveryVerdict(call_id=call_id, verdict=verdict, note=note))  # type: ignore[arg-type]
        await self.chat.session.flush()

    def _closed(self, calls: list[RecoveredCall] | None) -> None:
        # each verdict was appended and made durable when its dialog closed (_save_verdict)
        self.reviewing = False
        self.chat.prompt_input.focus()
        self.chat.rewind_flow.settle_interrupted()
