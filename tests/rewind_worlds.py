"""Sessions to rewind and recover, written with fixed times in a fixed workspace (their pictures name it), and the
two steps that open the rewind dialog and choose a turn in it: shared by the rewind, dialog, operator and type-ahead
tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_world import sha
from tui_helpers import World, fixed_workspace, make_world, wait_for, write_log

from cairn.app.screens.rewind import RewindScreen
from cairn.persistence.blobs import blob_store_for
from cairn.persistence.events import AnyEvent, AssistantMessage, RequestHeader, StepEnd, StepStart, ToolCall
from cairn.persistence.events import ToolCallRequest, ToolResult, TurnEnd, TurnStart, UserMessage
from cairn.widgets.prompt_input import PromptInput

PICTURE_WORKSPACE = Path("/tmp/cairn-rewind-workspace")


def crashed_write(workspace: str) -> list[AnyEvent]:
    """A turn cut by a crash after `write_file` notes.txt was recorded (fingerprinted), then a NOT_STARTED edit."""
    write_call = ToolCallRequest("call_1_1_1", "write_file", {"path": "notes.txt", "content": "hello\n"})
    after = ToolCallRequest("call_1_1_2", "run_command", {"command": "make deploy"})
    return [
        TurnStart(turn=1),
        StepStart(turn=1, step=1),
        UserMessage(turn=1, step=1, text="write hello to notes.txt, then deploy"),
        RequestHeader(turn=1, step=1, provider="script", model="script", params={}, tools=[], message_count=2),
        AssistantMessage(turn=1, step=1, text="Writing the notes first.", tool_calls=[write_call, after],
                         interrupted=False),
        ToolCall(turn=1, step=1, call_id=write_call.call_id, name="write_file", arguments=dict(write_call.arguments),
                 safety="side_effecting", parent_call_id=None, before_sha256=None, after_sha256=sha("hello\n")),
    ]


def evidence_world(tmp_path: Path) -> World:
    """Session `crashed-id`, cut by a crash after its `write_file` took effect (`crashed_write`), in PICTURE_WORKSPACE:
    the resume screen finds the evidence that it happened."""
    world = make_world(tmp_path, [])
    fixed_workspace(world, PICTURE_WORKSPACE)
    (PICTURE_WORKSPACE / "notes.txt").write_text("hello\n")  # the write took effect before the crash
    write_log(world.store, "crashed-id", crashed_write(str(PICTURE_WORKSPACE)), cwd=str(PICTURE_WORKSPACE))
    return world


def fixed_turns(world: World) -> None:
    """Three turns written with fixed times, their files in a fixed workspace and their before-images stored:
    turn 1 writes a.txt; turn 2 edits it and creates b.txt; turn 3 rewrites notes.md (hand-edited since) and runs a
    command."""
    events: list[AnyEvent] = []

    def turn(n: int, prompt: str, calls: list[tuple[str, dict, str | None, str | None]]) -> None:
        requests = [ToolCallRequest(f"call_{n}_1_{i}", name, args) for i, (name, args, _, _) in enumerate(calls, 1)]
        events.extend([TurnStart(turn=n), StepStart(turn=n, step=1), UserMessage(turn=n, step=1, text=prompt),
                       RequestHeader(turn=n, step=1, provider="script", model="script", params={}, tools=[],
                                     message_count=2),
                       AssistantMessage(turn=n, step=1, text="", tool_calls=requests, interrupted=False)])
        for request, (name, args, before, after) in zip(requests, calls):
            events.append(ToolCall(turn=n, step=1, call_id=request.call_id, name=name, arguments=args,
                                   safety="side_effecting", parent_call_id=None, before_sha256=before,
                                   after_sha256=after))
            events.append(ToolResult(turn=n, step=1, call_id=request.call_id, is_error=False, content="ok",
                                     error_code=None, source_seq=len(events) - 1))
        events.extend([AssistantMessage(turn=n, step=2, text="Done.", tool_calls=[], interrupted=False),
                       StepEnd(turn=n, step=1), TurnEnd(turn=n, reason="completed", error=None)])

    turn(1, "write the first draft of a.txt", [("write_file", {"path": "a.txt", "content": "one\n"}, None, sha("one\n"))])
    turn(2, "change a.txt and add b.txt\nwith a second line that the list does not show", [
        ("edit_file", {"path": "a.txt", "old": "one", "new": "two"}, sha("one\n"), sha("two\n")),
        ("write_file", {"path": "b.txt", "content": "bee\n"}, None, sha("bee\n"))])
    turn(3, "update the notes and rebuild", [
        ("write_file", {"path": "notes.md", "content": "v2\n"}, sha("v1\n"), sha("v2\n")),
        ("run_command", {"command": "make"}, None, None)])
    fixed_workspace(world, PICTURE_WORKSPACE)
    (PICTURE_WORKSPACE / "a.txt").write_text("two\n")
    (PICTURE_WORKSPACE / "b.txt").write_text("bee\n")
    (PICTURE_WORKSPACE / "notes.md").write_text("edited by hand\n")
    blobs = blob_store_for(world.store.backend)
    try:
        blobs.put(b"one\n")
        blobs.put(b"v1\n")
    finally:
        blobs.close()
    write_log(world.store, "rewind-id", events, cwd=str(PICTURE_WORKSPACE))


# -- the rewind dialog ----------------------------------------------------------------------------------------------


async def open_by_slash(pilot: Any, app: Any) -> RewindScreen:
    """The rewind dialog, opened by typing `/rewind` at the chat."""
    await wait_for(pilot, lambda: app.chat is not None and app.screen is app.chat, "the chat")
    app.chat.query_one(PromptInput).insert("/rewind")
    await pilot.press("enter")
    return await wait_for(pilot, lambda: isinstance(app.screen, RewindScreen) and app.screen, "the rewind dialog")


async def choose_turn(pilot: Any, dialog: RewindScreen, turn: int) -> None:
    """Move the dialog's choice to `turn` and wait for its plan."""
    await wait_for(pilot, lambda: dialog.plan is not None, "the first plan")
    while dialog.selected_turn != turn:
        await pilot.press("up")
    await wait_for(pilot, lambda: dialog.plan is not None and dialog.plan.to_turn == turn, f"the plan of turn {turn}")
    await pilot.pause()


async def dialog_at_turn(pilot: Any, app: Any, turn: int) -> RewindScreen:
    """The rewind dialog opened by `/rewind`, its choice moved to `turn` and that turn's plan shown."""
    dialog = await open_by_slash(pilot, app)
    await choose_turn(pilot, dialog, turn)
    return dialog
