"""Project instructions and the environment in the system prompt (issue 42, SPEC §2 rev 4 `context/*`).

At each turn's start the loop asks `ProjectContext.turn_started` to read the instruction files (the user's own
`AGENTS.md` in Cairn's config directory, then one file per level from the top of the enclosing git repository down to
the workspace, nearest last: `AGENTS.md`, else `CLAUDE.md`, else `GEMINI.md`) and to describe the environment (date, OS,
shell, workspace, git branch and status). Each is appended as an event only when it differs from the latest one in the
log, so the text is stored once per change and a resumed session knows what the model was told.

The system prompt is derived from the log (`SystemPrompt`), not from what was read: the session scrubs configured
secrets from every event it appends, so the model is told exactly what the log holds and never a secret.

Everything here treats the workspace as hostile: only regular files are read (a FIFO never blocks a turn), every file is
size-limited, and git runs with no hooks, fsmonitor, pager, filters, global or system config, under a time limit;
whatever fails is left out (git lines) or recorded as an error with a notice (a file), never a crash.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

import anyio.to_thread

from cairn.persistence.events import AnyEvent, ContextEnvironment, ContextInstructions, InstructionFile
from cairn.persistence.sanitize import clean_struct
from cairn.persistence.session import LiveSession

from ..tools.regular_files import kind_of

log = logging.getLogger("cairn.loop")

INSTRUCTION_NAMES = ("AGENTS.md", "CLAUDE.md", "GEMINI.md")  # per level: the first one present is read
FILE_LIMIT = 32 * 1024  # bytes of one file sent to the model
TOTAL_LIMIT = 64 * 1024  # bytes of all files together
GIT_TIMEOUT = 2.0  # seconds for all git calls of one turn's environment
SHELL = "/bin/sh"  # what run_command runs commands with (tools/command.py: `/bin/sh -c`)
INSTRUCTIONS_INTRO = ("Project instructions, from the files below (the user's own first, then from the repository's "
                      "top down to the workspace; where they disagree, the later, nearer file wins):")


def context_wanted() -> bool:
    """False when `CAIRN_PROJECT_CONTEXT=off`: no instructions or environment are read or recorded (a test that pins the
    exact events or request, an embedding that builds its own prompt). The prompt still tells what the log records.
    The faces take the setting from their validated config (`project_context`, config/resolver.py); this is the
    default of a loop built without one."""
    return os.environ.get("CAIRN_PROJECT_CONTEXT", "").strip().lower() != "off"


def user_config_dir() -> Path:
    """Cairn's config directory (where `config.toml` is looked for by default), holding the user's own AGENTS.md."""
    from ..config.settings import default_config_path

    return default_config_path().parent


def shown_path(path: Path, workspace: Path) -> str:
    """A path as the operator reads it: relative to the workspace inside or above it, `~/…` under HOME."""
    home = os.path.expanduser("~")
    if path.is_relative_to(workspace) or path.parent in workspace.parents:
        return os.path.relpath(path, workspace)
    if home not in ("", "/") and path.is_relative_to(home):
        return "~/" + os.path.relpath(path, home)
    return str(path)


def repository_top(workspace: Path) -> Path | None:
    """The nearest directory at or above the workspace holding a `.git` entry (None: not in a repository)."""
    for level in (workspace, *workspace.parents):
        if os.path.lexists(level / ".git"):
            return level
    return None


def instruction_paths(workspace: Path, config_dir: Path | None) -> list[tuple[Path, str]]:
    """(path, scope) of each instruction file present, in the order they are sent: the user's own, then one per level
    from the repository's top (or the workspace when it is in none) down to the workspace."""
    found: list[tuple[Path, str]] = []
    if config_dir is not None and os.path.lexists(config_dir / "AGENTS.md"):
        found.append((config_dir / "AGENTS.md", "user"))
    top = repository_top(workspace) or workspace
    levels = [workspace, *(p for p in workspace.parents if p.is_relative_to(top))]
    for level in reversed(levels):
        name = next((n for n in INSTRUCTION_NAMES if os.path.lexists(level / n)), None)
        if name is not None and (level / name, "user") not in found:  # (the workspace may be the config directory)
            found.append((level / name, "project"))
    return found


