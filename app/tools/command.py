"""run_command: a shell command in the workspace, with a time limit, bounded output, and no stray processes.

Why it is built this way:
- `CAIRN_CALL_ID` is exported so a command can make itself idempotent (SPEC §1: the call_id is the idempotency key).
- Tools never see Cairn's keys (SPEC §10 rev 4): the command's environment (`tool_environment`) leaves out every
  variable that names a key Cairn knows — `KEY_VARIABLES`, each profile's `api_key_env` — and any variable whose value
  is one of the session's secret values. Scrubbing the log cannot help here: `printenv KEY | rev` prints the key in a
  form no scrubber recognises. The config room, which learns the names and values, tells this module through
  `withhold()` (tools cannot import config: config imports this module to call it). A command that needs a key must
  be given one another way.
- The shell gets its own session and process group (`start_new_session`), so a timeout or a cancelled turn can stop the
  whole tree it started — `sleep 30 & sleep 30` included — rather than only the shell. Stopping is SIGTERM to the group,
  then SIGKILL to the group after KILL_GRACE seconds at most, so a command that ignores SIGTERM cannot hang a cancel.
  Having no controlling terminal also makes a program that opens /dev/tty to prompt fail at once instead of stopping.
- It dies with Cairn (SPEC §8), two ways. (1) The shell is started with the parent-death signal set to SIGKILL (`prctl`
  in the child before exec; it survives exec, so a lone command that dash execs carries it too). The kernel tracks the
  *thread* that forked: we spawn from the event loop's thread, which lives as long as Cairn. (2) Processes the shell
  forks do not inherit that setting, so the shell first starts a tiny guardian in its own process group (`_GUARDED`):
  it blocks reading a pipe whose only writer is Cairn. When the command finishes, Cairn writes a line and the guardian
  leaves quietly (background processes are then left running, as before); when Cairn dies in any way, the kernel closes
  the pipe, the guardian reads end-of-file and SIGKILLs the whole group. The guardian is double-forked, so the command's
  own bare `wait` never waits for it, and the command itself runs in a fresh `sh -c` exec'd in place (same pid, same
  semantics as before). A process that leaves the group on purpose (setsid) is beyond both.
- Right after spawn, `ctx.progress(pid, started_ms)` records the process (the loop appends `tool/progress`), so the
  resume screen can say whether a command from a crashed session is still running.
- Output is fed to us by the event loop (asyncio's subprocess protocol) and only the first OUTPUT_LIMIT bytes are kept;
  the rest is counted, not stored, so a command that prints 50 MB costs a pipe buffer, not 50 MB.
- A non-zero exit is a normal result ("[exit code N]"): the model needs the output and the code, not an error. Failing to
  start, and running out of time, are ToolFailures.
- When the shell exits but background processes it started still hold the output pipe open, we wait briefly for them,
  then close our end and return (noting it) instead of hanging until they finish. Those processes are left running (a
  later write to the closed pipe gets SIGPIPE); processes that redirect their output elsewhere are not affected at all.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import anyio

from cairn.persistence.sanitize import MIN_SECRET_CHARS

from .base import OUTPUT_LIMIT, Tool, ToolContext, ToolFailure
from .workspace import optional_number, require_str

# variables that hold a key (or, for the database URL, may hold a password) whatever the config says
KEY_VARIABLES = ("CAIRN_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CAIRN_DATABASE_URL")
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 600.0
EXIT_GRACE = 1.0  # seconds to wait for end-of-output after the shell itself has exited
KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL when a command is stopped (timeout or cancel)
REAP_TIMEOUT = 5.0  # how long to wait for a SIGKILLed shell to be reaped before giving up on it
_PR_SET_PDEATHSIG = 1

# Run as `sh -c _GUARDED sh <command>` with stdin = the read end of Cairn's guard pipe (see the module docstring). The
# guardian keeps the pipe as fd 3 and writes nothing anywhere; the command gets /dev/null as stdin and no fd 3.
_GUARDED = (
    "exec 3<&0 </dev/null; "
    "( (read -r cairn_done <&3 || kill -9 0) & ) >/dev/null 2>&1; "
    "exec 3<&-; "
    'exec /bin/sh -c "$1"'
)


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the parent: the child must only call it (see `_die_with_parent`)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when Cairn dies (Linux), or None where that is unavailable.

    It runs in the forked child before exec, so it does only what is safe there: one pre-resolved C call and a getppid.
    If Cairn died between fork and prctl the signal would never come, so the child checks and kills itself.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return set_parent_death_signal


class Capture:
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


class _Command(asyncio.SubprocessProtocol):
    """What the event loop tells us about the shell: output as it arrives, end of output, exit."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.output_ended = anyio.Event()
        self.exited = anyio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.capture.feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.output_ended.set()

    def process_exited(self) -> None:
        self.exited.set()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group; False if no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # only a process that is not ours could be left: nothing we can do
        return False
    return True


