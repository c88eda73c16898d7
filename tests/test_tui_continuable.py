"""The TUI against the strict local OpenAI-compatible server (SPEC rev 2 §7): after an HTTP error, a cut-off answer
or reasoning with tool calls, the next request is one the strictest servers accept, and reasoning and usage show."""

from __future__ import annotations

import pytest
from openai_server import OpenAIServer, cut_off, error, text, tool_calls
from tui_helpers import strict_app, wait_for

from cairn.app.config.resolver import resolve_config
from cairn.app.tui import CairnApp
from cairn.persistence.events import RequestHeader, TurnEnd
from cairn.persistence.store import SessionStore
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.reasoning import ReasoningBlock
from cairn.widgets.status_bar import StatusBar

pytestmark = pytest.mark.anyio


async def send(app: CairnApp, pilot, words: str, turns: int) -> list[TurnEnd]:
    app.chat.query_one(PromptInput).insert(words)
    await pilot.press("enter")
    ended = lambda: [e for e in app.session.events if isinstance(e, TurnEnd)]  # noqa: E731
    await wait_for(pilot, lambda: len(ended()) >= turns, f"turn {turns} to end")
    return ended()


async def test_an_http_error_then_a_cut_off_answer_then_a_new_prompt_all_continue(tmp_path):
    calls = [{"id": "call_w", "name": "write_file", "arguments": {"path": "x.txt", "content": "data"}}]
    with OpenAIServer([error(400, "bad request at step one"), cut_off(calls, keep=10), text("All good now.")]) as server:
        async with strict_app(tmp_path, server) as (app, pilot):
            first = await send(app, pilot, "hello", 1)
            second = await send(app, pilot, "write x.txt", 2)
            third = await send(app, pilot, "and now?", 3)
            await pilot.press("ctrl+q")
    assert first[0].reason == "error" and second[1].error.code == "MAX_TOKENS" and third[2].reason == "completed"
    assert not (tmp_path / "ws" / "x.txt").exists()
    assert not server.refusals, [(r.refused, r.violations) for r in server.refusals]
    roles = [m["role"] for m in server.requests[-1].body["messages"]]
    assert roles[:2] == ["system", "user"] and roles[-1] == "user"


