"""Every tool card shows its safety class, whatever its outcome (SPEC §11 rev 4: "safety shown on every card,
NOT_STARTED included"): never a bare `[?]`.

A call repair calls NOT_STARTED (or one denied, aborted or cut off) has no `tool/call`, so no safety is recorded for it:
a built-in tool's class is known by name, an MCP tool's from its other calls in the session, and a tool never called
says `safety unknown` in words.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from tui_helpers import CHANGELOG, DEPLOY, crashed_turn, make_world, wait_for, write_log

from cairn.app.tools.registry import builtin_tools
from cairn.persistence import events as ev
from cairn.persistence.events import (
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
)
from cairn.persistence.repair import repair_interrupted_turn
from cairn.widgets.tool_card import BUILTIN_SAFETY, ERROR_STATUS, STATUS_LABELS, UNKNOWN_SAFETY, ToolCard, status_for

ERROR_CODES = [None, ev.TOOL_NOT_STARTED, ev.TOOL_OUTCOME_UNKNOWN, ev.ABORTED_BEFORE_DISPATCH, ev.CHECKPOINT_FAILED,
               ev.TOOL_ERROR, ev.DENIED, ev.UNKNOWN_TOOL, ev.BAD_ARGUMENTS, ev.TRUNCATED]


def test_the_cards_table_of_builtin_classes_is_the_registrys():
    assert BUILTIN_SAFETY == {t.name: t.safety for t in builtin_tools()}


def test_every_status_has_a_label_and_every_error_code_a_status():
    assert set(ERROR_STATUS) <= set(ERROR_CODES)
    for code in ERROR_CODES:
        assert status_for(code) in STATUS_LABELS, code


class Cards(App[None]):
    def __init__(self, cards: list[ToolCard]) -> None:
        super().__init__()
        self.cards = cards

    def compose(self) -> ComposeResult:
        yield from self.cards


def title(card: ToolCard) -> str:
    return str(card._title.render())


@pytest.mark.anyio
@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c or "ok")
async def test_a_card_of_every_outcome_shows_its_status_and_a_safety_class(code):
    # for each outcome: a built-in tool with no safety recorded, one with it recorded, and a tool nobody knows
    unrecorded = ToolCard("c1", "edit_file", {"path": "a"}, "?")
    recorded = ToolCard("c2", "srv__deploy", {}, "idempotent")
    unknown = ToolCard("c3", "srv__never_called", {}, "?")
    app = Cards([unrecorded, recorded, unknown])
    async with app.run_test(size=(100, 20)) as pilot:
        for card in app.cards:
            card.set_result("output", code)
        await pilot.pause()
        label = STATUS_LABELS[status_for(code)]
        assert title(unrecorded).startswith(f"{label}  [side_effecting]  edit_file(")
        assert title(recorded).startswith(f"{label}  [idempotent]  srv__deploy(")
        assert title(unknown).startswith(f"{label}  [{UNKNOWN_SAFETY}]  srv__never_called(")
        assert all("[?]" not in title(card) for card in app.cards)


@pytest.mark.anyio
@pytest.mark.parametrize("status", list(STATUS_LABELS))
async def test_a_card_in_every_status_shows_a_safety_class(status):
    card = ToolCard("c1", "run_command", {"command": "ls"}, "?")
    async with Cards([card]).run_test(size=(80, 10)) as pilot:
        card.status = status
        await pilot.pause()
        assert title(card).startswith(f"{STATUS_LABELS[status]}  [side_effecting]  run_command(")


def mcp_turns() -> list:
    """Turn 1 calls the MCP tool `srv__lookup` (its tool/call records `read_only`); turn 2 asks for it again and for
    `srv__other`, never called, and is cut before either starts: repair makes both NOT_STARTED."""
    lookup = ToolCallRequest("call_1", "srv__lookup", {"q": "a"})
    again, other = ToolCallRequest("call_2", "srv__lookup", {"q": "b"}), ToolCallRequest("call_3", "srv__other", {})

    def head(t: int) -> list:
        return [TurnStart(turn=t), StepStart(turn=t, step=1), UserMessage(turn=t, step=1, text=f"prompt {t}"),
                RequestHeader(turn=t, step=1, provider="script", model="script", params={}, tools=[], message_count=2)]

    first = [*head(1), AssistantMessage(turn=1, step=1, text="", tool_calls=[lookup], interrupted=False),
             ToolCall(turn=1, step=1, call_id="call_1", name="srv__lookup", arguments={"q": "a"}, safety="read_only",
                      parent_call_id=None),
             ToolResult(turn=1, step=1, call_id="call_1", is_error=False, content="found", error_code=None,
                        source_seq=None),
             StepEnd(turn=1, step=1), TurnEnd(turn=1, reason="completed", error=None)]
    second = [*head(2), AssistantMessage(turn=2, step=1, text="Again.", tool_calls=[again, other], interrupted=False)]
    events = [*first, *second]
    for seq, e in enumerate(events):  # repair pairs results by seq
        e.seq = seq
    return events + repair_interrupted_turn(events)


@pytest.mark.anyio
async def test_not_started_cards_in_the_resumed_chat_show_their_safety(tmp_path):
    world = make_world(tmp_path, [])
    write_log(world.store, "crashed", crashed_turn())
    write_log(world.store, "mcp", mcp_turns())
    for sid, expected in (("crashed", {DEPLOY.call_id: ("⚠ OUTCOME_UNKNOWN", "side_effecting"),
                                       CHANGELOG.call_id: ("⊘ NOT_STARTED", "side_effecting")}),
                          ("mcp", {"call_1": ("✔ done", "read_only"), "call_2": ("⊘ NOT_STARTED", "read_only"),
                                   "call_3": ("⊘ NOT_STARTED", UNKNOWN_SAFETY)})):
        app = world.resume_app(sid)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.chat and len(app.chat.query(ToolCard)) == len(expected), "the cards")
            cards = {c.call_id: c for c in app.chat.query(ToolCard)}
            await wait_for(pilot, lambda: all(c.status != "running" for c in cards.values()), "the statuses")
            await pilot.pause()
            for call_id, (label, safety) in expected.items():
                assert title(cards[call_id]).startswith(f"{label}  [{safety}]  "), title(cards[call_id])
            await pilot.press("ctrl+q")
