"""Rewind and recovery evidence in the TUI (SPEC §9 rev 3): `/rewind` and Esc Esc open the dialog; files, the
conversation or both go back to before a turn through the real engine; a hand-edited file is refused until confirmed;
an interrupted rewind is finished or abandoned when the session opens; the resume screen shows Cairn's evidence and `e`
takes it as the verdict, durably. Sessions are real files: built by `cairn run` with the script provider, or written
with fixed times for the pictures."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.app.agent.rewind import prompts
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.rewind import PendingRewindScreen, RewindScreen
from cairn.persistence.blobs import blob_store_for
from cairn.persistence.events import (
    AssistantMessage,
    ConversationRewind,
    RecoveryEvidence,
    RecoveryVerdict,
    RequestHeader,
    RewindEnd,
    RewindFile,
    RewindPlan,
    RewindStep,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from cairn.persistence.session import LiveSession
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.transcript import Notice
from tui_helpers import make_world, screen_text, top_screen, wait_for, write_log

CAIRN = str(Path(sys.executable).parent / "cairn")
SIZE = (120, 32)
PICTURE_WORKSPACE = Path("/tmp/cairn-rewind-workspace")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write(path: str, content: str) -> dict:
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def edit(path: str, old: str, new: str) -> dict:
    return {"name": "edit_file", "arguments": {"path": path, "old": old, "new": new}}


def cli_turn(world, tmp_path: Path, sid: str, prompt: str, *calls: dict) -> None:
    """One turn through `cairn run --yes` with the script provider, in the world's home and workspace."""
    n = len(list(tmp_path.glob("turn*.json"))) + 1
    script = tmp_path / f"turn{n}.json"
    responses = [{"text": "", "tool_calls": list(calls)}] if calls else []
    script.write_text(json.dumps({"responses": [*responses, {"text": "done"}]}))
    first = not (Path(world.config.home) / "sessions").exists() or not any(
        s.id == sid for s in world.store.list_sessions())
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(world.config.home),
           "LANG": "C.UTF-8", "CAIRN_BACKEND": "jsonl", "CAIRN_PROVIDER": "script",
           "CAIRN_SNAPSHOTS": world.config.snapshots}
    proc = subprocess.run([CAIRN, "run", "--script", str(script), "--yes",
                           *(["--session-id", sid] if first else ["--resume", sid]), prompt],
                          env=env, cwd=world.workspace, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def three_turns(tmp_path: Path, sid: str = "rw", snapshots: str = "off"):
    """Turn 1 writes a.txt; turn 2 edits it and creates b.txt; turn 3 rewrites a.txt and runs a command. Workspace
    snapshots off unless asked for: these tests rewind from the file tools' before-images."""
    world = make_world(tmp_path, [])
    world.config = dataclasses.replace(world.config, snapshots=snapshots)
    cli_turn(world, tmp_path, sid, "write a", write("a.txt", "one\n"))
    cli_turn(world, tmp_path, sid, "change a, add b", edit("a.txt", "one", "two"), write("b.txt", "bee\n"))
    cli_turn(world, tmp_path, sid, "three", write("a.txt", "three\n"),
             {"name": "run_command", "arguments": {"command": "echo x > c.txt"}})
    assert (world.workspace / "a.txt").read_text() == "three\n"
    return world


def notices(app) -> str:
    return "\n".join(str(n.render()) for n in app.chat.query(Notice))


async def open_by_slash(pilot, app) -> RewindScreen:
    await wait_for(pilot, lambda: app.chat is not None and app.screen is app.chat, "the chat")
    app.chat.query_one(PromptInput).insert("/rewind")
    await pilot.press("enter")
    return await wait_for(pilot, lambda: isinstance(app.screen, RewindScreen) and app.screen, "the rewind dialog")


async def choose_turn(pilot, dialog: RewindScreen, turn: int) -> None:
    await wait_for(pilot, lambda: dialog.plan is not None, "the first plan")
    while dialog.selected_turn != turn:
        await pilot.press("up")
    await wait_for(pilot, lambda: dialog.plan is not None and dialog.plan.to_turn == turn, f"the plan of turn {turn}")
    await pilot.pause()


def test_rewind_files_from_the_slash_command(tmp_path):
    world = three_turns(tmp_path)
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            dialog = await open_by_slash(pilot, app)
            assert [t for t, _ in dialog.turns] == [1, 2, 3] and dialog.selected_turn == 3  # newest last, chosen
            await choose_turn(pilot, dialog, 2)
            shown = str(dialog.query_one("#plan-text").render())
            assert "a.txt" in shown and "b.txt — delete it" in shown
            assert "Commands ran in turn 3" in shown
            await pilot.press("f")
            await wait_for(pilot, lambda: app.screen is app.chat and not app.chat.rewinding, "the rewind")
            await wait_for(pilot, lambda: "restored to before turn 2" in notices(app), "its notice")
            assert "what they changed is not restored" in notices(app)
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "one\n"
    assert not (world.workspace / "b.txt").exists()
    assert (world.workspace / "c.txt").exists()  # a command's change is not Cairn's to undo
    log = world.log("rw")
    assert [e.outcome for e in log if isinstance(e, RewindEnd)] == ["completed"]
    assert not any(isinstance(e, ConversationRewind) for e in log)  # files only


def test_with_workspace_snapshots_the_dialog_takes_back_what_a_command_did_too(tmp_path):
    world = three_turns(tmp_path, snapshots="auto")
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the agent")
            dialog = await open_by_slash(pilot, app)
            await choose_turn(pilot, dialog, 2)
            shown = str(dialog.query_one("#plan-text").render())
            assert "commands' changes included" in shown and "c.txt — delete it" in shown
            await pilot.press("f")
            await wait_for(pilot, lambda: "restored to before turn 2" in notices(app), "its notice")
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "one\n"
    assert not (world.workspace / "b.txt").exists() and not (world.workspace / "c.txt").exists()


def test_rewind_conversation_only_keeps_the_files(tmp_path):
    world = three_turns(tmp_path)
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            dialog = await open_by_slash(pilot, app)
            await choose_turn(pilot, dialog, 3)
            await pilot.press("c")
            await wait_for(pilot, lambda: "the conversation continues from before turn 3" in notices(app), "notice")
            assert "⟲ rewound" in notices(app)  # the transcript marks where the conversation goes on from
            # the rewound turn's prompt waits in the prompt, to send, edit or drop
            assert app.chat.query_one(PromptInput).text == dict(prompts(app.session.events))[3]
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "three\n"
    assert [e.to_turn for e in world.log("rw") if isinstance(e, ConversationRewind)] == [3]


def test_esc_esc_then_both_asks_about_a_hand_edited_file_and_leave_it_keeps_it(tmp_path):
    """SPEC §10: the TUI asks path by path; "Leave it" keeps that path as it is, named, and the rest is rewound."""
    world = three_turns(tmp_path)
    (world.workspace / "a.txt").write_text("mine\n")  # changed outside Cairn
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.screen is app.chat, "the chat")
            await wait_for(pilot, lambda: app.chat.agent is not None, "the agent")
            await pilot.press("escape")
            await pilot.pause(0.7)
            assert app.screen is app.chat  # one Esc (or two far apart) opens nothing
            await pilot.press("escape", "escape")
            dialog = await wait_for(pilot, lambda: isinstance(app.screen, RewindScreen) and app.screen, "the dialog")
            await choose_turn(pilot, dialog, 2)
            assert "changed outside Cairn" in str(dialog.query_one("#plan-text").render())
            await pilot.press("b")
            asked = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "the question")
            assert asked.question.startswith("(1 of 1) a.txt: ")
            await pilot.press("n")  # leave a.txt: the rest goes back
            await wait_for(pilot, lambda: "the conversation continues from before turn 2" in notices(app), "notice")
            assert "not restored: a.txt" in notices(app) and "you chose to leave it" in notices(app)
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "mine\n"
    assert not (world.workspace / "b.txt").exists()
    log = world.log("rw")
    assert [e.to_turn for e in log if isinstance(e, ConversationRewind)] == [2]
    assert [e.outcome for e in log if isinstance(e, RewindEnd)] == ["completed"]


