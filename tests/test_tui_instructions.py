"""Project instructions in the TUI (issue 42): the transcript's one line when they are recorded, the notice for a file
over the limit, and `/instructions`."""

from __future__ import annotations

import pytest

from tui_helpers import ended_turns, make_world, running, submit
from waiting import wait_for

from cairn.persistence.events import ContextInstructions, UserMessage
from cairn.widgets.transcript import Notice, Transcript

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def context_on(monkeypatch, tmp_path):
    monkeypatch.delenv("CAIRN_PROJECT_CONTEXT", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def notices(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query_one(Transcript).query(Notice)]


async def test_the_transcript_names_the_instructions_and_slash_instructions_lists_them(tmp_path):
    world = make_world(tmp_path, [{"text": "answer"}])
    (world.workspace / "AGENTS.md").write_text("r" * (40 * 1024))
    app = world.new_app()
    toasts: list[tuple[str, str]] = []
    async with running(app) as pilot:
        # the loop's notice channel's toast, seen here with its severity
        app.chat._toast = lambda text, **kw: toasts.append((str(text), kw.get("severity", "information")))
        await submit(pilot, "/instructions")
        await wait_for(pilot, lambda: any("the next turn will send" in n for n in notices(app)), "the first answer")
        await submit(pilot, "hello")
        await wait_for(pilot, lambda: ended_turns(app.session.events), "the turn")
        await wait_for(pilot, lambda: any(n.startswith("≡ instructions: AGENTS.md (cut)") for n in notices(app)),
                       "the instructions line")
        # a cut AGENTS.md is a warning, not a failure: the status bar keeps its colour
        assert ("AGENTS.md is 40 KB: only its first 32 KB are sent", "warning") in toasts
        assert not app.chat.status_bar.failed
        await submit(pilot, "/instructions")
        await wait_for(pilot, lambda: any("recorded at turn 1" in n for n in notices(app)), "the /instructions answer")
        shown = next(n for n in notices(app) if "recorded at turn 1" in n)
        assert "AGENTS.md  (project, 40 KB, cut at the size limit)" in shown
        assert "! AGENTS.md is 40 KB: only its first 32 KB are sent" in shown
        assert [e.text for e in app.session.events if isinstance(e, UserMessage)] == ["hello"]
        assert len([e for e in app.session.events if isinstance(e, ContextInstructions)]) == 1
        await pilot.press("ctrl+q")
