"""`!command` in the real TUI (Textual's pilot): typed and sent, its card shows the command, output and exit code; it
waits in the prompt queue in order with prompts; Esc stops it; a crashed one reads "outcome unknown" when resumed."""

from __future__ import annotations

import pytest
from tui_helpers import CREATED, make_world, running, submit, types_of, write_log
from waiting import wait_for

from cairn.app.agent.operator_command import CANCELLED
from cairn.app.tools.command import _group_running
from cairn.persistence.events import OperatorCommand, TurnEnd, TurnStart
from cairn.widgets.operator_card import OperatorCard

pytestmark = pytest.mark.anyio


def card_text(card: OperatorCard) -> str:
    return f"{card._title.render()}\n{card._output.render()}"


async def test_typing_a_bang_command_runs_it_and_shows_its_card_with_the_output(tmp_path):
    world = make_world(tmp_path, [{"text": "It printed hi."}])
    app = world.new_app()
    async with running(app) as pilot:
        await pilot.press("!", "e", "c", "h", "o", "space", "h", "i", "enter")
        card = await wait_for(pilot, lambda: next(iter(app.chat.transcript.query(OperatorCard)), None), "the card")
        await wait_for(pilot, lambda: card.status == "done", "the command to end")
        await pilot.pause()
        assert card_text(card) == "✔ exit 0  !echo hi\nhi"
        await submit(pilot, "what did it print?")
        await wait_for(pilot, lambda: len([e for e in app.session.events if isinstance(e, TurnEnd)]) == 2, "turn 2")
        await wait_for(pilot, lambda: app.chat.idle(), "the loop to be idle")
    assert types_of(world.log())[:5] == ["turn/start", "operator/command", "operator/result", "turn/end",
                                         "turn/start"]
    assert "user/message" not in types_of(world.log())[:4]  # no prompt, no request for the command


async def test_a_bang_command_typed_during_a_turn_waits_in_the_queue_in_order(tmp_path):
    world = make_world(tmp_path, [{"text": "first answer", "delay_ms": 300, "chunks": 3}, {"text": "second"}])
    app = world.new_app()
    async with running(app) as pilot:
        await submit(pilot, "first")
        await wait_for(pilot, lambda: app.chat.turn_running, "the first turn")
        await submit(pilot, "!echo queued-command")
        await submit(pilot, "second")
        assert app.chat.prompt_queue.pending == ["!echo queued-command", "second"]
        await wait_for(pilot, lambda: len([e for e in app.session.events if isinstance(e, TurnEnd)]) == 3, "3 turns")
        await wait_for(pilot, lambda: app.chat.idle(), "the queue to be done")
    starts = [e.turn for e in world.log() if isinstance(e, TurnStart)]
    commands = [e for e in world.log() if isinstance(e, OperatorCommand)]
    assert starts == [1, 2, 3] and [(c.turn, c.command) for c in commands] == [(2, "echo queued-command")]


async def test_esc_stops_a_running_bang_command_and_its_process_group(tmp_path):
    world = make_world(tmp_path, [])
    app = world.new_app()
    group_file = world.workspace / "group"
    async with running(app) as pilot:
        await submit(pilot, "!echo $$ > group; sleep 30")
        await wait_for(pilot, lambda: group_file.exists() and group_file.read_text().strip(), "the command to run")
        group = int(group_file.read_text())
        await pilot.press("escape")
        card = app.chat.transcript.query_one(OperatorCard)
        await wait_for(pilot, lambda: card.status == "stopped", "the card to say stopped")
        await wait_for(pilot, lambda: app.chat.idle(), "the loop to be idle")
        assert not _group_running(group)
        assert card.output == CANCELLED
    ends = [e for e in world.log() if isinstance(e, TurnEnd)]
    assert [e.reason for e in ends] == ["cancelled"]


async def test_a_command_cairn_stopped_while_it_ran_reads_outcome_unknown_when_resumed(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed", [TurnStart(turn=1), OperatorCommand(turn=1, command="make deploy")],
              created=CREATED)
    app = world.resume_app("crashed")
    async with running(app) as pilot:
        card = await wait_for(pilot, lambda: next(iter(app.chat.transcript.query(OperatorCard)), None), "the card")
        await pilot.pause()
        assert card_text(card).startswith("⚠ outcome unknown (Cairn stopped while it ran)  !make deploy")
    assert types_of(world.log("crashed")) == ["turn/start", "operator/command", "turn/end"]