def test_esc_esc_then_both_overwrites_a_hand_edited_file_only_after_a_yes(tmp_path):
    world = three_turns(tmp_path)
    (world.workspace / "a.txt").write_text("mine\n")  # changed outside Cairn
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the agent")
            dialog = await open_by_slash(pilot, app)
            await choose_turn(pilot, dialog, 2)
            await pilot.press("b")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
            assert (world.workspace / "a.txt").read_text() == "mine\n"
            assert not any(isinstance(e, RewindPlan) for e in world.log("rw"))  # nothing before the answer
            await pilot.press("y")
            await wait_for(pilot, lambda: "the conversation continues from before turn 2" in notices(app), "notice")
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "one\n"
    assert not (world.workspace / "b.txt").exists()


def test_an_interrupted_rewind_is_shown_on_open_and_finished(tmp_path):
    world = three_turns(tmp_path)

    async def interrupt() -> None:  # what a crash after the first restored file leaves
        async with LiveSession(world.store.open_for_resume("rw")) as session:
            session.append(RewindPlan(rewind_id="r1", to_turn=2, conversation=True, commands_in=[3], files=[
                RewindFile(path="a.txt", restore_sha256=sha("one\n"), expected_sha256=sha("three\n")),
                RewindFile(path="b.txt", restore_sha256=None, expected_sha256=sha("bee\n"))]))
            session.append(RewindStep(rewind_id="r1", path="a.txt", outcome="done"))
            await session.flush()

    asyncio.run(interrupt())
    (world.workspace / "a.txt").write_text("one\n")
    app = world.resume_app("rw")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            screen = await wait_for(pilot, lambda: top_screen(app, PendingRewindScreen),
                                    "the interrupted rewind")
            text = str(screen.query_one("#pending").render())
            assert "Restored: a.txt" in text and "Not restored yet: b.txt" in text
            assert app.chat.rewinding  # no prompt is sent before it is settled
            await pilot.press("f")
            await wait_for(pilot, lambda: app.screen is app.chat and not app.chat.rewinding, "finished")
            await wait_for(pilot, lambda: "restored to before turn 2" in notices(app), "its notice")
            await app.action_quit()

    asyncio.run(run())
    assert not (world.workspace / "b.txt").exists()
    log = world.log("rw")
    assert [(e.rewind_id, e.outcome) for e in log if isinstance(e, RewindEnd)] == [("r1", "completed")]
    assert [e.to_turn for e in log if isinstance(e, ConversationRewind)] == [2]


