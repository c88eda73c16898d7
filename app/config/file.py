"""The configuration file (SPEC §7 rev 2): named profiles of provider settings, read with stdlib `tomllib`.

    default_profile = "deepseek"

    [profiles.deepseek]
    provider = "openai"
    base_url = "https://api.deepseek.com"
    api_key_env = "DEEPSEEK_API_KEY"
    model = "deepseek-chat"

Everything in the file is checked when it is read: a key Cairn does not know (usually a typo) or a value of the wrong
kind is a `ConfigError` naming the file, the line and the key, never silently ignored — a misspelt `max_tokens` that
did nothing would be worse than an error. Keys are never read from the file (it is the kind of file people share,
commit and paste into issues): `api_key = …`, or an authorization header with a literal value, is refused with a
message naming `api_key_env`, which says which environment variable holds the key.

This module reads no environment and imports nothing heavy; `resolver.py` decides precedence.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import msgspec

from .checks import ConfigError, check_base_url, nested_deeper_than, read_regular_file
from .values import boolean, did_you_mean, env_name, header_table, non_empty_text

PROVIDER_NAMES = ("openai", "anthropic", "demo", "script")
KEY_HEADERS = ("authorization", "api-key", "x-api-key")  # where a profile may ask the key to be sent
MAX_FILE_BYTES = 1024 * 1024
MAX_NESTING = 32  # levels of arrays/tables a config file may nest (headers and extra_body are the deepest settings)


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message is one line naming the file (and line and key when known)."""


class Profile(msgspec.Struct):
    name: str
    settings: dict[str, Any]  # validated values, only the keys the file sets


class ConfigFile(msgspec.Struct):
    path: Path
    default_profile: str | None = None
    profiles: dict[str, Profile] = msgspec.field(default_factory=dict)
    mcp_servers: dict[str, Any] = msgspec.field(default_factory=dict)  # NAME -> mcp_servers.McpServerConfig

    def profile(self, name: str, how: str) -> Profile:
        """The profile called `name`; `how` says who asked for it (for the error)."""
        found = self.profiles.get(name)
        if found is None:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise ConfigFileError(f"{how} names the profile {name!r}, which {self.path} does not define (profiles: {known})")
        return found


# ---------------------------------------------------------------------------------------------------- value checks


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of: {', '.join(choices)}")
        return value

    return check


def _integer(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            raise ValueError(f"must be a whole number from {low} to {high}" if high else f"must be a whole number >= {low}")
        return value

    return check


def _number(low: float, high: float | None = None) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low or (high is not None and value > high):
            limits = f"from {low:g} to {high:g}" if high is not None else f">= {low:g}"
            raise ValueError(f"must be a number {limits}")
        return float(value)

    return check


def _word(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", value):
        raise ValueError("must be a single word such as low, medium or high")
    return value


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    try:
        check_base_url(value, "base_url")
    except ConfigError as e:
        raise ValueError(str(e).removeprefix("base_url ")) from None
    return value


def _database_url(value: Any) -> str:
    """A libpq URL or key=value string, without a password: the file gets shared and committed (like a key)."""
    from urllib.parse import parse_qs, urlsplit

    text = non_empty_text(value)
    if "://" in text:
        if not text.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL, e.g. \"postgresql://cairn@db.example:5432/cairn\"")
        try:
            parts = urlsplit(text)
            has_password = parts.password is not None or "password" in parse_qs(parts.query)
        except ValueError:
            raise ValueError("is not a valid URL") from None
    else:
        has_password = re.search(r"(^|\s)password\s*=", text) is not None
    if has_password:
        raise ValueError(
            "must not carry a password: the config file gets shared and committed; put the password in ~/.pgpass "
            "(or PGPASSFILE / PGPASSWORD), or give the whole URL with CAIRN_DATABASE_URL"
        )
    return text


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a table, e.g. { top_k = 20 }")
    return dict(value)


def _tool_choice(value: Any) -> str | dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    return _choice("auto", "none", "required")(value)


_env_name = env_name("DEEPSEEK_API_KEY")
_headers = header_table(
    "\"X-Title\" = \"cairn\"",
    "keys are never read from the config file (it gets shared and committed); name the variable that holds the key "
    "with api_key_env (and api_key_header for where it goes)",
)

PROFILE_KEYS: dict[str, Callable[[Any], Any]] = {
    "provider": _choice(*PROVIDER_NAMES),
    "base_url": _url,
    "api_key_env": _env_name,
    "api_key_header": _choice(*KEY_HEADERS),
    "model": non_empty_text,
    "script": non_empty_text,
    "max_tokens": _integer(1),
    "context_window": _integer(1),
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0),
    "reasoning_effort": _word,
    "thinking_budget": _integer(1024),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": boolean,
    "include_usage": boolean,
    # "text": send tool calls and results as alternating text from the start (servers whose template has no tool role)
    "transcript": _choice("messages", "text"),
    # workspace snapshots in a shadow git repository for rewind (SPEC §9 rev 3): "auto" where git is installed, or "off"
    "snapshots": _choice("auto", "off"),
    # project instructions (AGENTS.md …) and the environment in the system prompt: "on", or "off"
    "project_context": _choice("on", "off"),
    "headers": _headers,
    "extra_body": _table,
    "timeout": _number(0.0),
    "max_retries": _integer(0, 100),
    # where sessions live (SPEC §5 rev 2): a team's profile points every member at one database
    "backend": _choice("jsonl", "sqlite", "postgres"),
    "database_url": _database_url,
}
TOP_KEYS = ("default_profile", "profiles", "mcp_servers")
REFUSED_KEYS = {
    "api_key": "keys are never read from the config file (it gets shared and committed): put the key in an environment "
    "variable and name it here with api_key_env = \"…\"",
}
REFUSED_KEYS["key"] = REFUSED_KEYS["apikey"] = REFUSED_KEYS["api-key"] = REFUSED_KEYS["api_key"]


