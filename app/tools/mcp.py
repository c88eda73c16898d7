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
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import anyio
import anyio.abc
import anyio.to_thread

from cairn.widgets.terminal_text import safe_text

from .base import Safety, Tool, ToolContext, ToolFailure, truncate_output
from .command import withhold

log = logging.getLogger("cairn.mcp")

SEPARATOR = "__"  # NAME__tool
MAX_TOOL_NAME = 64  # what OpenAI-compatible servers accept for a function name
DEFAULT_STARTUP_TIMEOUT = 15.0
DEFAULT_CALL_TIMEOUT = 120.0  # SPEC §8 rev 3: every call has a time limit
MAX_DESCRIPTION = 2000
META_KEY = "cairn/call_id"
SAFETY_CLASSES: tuple[Safety, ...] = ("read_only", "idempotent", "side_effecting")
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"})
# environment variable names whose values are treated as secrets (scrubbed from every event)
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH)", re.I)
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
SERVER_KEYS = ("command", "args", "env", "env_vars", "cwd", "url", "headers", "bearer_token_env", "enabled_tools",
               "disabled_tools", "safety", "startup_timeout", "call_timeout", "enabled")


# ---------------------------------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server as configured: stdio (`command`) or streamable HTTP (`url`)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    env_vars: tuple[str, ...] = ()  # names passed through from Cairn's own environment
    cwd: str | None = None  # relative to the workspace; default: the workspace
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    bearer_token_env: str | None = None  # the variable holding a token sent as `Authorization: Bearer …`
    enabled_tools: tuple[str, ...] | None = None  # None: every tool the server lists
    disabled_tools: tuple[str, ...] = ()
    safety: dict[str, Safety] = field(default_factory=dict)  # tool (as the server names it) -> class
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT  # seconds; past it the call is OUTCOME_UNKNOWN
    enabled: bool = True
    origin: str = "config file"  # or "editor"

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


class McpConfigError(ValueError):
    """A bad `[mcp_servers.NAME]` table: `keys` below the table name and a message (config.file adds file and line)."""

    def __init__(self, keys: list[str], message: str) -> None:
        super().__init__(message)
        self.keys = keys
        self.message = message


def parse_server_table(name: str, table: Any) -> McpServerConfig:
    """Validate one `[mcp_servers.NAME]` table. Raises McpConfigError naming the key."""
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name) or SEPARATOR in name:
        raise McpConfigError([], "a server name must be a word of letters, digits, - and _ (at most 32, no \"__\"), "
                                 "since its tools are called NAME__tool")
    if not isinstance(table, dict):
        raise McpConfigError([], "must be a table ([mcp_servers.NAME] section)")
    for key in table:
        if key not in SERVER_KEYS:
            import difflib

            close = difflib.get_close_matches(key, SERVER_KEYS, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else f"; known settings: {', '.join(SERVER_KEYS)}"
            raise McpConfigError([key], "unknown setting" + hint)
    if ("command" in table) == ("url" in table):
        raise McpConfigError([], "needs exactly one of command (a stdio server) or url (a streamable HTTP server)")
    values: dict[str, Any] = {"name": name}
    checks: dict[str, Callable[[Any], Any]] = {
        "command": _text, "args": _strings, "env": _string_table, "env_vars": _env_names, "cwd": _text, "url": _url,
        "headers": _headers, "bearer_token_env": _env_name, "enabled_tools": _strings, "disabled_tools": _strings,
        "safety": _safety_table, "startup_timeout": _seconds, "call_timeout": _seconds, "enabled": _boolean,
    }
    for key, value in table.items():
        try:
            values[key] = checks[key](value)
        except ValueError as e:
            raise McpConfigError([key], str(e)) from None
    if "url" in values and ("args" in values or "env" in values or "env_vars" in values or "cwd" in values):
        raise McpConfigError([], "args, env, env_vars and cwd belong to a stdio server (command), not to a url")
    if "command" in values and ("headers" in values or "bearer_token_env" in values):
        raise McpConfigError([], "headers and bearer_token_env belong to an HTTP server (url), not to a command")
    return McpServerConfig(**values)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise ValueError("must be a non-empty string")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise ValueError("must be a list of strings, e.g. [\"a\", \"b\"]")
    return tuple(value)


def _string_table(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) and "\0" not in v for v in value.values()):
        raise ValueError("must be a table of names to string values, e.g. { LOG_LEVEL = \"debug\" }")
    for name in value:
        _env_name(name)
    return dict(value)


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", value):
        raise ValueError("must be the name of an environment variable, e.g. \"GITHUB_TOKEN\"")
    return value


