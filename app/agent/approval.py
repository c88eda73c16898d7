"""Approval of side-effecting and idempotent tool calls (SPEC §8). Each face supplies its own approver: the TUI asks
with a modal, ACP asks the client, headless runs decide from `--yes`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from cairn.persistence.events import Decision


@dataclass(frozen=True)
class ApprovalRequest:
    call_id: str
    name: str
    arguments: dict[str, Any]
    safety: str
    turn: int
    step: int


@dataclass(frozen=True)
class ApprovalAnswer:
    """A decision with what only an interactive face can add: a note the model gets with a denial, and, for an
    `allowed_prefix` on `run_command`, the command prefix the grant is limited to."""

    decision: Decision
    note: str = ""
    command_prefix: str = ""


Approver = Callable[[ApprovalRequest], Awaitable["Decision | ApprovalAnswer"]]


def as_answer(reply: "Decision | ApprovalAnswer") -> ApprovalAnswer:
    return reply if isinstance(reply, ApprovalAnswer) else ApprovalAnswer(reply)


# Anything that could chain, substitute or redirect behind an allowed prefix (`pytest; rm -rf ~`, `pytest $(curl …)`,
# `pytest > ~/.bashrc`): a command holding one is never covered by a prefix grant, it is asked about.
SHELL_CONTROL = re.compile(r"[;&|`$<>(){}\n\r\\]")


def command_prefix_covers(prefix: str, command: object) -> bool:
    """`pytest` covers `pytest` and `pytest -q tests`, never `pytest-evil` nor `pytest && rm -rf ~`."""
    if not isinstance(command, str) or not prefix or SHELL_CONTROL.search(command):
        return False
    command = command.strip()
    return command == prefix or command.startswith(prefix + " ")


def first_word(command: object) -> str:
    """The prefix offered for a session grant: the command's first word (`pytest` of `pytest -q tests`); none for a
    compound command (`ls; echo x > f`), which a prefix grant could never cover (SHELL_CONTROL)."""
    if not isinstance(command, str) or SHELL_CONTROL.search(command) or not command.split():
        return ""
    return command.split()[0]


@dataclass
class Grants:
    """What the operator allowed for this session: whole tools, or `run_command` limited to command prefixes. Held
    in memory only (a reopened session asks again), listed in the TUI's status bar and revocable with /permissions."""

    tools: set[str] = field(default_factory=set)
    command_prefixes: set[str] = field(default_factory=set)

    def covers(self, name: str, arguments: object) -> bool:
        return self.covering(name, arguments) is not None

    def covering(self, name: str, arguments: object) -> str | None:
        """The label of the grant that lets this call run without asking (what `granted` records), or None."""
        if name in self.tools:
            return name
        command = arguments.get("command") if isinstance(arguments, dict) and name == "run_command" else None
        for prefix in sorted(self.command_prefixes):
            if command_prefix_covers(prefix, command):
                return f"run_command: {prefix}"
        return None

    def add(self, name: str, command_prefix: str = "") -> None:
        if name == "run_command" and command_prefix:
            self.command_prefixes.add(command_prefix)
        else:
            self.tools.add(name)

    def labels(self) -> list[str]:
        """One label per grant, as shown and as `/permissions revoke LABEL` takes it."""
        return sorted(self.tools) + sorted(f"run_command: {p}" for p in self.command_prefixes)

    def revoke(self, label: str) -> bool:
        if label in self.tools:
            self.tools.discard(label)
            return True
        prefix = label.removeprefix("run_command: ")
        if label.startswith("run_command: ") and prefix in self.command_prefixes:
            self.command_prefixes.discard(prefix)
            return True
        return False

    def clear(self) -> None:
        self.tools.clear()
        self.command_prefixes.clear()


def needs_approval(safety: str) -> bool:
    return safety != "read_only"


def headless_approver(yes: bool) -> Approver:
    """`--yes` allows every call once; without it, calls that need approval are denied (nobody is there to ask)."""

    async def decide(request: ApprovalRequest) -> Decision:
        return "allowed_once" if yes else "denied"

    return decide
