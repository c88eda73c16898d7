"""The TUI's approver (SPEC §8): each approval the agent asks for is a modal over the chat. The loop waits on a future
the modal's dismissal resolves; a turn cancelled meanwhile takes its modal away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.screen import Screen

    from ..agent.approval import ApprovalAnswer, ApprovalRequest
    from .typeahead import Typist


class ModalApprover:
    """`owner`: the screen the modals open over; `typist`: where keys typed while a modal waits for Tab go;
    `decided`: told after each answer (a session grant shows in the status bar)."""

    def __init__(self, owner: Screen[Any], workspace: Path, typist: Typist, decided: Callable[[], None]) -> None:
        self.owner = owner
        self.workspace = workspace
        self.typist = typist
        self.decided = decided

    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer:
        from ..agent.approval import ApprovalAnswer
        from .approval import ApprovalModal

        app = self.owner.app
        future: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()

        def decided(answer: ApprovalAnswer | None) -> None:
            if not future.done():
                future.set_result(answer or ApprovalAnswer("denied"))
            self.decided()

        modal = ApprovalModal(request, self.workspace, typist=self.typist)
        app.push_screen(modal, decided)
        try:
            return await future
        except asyncio.CancelledError:
            if modal.is_attached and app.screen is modal:
                modal.dismiss(ApprovalAnswer("cancelled"))
            raise
