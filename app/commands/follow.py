"""`cairn show ID --follow [--json]` (SPEC §13 rev 4): after the session as it stands, each new event as it is
committed, until its writer ends (exit 0, a last line on stderr saying so and how the session stands) or Ctrl-C (exit 130).

Headless: what a CI log or a script tails. Text is `cairn show`'s rendering, event by event (streamed chunks are not
printed, as in `cairn show`: the answer appears whole when its message is committed); `--json` is one event per line,
every event chunks included, flushed at once. Read-only: never locks, never writes. Imports nothing of Textual, ACP or
MCP (a follower on a build box has none of them loaded).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cairn.persistence.events import (
    AnyEvent,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
)

from ..exit_codes import EXIT_CANCELLED, EXIT_OK


class EventLines:
    """`cairn show`'s lines for one event at a time, given what came before it (a result is named by its call)."""

    def __init__(self, before: list[AnyEvent]) -> None:
        self.calls = {e.call_id: e for e in before if isinstance(e, ToolCall)}

    def __call__(self, event: AnyEvent) -> str | None:
        from ..render import render_session

        if isinstance(event, (AssistantChunk, ReasoningChunk)):
            return None
        if isinstance(event, ToolCall):
            self.calls[event.call_id] = event
        call = self.calls.get(event.call_id) if isinstance(event, ToolResult) else None
        context: list[AnyEvent] = [call] if call is not None else []
        lines = render_session([*context, event]).splitlines()[len(context):]
        if isinstance(event, AssistantMessage) and event.usage is not None and lines:
            lines = lines[:-1]  # the session's token totals, which `cairn show` prints once, at the end
        return "\n".join(lines) or None


def follow_session(args: argparse.Namespace, store: Any, inspection: Any) -> int:
    """Follow the session `show_command` has just printed (`inspection`: what it printed, and who held it then)."""
    from cairn.persistence.events import encode_event
    from cairn.persistence.store import ending_status
    from cairn.widgets.terminal_text import safe_json, safe_text

    from ..inspect.follow import follow

    session_id = args.session_id
    if inspection.live_pid is None:
        print(f"cairn: session {session_id} is not live: nothing to follow", file=sys.stderr)
        return EXIT_OK
    status = ending_status(inspection.events)
    render = EventLines(inspection.events)
    try:
        for event in follow(store, session_id, len(inspection.events)):
            if isinstance(event, TurnEnd):
                status = event.reason
            elif isinstance(event, TurnStart):
                status = "interrupted"
            if args.json:
                sys.stdout.buffer.write(safe_json(encode_event(event)) + b"\n")
                sys.stdout.buffer.flush()
            elif (text := render(event)) is not None:
                print(safe_text(text), flush=True)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    if status == "interrupted":
        how = f"interrupted (its last turn has no end; `cairn resume {session_id}` repairs and continues it)"
    else:
        how = f"not interrupted (its last turn ended: {status})"
    print(safe_text(f"cairn: the writer of session {session_id} ended; the session is {how}"), file=sys.stderr)
    return EXIT_OK
