"""`cairn attach ID` (SPEC §13 rev 4): the chat view of a session another process is writing, read-only.

A real `cairn run` (the script provider streaming slowly, a tool call that runs until the test lets it go) is attached
to through the App's pilot, on JSONL and PostgreSQL: the banner names the writer, the answer grows as it streams, the
tool card appears and finishes, a SIGKILLed writer leaves the banner saying `interrupted` and offering `r`. An approval
waiting at its writer is shown and decided by no key here. `r` in a real terminal opens the normal chat (`cairn resume`),
with the resume screen for the recovered call. Nothing attach does writes a byte of the session.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from crash_harness import CAIRN, Child, Rig
from pg_hosts import long_call
from tui_helpers import CREATED, completed_turn, make_world, screen_text, write_log
from waiting import wait_for, wait_sync

from cairn.app.screens.help import KEYS as HELP_KEYS
from cairn.app.screens.help import HelpScreen
from cairn.app.screens.attach import RESUME, AttachApp, AttachScreen, writer_name
from cairn.persistence.events import (
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    RequestHeader,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    encode_event,
)
from cairn.persistence.store import SessionStore
from cairn.widgets.answer_text import AssistantText

pytestmark = pytest.mark.anyio

WAIT = 30.0  # seconds: generous for a loaded 2-core machine
ANSWER = "The command finished; here is what it printed, explained one line at a time, slowly."


def writer(rig: Rig, session_id: str = "s") -> tuple[Child, Path]:
    """`cairn run`: a run_command call that runs until `go` appears, then an answer streamed in 30 pieces, 0.3 s apart.
    Returns the child and the `go` file, once the call runs."""
    started, go = rig.io / "started", rig.io / "go"
    call = long_call(started, go)
    call["text"] = "Running it."
    script = rig.script([call, {"text": ANSWER, "chunks": 30, "delay_ms": 300}])
    child = rig.spawn("run", "--provider", "script", "--script", script, "--session-id", session_id, "--yes", "go")
    wait_sync(lambda: started.exists() or child.popen.poll() is not None, "the tool call to start", timeout=WAIT)
    assert child.popen.poll() is None, child.stderr()
    return child, go


def banner(screen: AttachScreen) -> str:
    """What the banner shows (its text and its colour class are set together)."""
    return str(screen.banner.content)


def answer_shown(screen: AttachScreen) -> str:
    return "".join(w.source for w in screen.transcript.query(AssistantText))


async def test_attach_follows_a_live_jsonl_writer_its_tool_card_and_streaming_answer_then_offers_resume_when_killed(
        tmp_path):
    rig = Rig(tmp_path)
    try:
        child, go = writer(rig)
        before = rig.raw_log("s")
        screen = AttachScreen.load(rig.store(), "s")
        app = AttachApp(screen)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: screen.is_mounted and "running" in str(screen.transcript.cards), "mount")
            assert banner(screen).startswith(f"● watching pid {child.pid} — read-only"), banner(screen)
            assert writer_name(None, child.pid) in screen_text(app)
            card = next(iter(screen.transcript.cards.values()))
            assert card.tool_name == "run_command" and card.status == "running"
            assert not screen.check_action("resume", ())  # no `r` while another process writes
            await pilot.press("r", "a", "y", "enter")  # nothing here decides or writes anything
            assert app.is_running and rig.raw_log("s")[: len(before)] == before

            go.write_text("")  # the tool ends: its card finishes, then the answer streams
            await wait_for(pilot, lambda: card.status == "done", "the tool card to finish", timeout=WAIT)
            partial = await wait_for(pilot, lambda: (shown := answer_shown(screen).removeprefix("Running it."))
                                     and shown != ANSWER and shown, "part of the answer", timeout=WAIT)
            assert ANSWER.startswith(partial) and child.popen.poll() is None  # streamed: shown before it is whole
            await wait_for(pilot, lambda: len(answer_shown(screen)) > len("Running it.") + len(partial),
                           "the answer to grow", timeout=WAIT)
            child.kill()  # mid-answer
            await wait_for(pilot, lambda: "gone" in banner(screen), "the banner to say the writer is gone",
                           timeout=WAIT)
            assert banner(screen).startswith(f"■ writer pid {child.pid} gone: session interrupted — r resumes here"), \
                banner(screen)
            assert "-interrupted" in screen.banner.classes and screen.check_action("resume", ())
            assert "the writer stopped here: the session is interrupted — r resumes it here" in screen_text(app)
            await pilot.press("r")
            await wait_for(pilot, lambda: not app.is_running, "the app to end")
        assert app.return_value == RESUME
        stored = rig.store().backend.load("s").events
        assert screen.events == stored and isinstance(stored[-1], AssistantChunk)  # each event seen once; no repair
    finally:
        rig.cleanup()


async def test_attach_on_postgres_names_the_writers_host_and_pid_and_says_interrupted_once_it_is_killed(
        tmp_path, pg_database_url):
    rig = Rig(tmp_path, backend="postgres")
    try:
        child, go = writer(rig)
        screen = AttachScreen.load(rig.store(), "s")
        app = AttachApp(screen)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: screen.is_mounted, "mount")
            assert banner(screen).startswith(f"● watching {socket.gethostname()}:{child.pid} — read-only")
            card = await wait_for(pilot, lambda: screen.transcript.cards.get("call_1_1_1"), "the tool card")
            assert card.status == "running"
            child.kill()  # mid-call: repair will make it OUTCOME_UNKNOWN
            await wait_for(pilot, lambda: "gone: session interrupted" in banner(screen), "interrupted", timeout=WAIT)
            assert banner(screen).startswith(f"■ writer {socket.gethostname()}:{child.pid} gone")
            before = rig.raw_log("s")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.is_running, "the app to end")
        assert app.return_value is None and rig.raw_log("s") == before  # read-only: not a row more, no repair
        assert screen.events == rig.store().backend.load("s").events  # each event seen once, in order
        go.write_text("")
    finally:
        rig.cleanup()


class HeldSession:
    """A session this process holds and writes, as a TUI writer does (events appended and committed one batch at a
    time)."""

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self.opened = store.create(cwd="/w", session_id=session_id, created=CREATED)
        self.seq = 0
        self.closed = False

    def append(self, events: list[Any]) -> None:
        for e in events:
            e.seq, e.time = self.seq, CREATED + 1000 * self.seq
            self.seq += 1
        self.opened.writer.append([(e.seq, encode_event(e)) for e in events], durable=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.opened.writer.close()
            self.opened.lock.release()


async def test_an_approval_waiting_at_the_writer_says_where_no_key_here_decides_it_and_a_clean_end_is_ended(tmp_path, pg_database_url):
    store = SessionStore(tmp_path / "home", "postgres")
    held = HeldSession(store, "w")  # its turn waits at an approval, as the TUI's writer does while its dialog is open
    request = ToolCallRequest("call_1_1_1", "run_command", {"command": "rm -rf build"})
    held.append([
        TurnStart(turn=1), StepStart(turn=1, step=1), UserMessage(turn=1, step=1, text="clean the build"),
        RequestHeader(turn=1, step=1, provider="script", model="m", params={}, tools=[], message_count=2),
        AssistantMessage(turn=1, step=1, text="Cleaning.", tool_calls=[request], interrupted=False),
        ApprovalAsked(turn=1, step=1, call_id="call_1_1_1"),
    ])
    try:
        screen = AttachScreen.load(store, "w")
        app = AttachApp(screen)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: screen.is_mounted and screen.asked, "the waiting approval")
            host = socket.gethostname()
            assert f"waiting for approval on {host}" in screen_text(app)
            assert banner(screen).startswith(f"● watching {host}:{os.getpid()} — read-only · ⏸ waiting for approval")
            assert screen.transcript.cards["call_1_1_1"].status == "awaiting approval"
            stored = len(store.inspect("w").events)
            await pilot.press("a", "s", "y", "enter", "d", "r")  # the approval dialog's keys, and resume's
            assert app.is_running and len(store.inspect("w").events) == stored
            held.append([ApprovalDecided(turn=1, step=1, call_id="call_1_1_1", decision="allowed_once"),
                            ToolCall(turn=1, step=1, call_id="call_1_1_1", name="run_command",
                                     arguments={"command": "rm -rf build"}, safety="side_effecting",
                                     parent_call_id=None)])
            await wait_for(pilot, lambda: not screen.asked and screen.transcript.cards["call_1_1_1"].status == "running",
                           "the decision made at the writer", timeout=WAIT)
            await wait_for(pilot, lambda: "waiting for approval" not in screen_text(app), "the waiting lines to go")
            held.append([TurnEnd(turn=1, reason="cancelled", error=None)])
            held.close()  # the writer ends its session: its turn had an end, so it is `ended`, not interrupted
            await wait_for(pilot, lambda: "gone" in banner(screen), "the writer to be gone", timeout=WAIT)
            assert banner(screen).startswith(f"■ writer {host}:{os.getpid()} gone: session ended — r resumes here")
            assert "-ended" in screen.banner.classes
    finally:
        held.close()


async def test_a_session_that_is_not_live_is_shown_with_r_offered_and_r_resumes(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "done", completed_turn(1, "list the files", "Here they are."))
    screen = AttachScreen.load(world.store, "done")
    app = AttachApp(screen)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.is_mounted and "Here they are." in answer_shown(screen), "the session")
        assert banner(screen).startswith("■ not live (completed) — r resumes here, q leaves")
        assert screen.tail is None and screen.check_action("resume", ())
        await pilot.press("f1")  # the help screen, which lists attach's keys
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        assert [key for where, key, _ in HELP_KEYS if where == "attach"][0] == "r / q, Esc"
        await pilot.press("escape", "r")
        await wait_for(pilot, lambda: not app.is_running, "the app to end")
    assert app.return_value == RESUME


def test_cli_attach_to_an_unknown_session_is_one_line_and_exit_2_and_needs_a_terminal(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "done", completed_turn(1, "p", "a"))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CAIRN_HOME": str(world.store.home)}
    for session_id, needle in (("nope", "nope"), ("done", "needs a terminal")):
        proc = subprocess.run([CAIRN, "attach", session_id], env=env, capture_output=True, text=True, timeout=WAIT,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_r_in_a_terminal_opens_the_chat_on_the_killed_writers_session_with_the_resume_screen(tmp_path):
    """End to end: `cairn attach s` in a real terminal, the writer SIGKILLed mid-call, `r`: `cairn resume s`'s chat,
    the repaired call waiting for a verdict in the resume screen."""
    from terminal_driver import terminal

    rig = Rig(tmp_path)
    term = terminal(rig.env(), 120, 36)
    try:
        child, go = writer(rig)
        term.start("attach", rig.ws, f"{CAIRN} attach s")
        term.wait_screen("attach", f"watching pid {child.pid}", "run_command", timeout=WAIT)
        child.kill()
        term.wait_screen("attach", "gone: session interrupted", timeout=WAIT)
        term.send_keys("attach", "r")
        shown = term.wait_screen("attach", "Session s was interrupted", "1 tool call(s) recovered", "OUTCOME_UNKNOWN",
                                 "Continue to the chat", "durable through seq", timeout=WAIT)  # over the chat
        assert "watching" not in shown and "gone" not in shown
        term.send_keys("attach", "c")
        term.send_keys("attach", "C-q")
        wait_sync(lambda: not term.running("attach"), "the chat to quit", timeout=WAIT)
        go.write_text("")
    finally:
        term.close()
        rig.cleanup()


@pytest.mark.slow
def test_attach_on_host_b_watches_host_a_by_name_until_its_writer_ends(tmp_path):
    """Two machines (network namespaces, tests/pg_hosts.py): `cairn attach` in a terminal on hostB names hostA's writer,
    shows its tool card finish and its answer, then that the session ended."""
    import shlex

    from pg_helpers import fresh_schema
    from pg_hosts import script, two_hosts
    from terminal_driver import terminal

    with fresh_schema("attach") as (schema, _), two_hosts(tmp_path, schema) as (a, b):
        started, go = tmp_path / "started", tmp_path / "go"
        plan = script(tmp_path / "script.json", long_call(started, go), {"text": "All done on hostA."})
        with open(tmp_path / "a.err", "wb") as err:
            child = subprocess.Popen(a.command("run", "--yes", "--provider", "script", "--script", str(plan),
                                               "--session-id", "shared", "go"), cwd=a.workspace, env=a.env(),
                                     stdout=subprocess.DEVNULL, stderr=err)
        term = terminal(b.env(), 120, 36)
        try:
            wait_sync(lambda: started.exists() or child.poll() is not None, "hostA's tool call", timeout=WAIT)
            assert child.poll() is None, (tmp_path / "a.err").read_text()
            term.start("b", b.workspace, shlex.join(b.command("attach", "shared")))
            term.wait_screen("b", f"watching hostA:{child.pid} — read-only", "⟳ running", timeout=WAIT)
            go.write_text("")
            assert child.wait(WAIT) == 0, (tmp_path / "a.err").read_text()
            term.wait_screen("b", f"writer hostA:{child.pid} gone: session ended", "All done on hostA.", "✔ done",
                             "r Resume here", timeout=WAIT)
            term.send_keys("b", "q")
            wait_sync(lambda: not term.running("b"), "attach to end", timeout=WAIT)
        finally:
            term.close()
            if child.poll() is None:
                child.kill()
                child.wait(WAIT)


# -- the picture --------------------------------------------------------------------------------------------------------


class StillTail:
    """A tail whose writer never moves: a picture of a live session without a process whose pid would change it."""

    host = "build-box"
    holder: int | None = 4242  # None: the writer is gone

    def poll(self) -> tuple[list[Any], int | None]:
        return [], self.holder

    def last(self) -> list[Any]:
        return []

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def close(self) -> None:
        pass


def streaming_screen(tmp_path: Path) -> AttachScreen:
    """A completed turn, then one whose tool ran and whose answer is half streamed."""
    world = make_world(tmp_path, [])
    request = ToolCallRequest("call_2_1_1", "run_command", {"command": "pytest -q"})
    turn = [
        TurnStart(turn=2), StepStart(turn=2, step=1), UserMessage(turn=2, step=1, text="run the tests"),
        RequestHeader(turn=2, step=1, provider="script", model="m", params={}, tools=[], message_count=4),
        AssistantMessage(turn=2, step=1, text="Running the tests.", tool_calls=[request], interrupted=False),
        ToolCall(turn=2, step=1, call_id="call_2_1_1", name="run_command", arguments={"command": "pytest -q"},
                 safety="side_effecting", parent_call_id=None),
        ToolResult(turn=2, step=1, call_id="call_2_1_1", is_error=False, content="41 passed in 2.31s",
                   error_code=None, source_seq=9),
        StepStart(turn=2, step=2),
        RequestHeader(turn=2, step=2, provider="script", model="m", params={}, tools=[], message_count=6),
        *[AssistantChunk(turn=2, step=2, delta=d) for d in ("All 41 tests ", "pass. The slowest ", "is test_")],
    ]
    write_log(world.store, "s", completed_turn(1, "list the files", "Here they are.") + turn)
    events = world.store.inspect("s").events
    return AttachScreen(world.store, "s", events, 4242, StillTail())


def test_snapshot_attach_streaming_80x24(snap_compare, tmp_path):
    app = AttachApp(streaming_screen(tmp_path))

    async def ready(pilot: Any) -> None:
        app.theme = "textual-dark"
        await wait_for(pilot, lambda: "is test_" in screen_text(app), "the streaming answer")

    assert snap_compare(app, run_before=ready, terminal_size=(80, 24))
