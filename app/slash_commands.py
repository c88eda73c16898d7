"""Slash commands typed in the prompt. They run in the TUI and never reach the model; the command palette (Ctrl+P)
offers the same list. An unknown `/word` is refused with one line rather than sent: `/hepl` sent to a model is a
wasted (and billed) turn."""

from __future__ import annotations

from typing import Any

import msgspec


class SlashCommand(msgspec.Struct, frozen=True):
    name: str
    usage: str
    help: str


COMMANDS = (
    SlashCommand("help", "/help", "every key and command"),
    SlashCommand("new", "/new", "start a new session in this directory"),
    SlashCommand("sessions", "/sessions", "list sessions: open, resume, inspect"),
    SlashCommand("model", "/model [PROFILE|NAME]",
                 "list the config file's profiles; a PROFILE, or a model NAME, from the next turn"),
    SlashCommand("permissions", "/permissions [revoke N | clear]", "what you allowed for this session; revoke it"),
    SlashCommand("usage", "/usage", "tokens used by the last turn and the session"),
    SlashCommand("verdict", "/verdict", "record what happened to an OUTCOME_UNKNOWN call"),
    SlashCommand("rewind", "/rewind", "undo turns: restore files Cairn's tools changed, the conversation, or both (Esc Esc)"),
    SlashCommand("mcp", "/mcp", "MCP servers of this session: state, tools, why one failed"),
    SlashCommand("instructions", "/instructions", "the project instructions (AGENTS.md …) the model is told"),
    SlashCommand("compact", "/compact", "summarise the conversation before the next request (recovery facts kept)"),
    SlashCommand("copy", "/copy", "copy the last answer to the clipboard (OSC 52; the same as Ctrl+G)"),
    SlashCommand("quit", "/quit", "quit in order (the running turn is cancelled and closed)"),
)


def matches(text: str) -> list[SlashCommand]:
    """Completions for what is typed: only while it is one `/word` (no space yet)."""
    if not text.startswith("/") or any(ch.isspace() for ch in text):
        return []
    return [c for c in COMMANDS if c.name.startswith(text[1:].lower())]


def parse(text: str) -> tuple[str, str] | None:
    """(`name`, `argument`) for a slash command, None for a prompt. `//x` sends `/x` to the model as a prompt."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    word, _, rest = text[1:].partition(" ")
    return word.lower(), rest.strip()


def profile_config(config: Any, name: str) -> Any | None:
    """The configuration of the config-file profile `name` (same home, backend and workspace), or None when the file
    defines no such profile (then `/model NAME` means a model name). A profile that is broken raises ConfigError."""
    import os

    from .config.file import ConfigFileError, read_config_file
    from .config.resolver import resolve_config

    path = config.config_file
    if path is None:
        return None
    try:
        if name not in read_config_file(path).profiles:
            return None
    except (ConfigFileError, OSError):
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("CAIRN_PROVIDER", "CAIRN_MODEL", "CAIRN_BASE_URL")}
    return resolve_config(home=str(config.home), backend=config.backend, workspace=str(config.workspace),
                          profile=name, config_file=str(path), env=env)


# where a provider sends requests when a profile names no base_url (the providers' DEFAULT_BASE_URL, without importing
# them: the listing is drawn without loading an HTTP client)
DEFAULT_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com", "demo": "no server",
                 "script": "no server"}


def url_host(url: str | None) -> str:
    """A base URL's host[:port] as it may be shown: never its user part (a token) or its query."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url or "")
        host, port = parts.hostname, parts.port
    except ValueError:
        return "?"
    if not host:
        return "?"
    return f"[{host}]:{port}" if port and ":" in host else f"{host}:{port}" if port else host


def model_listing(config: Any, provider: Any, current_profile: str | None) -> str:
    """`/model` with no argument: what the next request uses, the config file's profiles (each with its provider,
    model and server host; the one in use marked) and how to switch. Settings a profile leaves out are named as
    defaults (the provider then depends on whether a key is set)."""
    from .config.file import ConfigFileError, read_config_file
    from .config.resolver import default_config_path
    from .config.settings import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL
    from .providers.base import limits_of

    models = {"openai": DEFAULT_OPENAI_MODEL, "anthropic": DEFAULT_ANTHROPIC_MODEL}
    endpoint = limits_of(provider).endpoint or config.base_url
    where = f" @ {url_host(endpoint)}" if endpoint else ""
    using = f" (profile {current_profile})" if current_profile else ""
    lines = [f"Now: {provider.name} · {provider.model}{where}{using}."]
    path = config.config_file
    switch_model = f"/model NAME uses another model of {provider.name} from the next request."
    profiles: dict[str, Any] = {}
    if path is not None:
        try:
            profiles = read_config_file(path).profiles
        except (ConfigFileError, OSError) as e:
            return "\n".join([*lines, f"The config file cannot be read: {e}", switch_model])
    if not profiles:
        return "\n".join([*lines, f"No profiles: add [profiles.NAME] sections (provider, model, base_url, api_key_env) "
                                  f"to {path or default_config_path()} to switch with /model NAME. {switch_model}"])
    lines.append(f"Profiles in {path}:")
    width = max(len(name) for name in profiles)
    for name, profile in profiles.items():
        settings = profile.settings
        kind = settings.get("provider")
        model = settings.get("model") or (f"{models[kind]} (default)" if kind in models else "default model")
        host = (url_host(settings["base_url"]) if settings.get("base_url")
                else DEFAULT_HOSTS.get(kind or "", "default server"))
        current = name == current_profile
        # (a mark on every line: a Notice drops a line's leading spaces)
        lines.append(f"{'▸' if current else '-'} {name:<{width}}  {kind or 'default provider'} · {model} · {host}"
                     + ("  (in use)" if current else ""))
    lines.append(f"/model PROFILE switches to a profile from the next turn. {switch_model}")
    return "\n".join(lines)


def mcp_summary(servers: Any) -> str:
    """`/mcp`: one line per configured MCP server."""
    states = servers.states if servers is not None else []
    if not states:
        return "No MCP server is configured ([mcp_servers.NAME] in the config file, or the editor's mcpServers)."
    lines = []
    for state in states:
        line = f"{state.config.name}: {state.status}"
        if state.tools:
            line += f" — {len(state.tools)} tool(s): {', '.join(state.tools)}"
        if state.error:
            line += f" — {state.error}"
        lines.append(line)
    return "\n".join(lines)
