"""Rewind and recovery evidence in the TUI (SPEC §9 rev 3): `/rewind` and Esc Esc open the dialog; files, the
conversation or both go back to before a turn through the real engine; a hand-edited file is refused until confirmed;
an interrupted rewind is finished or abandoned when the session opens; the resume screen shows Cairn's evidence and `e`
takes it as the verdict, durably. Sessions are real files: built by `cairn run` with the script provider, or written
with fixed times for the pictures."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_world import CAIRN, edit, sha, write
from rewind_worlds import choose_turn, dialog_at_turn, evidence_world, fixed_turns, open_by_slash
from tui_helpers import make_world, picture, screen_text, top_screen, wait_for
from waiting import stop_clock

from cairn.app.agent.rewind_plan import prompts
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.resume import TYPING_GAP, ResumeScreen
from cairn.app.screens.rewind import PendingRewindScreen, RewindScreen
from cairn.app.screens.rewind_flow import ESC_ESC, RewindFlow
from cairn.persistence.events import (
    ConversationRewind,
    RecoveryVerdict,
    RewindEnd,
    RewindFile,
    RewindPlan,
    RewindStep,
)
from cairn.persistence.session import LiveSession
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.transcript import Notice

SIZE = (120, 32)


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
           "CAIRN_SNAPSHOTS": world.config.snapshots,
           "CAIRN_PROJECT_CONTEXT": os.environ.get("CAIRN_PROJECT_CONTEXT", "on")}  # (tests/conftest.py: off)
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
            dialog = await dialog_at_turn(pilot, app, 2)
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
            await dialog_at_turn(pilot, app, 3)
            await pilot.press("c")
            await wait_for(pilot, lambda: "the conversation continues from before turn 3" in notices(app), "notice")
            assert "⟲ rewound" in notices(app)  # the transcript marks where the conversation goes on from
            # the rewound turn's prompt waits in the prompt, to send, edit or drop
            assert app.chat.query_one(PromptInput).text == dict(prompts(app.session.events))[3]
            await app.action_quit()

    asyncio.run(run())
    assert (world.workspace / "a.txt").read_text() == "three\n"
    assert [e.to_turn for e in world.log("rw") if isinstance(e, ConversationRewind)] == [3]


def test_esc_esc_then_both_asks_about_a_hand_edited_file_and_leave_it_keeps_it(tmp_path, monkeypatch):
    """SPEC §10: the TUI asks path by path; "Leave it" keeps that path as it is, named, and the rest is rewound."""
    world = three_turns(tmp_path)
    (world.workspace / "a.txt").write_text("mine\n")  # changed outside Cairn
    app = world.resume_app("rw")
    clock = stop_clock(monkeypatch, RewindFlow)  # Esc Esc is judged by this clock: the test moves it on

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.screen is app.chat, "the chat")
            await wait_for(pilot, lambda: app.chat.agent is not None, "the agent")
            await pilot.press("escape")
            await pilot.pause()
            clock.advance(ESC_ESC + 0.1)
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.chat  # one Esc (or two far apart) opens nothing
            await pilot.press("escape")
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
            await dialog_at_turn(pilot, app, 2)
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


def test_accept_evidence_key_records_a_durable_verdict(tmp_path, monkeypatch):
    world = evidence_world(tmp_path)
    app = world.resume_app("crashed-id")
    clock = stop_clock(monkeypatch, ResumeScreen)  # the typing gap is judged by this clock: the test moves it on

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
            clock.advance(TYPING_GAP)
            await pilot.press("e")  # on its own: asked once more, then yes
            await wait_for(pilot, lambda: top_screen(app, ConfirmDialog), "asked once more")
            clock.advance(TYPING_GAP)
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


@pytest.mark.parametrize("size", [(80, 24), (120, 32), (200, 50)], ids=["80x24", "120x32", "200x50"])
def test_rewind_dialog_picture(snap_compare, tmp_path, size):
    world = make_world(tmp_path, [])
    fixed_turns(world)
    app = world.resume_app("rewind-id")

    async def shown(pilot) -> None:
        dialog = await dialog_at_turn(pilot, app, 2)
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
        dialog = await dialog_at_turn(pilot, app, 1)
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
            await dialog_at_turn(pilot, app, 1)
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
