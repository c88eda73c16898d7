"""Slash commands typed in the prompt. They run in the TUI and never reach the model; the command palette (Ctrl+P)
offers the same list. An unknown `/word` is refused with one line rather than sent: `/hepl` sent to a model is a
wasted (and billed) turn."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str
    help: str


COMMANDS = (
    SlashCommand("help", "/help", "every key and command"),
    SlashCommand("new", "/new", "start a new session in this directory"),
    SlashCommand("sessions", "/sessions", "list sessions: open, resume, inspect"),
    SlashCommand("model", "/model [NAME]", "show the provider and model; NAME: use that model from the next turn"),
    SlashCommand("permissions", "/permissions [revoke N | clear]", "what you allowed for this session; revoke it"),
    SlashCommand("usage", "/usage", "tokens used by the last turn and the session"),
    SlashCommand("verdict", "/verdict", "record what happened to an OUTCOME_UNKNOWN call"),
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