# -- recovery evidence on the resume screen ---------------------------------------------------------------------------


def crashed_write(workspace: str) -> list:
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


def evidence_world(tmp_path: Path):
    world = make_world(tmp_path, [])
    shutil.rmtree(PICTURE_WORKSPACE, ignore_errors=True)
    PICTURE_WORKSPACE.mkdir(parents=True)
    world.config.workspace = world.workspace = PICTURE_WORKSPACE
    (PICTURE_WORKSPACE / "notes.txt").write_text("hello\n")  # the write took effect before the crash
    write_log(world.store, "crashed-id", crashed_write(str(PICTURE_WORKSPACE)), cwd=str(PICTURE_WORKSPACE))
    return world


def test_accept_evidence_key_records_a_durable_verdict(tmp_path):
    world = evidence_world(tmp_path)
    app = world.resume_app("crashed-id")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume")
            assert screen.calls[0].evidence == "happened"
            await pilot.press("h", "e", "l", "l", "o")  # typing meant for the prompt decides nothing (SPEC §11):
            await wait_for(pilot, lambda: app.chat.query_one(PromptInput).text == "hello", "it lands in the prompt")
            assert screen.held  # `h` is none of the screen's keys: the keys stay with the prompt until Tab
            assert not screen.calls[0].verdict
            assert not any(isinstance(e, RecoveryVerdict) for e in world.log("crashed-id"))
            await pilot.press("tab")
            await pilot.press("e", "x", "i", "t", "y")  # a word that starts with e (and holds a y) decides nothing
            question = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen, "asked")
            await wait_for(pilot, lambda: app.chat.query_one(PromptInput).text == "helloxity", "xity in the prompt")
            assert question.held and not screen.calls[0].verdict
            assert not any(isinstance(e, RecoveryVerdict) for e in world.log("crashed-id"))
            await pilot.press("tab", "n")  # the question it opened: not now
            await wait_for(pilot, lambda: app.screen is screen, "the resume screen again")
            await pilot.pause(0.6)
            await pilot.press("e")  # on its own: asked once more, then yes
            await pilot.pause(0.6)
            await pilot.press("y")
            await wait_for(pilot, lambda: screen.calls[0].verdict == "happened", "the verdict")
            # durable before the screen shows it: read the file back from disk
            verdicts = [e for e in world.log("crashed-id") if isinstance(e, RecoveryVerdict)]
            assert [(v.call_id, v.verdict) for v in verdicts] == [("call_1_1_1", "happened")]
            assert verdicts[0].note.startswith("accepted Cairn's evidence: notes.txt holds the intended content")
            await pilot.press("c")
            await app.action_quit()

    asyncio.run(run())


