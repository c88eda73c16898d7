"""One MCP server's connection: its transport and client session, from start to teardown, restarts and calls.

A `Connection` is a task that owns the server's transport (a stdio process, or a streamable HTTP client) and its SDK
session. It says what a face can show (`ServerState`), lists the server's tools (leaving out the ones Cairn cannot
offer), starts a server again before the call that needs it once its connection broke, and turns what can go wrong
during a call into the error the loop records: refused or malformed (`McpCallFailed`), never sent (it did not run), or
cut short (`McpOutcomeUnknown`, with its safety class's advice). A stdio server is started so that it dies with Cairn
(`_die_with_cairn`) and its stderr goes to a temporary file whose last line explains a failed start. The `mcp` SDK is
imported inside the methods that need it, never at import time.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Coroutine

import anyio

from ..config.mcp_servers import McpServerConfig
from .base import Safety, ToolContext
from .mcp_tools import McpCallFailed, McpOutcomeUnknown, render_result, schema_problem
from .mcp_wire import META_KEY, STDIO_ENCODING, http_client, register_codec

log = logging.getLogger("cairn.mcp")


@dataclass
class ServerState:
    """What a face can show about one server (`/mcp`): its state, why it failed, the tools it gave."""

    config: McpServerConfig
    status: str = "starting"  # starting | ready | failed | stopped | crashed
    error: str | None = None
    tools: list[str] = field(default_factory=list)  # exposed names
    server_info: str | None = None


class Connection:
    """One server: a task that owns its transport and client session from start to teardown."""

    def __init__(self, config: McpServerConfig, workspace: Path, environ: Any) -> None:
        self.config = config
        self.state = ServerState(config)
        self.workspace = workspace
        self.environ = environ
        self.session: Any = None
        self.listed: list[Any] = []
        self.ready = anyio.Event()
        self.finished = anyio.Event()
        self._stop = anyio.Event()
        self._scope = anyio.CancelScope()
        self._stderr: Any = None
        # starts a task beside the others (a restart)
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None
        self.bad_tools: list[str] = []  # one line each: a listed tool Cairn left out (a schema it cannot use)
        self.unsent: dict[str, str] = {}  # call id -> why its request never reached the server (HTTP: no connection)
        self._restarting: anyio.Event | None = None

    async def restart(self) -> bool:
        """Start the server again after its connection broke (SPEC §8 rev 3), before the call that needs it; True when
        it is ready. Concurrent callers wait for the one restart."""
        if self._restarting is not None:
            await self._restarting.wait()
            return self.session is not None
        if self.spawn is None:
            return False
        self._restarting = anyio.Event()
        try:
            self._stop.set()  # the old task still holds the dead transport: let it close it
            await self.finished.wait()
            self.state.status, self.state.error = "starting", None
            self.ready, self.finished, self._stop = anyio.Event(), anyio.Event(), anyio.Event()
            self._scope = anyio.CancelScope()
            self.spawn(self.run)
            with anyio.move_on_after(self.config.startup_timeout):
                await self.ready.wait()
            if not self.ready.is_set():
                self.abandon(f"it did not answer within {self.config.startup_timeout:g} s after a restart")
            return self.session is not None
        finally:
            self._restarting.set()
            self._restarting = None

    def stop(self) -> None:
        self._stop.set()

    def abandon(self, reason: str) -> None:
        """Give up on a server that did not start in time: its task stops it (bounded by the SDK's shutdown)."""
        self.fail(reason)
        self._scope.cancel()

    def fail(self, reason: str) -> None:
        if self.state.status in ("starting", "ready"):
            self.state.status = "failed" if self.state.status == "starting" else "crashed"
            self.state.error = reason
        self.ready.set()

    async def run(self) -> None:
        import mcp
        from mcp.types import Implementation

        from cairn.version import __version__

        try:
            with self._scope:
                async with AsyncExitStack() as stack:
                    streams = await stack.enter_async_context(self._transport(stack))
                    session = await stack.enter_async_context(mcp.ClientSession(
                        streams[0], streams[1], client_info=Implementation(name="cairn", version=__version__)))
                    init = await session.initialize()
                    info = getattr(init, "server_info", None)
                    self.state.server_info = f"{info.name} {info.version}".strip() if info else None
                    self.listed = await self._list_tools(session)
                    self.session = session
                    self.state.status = "ready"
                    self.ready.set()
                    await self._stop.wait()
        except Exception as e:  # noqa: BLE001 -- any failure of one server is that server's, never the session's
            self.fail(self._why(e))
            log.info("MCP server %s: %s", self.config.name, self.state.error)
        finally:
            self.session = None
            if self.state.status == "ready":
                self.state.status = "stopped"
            elif self.state.status == "starting":
                self.fail("stopped before it was ready")
            if self._stderr is not None:
                self._stderr.close()
            self.finished.set()

    async def _list_tools(self, session: Any) -> list[Any]:
        """Every tool the server lists that Cairn can offer; each one left out is one line in `bad_tools` (this
        start's: a restart lists again)."""
        self.bad_tools = []
        tools: list[Any] = []
        cursor = None
        for _ in range(100):  # a paginator that never ends must not hang the start
            from mcp.types import PaginatedRequestParams

            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            try:
                page = await session.list_tools(params=params)
            except ValueError:  # pydantic: one tool the SDK cannot take must not cost the server its other tools
                page_tools, cursor = await self._list_tools_one_by_one(session, cursor)
                tools.extend(page_tools)
            else:
                tools.extend(page.tools)
                cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
        usable = []
        for tool in tools:
            problem = schema_problem(getattr(tool, "input_schema", None))
            if problem is None:
                usable.append(tool)
            else:
                self.bad_tools.append(f"tool `{str(tool.name)[:80]}` left out: {problem}")
        return usable

    async def _list_tools_one_by_one(self, session: Any, cursor: str | None) -> tuple[list[Any], str | None]:
        """The same page, read raw and checked tool by tool; each tool left out is one line in `bad_tools`."""
        from mcp.types import Tool as McpTool

        # the SDK validates a page as a whole: read it unvalidated (pinned SDK: mcp 2.3.0's dispatcher)
        raw = await session._dispatcher.send_raw_request("tools/list", {"cursor": cursor} if cursor else None, {})
        listed = raw.get("tools") if isinstance(raw, dict) else None
        tools = []
        for item in listed if isinstance(listed, list) else []:
            name = item.get("name") if isinstance(item, dict) else None
            try:
                tools.append(McpTool.model_validate(item))
            except ValueError as e:
                first = str(e).splitlines()[1:2] or ["invalid"]  # pydantic: line 2 names the field
                self.bad_tools.append(f"tool `{str(name)[:80]}` left out: its definition is not valid MCP "
                                      f"({first[0].strip()[:120]})")
        next_cursor = raw.get("nextCursor") if isinstance(raw, dict) else None
        next_cursor = next_cursor if isinstance(next_cursor, str) and next_cursor else None
        from mcp.types import ListToolsResult

        # the SDK checks each call's result against its own listing, and lists again (failing) when a tool is missing
        session._absorb_tool_listing(ListToolsResult(tools=tools), complete=cursor is None and next_cursor is None)
        return tools, next_cursor

    def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.url:
            from mcp.client.streamable_http import streamable_http_client

            headers = dict(config.headers)
            if config.bearer_token_env:
                token = self.environ.get(config.bearer_token_env)
                if not token:
                    raise _StartError(f"{config.bearer_token_env} (bearer_token_env) is not set")
                headers["Authorization"] = f"Bearer {token}"
            client = http_client(headers, self.unsent)
            stack.push_async_callback(client.aclose)
            return streamable_http_client(config.url, http_client=client)
        from mcp import StdioServerParameters, stdio_client

        assert config.command is not None
        env = {name: self.environ[name] for name in config.env_vars if name in self.environ}
        env.update(config.env)
        path = env.get("PATH") or self.environ.get("PATH")
        command = config.command
        if os.sep not in command and shutil.which(command, path=path) is None:
            raise _StartError(f"command not found: {command}")
        cwd = (self.workspace / config.cwd) if config.cwd else self.workspace
        if not cwd.is_dir():
            raise _StartError(f"cwd {cwd} is not a directory")
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        executable, args = _die_with_cairn(command, list(config.args))
        # replacement, never a stalled call: invalid UTF-8 from a server becomes U+FFFD (SPEC §8 rev 3), and so does a
        # lone surrogate escape (rev 4), read through Cairn's codec before the SDK parses a line
        register_codec()
        return stdio_client(StdioServerParameters(command=executable, args=args, env=env, cwd=str(cwd),
                                                  encoding=STDIO_ENCODING, encoding_error_handler="replace"),
                            errlog=self._stderr)

    def stderr_tail(self) -> str:
        """The last line the server wrote on stderr (why it failed, usually), bounded."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 4096))
            lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""

    def _why(self, error: BaseException) -> str:
        from mcp.shared.exceptions import MCPError

        leaf = _leaf(error)
        if isinstance(leaf, _StartError):
            return str(leaf)
        tail = self.stderr_tail()
        if isinstance(leaf, MCPError) and "closed" in str(leaf).lower():
            reason = "it exited before answering"
        elif isinstance(leaf, OSError):
            reason = f"{type(leaf).__name__}: {leaf.strerror or leaf}"
        else:
            reason = f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
        return f"{reason} ({tail})" if tail else reason

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext, safety: Safety, shown: str) -> str:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        from cairn.persistence.repair import SAFETY_ADVICE

        name = self.config.name
        if self.session is not None and _connection_ended(self.session):
            # the server went away between calls (a stdio server that exited): nothing was sent, so this call has not
            # begun; the connection is started again first, as after any break (SPEC §8)
            tail = self.stderr_tail()
            self.fail("its connection ended between calls" + (f" ({tail})" if tail else ""))
            self.session = None
        if self.session is None and self.state.status == "crashed":
            log.info("MCP server %s: restarting it for a call (%s)", name, self.state.error)
            await self.restart()
        session = self.session
        if session is None:
            raise McpCallFailed(f"the MCP server `{name}` is not running ({self.state.error or self.state.status}); "
                                f"`{shown}` was not called")
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=self.config.call_timeout,
                                             meta={META_KEY: ctx.call_id})
        except MCPError as e:
            if e.code == CONNECTION_CLOSED and ctx.call_id in self.unsent:
                why = self.unsent.pop(ctx.call_id)
                self.fail(f"it could not be reached ({why})")
                self.session = None
                raise McpCallFailed(
                    f"the MCP server `{name}` could not be reached ({why}), so this call to `{shown}` was never sent "
                    "and did not run. Retry it if it is still needed: Cairn starts the server again before the next "
                    "call."
                ) from None
            if e.code == CONNECTION_CLOSED:
                tail = self.stderr_tail()
                self.fail("it stopped during a call" + (f" ({tail})" if tail else ""))
                self.session = None
                raise McpOutcomeUnknown(
                    f"TOOL_OUTCOME_UNKNOWN: the MCP server `{name}` stopped while this call to `{shown}` was running, "
                    f"so it may or may not have taken effect. {SAFETY_ADVICE[safety]}"
                ) from None
            if e.code == REQUEST_TIMEOUT:
                raise McpOutcomeUnknown(
                    f"TOOL_OUTCOME_UNKNOWN: the MCP server `{name}` did not answer this call to `{shown}` within "
                    f"{self.config.call_timeout:g} s, so it may or may not have taken effect. {SAFETY_ADVICE[safety]}"
                ) from None
            raise McpCallFailed(f"the MCP server `{name}` refused the call: {e.message}") from None
        except RuntimeError as e:  # results Cairn does not take (input requests, claimed extension results)
            raise McpCallFailed(f"the MCP server `{name}` answered in a way Cairn cannot use: {e}") from None
        except ValueError as e:  # a result that does not match the protocol (pydantic's ValidationError is one)
            raise McpCallFailed(f"the MCP server `{name}` sent a malformed result: {str(e)[:300]}") from None
        text = render_result(result)
        if getattr(result, "is_error", False):
            raise McpCallFailed(text or f"`{shown}` failed (the server gave no details)")
        return text


def _connection_ended(session: Any) -> bool:
    """Whether the SDK session already saw its connection end (its dispatcher closed: the server's output ended), so a
    request now would not be sent at all (pinned SDK: mcp 2.3.0's JSONRPCDispatcher)."""
    return getattr(getattr(session, "_dispatcher", None), "_closed", False) is True


class _StartError(Exception):
    """A reason a server cannot start that needs no traceback (command not found, a token not set)."""


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


# Run before the server's own command: set the parent-death signal (Linux; it survives exec), then exec the command.
_LAUNCHER = (
    "import ctypes,os,signal,sys\n"
    "try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "except Exception: pass\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "try: os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e: print(f'cannot run {sys.argv[2]}: {e.strerror}', file=sys.stderr); os._exit(127)\n"
)


def _die_with_cairn(command: str, args: list[str]) -> tuple[str, list[str]]:
    """The command line that starts `command` so that it dies with Cairn: with the parent-death signal set (Linux),
    checked against Cairn's pid so a server started just as Cairn died exits at once."""
    if not sys.platform.startswith("linux"):
        return command, args
    return sys.executable, ["-I", "-S", "-c", _LAUNCHER, str(os.getpid()), command, *args]