def kb(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.1f} KB" if size < 10 * 1024 else f"{size // 1024} KB"


def read_instruction(path: Path, shown: str, scope: str, limit: int) -> tuple[InstructionFile, str, str | None]:
    """One file read for the prompt: (record, text sent, notice). At most `limit` bytes are sent (cut at a character
    boundary); anything but a regular file, or an OS error, is an `error` with a notice and no text."""
    digest, head, size = hashlib.sha256(), bytearray(), 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once and is refused below
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OSError(f"it is {kind_of(mode)}, not a regular file")
            while chunk := os.read(fd, 1 << 16):
                digest.update(chunk)
                size += len(chunk)
                if len(head) <= limit:
                    head += chunk[:limit + 1 - len(head)]
        finally:
            os.close(fd)
    except OSError as e:
        reason = e.strerror or str(e)
        return (InstructionFile(path=shown, scope=scope, sha256=None, size=0, error=reason),
                "", f"{shown} could not be read ({reason}): it is not sent")
    notice = None
    if size > limit:
        cut = limit
        while cut > 0 and head[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
            cut -= 1
        head = head[:cut]
        notice = (f"{shown} is {kb(size)}: only its first {kb(cut)} are sent" if cut else
                  f"{shown} is not sent: the instructions are over {kb(TOTAL_LIMIT)} in total")
    record = InstructionFile(path=shown, scope=scope, sha256=digest.hexdigest(), size=size,
                             truncated=notice is not None)
    return record, bytes(head).decode("utf-8", "replace"), notice


def read_instructions(workspace: Path, config_dir: Path | None) -> tuple[list[InstructionFile], str, list[str]]:
    """The files, the text (each file under a header naming it, in order) and the notices for a workspace."""
    files: list[InstructionFile] = []
    parts: list[str] = []
    notices: list[str] = []
    left = TOTAL_LIMIT
    for path, scope in instruction_paths(workspace, config_dir):
        record, text, notice = read_instruction(path, shown_path(path, workspace), scope, min(FILE_LIMIT, left))
        files.append(record)
        if notice:
            notices.append(notice)
        if record.error is None and text:
            left -= len(text.encode("utf-8", "replace"))
            parts.append(f"--- {record.path} ---\n{text.rstrip()}")
    return files, "\n\n".join(parts), notices


# -- the environment ------------------------------------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    """Nothing of the user's git setup and nothing that prompts (snapshots.py's rule); the repository's own config is
    still read, so everything in it that can run a program is switched off on the command line (`_git`)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.devnull, "LANG": "C", "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat", "PAGER": "cat", "GIT_ATTR_NOSYSTEM": "1"}


SAFE_OPTIONS = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=" + os.devnull, "-c", "core.pager=cat",
                "-c", "credential.helper=", "-c", "core.untrackedCache=false", "-c", "diff.external=",
                "-c", "core.attributesFile=" + os.devnull, "-c", "status.submoduleSummary=false",
                "--no-pager", "--no-optional-locks")


def _git(git: str, workspace: Path, args: list[str], deadline: float) -> bytes | None:
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    try:
        done = subprocess.run([git, *SAFE_OPTIONS, *args], cwd=workspace, env=_git_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=left)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_lines(workspace: Path, timeout: float = GIT_TIMEOUT) -> list[str]:
    """`Git branch: …` and `Git status: …` for a workspace in a repository; [] when it is in none, git is missing,
    fails or is too slow. A filter a `.gitattributes` names could run a program while status compares contents: every
    filter the repository's config defines is emptied first."""
    git = shutil.which("git")
    if git is None or repository_top(workspace) is None:
        return []
    deadline = time.monotonic() + timeout
    names = _git(git, workspace, ["config", "-z", "--name-only", "--get-regexp", r"^filter\."], deadline)
    drivers = {name.rsplit(".", 1)[0] for name in (names or b"").decode("utf-8", "replace").split("\0")
               if name.count(".") >= 2}
    filters = [option for driver in sorted(drivers) for key in ("clean", "smudge", "process")
               for option in ("-c", f"{driver}.{key}=")]
    out = _git(git, workspace, [*filters, "status", "--porcelain=v2", "--branch", "-z", "--no-renames",
                                "--ignore-submodules=all", "--untracked-files=normal"], deadline)
    if out is None:
        return []
    return describe_status(out.decode("utf-8", "replace"))


