"""Tools from Model Context Protocol servers, with Cairn's crash semantics.

Servers come from the config file (`[mcp_servers.NAME]`) and, in ACP, from the editor (`session/new` / `session/load`
`mcpServers`). They start with the session, in parallel, each within its `startup_timeout`; one that fails is reported
through the composition's `report` callback and its tools are simply absent, so the session still works. Their tools
join the registry as `NAME__tool`, and their safety class comes from the tool's annotations (`safety_from_annotations`),
because recovery guidance has to be right for tools nobody here wrote:

    readOnlyHint                  → read_only       (parallel, no approval, retry after a crash is safe)
    idempotentHint, not read-only → idempotent      (approval; retry is safe)
    anything else                 → side_effecting  (approval; verify before retrying) — the safe default, also for
                                                     a tool without annotations and for destructiveHint

A per-tool `safety` override in the config wins (the user knows the server better than its annotations do).

Every call carries its `call_id` in the request's `_meta` as `{"cairn/call_id": …}`: the idempotency key of SPEC §1, so a
server that honours keys can deduplicate a retried side effect after OUTCOME_UNKNOWN. A cancelled call reaches the
server as an MCP cancellation (the SDK sends `notifications/cancelled` when the awaiting task is cancelled); the loop
then records it as OUTCOME_UNKNOWN, as for any body cut short. A server that dies during a call turns that call into a
TOOL_OUTCOME_UNKNOWN error result at once (the connection closes; nothing waits for an answer that cannot come), with
the advice of its safety class. A call whose request never reached its server (an HTTP server that is down: no
connection could be made) is not that: it did not run, and its error says so and that it may be retried. What a
server sends is read before the SDK parses it (`replace_lone_surrogates`): invalid UTF-8 and lone surrogate escapes
(a TypeScript server that cut a string mid-emoji) become U+FFFD, so an answer is never dropped and no call waits for
its time limit. A listed tool whose definition or input schema Cairn cannot offer (a schema that is not an object's,
e.g. `{"type": "string"}`) is left out with one line naming the server and the tool (`report`, and `left_out` for
faces that show it later); the server's other tools stay.

Output keeps text; images, audio and binary resources are summarised in one line; the whole is bounded by
`truncate_output` like the built-in tools; secrets are scrubbed at append like every event. A server that exits
between calls is started again before the next one (its connection had ended: that call was never sent).

Lifecycle: `McpServers` is an async context manager entered by `compose.mount_agent` before the policy and the loop,
so the AsyncExitStack stops the servers after the loop has quiesced and before persistence closes. A stdio server runs
in its own process group (the SDK stops the whole tree at teardown) and, on Linux, with the parent-death signal set,
so a SIGKILLed Cairn leaves no server behind either. It gets only the SDK's minimal environment (HOME, PATH, …, none of
which names a key) plus what its `env` / `env_vars` give: those are the operator's own words for this server and are
passed as configured, so Cairn's keys (SPEC §10 rev 4) reach a server only when its table names them. The servers'
secret values (tokens, secret-looking `env` values) are withheld from `run_command` in turn (`command.withhold`): a
command could print them in a form the log's scrubber cannot recognise. Its stderr goes to a temporary file whose last
line explains a failed start, never to the terminal (it would corrupt the TUI).

The `mcp` package (which brings pydantic) is imported only when a server is configured: `cairn run`, `show` and
`sessions` start-up stays lean without one. This module itself imports nothing heavy at import time.

This module holds `McpServers`, the servers of one session; the rest is split by job: the `[mcp_servers.NAME]` tables
and an editor's servers are read and checked in `config.mcp_servers`, one server's connection is `mcp_connection`,
its tools as Cairn's tools are `mcp_tools`, and what a server sends is read in `mcp_wire`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import anyio
import anyio.abc
import anyio.to_thread

from cairn.widgets.terminal_text import safe_text

from ..config.mcp_servers import McpServerConfig, server_secrets
from .base import Tool
from .command import withhold
from .mcp_connection import Connection, ServerState
from .mcp_tools import as_tool, exposed_name

log = logging.getLogger("cairn.mcp")


class McpServers:
    """The configured servers of one session, started in parallel and stopped together (an async context manager).

    `async with` starts them and waits until each is ready or has failed. `start()` (then `async with`, or `close()`)
    starts them in the background instead (issue 29: a session opens without waiting for its servers; the SDK import
    runs in a thread): `settled` is set once every server is ready or has failed and its tools are in `tools`;
    `wait_ready()` waits for that; `on_change` callbacks hear each state change (a status bar)."""

    def __init__(self, configs: Iterable[McpServerConfig], workspace: Path, *,
                 report: Callable[[str], None] | None = None, environ: Any = None) -> None:
        environ = os.environ if environ is None else environ
        self.connections = [Connection(c, workspace, environ) for c in configs if c.enabled]
        self.report = report or (lambda message: log.warning("%s", message))
        self.tools: list[Tool] = []
        self.secrets = [s for c in self.connections for s in server_secrets(c.config, environ)]
        withhold(values=self.secrets)
        self._tasks: anyio.abc.TaskGroup | None = None
        self.settled = anyio.Event()
        self.on_change: list[Callable[[], None]] = []  # called after any server's state changed
        self.on_settled: list[Callable[[list[Tool]], None]] = []  # called once, with the tools of the ready servers
        # one line per listed tool left out (a definition or schema Cairn cannot offer), also given to `report` as the
        # servers settle: a face that shows its notices later (ACP's greeting) names them from here
        self.left_out: list[str] = []
        self._closed = False
        self._stopping = False

    @property
    def states(self) -> list[ServerState]:
        return [c.state for c in self.connections]

    @property
    def starting(self) -> list[str]:
        """Names of the servers still starting."""
        return [c.config.name for c in self.connections if c.state.status == "starting"]

    async def __aenter__(self) -> McpServers:
        if self._tasks is None:
            await self.start()
        try:
            await self.wait_ready()
        except BaseException:
            await self._close(cancel=True)
            raise
        return self

    async def start(self) -> None:
        """Start every server in the background and return at once (see the class docstring)."""
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._start_all)

    async def wait_ready(self) -> None:
        """Until every server is ready or has failed (each within its `startup_timeout`)."""
        await self.settled.wait()

    async def _start_all(self) -> None:
        assert self._tasks is not None
        try:
            if self.connections:  # the SDK takes ~0.6 s to import: off the event loop, so a TUI stays responsive
                await anyio.to_thread.run_sync(_load_sdk)
            for connection in self.connections:
                if self._stopping:  # stopped while the SDK loaded: start nothing
                    connection.fail("stopped before it was ready")
                    continue
                connection.spawn = self._tasks.start_soon
                self._tasks.start_soon(connection.run)
            async with anyio.create_task_group() as waiting:
                for connection in self.connections:
                    waiting.start_soon(self._await_start, connection)
            for connection in self.connections:
                if connection.state.status == "ready":
                    self._register(connection)
                else:
                    self.report(f"MCP server `{connection.config.name}` did not start: {connection.state.error}; "
                                "its tools are not available in this session")
        finally:
            self.settled.set()
            self._changed()
        for callback in self.on_settled:
            callback(list(self.tools))

    def _changed(self) -> None:
        for callback in self.on_change:
            try:
                callback()
            except Exception:  # noqa: BLE001 -- a display's failure is not the servers'
                log.exception("MCP state callback failed")

    async def _await_start(self, connection: Connection) -> None:
        with anyio.move_on_after(connection.config.startup_timeout):
            await connection.ready.wait()
        if not connection.ready.is_set():
            connection.abandon(f"it did not answer within {connection.config.startup_timeout:g} s")
        self._changed()

    def _register(self, connection: Connection) -> None:
        config = connection.config
        for line in connection.bad_tools:
            self.left_out.append(f"MCP server `{config.name}`: {line}")
            self.report(self.left_out[-1])
        taken = {t.name for t in self.tools}
        names = {t.name for t in connection.listed}
        for wanted in (config.enabled_tools or ()):
            if wanted not in names:
                self.report(f"MCP server `{config.name}` has no tool `{wanted}` (enabled_tools)")
        for listed in connection.listed:
            if config.enabled_tools is not None and listed.name not in config.enabled_tools:
                continue
            if listed.name in config.disabled_tools:
                continue
            shown = exposed_name(config.name, listed.name)
            if shown in taken:
                self.report(f"MCP server `{config.name}`: tool `{listed.name}` skipped, its name `{shown}` is taken")
                continue
            taken.add(shown)
            self.tools.append(as_tool(config, listed, shown, connection.call))
            connection.state.tools.append(shown)

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close(cancel=False)

    async def stop(self) -> None:
        """Stop every server and wait until each has stopped (before the session closes); a start still under way is
        abandoned. `close()` (or leaving `async with`) then ends the task group."""
        self._stopping = True
        if not self.settled.is_set():
            for connection in self.connections:
                connection.abandon("stopped before it was ready")
            with anyio.CancelScope(shield=True):
                await self.settled.wait()
        for connection in self.connections:
            connection.stop()
        with anyio.CancelScope(shield=True):
            for connection in self.connections:
                if connection.spawn is not None:
                    await connection.finished.wait()

    async def close(self) -> None:
        await self._close(cancel=False)

    async def _close(self, *, cancel: bool) -> None:
        """Stop every server (each closes its stdin, waits, then stops its process group: the SDK bounds each wait)."""
        if self._closed:
            return
        self._closed = self._stopping = True
        assert self._tasks is not None
        for connection in self.connections:
            connection.stop()
        if cancel or not self.settled.is_set():
            self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(None, None, None)


def _load_sdk() -> None:
    import mcp  # noqa: F401
    import mcp.client.stdio  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401

    _one_line_sdk_logs()


class _OneLine(logging.Formatter):
    """The SDK's warnings as one line each (it logs a whole traceback for a line a server garbled)."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            try:  # pydantic: the first error's own words, not its multi-line report
                detail = str(error.errors()[0].get("msg"))  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            text = f"{text}: {detail}"
        return "cairn: MCP: " + " ".join(safe_text(text).split())[:300]


def _one_line_sdk_logs() -> None:
    sdk = logging.getLogger("mcp")
    if not any(isinstance(h.formatter, _OneLine) for h in sdk.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(_OneLine())
        sdk.addHandler(handler)
        sdk.propagate = False
