"""Pilot tests of the TUI: the barrier protocol between the agent worker and the persistence-service widget, ordered
quit, queued prompts, cancel, approval, the resume screen with its verdicts, and the sessions screen.

Everything real but the model: a real JSONL store on disk (with `ControlledOps` where a test must hold or fail an
fdatasync), the real composition (`mount_agent`), real tools, the `script` provider.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent_helpers import ControlledOps
from cairn.app.screens.approval import ApprovalModal
from cairn.app.screens.confirm import ConfirmDialog
from cairn.app.screens.resume import ResumeScreen
from cairn.app.screens.sessions import SessionChoice, SessionsScreen
from cairn.app.screens.verdict import VerdictDialog
from cairn.app.tui import CairnApp
from cairn.persistence.errors import CheckpointFailed
from cairn.persistence.events import (
    DENIED,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    ApprovalDecided,
    AssistantMessage,
    RecoveryVerdict,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from cairn.persistence.locks import SessionLock, lock_holder
from textual.widgets import DataTable, Input, Label, Static
from tui_helpers import (
    CHANGELOG,
    CREATED,
    CWD,
    DEPLOY,
    SESSION_ID,
    completed_turn,
    crashed_turn,
    approval_ready,
    ended_turns,
    make_world,
    results,
    running,
    submit,
    types_of,
    top_screen,
    wait_for,
    write_log,
)
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.status_bar import StatusBar
from cairn.widgets.tool_card import ToolCard

pytestmark = pytest.mark.anyio

SLOW = {"text": "streaming a long answer " * 10, "chunks": 100, "delay_ms": 50}  # ~5 s unless cut short


async def type_prompt(pilot, text: str) -> None:
    """Key by key, as a user types (about 70 ms a key under the pilot)."""
    await pilot.press(*text, "enter")


def status_text(app: CairnApp) -> str:
    assert app.chat is not None
    return str(app.chat.query_one(StatusBar).render())


def turn_ends(app: CairnApp) -> list[TurnEnd]:
    return ended_turns(app.session.events)


async def until_turns_ended(pilot, app: CairnApp, count: int = 1, timeout: float = 10.0) -> list[TurnEnd]:
    """Wait until `count` turns have ended in the log, then until the screen has applied every event it was sent."""
    await wait_for(pilot, lambda: len(turn_ends(app)) >= count, f"{count} turn(s) to end", timeout)
    await pilot.pause()
    return turn_ends(app)


def has(app: CairnApp, kind: str) -> bool:
    return kind in types_of(app.session.events)


def cells_by_column(table, key) -> dict[str, str]:
    """A table row as {column label: cell text}: tests name the columns they read, not their places."""
    return {str(column.label): str(cell) for column, cell in zip(table.columns.values(), table.get_row(key))}


def notifications(app: CairnApp) -> list[str]:
    return [n.message for n in app._notifications]


# -- the barrier protocol ---------------------------------------------------------------------------------------------


async def test_a_new_session_reaches_the_disk_only_with_its_first_prompt(tmp_path):
    world = make_world(tmp_path, [{"text": "Hello."}])
    opened = world.store.create(cwd=CWD, session_id="lazy", created=CREATED, deferred=True)  # what `cairn` does
    app = CairnApp(world.config, opened, world.store)
    async with running(app) as pilot:
        await pilot.pause()
        assert world.store.list_sessions() == [], "an untouched launch leaves no session behind"
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: any(isinstance(e, TurnEnd) for e in app.session.events), "the turn to end")
    assert [(s.id, s.status) for s in world.store.list_sessions()] == [("lazy", "completed")]
    assert types_of(world.log("lazy"))[0] == "turn/start"


async def test_turn_waits_at_pre_step_until_the_held_fsync_is_released(tmp_path):
    ops = ControlledOps()
    world = make_world(tmp_path, [{"text": "done"}], ops=ops)
    app = world.new_app()
    gate = threading.Event()
    async with running(app) as pilot:
        ops.fsync_entered.clear()
        ops.fsync_gate = gate
        await pilot.press("g", "o")
        # In the background: the pilot's press waits for the service widget to go idle, which it will not while
        # its flush is held.
        enter = asyncio.ensure_future(pilot.press("enter"))
        try:
            await wait_for(pilot, ops.fsync_entered.is_set, "the pre-step fdatasync to start")
            await asyncio.sleep(0.3)  # time enough to run the whole turn, were the worker not waiting

            assert types_of(app.session.events) == ["turn/start", "step/start", "user/message"]
            assert app.provider.requests_served == 0
            assert app.chat.agent.policy.barriers == ["pre-step"]
            assert app.chat.service.barriers_handled == 1  # the barrier went through the service widget
            assert "writing…" in status_text(app)
        finally:
            gate.set()
        await asyncio.wait_for(enter, 5)
        await until_turns_ended(pilot, app)

        assert turn_ends(app)[0].reason == "completed"
        assert app.provider.requests_served == 1
        assert app.chat.agent.policy.barriers == ["pre-step", "pre-request", "turn-end"]
        await wait_for(pilot, lambda: f"durable through seq {app.session.events[-1].seq}" in status_text(app),
                       "the status bar to report the last barrier")
        await pilot.press("ctrl+q")


async def test_concurrent_barriers_are_serialized_by_the_service_and_cost_one_fsync(tmp_path):
    ops = ControlledOps()
    world = make_world(tmp_path, [], ops=ops)
    app = world.new_app()
    gate = threading.Event()
    async with running(app) as pilot:
        service, coordinator = app.chat.service, app.session.coordinator
        await wait_for(pilot, lambda: app.chat.agent is not None, "the agent to be mounted")
        app.session.append(RecoveryVerdict(call_id="call_x", verdict="unknown", note="something to make durable"))
        fsyncs, handled = coordinator.stats.fsyncs, service.barriers_handled
        ops.fsync_entered.clear()
        ops.fsync_gate = gate
        try:
            waiters = [asyncio.ensure_future(service.request_barrier()) for _ in range(8)]
            await wait_for(pilot, ops.fsync_entered.is_set, "the first barrier's fdatasync to start")
            await asyncio.sleep(0.2)
            # one flush in progress; the other seven barrier messages wait in the service's queue behind it
            assert service.barriers_handled - handled == 1
            assert not any(w.done() for w in waiters)
        finally:
            gate.set()
        await asyncio.wait_for(asyncio.gather(*waiters), 5)

        assert service.barriers_handled - handled == 8
        assert coordinator.stats.fsyncs - fsyncs == 1
        assert coordinator.durable_seq == app.session.events[-1].seq
        await pilot.press("ctrl+q")


async def test_closed_service_refuses_a_barrier_with_an_error_not_a_hang(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    async with running(app) as pilot:
        service = app.chat.service
        await service.close()
        with pytest.raises(CheckpointFailed):
            await asyncio.wait_for(service.request_barrier(), 2)
        with pytest.raises(CheckpointFailed):  # the policy's route: LiveSession.flush() → the service
            await asyncio.wait_for(app.session.flush(), 2)
        await wait_for(pilot, lambda: "closed, durable through seq" in status_text(app), "the closed state")
        assert lock_holder(world.store.lock_dir, SESSION_ID) is None  # closing released the lock
        await pilot.press("ctrl+q")


# -- quit, queue, cancel ----------------------------------------------------------------------------------------------


async def test_ctrl_q_mid_turn_writes_the_real_closing_events_and_releases_the_lock(tmp_path):
    world = make_world(tmp_path, [SLOW])
    app = world.new_app()
    async with running(app) as pilot:
        await type_prompt(pilot, "a story")
        await wait_for(pilot, lambda: has(app, "assistant/chunk"), "streaming to start")
        assert lock_holder(world.store.lock_dir, SESSION_ID) is not None
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, "the app to exit", timeout=5)

    log = world.log()
    assert types_of(log)[-3:] == ["assistant/message", "step/end", "turn/end"]
    assert log[-1].reason == "cancelled"  # written by the loop itself, not a repaired `interrupted`
    assert isinstance(log[-3], AssistantMessage) and log[-3].interrupted
    assert [e.seq for e in log] == list(range(len(log)))
    assert world.store.inspect(SESSION_ID).repair == []  # nothing left for crash repair to close
    assert not app.session.live
    assert lock_holder(world.store.lock_dir, SESSION_ID) is None
    world.store.open_for_resume(SESSION_ID).lock.release()  # another opener can take it now


async def test_prompts_typed_during_a_turn_are_queued_visibly_and_run_in_order(tmp_path):
    first = {"text": "first answer, slowly", "chunks": 20, "delay_ms": 60}  # ~1.2 s
    world = make_world(tmp_path, [first, {"text": "second answer"}, {"text": "third answer"}])
    app = world.new_app()
    async with running(app) as pilot:
        await type_prompt(pilot, "one")
        await wait_for(pilot, lambda: has(app, "assistant/chunk"), "the first turn to stream")
        await submit(pilot, "two")  # not key by key: the first turn must still be running when both are queued
        await submit(pilot, "three")
        await pilot.pause()
        assert len(turn_ends(app)) == 0, "the first turn ended before the test could queue behind it"

        queue = app.chat.query_one("#queue", Static)
        assert queue.has_class("-visible") and queue.display
        assert str(queue.render()).splitlines() == [
            "queued: two", "queued: three  (↑ in an empty prompt takes the last one back to edit or drop)"]
        # the status follows the logged events a frame behind: "sending…" until the screen has drawn a chunk
        await wait_for(pilot, lambda: "● running · 2 queued" in status_text(app), "the status to count the queue")
        assert len(turn_ends(app)) == 0
        assert app.chat.pending == ["two", "three"]  # held by the screen (editable) until the loop is free
        assert [e.turn for e in app.session.events if isinstance(e, TurnStart)] == [1]

        await until_turns_ended(pilot, app, 3)
        await wait_for(pilot, lambda: "idle" in status_text(app), "the status to return to idle")
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["one", "two", "three"]
        assert [(e.turn, e.reason) for e in turn_ends(app)] == [(1, "completed"), (2, "completed"), (3, "completed")]
        assert [e.text for e in app.session.events if isinstance(e, AssistantMessage)] == [
            "first answer, slowly", "second answer", "third answer"]
        assert [e.turn for e in app.session.events if isinstance(e, UserMessage)] == [1, 2, 3]
        assert not queue.has_class("-visible")
        await pilot.press("ctrl+q")


async def test_escape_cancels_the_running_turn_and_the_next_prompt_runs(tmp_path):
    world = make_world(tmp_path, [SLOW, {"text": "after the cancel"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "a long one")
        await wait_for(pilot, lambda: has(app, "assistant/chunk"), "streaming to start")
        await pilot.press("escape")
        await until_turns_ended(pilot, app, 1, timeout=3)  # far sooner than the ~5 s the turn would take
        assert turn_ends(app)[0].reason == "cancelled"
        assert types_of(app.session.events)[-3:] == ["assistant/message", "step/end", "turn/end"]

        await submit(pilot, "again")
        await until_turns_ended(pilot, app, 2)
        assert turn_ends(app)[1].reason == "completed"
        assert app.session.events[-3].text == "after the cancel"
        await pilot.press("ctrl+q")


async def test_escape_keeps_prompts_typed_ahead_queued_and_paused_until_the_operator_sends_them(tmp_path):
    world = make_world(tmp_path, [SLOW, {"text": "for the typed-ahead one"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "a long one")
        await wait_for(pilot, lambda: has(app, "assistant/chunk"), "streaming to start")
        await submit(pilot, "typed ahead")
        await pilot.press("escape")
        await until_turns_ended(pilot, app, 1, timeout=3)
        await asyncio.sleep(0.3)
        assert turn_ends(app)[0].reason == "cancelled"
        assert app.chat.pending == ["typed ahead"] and len(turn_ends(app)) == 1  # not started by the Esc
        queue = str(app.chat.query_one("#queue", Static).render())
        assert queue.startswith("paused: typed ahead") and "Enter in an empty prompt sends it" in queue
        assert "1 paused" in status_text(app)

        await pilot.press("enter")  # an empty Enter sends the paused queue
        await until_turns_ended(pilot, app, 2)
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["a long one", "typed ahead"]
        assert turn_ends(app)[1].reason == "completed" and app.chat.pending == []
        await pilot.press("ctrl+q")


# -- approval ---------------------------------------------------------------------------------------------------------


def command_script(*commands: str) -> list[dict]:
    calls = [{"name": "run_command", "arguments": {"command": c}} for c in commands]
    return [{"text": "Running it.", "tool_calls": calls}, {"text": "Finished."}]


async def test_approval_allow_once_runs_the_tool(tmp_path):
    world = make_world(tmp_path, command_script("printf ran > ran.txt"))
    app = world.new_app()
    async with running(app) as pilot:
        await type_prompt(pilot, "run it")
        modal = await approval_ready(pilot, app)
        assert modal.request.name == "run_command" and modal.request.safety == "side_effecting"
        card = app.chat.query_one(ToolCard)
        assert card.status == "awaiting approval"
        assert not has(app, "tool/call") and not (world.workspace / "ran.txt").exists()

        await pilot.press("a")
        await until_turns_ended(pilot, app)
        assert (world.workspace / "ran.txt").read_text() == "ran"
        decided = [e for e in app.session.events if isinstance(e, ApprovalDecided)]
        assert [d.decision for d in decided] == ["allowed_once"]
        result = results(app.session.events)["call_1_1_1"]
        assert not result.is_error and result.error_code is None
        await wait_for(pilot, lambda: card.status == "done", "the card to show the result", timeout=2)
        assert turn_ends(app)[0].reason == "completed"
        await pilot.press("ctrl+q")


async def test_approval_deny_records_denied_and_the_tool_never_runs(tmp_path):
    world = make_world(tmp_path, command_script("printf ran > ran.txt"))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run it")
        await approval_ready(pilot, app)
        await pilot.press("d")
        await until_turns_ended(pilot, app)

        assert not (world.workspace / "ran.txt").exists()
        assert not has(app, "tool/call")
        result = results(app.session.events)["call_1_1_1"]
        assert result.is_error and result.error_code == DENIED
        assert [e.decision for e in app.session.events if isinstance(e, ApprovalDecided)] == ["denied"]
        await wait_for(pilot, lambda: app.chat.query_one(ToolCard).status == "denied", "a denied card", timeout=2)
        assert turn_ends(app)[0].reason == "completed"  # the model heard "denied" and answered
        await pilot.press("ctrl+q")


async def test_approval_allow_for_session_skips_the_modal_for_that_tool_afterwards(tmp_path):
    world = make_world(tmp_path, command_script("printf 1 > one.txt", "printf 2 > two.txt"))
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "run both")
        await approval_ready(pilot, app)
        await pilot.press("s")
        await until_turns_ended(pilot, app)
        decided = [e.decision for e in app.session.events if isinstance(e, ApprovalDecided)]
        assert decided == ["allowed_session", "granted"]  # the second call ran on the grant, and says so
        assert (world.workspace / "one.txt").read_text() == "1" and (world.workspace / "two.txt").read_text() == "2"
        await pilot.press("ctrl+q")


# -- resume screen and verdicts ---------------------------------------------------------------------------------------


async def test_resume_screen_lists_repaired_calls_and_its_verdict_lands_before_the_next_turn(tmp_path):
    world = make_world(tmp_path, [{"text": "Checked the deploy; not redoing it."}])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        assert [(c.call_id, c.tool, c.status) for c in screen.calls] == [
            (DEPLOY.call_id, "run_command", "OUTCOME_UNKNOWN"), (CHANGELOG.call_id, "edit_file", "NOT_STARTED")]
        table = screen.query_one(DataTable)
        assert table.row_count == 2
        repaired = results(app.session.events)
        assert repaired[DEPLOY.call_id].error_code == TOOL_OUTCOME_UNKNOWN
        assert repaired[CHANGELOG.call_id].error_code == TOOL_NOT_STARTED

        # a prompt that reaches the chat while the screen is up does not start a turn
        app.chat.post_message(PromptInput.Submitted("sneaking past the resume screen"))
        await wait_for(pilot, lambda: app.chat.history.entries[-1:] == ["sneaking past the resume screen"],
                       "the chat to take the prompt (into its history, not a turn)")
        assert [e.reason for e in turn_ends(app)] == ["interrupted"]
        assert not any(isinstance(e, TurnStart) and e.turn == 2 for e in app.session.events)

        await pilot.press("v")  # cursor is on the OUTCOME_UNKNOWN row
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the verdict dialog")
        await pilot.press("n")  # "It did not happen" chosen (nothing was preselected); the keys move to the note
        assert isinstance(app.focused, Input)
        app.focused.value = "checked the server"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen, "back on the resume screen")
        assert screen.calls[0].verdict == "did_not_happen"
        assert cells_by_column(table, DEPLOY.call_id)["verdict"] == "did_not_happen"
        # durable when the dialog closed (SPEC §2 rev 3), before Continue: on disk, not only in memory
        assert [e.verdict for e in world.log("crashed-id") if isinstance(e, RecoveryVerdict)] == ["did_not_happen"]

        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the chat to take the prompt")
        await submit(pilot, "carry on")
        await until_turns_ended(pilot, app, 2)
        await pilot.press("ctrl+q")

    log = world.log("crashed-id")
    kinds = types_of(log)
    repaired_end = kinds.index("turn/end")
    verdict_at = kinds.index("recovery/verdict")
    next_start = max(i for i, k in enumerate(kinds) if k == "turn/start")
    assert log[repaired_end].reason == "interrupted"
    assert repaired_end < verdict_at < next_start
    assert kinds.count("recovery/verdict") == 1
    verdict = log[verdict_at]
    assert (verdict.call_id, verdict.verdict, verdict.note) == (DEPLOY.call_id, "did_not_happen", "checked the server")
    assert [e.text for e in log if isinstance(e, UserMessage)][-1] == "carry on"


async def test_a_session_whose_provider_cannot_be_built_still_opens_takes_verdicts_and_says_what_is_missing(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    reason = "set OPENAI_API_KEY (or CAIRN_API_KEY) to continue this session"
    app = CairnApp(world.config, world.store.open_for_resume("crashed-id"), world.store, unavailable=reason)
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog), "the verdict dialog")
        await pilot.press("h", "enter")
        await wait_for(pilot, lambda: app.screen is screen, "back on the resume screen")
        assert [e.verdict for e in world.log("crashed-id") if isinstance(e, RecoveryVerdict)] == ["happened"]
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the chat")
        await submit(pilot, "carry on")
        await wait_for(pilot, lambda: any(reason in str(n.message) for n in app._notifications), "the reason shown")
        assert app.is_running and not any(isinstance(e, TurnStart) and e.turn == 2 for e in app.session.events)
        await pilot.press("ctrl+q")


async def test_resume_screen_refuses_a_verdict_on_a_not_started_call(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed-id", crashed_turn())
    app = world.resume_app("crashed-id")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        await pilot.press("down", "v")
        await pilot.pause()
        assert app.screen is screen  # no dialog for a call that never ran
        assert "NOT_STARTED call never ran" in screen.guard_text()  # said on the screen's own line, not a toast
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptInput), "the chat")
        assert not any(isinstance(e, RecoveryVerdict) for e in app.session.events)
        await pilot.press("ctrl+q")


# -- sessions screen --------------------------------------------------------------------------------------------------


async def test_sessions_screen_lists_sessions_and_refuses_to_open_a_live_locked_one(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "older", completed_turn(1, "list the files", "Here they are."))
    write_log(world.store, "held", completed_turn(1, "someone else's session", "Busy."), created=1_764_690_000_000)
    lock = SessionLock(world.store.lock_dir, "held")
    lock.acquire()  # a live owner (flock conflicts between open files even within one process)
    try:
        app = world.sessions_app()
        async with running(app) as pilot:
            screen = await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen, "sessions")
            table = screen.query_one(DataTable)
            rows = {key.value: cells_by_column(table, key) for key in table.rows}
            assert set(rows) == {"older", "held"}
            order = ("first prompt", "status", "events")
            assert [rows["held"][c] for c in order] == ["someone else's session", "live", "7"]  # `cairn sessions` words
            assert [rows["older"][c] for c in order] == ["list the files", "completed", "7"]
            assert [rows["older"][c] for c in ("id", "cwd")] == ["older", "/workspace"]

            table.move_cursor(row=table.get_row_index("held"))
            await pilot.press("enter")
            await pilot.pause()
            assert app.is_running and app.screen is screen
            assert any("held is live in another process" in m for m in notifications(app))

            table.move_cursor(row=table.get_row_index("older"))
            await pilot.press("enter")
            await wait_for(pilot, lambda: not app.is_running, "the app to end with the choice")
        assert app.return_value == SessionChoice("open", "older")
    finally:
        lock.release()


async def test_sessions_screen_lists_an_unreadable_file_and_refuses_to_open_or_inspect_it(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "older", completed_turn(1, "list the files", "Here they are."))
    (world.store.home / "sessions" / "broken.jsonl").write_bytes(b'[1, 2, 3]\n')
    app = world.sessions_app()
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen, "sessions")
        table = screen.query_one(DataTable)
        rows = {key.value: cells_by_column(table, key) for key in table.rows}
        assert set(rows) == {"older", "broken"} and rows["broken"]["status"] == "unreadable"
        table.move_cursor(row=table.get_row_index("broken"))
        for key in ("enter", "i"):
            await pilot.press(key)
            await pilot.pause()
            assert app.is_running and app.screen is screen, f"{key} on an unreadable row keeps the list"
        assert sum("broken cannot be read" in m for m in notifications(app)) == 2


async def test_sessions_screen_deletes_a_session_after_confirmation_never_a_live_one(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "older", completed_turn(1, "list the files", "Here they are."))
    write_log(world.store, "held", completed_turn(1, "someone else's session", "Busy."), created=1_764_690_000_000)
    lock = SessionLock(world.store.lock_dir, "held")
    lock.acquire()
    try:
        app = world.sessions_app()
        async with running(app) as pilot:
            screen = await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen, "sessions")
            table = screen.query_one(DataTable)
            table.move_cursor(row=table.get_row_index("held"))
            await pilot.press("x")
            await pilot.pause()
            assert any("held is open in another process" in m for m in notifications(app))
            table.move_cursor(row=table.get_row_index("older"))
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("n")  # keep
            await pilot.pause()
            assert world.store.exists("older")
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: not world.store.exists("older"), "the deletion")
            assert [key.value for key in table.rows] == ["held"]
        assert world.store.exists("held")
    finally:
        lock.release()


async def test_ctrl_o_opens_the_sessions_screen_from_the_chat_and_escape_returns(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "older", completed_turn(1, "list the files", "Here they are."))
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press("ctrl+o")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen, "sessions")
        table = screen.query_one(DataTable)
        assert cells_by_column(table, SESSION_ID)["status"] == "open here"
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.chat, "the chat again")
        assert app.session.live
        await pilot.press("ctrl+q")


async def test_sessions_and_resume_screens_show_brackets_verbatim_not_as_markup(tmp_path):
    """A prompt or a model's arguments with `[/tmp]` once crashed these screens (DataTable parses str cells as
    markup)."""
    world = make_world(tmp_path, [])
    events = crashed_turn()
    tricky = {"command": "ls [/tmp] [b]x"}
    events[2].text = "why does arr[i] fail with [/tmp]?"
    events[4].tool_calls[0].arguments = tricky
    events[7].arguments = tricky
    call_id = "call_[/x]_1"  # ids come from the model too
    events[4].tool_calls[0].call_id = events[5].call_id = events[6].call_id = events[7].call_id = call_id
    write_log(world.store, "brackets", events)

    app = world.sessions_app()
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen, "sessions")
        await pilot.pause()
        assert cells_by_column(screen.query_one(DataTable), "brackets")["first prompt"] == "why does arr[i] fail with [/tmp]?"
        assert app.is_running
        await pilot.press("ctrl+q")

    app = world.resume_app("brackets")
    async with running(app) as pilot:
        screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "resume screen")
        await pilot.pause()
        assert str(screen.query_one(DataTable).get_row(call_id)[1]) == 'command="ls [/tmp] [b]x"'
        await pilot.press("v")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, VerdictDialog) and app.screen, "the dialog")
        assert "(call_[/x]_1)" in str(dialog.query_one(Label).render())
        assert app.is_running
        await pilot.press("ctrl+q")