def describe_status(porcelain: str) -> list[str]:
    """The two git lines from `git status --porcelain=v2 --branch -z` output."""
    head, oid = "", ""
    counts = {"modified": 0, "added": 0, "deleted": 0, "untracked": 0}
    for entry in porcelain.split("\0"):
        if entry.startswith("# branch.head "):
            head = entry[len("# branch.head "):]
        elif entry.startswith("# branch.oid "):
            oid = entry[len("# branch.oid "):]
        elif entry.startswith("? "):
            counts["untracked"] += 1
        elif entry[:2] in ("1 ", "2 ", "u "):
            xy = entry[2:4]
            counts["added" if "A" in xy else "deleted" if "D" in xy else "modified"] += 1
    if head == "(detached)":
        branch = f"detached at {oid[:7]}"
    else:
        branch = head + (" (no commits yet)" if oid == "(initial)" else "")
    status = ", ".join(f"{n} {word}" for word, n in counts.items() if n) or "clean"
    return [f"Git branch: {branch}", f"Git status: {status}"]


def environment_text(workspace: Path, git_timeout: float = GIT_TIMEOUT) -> str:
    lines = [
        f"Date: {datetime.date.today().isoformat()}",
        f"OS: {platform.system()} {platform.release()}".rstrip(),
        f"Shell (run_command): {SHELL}",
        f"Workspace: {workspace}",
        *git_lines(workspace, git_timeout),
    ]
    return "\n".join(lines)


# -- recording and the derived prompt -------------------------------------------------------------------------------


class RecordedContext:
    """The latest `context/environment` and `context/instructions` in a session's log, followed incrementally."""

    def __init__(self, session: LiveSession) -> None:
        self.session = session
        self.environment: ContextEnvironment | None = None
        self.instructions: ContextInstructions | None = None
        self._seen = 0
        self.changes = 0  # how many context events were seen (the prompt is rebuilt only when this grows)

    def update(self) -> None:
        events: list[AnyEvent] = self.session.events
        if len(events) < self._seen:  # (a list replaced under us: follow it from the start)
            self._seen = 0
        for e in events[self._seen:]:
            if isinstance(e, ContextEnvironment):
                self.environment, self.changes = e, self.changes + 1
            elif isinstance(e, ContextInstructions):
                self.instructions, self.changes = e, self.changes + 1
        self._seen = len(events)


class SystemPrompt:
    """The system prompt each request sends: the base prompt, then the latest recorded environment and instructions
    (rebuilt only when a new context event was appended)."""

    def __init__(self, base: str, session: LiveSession) -> None:
        self.base = base
        self.recorded = RecordedContext(session)
        self._built = (-1, base)

    @property
    def text(self) -> str:
        self.recorded.update()
        if self._built[0] != self.recorded.changes:
            self._built = (self.recorded.changes, compose_prompt(self.base, self.recorded.environment,
                                                                 self.recorded.instructions))
        return self._built[1]


def compose_prompt(base: str, environment: ContextEnvironment | None, instructions: ContextInstructions | None) -> str:
    parts = [base]
    if environment is not None and environment.text:
        parts.append("Environment:\n" + environment.text)
    if instructions is not None and instructions.text:
        parts.append(INSTRUCTIONS_INTRO + "\n\n" + instructions.text)
    return "\n\n".join(parts)