async def test_reasoning_with_a_tool_call_is_shown_and_sent_back_and_usage_reaches_the_status_bar(tmp_path):
    calls = [{"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}}]
    usage = {"prompt_tokens": 1200, "completion_tokens": 30, "total_tokens": 1230}
    answers = [tool_calls(calls, reasoning="Look at the files first.", usage=usage),
               text("Nothing here.", reasoning="Empty.", require_reasoning=True, usage=usage)]
    with OpenAIServer(answers) as server:
        async with strict_app(tmp_path, server) as (app, pilot):
            ends = await send(app, pilot, "what is here?", 1)
            blocks = await wait_for(pilot, lambda: len(app.chat.query(ReasoningBlock)) == 2
                                    and list(app.chat.query(ReasoningBlock)), "both reasoning blocks")
            # (the arrows matter: the session id, a time stamp, can hold "60" too)
            await wait_for(pilot, lambda: "↓60" in str(app.chat.query_one(StatusBar).render()), "the usage")
            status = str(app.chat.query_one(StatusBar).render())
            await pilot.press("ctrl+q")
    assert ends[0].reason == "completed"
    assert not server.refusals, [(r.refused, r.violations) for r in server.refusals]
    assert len(blocks) == 2
    assert "↑2.4k" in status and "↓60" in status, status  # the session's input and output tokens, compact


async def test_model_switches_to_a_config_file_profile_from_the_next_turn_and_the_header_records_it(tmp_path):
    with OpenAIServer([text("from the first server")]) as first, OpenAIServer([text("from the local profile")]) as local:
        config_file = tmp_path / "config.toml"
        config_file.write_text(f'''
[profiles.local]
provider = "openai"
base_url = "{local.base_url}"
model = "local-model"
''')
        workspace = tmp_path / "ws"
        workspace.mkdir()
        home = tmp_path / "home"
        config = resolve_config(home=str(home), provider="openai", model="strict-model", base_url=first.base_url,
                                workspace=str(workspace), config_file=str(config_file),
                                env={"CAIRN_API_KEY": "sk-tui", "CAIRN_CONFIG": str(config_file)})
        store = SessionStore(home, "jsonl")
        app = CairnApp(config, store.create(cwd=str(workspace), deferred=True), store)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await send(app, pilot, "one", 1)
                app.chat.query_one(PromptInput).insert("/model local")
                await pilot.press("enter")
                await send(app, pilot, "two", 2)
                status = str(app.chat.query_one(StatusBar).render())
                headers = [e for e in app.session.events if type(e).__name__ == "RequestHeader"]
                await pilot.press("ctrl+q")
        finally:
            app.close_if_still_open()
    assert [r.body["model"] for r in first.requests] == ["strict-model"]
    assert [r.body["model"] for r in local.requests] == ["local-model"]
    assert [(h.model, h.profile) for h in headers] == [("strict-model", None), ("local-model", "local")]
    assert "openai/local-model" in status


async def test_the_anthropic_provider_in_the_tui_with_thinking_a_tool_call_and_a_strict_server(tmp_path):
    from anthropic_server import AnthropicServer, message, tool_use

    calls = [{"id": "toolu_ls", "name": "list_dir", "input": {"path": "."}}]
    with AnthropicServer([tool_use(calls, thinking="Look first."), message("Nothing here.", thinking="Empty.")]) as srv:
        workspace = tmp_path / "ws"
        workspace.mkdir()
        home = tmp_path / "home"
        config = resolve_config(home=str(home), provider="anthropic", model="claude-test", base_url=srv.base_url,
                                workspace=str(workspace), env={"ANTHROPIC_API_KEY": "sk-ant-tui"})
        store = SessionStore(home, "jsonl")
        app = CairnApp(config, store.create(cwd=str(workspace), deferred=True), store)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                ends = await send(app, pilot, "what is here?", 1)
                blocks = await wait_for(pilot, lambda: len(app.chat.query(ReasoningBlock)) == 2
                                        and list(app.chat.query(ReasoningBlock)), "both reasoning blocks")
                await pilot.press("ctrl+q")
        finally:
            app.close_if_still_open()
    assert ends[0].reason == "completed"
    assert not srv.refusals, [(r.refused, r.violations) for r in srv.refusals]
    assert len(blocks) == 2 and len(srv.requests) == 2
    assert srv.requests[1].header("x-api-key") == "sk-ant-tui"


async def test_the_status_bar_shows_the_host_when_the_operator_named_another_server(tmp_path):
    """SPEC §6 rev 3: a resumed session goes to its recorded endpoint unless the operator names another; then the
    status bar says which host the conversation now goes to."""
    from tui_helpers import completed_turn, make_world, write_log

    from cairn.app.config.resolver import resolve_config
    from cairn.app.config.resumed import config_for_session
    from cairn.app.tui import CairnApp
    from cairn.widgets.status_bar import StatusBar

    world = make_world(tmp_path, [])
    events = completed_turn(1, "hello", "hi")
    events[3] = RequestHeader(turn=1, step=1, provider="openai", model="m", params={}, tools=[], message_count=2,
                              endpoint="http://127.0.0.1:8081/v1")
    write_log(world.store, "s", events)
    opened = world.store.open_for_resume("s")
    for named, shown in ((None, ""), ("http://127.0.0.1:9099/v1", " @127.0.0.1:9099")):
        config = config_for_session(resolve_config(home=str(world.store.home), workspace=str(world.workspace),
                                                   base_url=named, env={"CAIRN_PROVIDER": "openai"}), opened.events)
        app = CairnApp(config, opened, world.store)
        async with app.run_test(size=(120, 30)) as pilot:
            bar = await wait_for(pilot, lambda: app.chat is not None and app.chat.query(StatusBar)
                                 and app.chat.query_one(StatusBar), "the status bar")
            await wait_for(pilot, lambda: bar.provider, "the status bar to name the provider")
            assert bar.provider == "openai/m" + shown
            await pilot.press("ctrl+q")
        opened = world.store.open_for_resume("s")
    from cairn.app.compose import close_unused

    close_unused(opened)
