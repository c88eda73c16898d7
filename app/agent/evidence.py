"""The evidence around tool calls (SPEC §9 rev 3): what rewind and recovery need later, gathered as the calls run.

A plug-in beside the checkpoint policy: the policy chooses barriers around a tool, this records what the workspace
was around it — a file tool's fingerprint and before-image, and workspace snapshots (at a turn's start and end, and
before each side-effecting command). The loop calls it at four points (`turn_started`, `before_call`,
`body_starting`, `turn_completed`); it never chooses a barrier, and the pre-tool barrier that follows `before_call`
covers whatever it recorded.

Unlike the policy it cannot sit in the hooks' `around_tool` chain: a fingerprint is part of the call's `tool/call`,
which that chain already finds appended (the pre-tool barrier must follow it).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

import anyio

from cairn.persistence.blobs import MAX_BEFORE_IMAGE, BlobStore
from cairn.persistence.events import WorkspaceSnapshot
from cairn.persistence.session import LiveSession

from ..tools.base import Tool
from ..tools.command import run_command
from ..tools.file_writes import Fingerprint, edit_file, fingerprint, write_file
from .hooks import ToolRunContext
from .snapshots import ShadowRepo, Snapshot, SnapshotUnavailable

log = logging.getLogger("cairn.loop")


class Evidence:
    def __init__(self, session: LiveSession, workspace: Path, blobs: Callable[[], BlobStore] | None = None,
                 snapshots: ShadowRepo | None = None, report: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.workspace = Path(workspace).resolve()
        self.blobs = blobs  # the before-image store beside the session (built on first use); None: none kept
        self.snapshots = snapshots  # the workspace's shadow git repository (None: snapshots off or no git)
        self.report = report or log.warning
        self._last_shot: WorkspaceSnapshot | None = None  # this session's latest workspace/snapshot event
        self._touched = False  # a tool with an effect ran since that snapshot
        self._told_left_out: set[str] = set()  # paths the operator was told were left out of snapshots

    async def turn_started(self, turn: int) -> None:
        await self._snapshot(turn, "turn-start")

    async def turn_completed(self, turn: int) -> None:
        """After the last `step/end` of a turn that finished, before its `turn/end`."""
        await self._snapshot(turn, "turn-end")

    async def before_call(self, tool: Tool, turn: int, call_id: str, arguments: dict[str, Any]) -> Fingerprint | None:
        """Before a top-level call's `tool/call` is appended: a file tool's fingerprint (to record on the call) with
        its before-image stored, and a snapshot before a side-effecting command."""
        found = await self._fingerprint(tool, arguments)
        if tool.body is run_command and tool.safety == "side_effecting":
            await self._snapshot(turn, "command", call_id)  # recorded before this call's pre-tool barrier
        return found

    def body_starting(self, run: ToolRunContext) -> None:
        """A tool body starts: one with an effect makes the next command snapshot look at the workspace again."""
        self._touched = self._touched or run.safety != "read_only"

    async def _snapshot(self, turn: int, at: str, call_id: str | None = None) -> None:
        """The workspace as a tree in the shadow repository, recorded (SPEC §9 rev 3). A snapshot git cannot take in
        its time budget turns snapshots off for the rest of the session, with one line saying so."""
        repo = self.snapshots
        if repo is None:
            return
        last = self._last_shot
        if at == "command" and not self._touched and last is not None and last.turn == turn:
            # nothing with an effect ran since this turn's last snapshot: the command starts from that tree
            shot = Snapshot(last.tree, [(path, "") for path in last.left_out], last.manifest)
        else:
            try:
                shot = await anyio.to_thread.run_sync(repo.snapshot)
            except SnapshotUnavailable as e:
                self.snapshots = None
                self.report(str(e))
                return
        self._touched = False
        self._last_shot = WorkspaceSnapshot(
            turn=turn, at=at, tree=shot.tree, call_id=call_id, left_out=[path for path, _ in shot.left_out],
            manifest=shot.manifest, workspace=str(repo.workspace))
        self.session.append(self._last_shot)
        news = [(path, why) for path, why in shot.left_out if why and path not in self._told_left_out]
        if news:  # once a session per path, not at every snapshot
            self._told_left_out.update(path for path, _ in news)
            shown = ", ".join(f"{path} ({why})" for path, why in news[:5])
            more = f" and {len(news) - 5} more" if len(news) > 5 else ""
            self.report(f"left out of workspace snapshots (not restorable): {shown}{more}")

    async def _fingerprint(self, tool: Tool, arguments: dict[str, Any]) -> Fingerprint | None:
        """A file tool's fingerprint, with its before-image stored durably — both before its `tool/call` is appended,
        so the pre-tool barrier that follows covers a call whose image is already on disk (SPEC §9 rev 3)."""
        if tool.body not in (write_file, edit_file):  # Cairn's own file tools only
            return None
        name = tool.name
        found = await anyio.to_thread.run_sync(fingerprint, name, arguments, self.workspace, MAX_BEFORE_IMAGE)
        if found is not None and found.before is not None and self.session.holds_secret(found.before):
            log.info("%s holds a configured secret: its before-image is not kept (not restorable)", name)
            found = dataclasses.replace(found, before=None)
        if found is not None and found.before is not None and self.blobs is not None:
            await anyio.to_thread.run_sync(self.blobs().put, found.before)
        elif found is not None and found.before is None and found.before_sha256 is not None:
            log.info("%s is over %d bytes: its before-image is not kept (not restorable)", name, MAX_BEFORE_IMAGE)
        return found