# ---------------------------------------------------------------------------------------------------- reading


def read_config_file(path: Path) -> ConfigFile:
    """Read and validate `path`. Raises ConfigFileError (one line) for anything wrong with it."""
    try:
        raw = read_regular_file(path, "config file", MAX_FILE_BYTES)  # never opens a FIFO (it would block)
    except ConfigError as e:
        raise ConfigFileError(str(e)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigFileError(f"config file {path} is larger than {MAX_FILE_BYTES // 1024} KiB; is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(f"config file {path} is not UTF-8 text") from None
    import tomllib  # only when there is a file (~2 ms before the TUI's first frame otherwise, P8)

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigFileError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    if nested_deeper_than(data, MAX_NESTING):
        raise ConfigFileError(f"{path}: arrays or tables nested more than {MAX_NESTING} levels deep; "
                              "no setting needs that") from None
    return parse_config(data, path, text)


def parse_config(data: dict[str, Any], path: Path, text: str = "") -> ConfigFile:
    where = _Locator(path, text)
    for key in data:
        if key not in TOP_KEYS:
            hint = "; profile settings go under [profiles.NAME]" if key in PROFILE_KEYS or key in REFUSED_KEYS else ""
            raise ConfigFileError(where.error([key], "unknown setting" + (hint or did_you_mean(key, TOP_KEYS))))
    result = ConfigFile(path)
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ConfigFileError(where.error(["profiles"], "must be a table of [profiles.NAME] sections"))
    for name, body in profiles.items():
        if not isinstance(body, dict):
            raise ConfigFileError(where.error(["profiles", name], "must be a table ([profiles.NAME] section)"))
        settings: dict[str, Any] = {}
        for key, value in body.items():
            keys = ["profiles", name, key]
            if key.lower() in REFUSED_KEYS:
                raise ConfigFileError(where.error(keys, REFUSED_KEYS[key.lower()]))
            check = PROFILE_KEYS.get(key)
            if check is None:
                raise ConfigFileError(where.error(keys, "unknown setting" + did_you_mean(key, PROFILE_KEYS)))
            try:
                settings[key] = check(value)
            except ValueError as e:
                raise ConfigFileError(where.error(keys, str(e))) from None
        result.profiles[name] = Profile(name, settings)
    servers = data.get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise ConfigFileError(where.error(["mcp_servers"], "must be a table of [mcp_servers.NAME] sections"))
    if servers:
        from .mcp_servers import McpConfigError, parse_server_table  # (only when there are servers to read)

        for name, body in servers.items():
            try:
                result.mcp_servers[name] = parse_server_table(name, body)
            except McpConfigError as e:
                if e.keys:
                    raise ConfigFileError(where.error(["mcp_servers", name, *e.keys], e.message)) from None
                line = where._line(["mcp_servers", name, "\0"])  # no such key: the line of the table's header
                raise ConfigFileError(f"{path}{f':{line}' if line else ''}: mcp_servers.{name}: {e.message}") from None
    default = data.get("default_profile")
    if default is not None:
        if not isinstance(default, str) or default not in result.profiles:
            known = ", ".join(sorted(result.profiles)) or "none defined"
            raise ConfigFileError(where.error(["default_profile"], f"names no profile of this file (profiles: {known})"))
        result.default_profile = default
    return result


class _Locator:
    """Finds the line a key was set on, for messages (tomllib gives values, not positions). Best effort: a key set in
    an inline table or a dotted key still gets the right line when its name is on it; otherwise no line is named."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def error(self, keys: list[str], message: str) -> str:
        line = self._line(keys)
        dotted = ".".join(keys)
        return f"{self.path}:{line}: {dotted}: {message}" if line else f"{self.path}: {dotted}: {message}"

    def _line(self, keys: list[str]) -> int | None:
        *tables, key = keys
        start, end = 0, len(self.lines)
        if tables:
            header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(_key_pattern(t) for t in tables) + r"\s*\]\s*(#.*)?$")
            for i, line in enumerate(self.lines):
                if header.match(line):
                    start = i + 1
                    end = next((j for j in range(start, len(self.lines)) if self.lines[j].lstrip().startswith("[")),
                               len(self.lines))
                    break
        assignment = re.compile(r"(^|[\s{,.])" + _key_pattern(key) + r"\s*=")
        for i in range(start, end):
            if assignment.search(self.lines[i]):
                return i + 1
        if not tables or start == 0:
            return None
        return start  # the key's own line was not found: name its section


def _key_pattern(key: str) -> str:
    quoted = re.escape(key)
    return f"(?:{quoted}|\"{quoted}\"|'{quoted}')"
