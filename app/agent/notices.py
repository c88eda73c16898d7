"""What faces hear from the loop besides the session's events: one typed channel for what is not in the log.

A face hears about a turn in two ways only. The session's events (`session.subscribe`) are the durable record: every
turn, step, message and call. The loop's `notices` carry what is transient and never written: a summary request
running, a silent server, the context window learnt, a queued turn's result handed back. A face subscribes once
(`loop.notices.append(listener)`) and matches on the notice's type. Hooks (hooks.py) are a control seam for plug-ins
such as the checkpoint policy, not a way for faces to listen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cairn.persistence.events import TurnError


@dataclass
class TurnResult:
    turn: int
    reason: str  # completed | cancelled | error
    error: TurnError | None
    text: str  # the last assistant text of the turn


@dataclass(frozen=True)
class Compacting:
    """A summary request started (True) or ended (False)."""

    active: bool


@dataclass(frozen=True)
class Waiting:
    """How long the server has sent nothing, every few seconds while it stays silent; None once it answers again or
    the attempt ends."""

    seconds: float | None


@dataclass(frozen=True)
class WindowKnown:
    """The context window requests must fit and where it came from, whenever it is first known or changes."""

    window: int
    source: str


@dataclass(frozen=True)
class TurnFinished:
    """A queued turn ended (in the loop's task, its lock released, before the loop takes the next prompt): also a
    turn refused before it started, which has no `turn/end`."""

    result: TurnResult


Notice = Compacting | Waiting | WindowKnown | TurnFinished
OnNotice = Callable[[Notice], None]


def tell(listeners: list[OnNotice], notice: Notice) -> None:
    for listener in listeners:
        listener(notice)
