"""The status bar: session, the session's workspace when it is not where Cairn was started (SPEC §10), provider/model,
backend, turn state, what is allowed for the session (approval grants, revocable with /permissions), token usage and
durability ("durable through seq N").

Token usage is what the provider reported on `assistant/message.usage`: input (↑) and output (↓) tokens of the current
(or last) turn and of the whole session. It is left out while nothing is known, e.g. with a server that sends no usage.
"""

from __future__ import annotations

import msgspec
from textual.reactive import reactive
from textual.widgets import Static

from cairn.widgets.terminal_text import safe_text
from cairn.persistence.events import Usage


def format_tokens(n: int) -> str:
    """Compact counts for a one-line bar: 950, 12.3k, 123k, 1.2M."""
    if n < 1000:
        return str(n)
    if n < 100_000:
        return f"{n / 1000:.1f}k"
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1_000_000:.1f}M"


class TokenTotals(msgspec.Struct):
    """Sums of the counts providers reported; `known` stays False until some answer reported any."""

    input: int = 0
    output: int = 0
    known: bool = False

    def add(self, usage: Usage | None) -> None:
        if usage is None or (usage.input_tokens is None and usage.output_tokens is None):
            return
        self.input += usage.input_tokens or 0
        self.output += usage.output_tokens or 0
        self.known = True

    def __str__(self) -> str:
        return f"↑{format_tokens(self.input)} ↓{format_tokens(self.output)}"


def usage_text(turn: TokenTotals, session: TokenTotals) -> str:
    """`turn ↑1.2k ↓340 · session ↑12.3k ↓1.2k`; the session part alone when this turn reported nothing yet, and the
    turn part alone while it is the whole session."""
    if not session.known:
        return ""
    if not turn.known:
        return f"session {session}"
    if (turn.input, turn.output) == (session.input, session.output):
        return f"tokens {turn}"
    return f"turn {turn} · session {session}"


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    StatusBar.-failed { background: $error; color: $text; }
    """

    session_id: reactive[str] = reactive("")
    workspace: reactive[str] = reactive("")  # set only when the session works outside the current directory
    provider: reactive[str] = reactive("")
    backend: reactive[str] = reactive("")
    activity: reactive[str] = reactive("idle")
    grants: reactive[str] = reactive("")
    usage: reactive[str] = reactive("")
    durability: reactive[str] = reactive("")
    failed: reactive[bool] = reactive(False)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(markup=False, **kwargs)  # type: ignore[arg-type]

    # The parts in the order they go when the line is too long: least important first. Durability ("durable through
    # seq N") never goes and is never cut; the turn state goes last, the workspace (a session working elsewhere) just
    # before it.
    DROP_ORDER = (3, 2, 0, 6, 5, 1)

    def render(self) -> str:
        """All parts when they fit; on a narrow terminal the separators tighten, then parts go, least important first
        (backend, provider, session id — all on the sessions screen — then usage, then grants, then the workspace), so
        the turn state and durability stay; the turn state alone is shortened if even that is too long."""
        width = self.content_region.width or 1_000
        allowed = f"allowed: {self.grants}" if self.grants else ""
        workspace = f"in {self.workspace}" if self.workspace else ""
        parts = [self.session_id, workspace, self.provider, self.backend, self.activity, allowed, self.usage,
                 self.durability]
        line = "  │  ".join(p for p in parts if p)
        dropped: set[int] = set()
        for index in (None, *self.DROP_ORDER):
            if index is not None:
                dropped.add(index)
            if len(line) <= width:
                break
            line = " │ ".join(p for i, p in enumerate(parts) if p and i not in dropped)
        if len(line) > width and self.activity and self.durability:
            room = max(1, width - len(self.durability) - 3)
            activity = self.activity if len(self.activity) <= room else self.activity[: room - 1] + "…"
            line = f"{activity} │ {self.durability}" if room > 1 else self.durability
        return safe_text(line)

    def watch_failed(self, failed: bool) -> None:
        self.set_class(failed, "-failed")

    def show_usage(self, turn: TokenTotals, session: TokenTotals) -> None:
        self.usage = usage_text(turn, session)

    def show_durability(self, state: str, durable_seq: int, error: str | None = None) -> None:
        if state == "failed":
            self.failed = True
            self.durability = f"CHECKPOINT FAILED: {error}" if error else "CHECKPOINT FAILED"
        elif state == "writing":
            self.durability = "writing…"
        elif state == "closed":
            self.durability = f"closed, durable through seq {durable_seq}"
        else:
            self.failed = False
            self.durability = f"durable through seq {durable_seq}" if durable_seq >= 0 else "nothing written yet"
