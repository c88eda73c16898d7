"""The chat's footer is rebuilt when the keys it shows change, and only then (widgets/quiet_footer.py)."""

from __future__ import annotations

import pytest
from textual.widgets._footer import FooterKey
from tui_helpers import make_world, wait_for

from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.quiet_footer import QuietFooter

pytestmark = pytest.mark.anyio


def shown_keys(footer: QuietFooter) -> list[str]:
    return [key.description for key in footer.query(FooterKey)]


async def test_the_footer_is_rebuilt_only_when_the_keys_it_shows_change(tmp_path):
    slow = {"text": "A slow answer, in many pieces. " * 8, "chunks": 40, "delay_ms": 50}
    world = make_world(tmp_path, [slow])
    app = world.new_app()
    async with app.run_test(size=(100, 30)) as pilot:
        footer = app.chat.query_one(QuietFooter)
        await wait_for(pilot, lambda: "Quit" in shown_keys(footer), "the footer's keys")
        assert "Cancel turn" not in shown_keys(footer)
        rebuilds: list[int] = []
        rebuild = footer.recompose

        async def counted() -> None:
            rebuilds.append(1)
            await rebuild()

        footer.recompose = counted  # type: ignore[method-assign]
        prompt = app.chat.query_one(PromptInput)
        prompt.insert("typing hides Esc Esc, a key the footer does not show")
        for _ in range(3):
            app.chat.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert rebuilds == []
        assert "Quit" in shown_keys(footer)

        await pilot.press("enter")  # a turn runs: "Cancel turn" is a key the footer shows
        await wait_for(pilot, lambda: "Cancel turn" in shown_keys(footer), "Cancel turn in the footer")
        assert rebuilds
        await app.action_quit()