class ProjectContext:
    """Reads the context at each turn's start and records what changed (the loop's only call is `turn_started`)."""

    def __init__(self, session: LiveSession, workspace: Path, report: Callable[[str], None] | None = None,
                 config_dir: Path | None = None, git_timeout: float = GIT_TIMEOUT) -> None:
        self.session = session
        self.workspace = Path(workspace).resolve()
        self.report = report or log.warning
        self.config_dir = config_dir or user_config_dir()  # (where the user's own AGENTS.md is looked for)
        self.git_timeout = git_timeout
        self.recorded = RecordedContext(session)

    def read(self) -> tuple[str, tuple[list[InstructionFile], str, list[str]]]:
        """(environment text, instructions) as they are now. Blocking: file reads and git."""
        return (environment_text(self.workspace, self.git_timeout),
                read_instructions(self.workspace, self.config_dir))

    def start_reading(self) -> "asyncio.Future[tuple[str, tuple[list[InstructionFile], str, list[str]]]]":
        """`read()` started now in a worker thread, for `turn_started(turn, reading)`: the loop starts it before the
        turn-start snapshot, so the two git runs overlap instead of adding up before the first request (P14)."""
        return asyncio.get_running_loop().run_in_executor(None, self.read)

    async def turn_started(self, turn: int, reading: "asyncio.Future[tuple[str, tuple[list[InstructionFile], str, "
                                                     "list[str]]]] | None" = None) -> None:
        try:
            if reading is None:
                environment, (files, text, notices) = await anyio.to_thread.run_sync(self.read, abandon_on_cancel=True)
            else:
                environment, (files, text, notices) = await reading
        except Exception as e:  # (a bug, or an OS surprise: the turn goes on with what the log last recorded)
            log.exception("reading the project context failed")
            self.report(f"project instructions and environment not read: {type(e).__name__}: {e}")
            return
        self.recorded.update()
        last_env, last = self.recorded.environment, self.recorded.instructions
        # compared as they would be stored (secrets scrubbed, surrogates replaced), or a scrubbed record never matches
        env = ContextEnvironment(turn=turn, text=environment)
        instructions = ContextInstructions(turn=turn, files=files, text=text, notices=notices)
        for event in (env, instructions):
            clean_struct(event, self.session.coordinator.secrets)
        if last_env is None or last_env.text != env.text:
            self.session.append(env)
        if (instructions.files, instructions.notices) != ((last.files, last.notices) if last else ([], [])):
            self.session.append(instructions)
            for notice in instructions.notices:
                self.report(notice)


def loaded_lines(event: ContextInstructions | None) -> list[str]:
    """What `/instructions` shows: each file with its level and size (cut, or why it was not read), then the notices."""
    if event is None or not event.files:
        return ["No project instructions are loaded (AGENTS.md, CLAUDE.md or GEMINI.md in the workspace or above it, "
                "up to the repository's top, or AGENTS.md in Cairn's config directory)."]
    lines = []
    for f in event.files:
        state = f"not read: {f.error}" if f.error else kb(f.size) + (", cut at the size limit" if f.truncated else "")
        lines.append(f"{f.path}  ({f.scope}, {state})")
    return lines + [f"! {n}" for n in event.notices]


def context_line(event: ContextInstructions | ContextEnvironment) -> str:
    """One line for a transcript: `instructions: AGENTS.md, sub/AGENTS.md (2.1 KB)` or the environment's lines."""
    if isinstance(event, ContextEnvironment):
        return "environment: " + "; ".join(event.text.splitlines())
    if not event.files:
        return "instructions: none"
    names = ", ".join(f.path + (" (not read)" if f.error else " (cut)" if f.truncated else "") for f in event.files)
    return f"instructions: {names} ({kb(len(event.text.encode('utf-8', 'replace')))})"


def instructions_report(events: list[AnyEvent], workspace: Path, enabled: bool | None = None) -> str:
    """What `/instructions` says: the files the model is told (the latest record), or, before any is recorded, the
    files the next turn will read."""
    latest = next((e for e in reversed(events) if isinstance(e, ContextInstructions)), None)
    if latest is not None:
        head = f"Project instructions the model is told (recorded at turn {latest.turn}; re-read at each turn's start):"
        return "\n".join([head, *loaded_lines(latest)])
    if not (context_wanted() if enabled is None else enabled):
        return "Project instructions are off (CAIRN_PROJECT_CONTEXT=off): none are read or sent."
    files, text, notices = read_instructions(Path(workspace).resolve(), user_config_dir())
    if not files:
        return loaded_lines(None)[0]
    now = ContextInstructions(turn=0, files=files, text=text, notices=notices)
    return "\n".join(["Project instructions the next turn will send (not recorded yet):", *loaded_lines(now)])
