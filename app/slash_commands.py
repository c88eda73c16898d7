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
                 "show the provider and model; a config-file PROFILE, or a model NAME, from the next turn"),
    SlashCommand("permissions", "/permissions [revoke N | clear]", "what you allowed for this session; revoke it"),
    SlashCommand("usage", "/usage", "tokens used by the last turn and the session"),
    SlashCommand("verdict", "/verdict", "record what happened to an OUTCOME_UNKNOWN call"),
    SlashCommand("rewind", "/rewind", "undo turns: restore files Cairn's tools changed, the conversation, or both (Esc Esc)"),
    SlashCommand("mcp", "/mcp", "MCP servers of this session: state, tools, why one failed"),
    SlashCommand("compact", "/compact", "summarise the conversation before the next request (recovery facts kept)"),
    SlashCommand("quit", "/quit", "quit in order (the running turn is cancelled and closed)"),
)
BY_NAME = {c.name: c for c in COMMANDS}


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

    path = getattr(config, "config_file", None)
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
