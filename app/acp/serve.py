"""`cairn acp`: serve the ACP agent over stdin/stdout until the client goes away or a signal asks us to stop.

stdout carries nothing but protocol. Logs go to stderr, and once the protocol stream holds the real stdout, `sys.stdout`
is pointed at stderr, so a stray print anywhere cannot corrupt the stream.

Shutdown is ordered, whatever starts it (stdin EOF: the client closed the pipe or died; SIGTERM or SIGINT): every
session stops its running turn the way `session/cancel` does and waits until the real `step/end`/`turn/end` are
written, then its checkpoint policy is removed, then its log is flushed, closed and unlocked (session.py). On a
signal the connection stays open until the cancelled prompts are answered, so a client still listening gets
`cancelled`; on EOF nobody is listening, and the sessions just close. Either way a later `cairn show` finds a log that
ends in a real `turn/end` with reason `cancelled`, not one that needs repair.

Malformed input: the package's reader logs and skips a line that is not JSON, and its receive loop dies on a line
that is JSON but not an object (or has an id that is not a string or a number), which would end the agent. JSON-RPC
2.0 asks for an answer instead (-32700 Parse error / -32600 Invalid Request, with id null), so every line passes
through `LineScreen` first: it answers those lines itself and hands the rest to the package unchanged. A message that
is neither a request, a notification nor a response (`{}`) is answered -32600 too (the package would drop it silently).
`session/cancel` is a notification, but some clients send it as a request (with an id): the package would answer
-32601 and the turn would run on, so the screen forwards it as the notification it means and answers it (null).
Everything else (routing, unknown methods -32601, bad params -32602) is the package's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any, cast

import acp
import anyio
from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES

from ..config.resolver import Config
from .agent import CairnAgent

log = logging.getLogger("cairn.acp")

PARSE_ERROR, INVALID_REQUEST = -32700, -32600
CANCEL_REQUEST = 1  # not an error: `session/cancel` sent as a request (see the module docstring)


def run_acp(config: Config, pending: bytes = b"") -> int:
    """Serve until the client goes away. early.py (the entry point of `cairn acp`) has checked the configuration and
    the stdio, and may already have answered `initialize`: `pending` is what it read from stdin and did not answer,
    read here first."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="cairn acp: %(levelname)s %(message)s")
    anyio.run(serve, config, pending)
    return 0


async def serve(config: Config, pending: bytes = b"") -> None:
    stdin, stdout = await acp.stdio_streams(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    sys.stdout = sys.stderr  # the real stdout now belongs to the protocol stream
    screened = asyncio.StreamReader(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    screen = LineScreen(stdin, screened, stdout, pending)
    async with anyio.create_task_group() as helpers:
        helpers.start_soon(screen.run)
        async with anyio.create_task_group() as hosts:
            agent = CairnAgent(config, hosts)
            helpers.start_soon(stop_on_signal, agent, screen)
            try:
                # (acp looks each method up by name, calls it with keywords and answers "method not found" for one an
                # agent lacks: CairnAgent implements the part of `acp.Agent` Cairn supports, not the whole protocol)
                served = cast(acp.Agent, agent)
                await acp.run_agent(served, stdout, screened, observers=[agent.observe])  # returns at end of input
            except Exception:
                log.exception("the connection failed")
            finally:
                await agent.shutdown()
        helpers.cancel_scope.cancel()
    log.info("stopped")


async def stop_on_signal(agent: CairnAgent, screen: "LineScreen") -> None:
    """The first SIGTERM/SIGINT/SIGHUP starts the ordered shutdown; a second one exits at once (the logs stay
    repairable: that is what repair is for)."""

    async def shutdown() -> None:
        await agent.shutdown()  # turns cancelled and closed, logs closed, prompts answered
        screen.end()  # then end the input, as an EOF would: the connection closes after its last answer

    stopping = False
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            async for signum in signals:
                name = signal.Signals(signum).name
                if stopping:
                    log.warning("%s again: exiting now", name)
                    os._exit(130)
                stopping = True
                log.info("%s: stopping every session", name)
                tg.start_soon(shutdown)


class LineScreen:
    """Reads protocol lines from stdin, answers the ones that are not JSON-RPC messages, forwards the rest."""

    def __init__(self, source: asyncio.StreamReader, sink: asyncio.StreamReader, out: asyncio.StreamWriter,
                 pending: bytes = b"") -> None:
        self.source, self.sink, self.out = source, sink, out
        self._ended = False
        # what early.py read from stdin and did not answer: its whole lines are screened before the stream's (an
        # unfinished last one is completed by what the stream reads next)
        *self._pending, self._partial = pending.split(b"\n")

    async def _next_line(self) -> bytes:
        if self._pending:
            return self._pending.pop(0) + b"\n"
        line = await self.source.readline()
        if self._partial:
            line, self._partial = self._partial + line, b""
        return line

    async def run(self) -> None:
        try:
            while not self._ended:
                try:
                    line = await self._next_line()
                except ValueError:  # longer than the buffer limit; what follows of it is answered as another bad line
                    self._answer(PARSE_ERROR, "Parse error: message too large")
                    continue
                if not line:
                    break
                problem = check_line(line)
                if problem is None:
                    self.sink.feed_data(line)
                elif problem[0] == CANCEL_REQUEST:
                    self._cancel_request(line)
                elif problem[0]:
                    self._answer(*problem)
        finally:
            self.end()

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self.sink.feed_eof()

    def _cancel_request(self, line: bytes) -> None:
        message = json.loads(line)
        notification = {"jsonrpc": "2.0", "method": message["method"], "params": message.get("params")}
        self.sink.feed_data((json.dumps(notification) + "\n").encode())
        self.out.write((json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": None}) + "\n").encode())

    def _answer(self, code: int, message: str) -> None:
        # One whole line per write(): the package's sender writes whole lines too, so lines never interleave.
        error = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
        self.out.write((json.dumps(error) + "\n").encode())


def check_line(line: bytes) -> tuple[int, str] | None:
    """None for a line the package can handle; otherwise the error to answer (code 0: skip silently, a blank line)."""
    if not line.strip():
        return (0, "")
    try:
        message: Any = json.loads(line)
    except ValueError as e:
        return (PARSE_ERROR, f"Parse error: {e}")
    if not isinstance(message, dict):
        return (INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be a JSON object")
    if "id" in message and not isinstance(message["id"], (str, int, float, type(None))):
        return (INVALID_REQUEST, "Invalid Request: id must be a string, a number or null")
    if "method" not in message and not ("id" in message and ("result" in message or "error" in message)):
        return (INVALID_REQUEST, "Invalid Request: a message needs a method (request, notification) or an id with "
                "a result or an error (response)")
    if message.get("method") == "session/cancel" and message.get("id") is not None:
        return (CANCEL_REQUEST, "")
    return None
