"""The `[mcp_servers.NAME]` tables of the config file, and an editor's `mcpServers` (ACP), as server configs.

This is the one place an MCP server's settings are checked: `file.py` calls `parse_server_table` for each table (and
adds the file and line to its errors), ACP's agent calls `from_editor`; `tools.mcp` starts what they give. A server is
stdio (`command`) or streamable HTTP (`url`); its secrets (header values, the bearer token, secret-looking environment
values) are listed by `server_secrets`, so they are scrubbed from every event and withheld from `run_command`. Nothing
here imports the `mcp` SDK.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..tools.base import Safety
from .values import boolean, did_you_mean, env_name, header_table, text_without_nul

SEPARATOR = "__"  # NAME__tool
DEFAULT_STARTUP_TIMEOUT = 15.0
DEFAULT_CALL_TIMEOUT = 120.0  # SPEC §8 rev 3: every call has a time limit
SAFETY_CLASSES: tuple[Safety, ...] = ("read_only", "idempotent", "side_effecting")
# environment variable names whose values are treated as secrets (scrubbed from every event)
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH)", re.I)
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
SERVER_KEYS = ("command", "args", "env", "env_vars", "cwd", "url", "headers", "bearer_token_env", "enabled_tools",
               "disabled_tools", "safety", "startup_timeout", "call_timeout", "enabled")


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
            raise McpConfigError([key], "unknown setting" + did_you_mean(key, SERVER_KEYS))
    if ("command" in table) == ("url" in table):
        raise McpConfigError([], "needs exactly one of command (a stdio server) or url (a streamable HTTP server)")
    values: dict[str, Any] = {"name": name}
    for key, value in table.items():
        try:
            values[key] = SERVER_CHECKS[key](value)
        except ValueError as e:
            raise McpConfigError([key], str(e)) from None
    if "url" in values and ("args" in values or "env" in values or "env_vars" in values or "cwd" in values):
        raise McpConfigError([], "args, env, env_vars and cwd belong to a stdio server (command), not to a url")
    if "command" in values and ("headers" in values or "bearer_token_env" in values):
        raise McpConfigError([], "headers and bearer_token_env belong to an HTTP server (url), not to a command")
    return McpServerConfig(**values)


_env_name = env_name("GITHUB_TOKEN")
_headers = header_table("\"X-Team\" = \"infra\"",
                        "secrets are never read from the config file; name the variable that holds the token with "
                        "bearer_token_env")


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


def _env_names(value: Any) -> tuple[str, ...]:
    names = _strings(value)
    for name in names:
        _env_name(name)
    return names


def _url(value: Any) -> str:
    from urllib.parse import urlsplit

    parts = None
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
        if parts is not None and ok:
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        ok = False
    if not ok or parts is None:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/mcp")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials; put a token in an environment variable and name it with "
                         "bearer_token_env")
    return value


def _safety_table(value: Any) -> dict[str, Safety]:
    if not isinstance(value, dict) or not all(v in SAFETY_CLASSES for v in value.values()):
        raise ValueError("must be a table of tool names to read_only, idempotent or side_effecting, "
                         "e.g. { create_ticket = \"idempotent\" }")
    return dict(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("must be a number of seconds > 0")
    return float(value)


SERVER_CHECKS: dict[str, Callable[[Any], Any]] = {
    "command": text_without_nul, "args": _strings, "env": _string_table, "env_vars": _env_names,
    "cwd": text_without_nul, "url": _url, "headers": _headers, "bearer_token_env": _env_name,
    "enabled_tools": _strings, "disabled_tools": _strings, "safety": _safety_table, "startup_timeout": _seconds,
    "call_timeout": _seconds, "enabled": boolean,
}


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
