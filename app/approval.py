"""Approval of side-effecting and idempotent tool calls (SPEC §8). Each face supplies its own approver: the TUI asks
with a modal, ACP asks the client, headless runs decide from `--yes`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from cairn.persistence.events import Decision


@dataclass(frozen=True)
class ApprovalRequest:
    call_id: str
    name: str
    arguments: dict[str, Any]
    safety: str
    turn: int
    step: int


Approver = Callable[[ApprovalRequest], Awaitable[Decision]]


def needs_approval(safety: str) -> bool:
    return safety != "read_only"


def headless_approver(yes: bool) -> Approver:
    """`--yes` allows every call once; without it, calls that need approval are denied (nobody is there to ask)."""

    async def decide(request: ApprovalRequest) -> Decision:
        return "allowed_once" if yes else "denied"

    return decide
