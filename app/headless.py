"""`cairn run`: one headless turn through the same composition as every other face.

The answer streams to stdout as it arrives; tool activity and notices go to stderr, so stdout stays the answer (or, with
`--json`, one JSON line per event written by this run, repair events included). SIGINT/SIGTERM cancel the turn, which
still ends with real `step/end`/`turn/end` events, and the command exits 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import anyio

from cairn.persistence.events import (
    AnyEvent,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolResult,
    encode_event,
)

from .approval import headless_approver
from .cli import EXIT_CANCELLED, EXIT_OK, EXIT_TURN_ERROR, EXIT_USAGE, fail
from .compose import open_agent
from .render import first_line, result_status, summarize_arguments


class Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.out = sys.stdout
        self.ends_with_newline = True

    def __call__(self, event: AnyEvent) -> None:
        if self.as_json:
            self.out.buffer.write(encode_event(event) + b"\n")
            self.out.buffer.flush()
            return
        if isinstance(event, AssistantChunk):
            self.out.write(event.delta)
            self.out.flush()
            self.ends_with_newline = event.delta.endswith("\n")
        elif isinstance(event, AssistantMessage):
            self.finish_line()
        elif isinstance(event, ToolCall):
            note(f"→ {event.name}({summarize_arguments(event.arguments)})")
        elif isinstance(event, ApprovalDecided) and event.decision == "denied":
            note(f"  {event.call_id} denied: headless runs need --yes to allow side effects")
        elif isinstance(event, ToolResult):
            note(f"← {result_status(event)}: {first_line(event.content, 120)}")

    def finish_line(self) -> None:
        if not self.as_json and not self.ends_with_newline:
            self.out.write("\n")
            self.out.flush()
            self.ends_with_newline = True


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace, config: Any) -> int:
    prompt = " ".join(args.prompt)
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        return fail("the prompt is empty", EXIT_USAGE)
    return anyio.run(_run, args, config, prompt)


async def _run(args: argparse.Namespace, config: Any, prompt: str) -> int:
    printer = Printer(args.json)
    async with open_agent(
        config,
        session_id=args.session_id,
        resume=args.resume,
        approver=headless_approver(args.yes),
        report=lambda message: note(f"cairn: {message}"),
    ) as agent:
        session = agent.session
        if not args.json:
            note(f"cairn: session {session.id} ({config.backend}, {config.provider})")
        for event in session.repaired:
            if args.json:
                printer(event)
            elif isinstance(event, ToolResult):
                note(f"cairn: recovered call {event.call_id}: {result_status(event)}")
        session.subscribe(printer)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, agent.loop)
            result = await agent.run(prompt)
            tg.cancel_scope.cancel()
        printer.finish_line()
    if result.reason == "completed":
        return EXIT_OK
    if result.reason == "cancelled":
        return fail("turn cancelled", EXIT_CANCELLED)
    assert result.error is not None
    return fail(f"turn ended in error: {result.error.message} (session {session.id} can be resumed)", EXIT_TURN_ERROR)


async def _cancel_on_signal(loop: Any) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            loop.cancel()
