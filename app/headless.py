"""`cairn run`: one headless turn through the same composition as every other face.

The answer streams to stdout as it arrives; the model's reasoning, tool activity and notices go to stderr, so stdout
stays the answer (or, with `--json`, a `{"type": "session", …}` line and then one JSON line per event written by this
run, repair events included). Everything printed in text mode that came from outside (model, tools, prompt, session
file) goes through `safe_text`, so an escape sequence in it cannot act on the terminal. SIGINT/SIGTERM cancel the turn,
which still ends with real `step/end`/`turn/end` events, and the command exits 130.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from typing import Any, TextIO

import anyio
import msgspec

from cairn.persistence.events import (
    MAX_TOKENS,
    AnyEvent,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    RequestRetry,
    ToolCall,
    ToolResult,
    encode_event,
)
from cairn.widgets.terminal_text import safe_json, safe_text

from .agent.approval import headless_approver
from .agent.notices import Notice, Waiting
from .compose import Agent, open_agent
from .exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_TURN_ERROR, EXIT_USAGE, fail
from .render import first_line, result_status, shown_model, summarize_arguments

REASONING_PREFIX = "thinking┆ "
DIM, RESET = "\x1b[2m", "\x1b[0m"


class Printer:
    def __init__(self, as_json: bool, err: TextIO | None = None) -> None:
        self.as_json = as_json
        self.out = sys.stdout
        self.err = err or sys.stderr
        self.ends_with_newline = True
        self.line_broken = False  # a notice broke the answer's open line on the shared terminal (`note`)
        self.dim = _wants_colour(self.err)
        self.thinking = False  # a reasoning line is open on stderr
        self.thinking_at_line_start = True

    def __call__(self, event: AnyEvent) -> None:
        if self.as_json:
            self.out.buffer.write(safe_json(encode_event(event)) + b"\n")
            self.out.buffer.flush()
            return
        if isinstance(event, ReasoningChunk):
            self.reasoning(event.delta)
            return
        if isinstance(event, AssistantChunk):
            self.end_reasoning()
            self.out.write(safe_text(event.delta))
            self.out.flush()
            self.ends_with_newline = event.delta.endswith("\n")
            self.line_broken = False
        elif isinstance(event, AssistantMessage):
            self.end_reasoning()
            self.finish_line()
        elif isinstance(event, ToolCall):
            self.note(f"→ {event.name}({summarize_arguments(event.arguments)})")
        elif isinstance(event, ApprovalDecided) and event.decision == "denied":
            self.note(f"  {event.call_id} denied: headless runs need --yes to allow side effects")
        elif isinstance(event, ToolResult):
            self.note(f"← {result_status(event)}: {first_line(event.content, 120)}")
        elif isinstance(event, RequestRetry):
            self.note(f"cairn: {event.reason}; retrying in {event.delay_ms / 1000:.1f} s (attempt {event.attempt})")

    def reasoning(self, delta: str) -> None:
        """Stream the model's thinking to stderr, every line prefixed (and dimmed on a terminal) so it is never
        mistaken for the answer."""
        if not delta:
            return
        text = safe_text(delta)
        pieces: list[str] = []
        for line in text.splitlines(keepends=True):
            if self.thinking_at_line_start:
                pieces.append(REASONING_PREFIX)
            pieces.append(line)
            self.thinking_at_line_start = line.endswith("\n")
        body = "".join(pieces)
        self.err.write(f"{DIM}{body}{RESET}" if self.dim else body)
        self.err.flush()
        self.thinking = not self.thinking_at_line_start

    def end_reasoning(self) -> None:
        if self.thinking:
            self.err.write("\n")
            self.err.flush()
        self.thinking = False
        self.thinking_at_line_start = True

    def note(self, message: str) -> None:
        """A notice on a line of its own: when the answer's line is open on the same terminal or file, it is broken on
        stderr first (stdout, the answer itself, is never changed)."""
        self.end_reasoning()
        open_line = not (self.ends_with_newline or self.line_broken)
        lead = "\n" if open_line and _same_destination(self.out, self.err) else ""
        self.line_broken = self.line_broken or bool(lead)
        print(lead + safe_text(message), file=self.err, flush=True)

    def finish_line(self) -> None:
        if not self.as_json and not self.ends_with_newline:
            self.out.write("\n")
            self.out.flush()
            self.ends_with_newline = True


def _wants_colour(stream: TextIO) -> bool:
    try:
        return stream.isatty() and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError):
        return False


def _same_destination(out: TextIO, err: TextIO) -> bool:
    """Whether stdout and stderr end up in one place (a terminal, `2>&1` into a file or pipe)."""
    try:
        a, b = os.fstat(out.fileno()), os.fstat(err.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) or (out.isatty() and err.isatty())


def note(message: str) -> None:
    print(safe_text(message), file=sys.stderr, flush=True)


def read_prompt(words: list[str]) -> str:
    """The prompt as text. Bytes that are not UTF-8 (in argv, Python hands them over as lone surrogates; on stdin, as
    raw bytes) become U+FFFD: the prompt is recorded and the turn runs, it is never refused for its encoding."""
    prompt = " ".join(words)
    if prompt == "-":
        return sys.stdin.buffer.read().decode("utf-8", "replace")
    return prompt.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_command(args: argparse.Namespace, config: Any) -> int:
    try:
        prompt = read_prompt(args.prompt)
    except UnicodeEncodeError:  # a surrogate that surrogateescape did not produce: replace it as is
        prompt = safe_text(" ".join(args.prompt))
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
        # MCP servers start first and in the background; the first request waits for them only (issue 29)
        mcp_background=True,
        mcp_waiting=lambda names: note(f"cairn: waiting for MCP server {', '.join(names)} to start"),
    ) as agent:
        session, provider = agent.session, agent.loop.provider
        assert agent.config is not None  # (open_agent always gives the effective config)
        if agent.loop.pending_rewind() is not None:  # nothing else runs until it is settled (SPEC §10)
            from .agent.rewind import pending_rewind, pending_text

            found = pending_rewind(session.events)
            assert found is not None
            return fail(pending_text(*found, session.id), EXIT_USAGE)
        if args.json:
            sys.stdout.buffer.write(safe_json(session_line(agent)) + b"\n")
            sys.stdout.buffer.flush()
        else:
            model = shown_model(provider.model, session.coordinator.secrets)
            note(f"cairn: session {session.id} ({agent.config.backend}, {provider.name} {model})")
        for event in session.repaired:
            if args.json:
                printer(event)
            elif isinstance(event, ToolResult):
                note(f"cairn: recovered call {event.call_id}: {result_status(event)}")
        session.subscribe(printer)
        name = provider.name

        def waiting(notice: Notice) -> None:  # a stalled server is visible, at least every 10 s
            if isinstance(notice, Waiting) and notice.seconds is not None:
                printer.note(f"cairn: waiting for the server ({name}): {notice.seconds:.0f} s (CAIRN_TIMEOUT limits "
                             "it; Ctrl+C cancels)")

        agent.loop.notices.append(waiting)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, agent.loop)
            result = await agent.run(prompt)
            tg.cancel_scope.cancel()
        printer.end_reasoning()
        printer.finish_line()
    if result.reason == "completed":
        return EXIT_OK
    if result.reason == "cancelled":
        return fail("turn cancelled", EXIT_CANCELLED)
    assert result.error is not None
    if result.error.code == MAX_TOKENS:
        return fail(f"{limit_words(agent)}; raise it with --max-tokens N or CAIRN_MAX_TOKENS "
                    f"(session {session.id} can be resumed)", EXIT_TURN_ERROR)
    return fail(f"turn ended in error: {result.error.message} (session {session.id} can be resumed)", EXIT_TURN_ERROR)


def session_line(agent: Agent) -> bytes:
    """The first `--json` line: which session this run writes to and what answers in it (not an event: no seq)."""
    assert agent.config is not None and agent.provider is not None
    return msgspec.json.encode({
        "type": "session", "id": agent.session.id, "backend": agent.config.backend,
        "provider": agent.provider.name, "model": shown_model(agent.provider.model, agent.session.coordinator.secrets),
    })


def limit_words(agent: Agent) -> str:
    """Name the output limit the answer hit: the `max_tokens` its request sent when it sent one (openai does)."""
    limit = agent.loop.output_limit
    if limit:
        return f"the answer hit the output limit of {limit} tokens (max_tokens) and was cut off"
    return f"the answer hit the {agent.loop.provider.name} provider's output limit and was cut off"


async def _cancel_on_signal(loop: Any) -> None:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) cancel the turn in order: the running command's process group
    is stopped, the real closing events are appended, the final flush and unlock follow. A second signal exits at once;
    the log is still repairable (that is what repair is for)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        first = True
        async for signum in signals:
            if not first:
                print(f"cairn: {signal.Signals(signum).name} again: exiting now (the session can be resumed)",
                      file=sys.stderr)
                os._exit(EXIT_CANCELLED)
            first = False
            loop.cancel()
