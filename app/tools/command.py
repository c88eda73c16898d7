"""run_command: a shell command in the workspace, with a time limit, bounded output, and no stray processes.

Why it is built this way:
- `CAIRN_CALL_ID` is exported so a command can make itself idempotent (SPEC §1: the call_id is the idempotency key).
- Cairn's API key is not passed on (`CAIRN_API_KEY`, `OPENAI_API_KEY`, and any other variable holding the same
  value): whatever a command prints is recorded in the session log, and nothing secret may ever be written there
  (SPEC §5). A command that needs a key must be given one another way.
- The shell gets its own session/process group (`start_new_session`), so a timeout or a cancelled turn can SIGKILL the
  whole tree it started — `sleep 30 & sleep 30` included — rather than only the shell.
- Output is read incrementally and only the first OUTPUT_LIMIT bytes are kept; the rest is counted, not stored, so a
  command that prints 50 MB costs a pipe buffer, not 50 MB. The model sees a notice with the omitted byte count.
- A non-zero exit is a normal result ("[exit code N]"): the model needs the output and the code, not an error. Failing to
  start, and running out of time, are ToolFailures.
- When the shell exits but background processes it started still hold the output pipe open, we wait briefly for them,
  then stop reading and return (noting it) instead of hanging until they finish. Those processes are left running;
  processes that redirect their output elsewhere are not affected at all.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
from typing import Any

import anyio
from anyio.abc import Process

from .base import OUTPUT_LIMIT, Tool, ToolContext, ToolFailure
from .workspace import optional_number, require_str

SECRET_ENV = ("CAIRN_API_KEY", "OPENAI_API_KEY")
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 600.0
EXIT_GRACE = 1.0  # seconds to wait for end-of-output after the shell itself has exited
REAP_TIMEOUT = 5.0  # how long to wait for a SIGKILLed shell to be reaped before giving up on it


class _Capture:
    """The first `limit` bytes of a stream, plus a count of what came after."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.head = bytearray()
        self.omitted = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.omitted += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        # An incremental decoder drops a multi-byte character cut in half at the limit instead of showing garbage.
        decoded = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(bytes(self.head), final=self.omitted == 0)
        if self.omitted:
            decoded += f"\n[output truncated: {self.omitted} more bytes not shown]"
        return decoded


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


async def _pump(process: Process, capture: _Capture) -> bool:
    """Read output until the shell has exited and the output has ended. Returns True if we stopped reading because
    background processes still held the output open `EXIT_GRACE` seconds after the shell exited."""
    assert process.stdout is not None
    eof = anyio.Event()

    async def read() -> None:
        async for chunk in process.stdout:
            capture.feed(chunk)
        eof.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await process.wait()
        with anyio.move_on_after(EXIT_GRACE):
            await eof.wait()
        tg.cancel_scope.cancel()
    return not eof.is_set()


def _status_line(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"[exit code {returncode} (killed by {name})]"
    return f"[exit code {returncode}]"


def _join(output: str, line: str) -> str:
    if output and not output.endswith("\n"):
        output += "\n"
    return output + line


def command_environment() -> dict[str, str]:
    """This process's environment without Cairn's API key (see the module docstring)."""
    keys = {os.environ[name] for name in SECRET_ENV if os.environ.get(name)}
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV and v not in keys}


async def run_command(args: dict[str, Any], ctx: ToolContext) -> str:
    command = require_str(args, "command")
    timeout = optional_number(args, "timeout", DEFAULT_TIMEOUT, minimum=1, maximum=MAX_TIMEOUT)
    env = command_environment()
    env["CAIRN_CALL_ID"] = ctx.call_id
    try:
        process = await anyio.open_process(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ctx.workspace,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolFailure(f"could not start the command: {exc}") from exc

    capture = _Capture()
    done = False
    try:
        with anyio.move_on_after(timeout) as deadline:
            lingering = await _pump(process, capture)
        if deadline.cancelled_caught:
            _kill_group(process.pid)
            raise ToolFailure(
                f"command timed out after {timeout:g} s; it and the processes it started were killed. "
                f"Output so far:\n{capture.text() or '(none)'}"
            )
        done = True
    finally:
        if not done:  # timed out, cancelled, or failed while reading: leave nothing running
            _kill_group(process.pid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(REAP_TIMEOUT):
            await process.aclose()

    assert process.returncode is not None
    result = _join(capture.text(), _status_line(process.returncode))
    if lingering:
        result += (
            "\n[the shell exited but background processes still held its output open; stopped reading after "
            f"{EXIT_GRACE:g} s and left them running]"
        )
    return result


RUN_COMMAND = Tool(
    name="run_command",
    description=(
        "Run a shell command (/bin/sh -c) in the workspace directory and return its combined stdout and stderr, "
        "followed by '[exit code N]'. stdin is empty (/dev/null), so interactive programs cannot prompt. The command is "
        f"killed, with all processes it started, after `timeout` seconds (default {DEFAULT_TIMEOUT:g}, at most "
        f"{MAX_TIMEOUT:g}). Output beyond {OUTPUT_LIMIT} bytes is cut off with a notice. The environment variable "
        "CAIRN_CALL_ID holds this call's unique id, usable as an idempotency key."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command line to run, e.g. 'pytest -q tests/'."},
            "timeout": {
                "type": "number",
                "minimum": 1,
                "maximum": MAX_TIMEOUT,
                "description": f"Time limit in seconds (default {DEFAULT_TIMEOUT:g}, at most {MAX_TIMEOUT:g}).",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    safety="side_effecting",
    body=run_command,
)