# -- pictures ---------------------------------------------------------------------------------------------------------


def picture(snap_compare, app, size, run_before) -> bool:
    async def prepare(pilot) -> None:
        app.theme = "textual-dark"
        if app.chat is not None:
            app.chat.query_one(PromptInput).cursor_blink = False
        await run_before(pilot)

    try:
        return snap_compare(app, run_before=prepare, terminal_size=size)
    finally:
        app.close_if_still_open()


def fixed_turns(world) -> None:
    """Three turns written with fixed times, their files in a fixed workspace and their before-images stored:
    turn 1 writes a.txt; turn 2 edits it and creates b.txt; turn 3 rewrites notes.md (hand-edited since) and runs a
    command."""
    events: list = []

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
    shutil.rmtree(PICTURE_WORKSPACE, ignore_errors=True)
    PICTURE_WORKSPACE.mkdir(parents=True)
    (PICTURE_WORKSPACE / "a.txt").write_text("two\n")
    (PICTURE_WORKSPACE / "b.txt").write_text("bee\n")
    (PICTURE_WORKSPACE / "notes.md").write_text("edited by hand\n")
    blobs = blob_store_for(world.store.backend)
    try:
        blobs.put(b"one\n")
        blobs.put(b"v1\n")
    finally:
        blobs.close()
    world.config.workspace = world.workspace = PICTURE_WORKSPACE
    write_log(world.store, "rewind-id", events, cwd=str(PICTURE_WORKSPACE))


@pytest.mark.parametrize("size", [(80, 24), (120, 32), (200, 50)], ids=["80x24", "120x32", "200x50"])
def test_rewind_dialog_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    fixed_turns(world)
    app = world.resume_app("rewind-id")

    async def shown(pilot) -> None:
        dialog = await open_by_slash(pilot, app)
        await choose_turn(pilot, dialog, 2)
        text = screen_text(app)
        for words in ("Rewind", "1  write the first draft of a.txt", "2  change a.txt and add b.txt",
                      "3  update the notes and rebuild", "a.txt — restore its earlier content", "b.txt — delete it",
                      "changed outside Cairn", "Commands ran in turn 3", "Files [f]", "Conversation [c]",
                      "Both [b]", "Cancel [esc]"):
            assert words in text, words
        listed = [str(o.prompt) for o in dialog.query_one("#turns").options]
        assert not any("second line" in line for line in listed)  # first lines only

    assert picture(snap_compare, app, size, shown)


