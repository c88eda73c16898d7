"""The operator's own shell command (`!command` in the TUI): a turn of its own, not a model tool call (SPEC §2 rev 4).

A turn like any other from the outside — `turn/start`, the turn-start workspace snapshot, …, the turn-end snapshot,
`turn/end` — so `/rewind` and `cairn rewind --turn N` undo what the command did, like any command's turn. Inside it
there is no step and no model request: `operator/command` (the intent), the process, `operator/result` (exit code and
output). The model hears of it with the next prompt: the transcript turns both events into user content
(operator_text.py), merged with that prompt into one user message.

- The intent is made durable (a barrier) before the process starts, so a crash while it runs leaves a log that says
  it was started: repair closes the turn `interrupted`, and the model is told its outcome is unknown. The barrier is
  taken here, through the session's barrier API (`LiveSession.flush`, routed like every other barrier), not chosen
  by the checkpoint policy through a hook: the policy places barriers around the *model's* work (steps, requests,
  tool bodies) and can be left out, trading durability for speed; an operator command's intent is durable by
  definition, whatever policy is mounted — the operator typed it and must never meet a command that ran without a
  trace. Reusing `around_tool` instead would show tracing and fault-injection hooks a "tool call" the log does not
  have.
- It runs the way `run_command` runs (`tools/command.run_shell`): its own process group, killed with Cairn, Cairn's
  keys left out of its environment, the same time limit and output limit. No approval: the operator typed it.
- Esc (the loop's cancel) stops its whole process group; `operator/result` then has exit code None and the output
  so far, and the turn ends `cancelled`. A command that cannot start ends the turn `error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

import anyio
import anyio.lowlevel

from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import OperatorCommand, OperatorResult, TurnStart
from cairn.persistence.session import LiveSession

from ..tools.base import OUTPUT_LIMIT, ToolFailure
from ..tools.command import DEFAULT_TIMEOUT, LINGERING, Capture, run_shell, timed_out_text, tool_environment
from .evidence import Evidence
from .turn_state import TurnFailure, TurnState

COMMAND_FAILED = "COMMAND_FAILED"  # turn/end error code: the operator's command could not start
CANCELLED = "[stopped: the operator cancelled it; it and the processes it started were stopped]"


@dataclass(frozen=True)
class OperatorCommandRequest:
    """What the loop's queue holds for a `!command` (a plain `str` is a prompt)."""

    command: str

    def __str__(self) -> str:
        return f"!{self.command}"


TurnInput = Union[str, OperatorCommandRequest]


def parse(text: str) -> OperatorCommandRequest | None:
    """`!cmd` is an operator command; a lone `!` (nothing after it but blanks) is an ordinary prompt."""
    if text.startswith("!") and text[1:].strip():
        return OperatorCommandRequest(text[1:].strip())
    return None


def as_turn_input(text: str) -> TurnInput:
    """What a line typed in the prompt becomes in the loop's queue."""
    return parse(text) or text


async def run_operator_turn(session: LiveSession, evidence: Evidence, workspace: Path, st: TurnState,
                            request: OperatorCommandRequest, timeout: float = DEFAULT_TIMEOUT) -> None:
    """The body of an operator command's turn (the loop's `_turn` opens and closes it). Every way out after
    `operator/command` leaves its `operator/result` appended (synchronously: no await can cut it)."""
    session.append(TurnStart(turn=st.turn))
    await evidence.turn_started(st.turn)
    session.append(OperatorCommand(turn=st.turn, command=request.command))
    capture = Capture(OUTPUT_LIMIT)
    result: OperatorResult | None = None
    failure: str | None = None
    try:
        try:
            await session.flush()  # the intent is durable before the process exists (see the module docstring)
        except CheckpointFailed as e:
            result = OperatorResult(turn=st.turn, exit_code=None,
                                    output=f"Not run: the checkpoint before this command failed ({e.cause}).")
            raise
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled while the barrier ran: it must not start
        try:
            code, lingering = await run_shell(request.command, workspace, tool_environment(), timeout, capture)
        except ToolFailure as e:
            failure = str(e)
            result = OperatorResult(turn=st.turn, exit_code=None, output=failure)
        else:
            output = capture.text()
            if code is None:
                output = _join(output, f"[{timed_out_text(timeout)}]")
            elif lingering:
                output = _join(output, LINGERING)
            result = OperatorResult(turn=st.turn, exit_code=code, output=output)
    finally:
        if result is None:  # cancelled (or a bug): it was stopped, or never started
            result = OperatorResult(turn=st.turn, exit_code=None, output=_join(capture.text(), CANCELLED))
        try:
            session.append(result)
        except Exception:  # the session was closed under it: repair closes the turn on the next open
            pass
    if failure is not None:
        raise TurnFailure(COMMAND_FAILED, failure)
    await evidence.turn_completed(st.turn)


def _join(output: str, line: str) -> str:
    if output and not output.endswith("\n"):
        output += "\n"
    return output + line
