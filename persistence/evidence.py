"""Recovery evidence (SPEC §9 rev 3): what Cairn can verify itself about an OUTCOME_UNKNOWN call after a crash.

A file tool's `tool/call` carries the path's hash before the body and the hash the body would leave; looking at the
file now answers the question the log cannot: it holds `after_sha256` → `happened`, still `before_sha256` →
`did_not_happen`, anything else → `unknown`. For `run_command` the evidence is whether its process (pid and start time
from `tool/progress`) is still running. Evidence is not a verdict: the operator may take it as one, or record another.

Reading the workspace is outside input: a path that leaves the workspace, a symlink, something that is not a regular
file, or a file that cannot be read is `unknown` with the reason — never an error.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .events import (
    TOOL_OUTCOME_UNKNOWN,
    AnyEvent,
    RecoveryEvidence,
    ToolCall,
    ToolProgress,
    ToolResult,
)

FILE_TOOLS = ("write_file", "edit_file")
HASH_CHUNK = 1 << 20


def sha256_of_file(path: Path) -> str | None:
    """The content hash of a regular file (not following a final symlink), or None when there is no file there.
    Raises OSError (or ValueError for something that is not a regular file) when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        digest = hashlib.sha256()
        while chunk := os.read(fd, HASH_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def inside(workspace: Path, relative: str) -> Path | None:
    """`relative` resolved inside `workspace` (its parent directories resolved, the name itself not followed), or None
    when it leaves the workspace."""
    try:
        root = workspace.resolve()
        target = (root / relative)
        parent = target.parent.resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    if parent != root and root not in parent.parents:
        return None
    return parent / target.name


def file_finding(call: ToolCall, workspace: Path) -> RecoveryEvidence | None:
    """The evidence for a fingerprinted file-tool call, or None for a call without fingerprints."""
    args = call.arguments if isinstance(call.arguments, dict) else {}
    path = args.get("path")
    if call.after_sha256 is None or not isinstance(path, str):
        return None
    shown = path
    target = inside(workspace, path)
    if target is None:
        return RecoveryEvidence(call_id=call.call_id, finding="unknown", detail=f"{shown} is outside the workspace now")
    try:
        now = sha256_of_file(target)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return RecoveryEvidence(call_id=call.call_id, finding="unknown", detail=f"{shown} cannot be read now ({reason})")
    if now == call.after_sha256:
        finding, detail = "happened", f"{shown} holds the intended content (sha256 {now[:12]}), so the change took effect"
    elif now == call.before_sha256:
        if now is None:
            finding, detail = "did_not_happen", f"{shown} still does not exist, so the write did not take effect"
        else:
            finding, detail = "did_not_happen", (f"{shown} still holds its content from before the call (sha256 "
                                                 f"{now[:12]}), so the change did not take effect")
    elif now is None:
        finding, detail = "unknown", f"{shown} no longer exists; it held neither the old nor the intended content"
    else:
        finding, detail = "unknown", (f"{shown} holds neither its old nor the intended content (sha256 {now[:12]}): "
                                      "it changed in another way")
    return RecoveryEvidence(call_id=call.call_id, finding=finding, detail=detail)  # type: ignore[arg-type]


def process_running(pid: int, started_ms: int) -> bool | None:
    """Whether the process `pid` that started at `started_ms` still runs: False when no such process exists or the pid
    now belongs to a process that started later (reused); None when it cannot be told."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else: the start time below tells whether it is ours
    except OSError:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return False  # it has exited (a zombie not yet reaped): it runs no more
        ticks = os.sysconf("SC_CLK_TCK")
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        began_ms = (boot + int(fields[19]) / ticks) * 1000
    except (OSError, IndexError, ValueError, StopIteration):
        return None  # it exists and its age cannot be read (not Linux): it cannot be told whether it is ours
    return abs(began_ms - started_ms) < 2_000  # boot time is whole seconds; a reused pid started later


def command_finding(call: ToolCall, progress: ToolProgress) -> RecoveryEvidence:
    running = process_running(progress.pid, progress.started)
    if running:
        detail = f"its process (pid {progress.pid}) is still running: it may not have finished yet"
    elif running is None:
        detail = f"whether its process (pid {progress.pid}) still runs cannot be told on this machine"
    else:
        detail = f"its process (pid {progress.pid}) is no longer running; what it did before it stopped is not known"
    return RecoveryEvidence(call_id=call.call_id, finding="unknown", detail=detail)


def gather_evidence(events: list[AnyEvent], repaired: list[AnyEvent], workspace: Path) -> list[RecoveryEvidence]:
    """Evidence for each OUTCOME_UNKNOWN result among `repaired` whose call Cairn can check (seq and time unset)."""
    unknown = [r for r in repaired if isinstance(r, ToolResult) and r.error_code == TOOL_OUTCOME_UNKNOWN]
    if not unknown:
        return []
    # only the interrupted turn matters: read back from the end to its first call (seq is the index: contiguous)
    first = min((r.source_seq for r in unknown if r.source_seq is not None), default=len(events))
    progress = {e.call_id: e for e in events[first:] if isinstance(e, ToolProgress)}
    found: list[RecoveryEvidence] = []
    for result in unknown:
        seq = result.source_seq
        call = events[seq] if seq is not None and 0 <= seq < len(events) else None
        if not isinstance(call, ToolCall) or call.seq != seq or call.parent_call_id is not None:
            continue
        if call.name in FILE_TOOLS:
            evidence = file_finding(call, workspace)
        elif call.name == "run_command" and call.call_id in progress:  # no recorded process: nothing to check
            evidence = command_finding(call, progress[call.call_id])
        else:
            evidence = None
        if evidence is not None:
            found.append(evidence)
    return found


def evidence_by_call(events: list[AnyEvent]) -> dict[str, RecoveryEvidence]:
    """The latest evidence recorded for each call id."""
    return {e.call_id: e for e in events if isinstance(e, RecoveryEvidence)}