def _env_names(value: Any) -> tuple[str, ...]:
    names = _strings(value)
    for name in names:
        _env_name(name)
    return names


def _url(value: Any) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value) if isinstance(value, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
        if ok:
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/mcp")
    if parts is not None and (parts.username or parts.password):
        raise ValueError("must not carry credentials; put a token in an environment variable and name it with "
                         "bearer_token_env")
    return value


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("must be a table of header names to string values, e.g. { \"X-Team\" = \"infra\" }")
    for name in value:
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise ValueError(f"has a header name that is not valid: {name[:40]!r}")
        if name.lower() in SECRET_HEADERS:
            raise ValueError(f"must not carry {name}: secrets are never read from the config file; name the variable "
                             "that holds the token with bearer_token_env")
    return dict(value)


def _safety_table(value: Any) -> dict[str, Safety]:
    if not isinstance(value, dict) or not all(v in SAFETY_CLASSES for v in value.values()):
        raise ValueError("must be a table of tool names to read_only, idempotent or side_effecting, "
                         "e.g. { create_ticket = \"idempotent\" }")
    return dict(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("must be a number of seconds > 0")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def from_editor(servers: Iterable[Any], taken: Iterable[str] = ()) -> tuple[list[McpServerConfig], list[str]]:
    """ACP `mcpServers` as server configs, and one line for each that Cairn cannot use (a transport it lacks). Works on
    the ACP schema objects by attribute, so this module never imports acp. Editor names are free text: they become a
    NAME (letters, digits, -, _), made unique."""
    configs: list[McpServerConfig] = []
    skipped: list[str] = []
    used = set(taken)
    for server in servers:
        shown = str(getattr(server, "name", "") or "?")
        kind = getattr(server, "type", None) or ("stdio" if getattr(server, "command", None) else "unknown")
        if kind not in ("stdio", "http"):
            skipped.append(f"{shown} ({kind} transport; Cairn supports stdio and http)")
            continue
        name = _editor_name(shown, used)
        used.add(name)
        if kind == "stdio":
            env = {e.name: e.value for e in getattr(server, "env", None) or []}
            configs.append(McpServerConfig(name=name, command=server.command, args=tuple(server.args or ()), env=env,
                                           origin="editor"))
        else:
            headers = {h.name: h.value for h in getattr(server, "headers", None) or []}
            configs.append(McpServerConfig(name=name, url=server.url, headers=headers, origin="editor"))
    return configs, skipped


def _editor_name(shown: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "_", shown).strip("_-").replace(SEPARATOR, "_")[:28] or "mcp"
    if not base[0].isalnum():
        base = "m" + base
    name, n = base, 2
    while name in used:
        name, n = f"{base}_{n}", n + 1
    return name


def server_secrets(config: McpServerConfig, environ: Any = None) -> list[str]:
    """Values that must never be stored: header values (an editor may send an Authorization header), the bearer
    token, and environment values whose name looks secret (GITHUB_TOKEN, …)."""
    environ = os.environ if environ is None else environ
    found = list(config.headers.values())
    if config.bearer_token_env and environ.get(config.bearer_token_env):
        found.append(environ[config.bearer_token_env])
    for name, value in config.env.items():
        if SECRET_NAME.search(name):
            found.append(value)
    for name in config.env_vars:
        if SECRET_NAME.search(name) and environ.get(name):
            found.append(environ[name])
    return [s for s in found if s and len(s) >= 4]


# ---------------------------------------------------------------------------------------------------- tools


def safety_from_annotations(annotations: Any) -> Safety:
    """The safety class an MCP tool's annotations give (see the module docstring); hints only, so unknown → the safe
    default."""
    if annotations is not None and getattr(annotations, "read_only_hint", None) is True:
        return "read_only"
    if annotations is not None and getattr(annotations, "idempotent_hint", None) is True:
        return "idempotent"
    return "side_effecting"


def exposed_name(server: str, tool: str) -> str:
    """`server__tool`, with characters model APIs refuse replaced by `_` and cut to MAX_TOOL_NAME."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", tool)
    return f"{server}{SEPARATOR}{clean}"[:MAX_TOOL_NAME]


def split_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of a name this module gave out, for displays; None for other tools."""
    server, sep, tool = name.partition(SEPARATOR)
    return (server, tool) if sep and server and tool else None


def render_result(result: Any) -> str:
    """A CallToolResult as text for the model and the log: text kept; images, audio and binary resources summarised
    (their bytes mean nothing in a transcript); structured content only when there is nothing else."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(getattr(block, "data", "") or "") * 3 // 4
            parts.append(f"[{kind} {getattr(block, 'mime_type', '') or ''}, about {size} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.name} {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(f"[resource {resource.uri}]\n{text}")
            else:
                size = len(getattr(resource, "blob", "") or "") * 3 // 4
                mime = getattr(resource, "mime_type", None) or "binary"
                parts.append(f"[resource {resource.uri}, {mime}, about {size} bytes, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return truncate_output("\n".join(parts))


def _schema(raw: Any) -> dict[str, Any]:
    """The input schema as offered to the model: an object schema (one without a `type` gets `"type": "object"`; a
    schema whose `type` is something else never reaches here, see `schema_problem`)."""
    schema = dict(raw) if isinstance(raw, dict) else {}
    kind = schema.get("type")
    if kind != "object":
        if isinstance(kind, list) and "object" in kind:
            return {**schema, "type": "object"}  # ["object", "null"]: Cairn always sends an object
        schema = {"type": "object", "properties": schema.get("properties") or {}}
    return schema


def schema_problem(raw: Any) -> str | None:
    """Why a listed tool's input schema cannot be offered to a model (None: it can). A tool's arguments are always a
    JSON object (MCP `tools/call`, and every model API's function parameters), so a schema that says otherwise — e.g.
    `{"type": "string"}` — describes arguments no call could send: the tool is left out (SPEC §8), never rewritten to
    an empty object the model would then call blind. A schema without a `type` is taken as an object's."""
    if not isinstance(raw, dict):
        return "its input schema is not a JSON object"
    kind = raw.get("type", "object")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return None
    shown = json.dumps(kind, ensure_ascii=False)
    return f"its input schema is not an object schema (type {shown[:40]}), and a tool's arguments are always an object"


class McpCallFailed(ToolFailure):
    """The server answered the call with an error (it ran, or refused to)."""


class McpOutcomeUnknown(ToolFailure):
    """The call was sent but no answer can come (the server died, or the call timed out): it may have taken effect."""

    code = "TOOL_OUTCOME_UNKNOWN"


# ---------------------------------------------------------------------------------------------------- servers


@dataclass
class ServerState:
    """What a face can show about one server (`/mcp`): its state, why it failed, the tools it gave."""

    config: McpServerConfig
    status: str = "starting"  # starting | ready | failed | stopped | crashed
    error: str | None = None
    tools: list[str] = field(default_factory=list)  # exposed names
    server_info: str | None = None


class _Connection:
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
        self.spawn: Callable[[Callable[[], Any]], None] | None = None  # starts a task beside the others (a restart)
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
        self._fail(reason)
        self._scope.cancel()

    def _fail(self, reason: str) -> None:
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
            self._fail(self._why(e))
            log.info("MCP server %s: %s", self.config.name, self.state.error)
        finally:
            self.session = None
            if self.state.status == "ready":
                self.state.status = "stopped"
            elif self.state.status == "starting":
                self._fail("stopped before it was ready")
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
            client = _http_client(headers, self.unsent)
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
        _register_codec()
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
            self._fail("its connection ended between calls" + (f" ({tail})" if tail else ""))
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
                self._fail(f"it could not be reached ({why})")
                self.session = None
                raise McpCallFailed(
                    f"the MCP server `{name}` could not be reached ({why}), so this call to `{shown}` was never sent "
                    "and did not run. Retry it if it is still needed: Cairn starts the server again before the next "
                    "call."
                ) from None
            if e.code == CONNECTION_CLOSED:
                tail = self.stderr_tail()
                self._fail("it stopped during a call" + (f" ({tail})" if tail else ""))
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


# ---------------------------------------------------------------------------------------------------- the wire

# JSON text from a server, read before the SDK parses it. A server on the official TypeScript SDK that cuts a string
# between the two halves of an emoji sends what JSON.stringify makes of it: a lone surrogate escape ("\ud83d"). The
# SDK's strict parser refuses the whole message, so the answer is lost and the call waits for its time limit (SPEC §8:
# never a stalled call). Each lone surrogate escape becomes "\ufffd" (U+FFFD, the same six characters, so a
# Content-Length stays right); a well-formed pair and every other escape pass unchanged. Escapes are read from left to
# right, so the "\\" of an escaped backslash is never taken for the start of one. Backslashes occur only inside JSON
# strings, so no other context is needed; only an escape cut by a chunk's end is held back for the next chunk.
_LOW_ESCAPE_PREFIX = re.compile(r"(\\(u([dD]([c-fC-F][0-9a-fA-F]{0,2})?)?)?)?")  # what may still become "\\udcXX"
_HEX = frozenset("0123456789abcdefABCDEF")
REPLACEMENT_ESCAPE = "\\ufffd"


def _hex4(text: str, at: int) -> int | None:
    """The value of the four hex digits at `at`, or None when they are not four hex digits."""
    digits = text[at:at + 4]
    return int(digits, 16) if len(digits) == 4 and all(c in _HEX for c in digits) else None


def replace_lone_surrogates(text: str, final: bool = True) -> tuple[str, str]:
    """(`text` with each lone surrogate escape replaced by "\\ufffd", the tail held back because an escape there is
    cut short — always "" when `final`)."""
    out: list[str] = []
    i, n = 0, len(text)
    while True:
        j = text.find("\\", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out), ""
        out.append(text[i:j])
        if not final and (j + 6 > n and _could_be_escape(text[j:])):
            return "".join(out), text[j:]
        if text[j + 1:j + 2] != "u" or (code := _hex4(text, j + 2)) is None:
            out.append(text[j:j + 2])  # any other escape ("\\\\", "\\n", …), or not one at all: unchanged
            i = j + 2
            continue
        i = j + 6
        if not 0xD800 <= code <= 0xDFFF:
            out.append(text[j:i])
            continue
        if code <= 0xDBFF:  # a high surrogate: whole only when a low one follows
            rest = text[i:i + 6]
            if not final and len(rest) < 6 and _LOW_ESCAPE_PREFIX.fullmatch(rest):
                return "".join(out), text[j:]
            low = _hex4(text, i + 2) if rest.startswith("\\u") else None
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                out.append(text[j:i + 6])
                i += 6
                continue
        out.append(REPLACEMENT_ESCAPE)


def _could_be_escape(tail: str) -> bool:
    """Whether `tail` (a backslash and fewer than six characters) may still become a \\uXXXX escape."""
    return tail == "\\" or (tail[1] == "u" and all(c in _HEX for c in tail[2:]))


class _JsonTextDecoder(codecs.IncrementalDecoder):
    """UTF-8 (with the error handler given, "replace" for servers), then lone surrogate escapes replaced."""

    def __init__(self, errors: str = "strict") -> None:
        super().__init__(errors)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors)
        self._held = ""

    def decode(self, data: Any, final: bool = False) -> str:
        text, self._held = replace_lone_surrogates(self._held + self._utf8.decode(data, final), final)
        return text

    def reset(self) -> None:
        self._utf8.reset()
        self._held = ""

    def getstate(self) -> tuple[bytes, int]:
        buffered, flag = self._utf8.getstate()
        return self._held.encode("ascii") + buffered, flag  # (what is held is an escape's start: ASCII)

    def setstate(self, state: tuple[bytes, int]) -> None:
        self.reset()
        self._utf8.setstate(state)


STDIO_ENCODING = "cairn_mcp_json"  # the codec a stdio server's output is read with (see `_JsonTextDecoder`)


def _find_codec(name: str) -> codecs.CodecInfo | None:
    if name != STDIO_ENCODING:
        return None

    def decode(data: Any, errors: str = "strict") -> tuple[str, int]:
        text, _ = codecs.utf_8_decode(data, errors, True)
        return replace_lone_surrogates(text)[0], len(data)

    return codecs.CodecInfo(codecs.utf_8_encode, decode, name=STDIO_ENCODING,
                            incrementalencoder=codecs.getincrementalencoder("utf-8"),
                            incrementaldecoder=_JsonTextDecoder)


_codec_registered = False


def _register_codec() -> None:
    """The SDK's stdio transport decodes the server's stdout with the encoding it is given (StdioServerParameters):
    that name is the seam where Cairn reads the bytes before the SDK parses them."""
    global _codec_registered
    if not _codec_registered:
        codecs.register(_find_codec)
        _codec_registered = True


def _http_client(headers: dict[str, str], unsent: dict[str, str]) -> Any:
    """The HTTP client a streamable HTTP server is reached with: the SDK's (its timeouts, proxies from the
    environment), plus two things at the transport boundary, where Cairn sees the bytes and the failures first:

    - every response body is read through `replace_lone_surrogates` (bodies with a Content-Encoding are left as they
      are: their bytes are not JSON text yet);
    - a `tools/call` whose request could not even be sent — no connection to the server (refused, unreachable, timed
      out connecting) — has its call id put in `unsent` (with why), so the call says it never reached the server and
      did not run, instead of "stopped while this call was running"."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    class Fixed(httpx2.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            held = ""
            async for chunk in self.inner:
                # bytes as Latin-1 text: one character per byte, so the ASCII escapes are found and the rest kept as is
                text, held = replace_lone_surrogates(held + chunk.decode("latin-1"), final=False)
                if text:
                    yield text.encode("latin-1")
            if held:
                yield replace_lone_surrogates(held)[0].encode("latin-1")

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Client(httpx2.AsyncClient):
        async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
            try:
                response = await super().send(request, stream=True, **kwargs)
            except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as e:
                call_id = _call_id_of(request)
                if call_id is not None:
                    unsent[call_id] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                raise
            if response.headers.get("content-encoding", "identity").strip().lower() in ("", "identity"):
                response.stream = Fixed(response.stream)
            if not stream:
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            return response

    return Client(headers=headers, timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))


def _call_id_of(request: Any) -> str | None:
    """The Cairn call id a `tools/call` request carries (`params._meta["cairn/call_id"]`), else None."""
    try:
        message = json.loads(request.content)
        if message.get("method") != "tools/call":
            return None
        value = message["params"]["_meta"][META_KEY]
    except Exception:  # noqa: BLE001 -- not a request Cairn can read: not a call
        return None
    return value if isinstance(value, str) else None


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
    """The command line that starts `command` so that it dies with Cairn (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        return command, args
    return sys.executable, ["-I", "-S", "-c", _LAUNCHER, str(os.getpid()), command, *args]


class McpServers:
    """The configured servers of one session, started in parallel and stopped together (an async context manager).

    `async with` starts them and waits until each is ready or has failed. `start()` (then `async with`, or `close()`)
    starts them in the background instead (issue 29: a session opens without waiting for its servers; the SDK import
    runs in a thread): `settled` is set once every server is ready or has failed and its tools are in `tools`;
    `wait_ready()` waits for that; `on_change` callbacks hear each state change (a status bar)."""

    def __init__(self, configs: Iterable[McpServerConfig], workspace: Path, *,
                 report: Callable[[str], None] | None = None, environ: Any = None) -> None:
        environ = os.environ if environ is None else environ
        self.connections = [_Connection(c, workspace, environ) for c in configs if c.enabled]
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
                    connection._fail("stopped before it was ready")
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

    async def _await_start(self, connection: _Connection) -> None:
        with anyio.move_on_after(connection.config.startup_timeout):
            await connection.ready.wait()
        if not connection.ready.is_set():
            connection.abandon(f"it did not answer within {connection.config.startup_timeout:g} s")
        self._changed()

    def _register(self, connection: _Connection) -> None:
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
            safety = config.safety.get(listed.name) or safety_from_annotations(getattr(listed, "annotations", None))
            description = (listed.description or getattr(listed, "title", None) or listed.name)[:MAX_DESCRIPTION]
            self.tools.append(Tool(
                name=shown,
                description=f"{description} (MCP server {config.name})",
                parameters=_schema(getattr(listed, "input_schema", None)),
                safety=safety,
                body=_body(connection, listed.name, safety, shown),
            ))
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


def _body(connection: _Connection, tool: str, safety: Safety, shown: str) -> Any:
    async def body(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return await connection.call(tool, arguments, ctx, safety, shown)

    return body
