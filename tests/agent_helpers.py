"""Shared builders for loop, policy and CLI tests: a real store, the real composition, the script provider."""

from __future__ import annotations

import errno
import json
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from cairn.app.agent.approval import Approver, headless_approver
from cairn.app.compose import Agent, open_agent
from cairn.app.config.resolver import resolve_config
from cairn.app.tools.registry import ToolRegistry, builtin_tools
from cairn.persistence.events import AnyEvent, event_type
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.store import SessionStore


def types(events: list[AnyEvent]) -> list[str]:
    return [event_type(e) for e in events]


def write_script(path: Path, responses: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"responses": responses}))
    return path


class ControlledOps(FileOps):
    """Real file operations, plus faults and pauses armed by a test (the JSONL backend's seam)."""

    def __init__(self) -> None:
        self.fail_fsync = 0  # how many of the next fdatasyncs fail with EIO
        self.fsync_gate: threading.Event | None = None  # when set, fdatasync waits for it (in the writer thread)
        self.fsync_entered = threading.Event()
        self.fsyncs = 0

    inline_safe = False  # fdatasync may be held on purpose: keep it off the event loop

    def fdatasync(self, fd: int) -> None:
        self.fsyncs += 1
        self.fsync_entered.set()
        if self.fsync_gate is not None:
            self.fsync_gate.wait(10)
        if self.fail_fsync:
            self.fail_fsync -= 1
            raise OSError(errno.EIO, "injected fsync failure")
        super().fdatasync(fd)


@asynccontextmanager
async def script_agent(
    tmp_path: Path,
    responses: list[dict[str, Any]],
    *,
    approver: Approver | None = None,
    tools: ToolRegistry | None = None,
    ops: FileOps | None = None,
    backend: str = "jsonl",
    with_policy: bool = True,
    report: Any = None,
) -> AsyncIterator[Agent]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    script = write_script(tmp_path / "script.json", responses)
    home = tmp_path / "home"
    # workspace snapshots off: these tests pin SPEC §2's event order (tests/test_snapshots.py covers snapshots)
    config = resolve_config(home=str(home), backend=backend, provider="script", script=str(script),
                            workspace=str(workspace), env={"CAIRN_SNAPSHOTS": "off"})
    opened = None
    if ops is not None:
        opened = SessionStore(home, JsonlBackend(home, ops)).create(cwd=str(workspace))
    async with open_agent(
        config, opened=opened, approver=approver or headless_approver(True), tools=tools or ToolRegistry(builtin_tools()),
        with_policy=with_policy, report=report,
    ) as agent:
        yield agent