def _group_running(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in the group. Zombies count for killpg, and an orphan's zombie waits
    for whatever reaps orphans here (seconds, in some containers), so on Linux /proc is asked instead."""
    if not _signal_group(pgid, 0):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":  # fields: state, ppid, pgrp, …
            return True
    return False


async def _stop_group(pgid: int, command: _Command) -> None:
    """SIGTERM the whole group, give it KILL_GRACE seconds to go, then SIGKILL whatever is left. Bounded in time, and
    shielded so that a cancelled call still leaves nothing running."""
    with anyio.CancelScope(shield=True):
        if _signal_group(pgid, signal.SIGTERM):
            with anyio.move_on_after(KILL_GRACE):
                await command.exited.wait()
                while _group_running(pgid):
                    await anyio.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        with anyio.move_on_after(REAP_TIMEOUT):
            await command.exited.wait()


async def _pump(command: _Command) -> bool:
    """Wait until the shell has exited and its output has ended. Returns True if we stopped waiting because background
    processes still held the output open `EXIT_GRACE` seconds after the shell exited."""
    await command.exited.wait()
    with anyio.move_on_after(EXIT_GRACE):
        await command.output_ended.wait()
    return not command.output_ended.is_set()


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


# What no tool process inherits, for the life of this process: a name or value learned for one session stays withheld
# for the next (one process may serve several, in ACP), since withholding more never exposes anything.
_withheld_names: set[str] = set(KEY_VARIABLES)
_withheld_values: set[str] = set()


def withhold(names: Iterable[str | None] = (), values: Iterable[str | None] = ()) -> None:
    """Keep these variables, and any variable holding one of these values, out of every tool's environment from now on.
    Values shorter than the log's scrubber takes are ignored: they would strip ordinary variables (`USER=dev`)."""
    _withheld_names.update(n for n in names if n)
    _withheld_values.update(v for v in values if v and len(v) >= MIN_SECRET_CHARS)


def tool_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without Cairn's keys: the withheld variables, and every variable whose value
    is a withheld value or the value of a withheld variable (a copy of the key under another name)."""
    environ = os.environ if environ is None else environ
    held = (environ.get(name) for name in _withheld_names)
    values = _withheld_values | {v for v in held if v and len(v) >= MIN_SECRET_CHARS}
    return {k: v for k, v in environ.items() if k not in _withheld_names and v not in values}


async def run_shell(command_line: str, cwd: Path, env: dict[str, str], timeout: float, capture: Capture,
                    started: Callable[[int, int], None] = lambda pid, started_ms: None) -> tuple[int | None, bool]:
    """Run `command_line` the way this module runs every command (see the module docstring): its output goes into
    `capture` as it arrives, `started(pid, started_ms)` is told right after spawn. Returns (exit status, whether
    background processes still held the output open); the status is None when the time limit stopped it. Raises
    ToolFailure when it cannot start; a cancel stops the whole group before it propagates. Shared by `run_command`
    and the operator's own `!command` (agent/operator_command.py)."""
    loop = asyncio.get_running_loop()
    guard_read, guard_write = os.pipe()  # both ends close-on-exec; Popen gives the shell the read end as its stdin
    started_ms = int(time.time() * 1000)
    # Shielded: the process exists before subprocess_exec returns, so a cancel arriving inside it would leave a command
    # that was never reported (no tool/progress) and whose group nobody stops. Spawning is brief; the cancel lands on
    # the first wait after it, which stops the whole group.
    try:
        with anyio.CancelScope(shield=True):
            transport, command = await loop.subprocess_exec(
                lambda: _Command(capture),
                "/bin/sh",
                "-c",
                _GUARDED,
                "sh",
                command_line,
                stdin=guard_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        os.close(guard_write)
        raise ToolFailure(f"could not start the command: {exc}") from exc
    finally:
        os.close(guard_read)

    pid = transport.get_pid()  # also the process group id (start_new_session)
    done = False
    try:
        started(pid, started_ms)
        with anyio.move_on_after(timeout) as deadline:
            lingering = await _pump(command)
        done = not deadline.cancelled_caught
        if done:
            with contextlib.suppress(OSError):  # the guardian may be gone already (the command killed its group)
                os.write(guard_write, b"\n")  # one byte into an empty pipe: never blocks
    finally:
        if not done:  # timed out, cancelled, or failed while waiting: leave nothing running
            await _stop_group(pid, command)
        os.close(guard_write)
        transport.close()
    if not done:
        return None, False
    returncode = transport.get_returncode()
    assert returncode is not None
    return returncode, lingering


def timed_out_text(timeout: float) -> str:
    return f"command timed out after {timeout:g} s; it and the processes it started were stopped."


LINGERING = ("[the shell exited but background processes still held its output open; stopped reading after "
             f"{EXIT_GRACE:g} s and left them running]")


async def run_command(args: dict[str, Any], ctx: ToolContext) -> str:
    command_line = require_str(args, "command")
    timeout = optional_number(args, "timeout", DEFAULT_TIMEOUT, minimum=1, maximum=MAX_TIMEOUT)
    env = tool_environment()
    env["CAIRN_CALL_ID"] = ctx.call_id
    capture = Capture()
    returncode, lingering = await run_shell(command_line, ctx.workspace, env, timeout, capture, ctx.progress)
    if returncode is None:
        raise ToolFailure(f"{timed_out_text(timeout)} Output so far:\n{capture.text() or '(none)'}")
    result = _join(capture.text(), _status_line(returncode))
    if lingering:
        result += "\n" + LINGERING
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