@pytest.mark.parametrize("size", [(80, 24), (120, 32), (200, 50)], ids=["80x24", "120x32", "200x50"])
def test_resume_screen_with_evidence_picture(snap_compare, tmp_path, size):
    world = evidence_world(tmp_path)
    app = world.resume_app("crashed-id")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
        await pilot.pause()
        text = screen_text(app)
        for words in ("write_file", "OUTCOME_UNKNOWN", "NOT_STARTED", "happened", "call_1_1_1", "call_1_1_2",
                      "Cairn checked: happened", "Accept evidence"):
            assert words in text, words

    assert picture(snap_compare, app, size, shown)


SNAPSHOT_WORKSPACE = Path("/tmp/cairn-rewind-snapshot-workspace")


def snapshot_turns(tmp_path: Path, ws: Path = SNAPSHOT_WORKSPACE):
    """A workspace with ignored files; turn 1 removes `.gitignore` (so the ignored files enter its end snapshot) and
    adds a file; between turns the operator edits one file and adds another; turn 2 says hello. Real git snapshots.
    The pictures use a fixed workspace (the status bar names it); other tests pass their own."""
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    world = make_world(tmp_path, [])
    world.config = dataclasses.replace(world.config, snapshots="auto", workspace=ws)
    world.workspace = ws
    (ws / ".gitignore").write_text("*.log\nbuild/\n")
    (ws / "app.log").write_text("precious log\n")
    (ws / "build").mkdir()
    (ws / "build" / "out.o").write_text("object\n")
    (ws / "README.md").write_text("readme\n")
    (ws / "notes.txt").write_text("notes\n")
    cli_turn(world, tmp_path, "snap", "tidy up the project",
             {"name": "run_command", "arguments": {"command": "rm .gitignore && echo more >> README.md"}},
             write("new.txt", "new\n"))
    with open(ws / "notes.txt", "a") as f:
        f.write("the operator's line\n")
    (ws / "mine.txt").write_text("mine\n")
    cli_turn(world, tmp_path, "snap", "say hello")
    return world


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=["80x24", "120x40", "200x50"])
def test_rewind_dialog_with_not_restored_paths_picture(snap_compare, tmp_path, size):
    """SPEC §10: the plan names what it leaves alone and why — ignored then, changed only by the operator."""
    world = snapshot_turns(tmp_path)
    app = world.resume_app("snap")

    async def shown(pilot) -> None:
        await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the agent")
        dialog = await open_by_slash(pilot, app)
        await choose_turn(pilot, dialog, 1)
        plan = str(dialog.query_one("#plan-text").render())
        for words in ("README.md — restore its earlier content", ".gitignore — restore its earlier content",
                      "new.txt — delete it", "Not restored (left as they are):",
                      "app.log — not captured at the start of a command of turn 1: ignored by .gitignore",
                      "build/out.o — not captured", "mine.txt — changed outside Cairn's turns",
                      "notes.txt — changed outside Cairn's turns"):
            assert words in plan, words
        assert "Undo the last rewind" not in screen_text(app)  # no rewind yet

    assert picture(snap_compare, app, size, shown)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
def test_rewind_then_undo_from_the_dialog_puts_everything_back(tmp_path):
    ws = tmp_path / "ws-undo"
    world = snapshot_turns(tmp_path, ws)

    def files() -> dict[str, str]:
        return {p.relative_to(ws).as_posix(): p.read_text() for p in ws.rglob("*")
                if p.is_file()}

    before = files()
    app = world.resume_app("snap")

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.agent is not None, "the agent")
            dialog = await open_by_slash(pilot, app)
            await choose_turn(pilot, dialog, 1)
            await pilot.press("b")
            await wait_for(pilot, lambda: "the conversation continues from before turn 1" in notices(app), "rewound")
            assert not (ws / "new.txt").exists()
            assert (ws / "app.log").exists() and (ws / "mine.txt").exists()
            app.chat.query_one(PromptInput).clear()  # the rewound turn's prompt waits there to be sent again
            await open_by_slash(pilot, app)
            assert "Undo the last rewind [u]" in screen_text(app)
            await pilot.press("u")
            await wait_for(pilot, lambda: "undid the last rewind" in notices(app), "undone")
            await app.action_quit()

    asyncio.run(run())
    assert files() == before
