"""Builders shared by the TUI tests: a real store and config for `CairnApp`, logs with fixed times, bounded waits."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from agent_helpers import write_script

from cairn.app.config.resolver import Config, resolve_config
from cairn.app.tui import CairnApp
from cairn.persistence.events import (
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantMessage,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
)
from cairn.persistence.jsonl import FileOps, JsonlBackend
from cairn.persistence.store import SessionStore

SESSION_ID = "fixed-id"
CREATED = 1_764_686_400_000  # 2025-12-02 14:40:00 UTC
CWD = "/workspace"  # what the header (and the sessions screen) shows; tools run in the real tmp workspace
SIZE = (100, 30)


@dataclass
class World:
    config: Config
    store: SessionStore
    workspace: Path

    def new_app(self, session_id: str = SESSION_ID) -> CairnApp:
        opened = self.store.create(cwd=CWD, session_id=session_id, created=CREATED)
        return CairnApp(self.config, opened, self.store)

    def resume_app(self, session_id: str) -> CairnApp:
        return CairnApp(self.config, self.store.open_for_resume(session_id), self.store)

    def sessions_app(self) -> CairnApp:
        return CairnApp(self.config, None, self.store)

    def log(self, session_id: str = SESSION_ID) -> list[AnyEvent]:
        """The session as stored on disk (no repair)."""
        return self.store.backend.load(session_id).events


def make_world(tmp_path: Path, responses: list[dict[str, Any]], ops: FileOps | None = None) -> World:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.json", responses)
    # workspace snapshots off: these worlds test the screens (test_snapshots.py and test_tui_rewind.py turn them on)
    config = resolve_config(home=str(home), provider="script", script=str(script), workspace=str(workspace),
                            env={"CAIRN_SNAPSHOTS": "off"})
    store = SessionStore(home, JsonlBackend(home, ops) if ops is not None else "jsonl")
    return World(config, store, workspace)


def write_log(store: SessionStore, session_id: str, events: list[AnyEvent], *, created: int = CREATED,
              cwd: str = CWD, step_ms: int = 1000) -> None:
    """A closed session whose events carry fixed times (`created` + k·step_ms), written straight to the backend —
    the live coordinator would stamp them with the clock."""
    opened = store.create(cwd=cwd, session_id=session_id, created=created)
    try:
        batch = []
        for seq, event in enumerate(events):
            event.seq = seq
            event.time = created + (seq + 1) * step_ms
            batch.append((seq, encode_event(event)))
        opened.writer.append(batch, durable=True)
    finally:
        opened.writer.close()
        opened.lock.release()


def completed_turn(turn: int, prompt: str, answer: str) -> list[AnyEvent]:
    return [
        TurnStart(turn=turn),
        StepStart(turn=turn, step=1),
        UserMessage(turn=turn, step=1, text=prompt),
        RequestHeader(turn=turn, step=1, provider="script", model="script", params={}, tools=[], message_count=2),
        AssistantMessage(turn=turn, step=1, text=answer, tool_calls=[], interrupted=False),
        StepEnd(turn=turn, step=1),
        TurnEnd(turn=turn, reason="completed", error=None),
    ]


DEPLOY = ToolCallRequest("call_1_1_1", "run_command", {"command": "make deploy"})
CHANGELOG = ToolCallRequest("call_1_1_2", "edit_file", {"path": "CHANGELOG.md", "old": "## next", "new": "## 1.4.0"})


def crashed_turn() -> list[AnyEvent]:
    """A turn cut by a crash while `run_command` ran (its tool/call is recorded) and before `edit_file` began: repair
    makes the first OUTCOME_UNKNOWN and the second NOT_STARTED. Fresh objects on every call: tests may edit them."""
    deploy, changelog = (ToolCallRequest(c.call_id, c.name, dict(c.arguments)) for c in (DEPLOY, CHANGELOG))
    return [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        UserMessage(turn=1, step=1, text="deploy the site, then note the version in the changelog"),
        RequestHeader(turn=1, step=1, provider="script", model="script", params={}, tools=[], message_count=2),
        AssistantMessage(turn=1, step=1, text="Deploying first, then I will edit the changelog.",
                         tool_calls=[deploy, changelog], interrupted=False),
        ApprovalAsked(turn=1, step=1, call_id=DEPLOY.call_id),
        ApprovalDecided(turn=1, step=1, call_id=DEPLOY.call_id, decision="allowed_once"),
        ToolCall(turn=1, step=1, call_id=DEPLOY.call_id, name="run_command", arguments=dict(DEPLOY.arguments),
                 safety="side_effecting", parent_call_id=None),
    ]


def types_of(events: list[AnyEvent]) -> list[str]:
    from cairn.persistence.events import event_type

    return [event_type(e) for e in events]


def results(events: list[AnyEvent]) -> dict[str, ToolResult]:
    return {e.call_id: e for e in events if isinstance(e, ToolResult)}


def wait_sync(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


async def wait_for(pilot: Any, condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Let the app run until `condition()` is truthy; fail (never hang) after `timeout` seconds.

    Sleeps with asyncio rather than `pilot.pause()`: the pilot's pauses wait until every widget of the screen has
    drained its message queue, and the persistence-service widget does not while a test holds its fdatasync."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def screen_text(app: Any) -> str:
    """Every line on screen as plain text, as the compositor hands it to the terminal (what a snapshot will show)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def top_screen(app: Any, kind: type) -> Any:
    """The app's top screen if it is a `kind` whose `on_mount` has run (a screen pushed during the app's own start-up
    is on top of the stack before it is mounted), else None."""
    screen = app.screen
    return screen if isinstance(screen, kind) and screen.is_mounted else None


def ended_turns(events: list[AnyEvent]) -> list[TurnEnd]:
    return [e for e in events if isinstance(e, TurnEnd)]



async def approval_ready(pilot: Any, app: Any, timeout: float = 10.0) -> Any:
    """The approval modal, once it takes a decision (opened while the operator typed, it waits for Tab: SPEC §11)."""
    from cairn.app.screens.approval import ApprovalModal

    modal = await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen, "the approval modal",
                           timeout)
    await wait_for(pilot, lambda: modal.armed, "the approval modal to take keys", timeout)
    await wait_for(pilot, lambda: str(modal.query_one("#guard").render()).startswith("Choose"), "its hint", timeout)
    return modal


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[Any]:
    """`app.run_test` at the standard size, closed even when the test fails inside it."""
    try:
        async with app.run_test(size=SIZE) as pilot:
            yield pilot
    finally:
        app.close_if_still_open()
