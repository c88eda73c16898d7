"""Builders shared by the TUI tests: a real store and config for `CairnApp`, logs with fixed times, bounded waits
(from waiting.py), and the pictures: `picture()` for `snap_compare`, a fixed workspace, a repaint before the shot."""

from __future__ import annotations

import shutil
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from agent_helpers import write_script
from waiting import wait_for, wait_sync  # noqa: F401  (the TUI tests take their waits from here too)

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
from cairn.widgets.prompt_input import PromptInput

SESSION_ID = "fixed-id"
CREATED = 1_764_686_400_000  # 2025-12-02 14:40:00 UTC
CWD = "/workspace"  # what the header (and the sessions screen) shows; tools run in the real tmp workspace
SIZE = (100, 30)
SNAPSHOT_WORKSPACE = Path("/tmp/cairn-snapshot-workspace")  # previews and the header name it: a fixed path


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


def screen_text(app: Any) -> str:
    """Every line on screen as plain text, as the compositor hands it to the terminal (what a snapshot will show)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def top_screen(app: Any, kind: type[Any]) -> Any:
    """The app's top screen if it is a `kind` whose `on_mount` has run (a screen pushed during the app's own start-up
    is on top of the stack before it is mounted), else None."""
    screen = app.screen
    return screen if isinstance(screen, kind) and screen.is_mounted else None


def ended_turns(events: list[AnyEvent]) -> list[TurnEnd]:
    return [e for e in events if isinstance(e, TurnEnd)]



async def submit(pilot: Any, text: str) -> None:
    """The text placed in the prompt at once, then a real Enter: for tests about what happens after the prompt."""
    pilot.app.chat.query_one(PromptInput).insert(text)
    await pilot.press("enter")


async def approval_ready(pilot: Any, app: Any, timeout: float = 10.0) -> Any:
    """The approval modal, once it takes a decision (opened while the operator typed, it waits for Tab: SPEC §11)."""
    from cairn.app.screens.approval import ApprovalModal

    modal = await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal) and app.screen, "the approval modal",
                           timeout)
    await wait_for(pilot, lambda: modal.armed, "the approval modal to take keys", timeout)
    await wait_for(pilot, lambda: str(modal.query_one("#guard").render()).startswith("Choose"), "its hint", timeout)
    return modal


@asynccontextmanager
async def strict_app(tmp_path: Path, server: Any) -> AsyncIterator[tuple[CairnApp, Any]]:
    """A new session's app and its pilot at 120×40, talking to `server` (the strict local OpenAI-compatible one) with no
    retries: what the next request looks like after an error is the server's to judge."""
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    home = tmp_path / "home"
    config = resolve_config(home=str(home), provider="openai", model="strict-model", base_url=server.base_url,
                            workspace=str(workspace), env={"CAIRN_API_KEY": "sk-tui", "CAIRN_MAX_RETRIES": "0"})
    store = SessionStore(home, "jsonl")
    app = CairnApp(config, store.create(cwd=str(workspace), deferred=True), store)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            yield app, pilot
    finally:
        app.close_if_still_open()


@asynccontextmanager
async def running(app: Any, size: tuple[int, int] = SIZE) -> AsyncIterator[Any]:
    """`app.run_test` (at the standard size unless told), closed even when the test fails inside it."""
    try:
        async with app.run_test(size=size) as pilot:
            yield pilot
    finally:
        app.close_if_still_open()


def iter_ids(home: Path) -> Iterator[str]:
    """Session ids under `home` (a JSONL home), oldest name first."""
    return (path.stem for path in sorted((home / "sessions").glob("*.jsonl")))


# -- pictures ---------------------------------------------------------------------------------------------------------


def picture(snap_compare: Any, app: CairnApp, size: tuple[int, int],
            run_before: Callable[[Any], Awaitable[None]] | None = None, *, press: tuple[str, ...] | list[str] = (),
            before_close: Callable[[], None] | None = None) -> bool:
    """Compare the app's picture at `size` after `run_before(pilot)` and `press`, then release what the app held (the
    harness ends the app with `exit()`, not the ordered quit). The theme is set here (TEXTUAL_THEME is read when textual
    is imported, before any conftest runs) and the prompt's cursor does not blink."""

    async def prepare(pilot: Any) -> None:
        app.theme = "textual-dark"
        if app.chat is not None:
            app.chat.query_one(PromptInput).cursor_blink = False
        if run_before is not None:
            await run_before(pilot)

    try:
        return bool(snap_compare(app, press=press, run_before=prepare, terminal_size=size))
    finally:
        if before_close is not None:
            before_close()
        app.close_if_still_open()


def fixed_workspace(world: World, path: Path = SNAPSHOT_WORKSPACE) -> Path:
    """Previews and the header name the workspace: an emptied fixed directory, so no picture carries pytest's tmp
    path."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    world.config.workspace = world.workspace = path
    return path


async def repaint(pilot: Any, app: Any, *, durable: bool = True) -> None:
    """The chat behind a modal is composited from its last paint: repaint once its events are applied and (`durable`)
    made durable (the status bar says `durable through seq N`, not `writing…`)."""
    from cairn.widgets.status_bar import StatusBar

    if durable and app.chat is not None:
        status = app.chat.query_one(StatusBar)
        await wait_for(pilot, lambda: status.durability == f"durable through seq {app.session.coordinator.durable_seq}",
                       "the status bar to show what is durable")
    if app.chat is not None:
        app.chat.refresh(layout=True)
    app.screen.refresh(layout=True)
    await pilot.pause()
    await pilot.pause()
