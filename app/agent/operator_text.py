"""What the model is told of the operator's own `!command` (operator_command.py runs it): user content before the
next prompt, merged with it into one user message by the transcript. Apart from the command's runner so that the
transcript, and faces that replay a session (ACP), read it without importing the turn machinery."""

from __future__ import annotations

from cairn.persistence.events import OperatorCommand, OperatorResult

from ..render import fence

UNKNOWN = "its outcome is unknown (Cairn stopped while it ran)"


def operator_text(command: OperatorCommand, result: OperatorResult | None) -> str:
    """`[The operator ran `cmd` in the workspace: exit code 0]` and its output fenced; without a result (Cairn stopped
    while it ran, and repair closed the turn) its outcome is unknown."""
    ran = f"[The operator ran `{command.command}` in the workspace"
    if result is None:
        return f"{ran}: {UNKNOWN}]"
    if result.exit_code is None:
        status = "it did not finish (stopped, or could not start)"
    else:
        status = f"exit code {result.exit_code}"
    return f"{ran}: {status}]\n{fence(result.output or '(no output)')}"
