"""Time to ready (issue 29), as behaviour: the TUI shows its session and takes keys before the agent stack (loop, tools,
providers, MCP) is built; a prompt sent meanwhile runs once it is; MCP servers start in the background, the status bar
says they are coming up, and a prompt sent before they are ready waits for them only, with a visible line, then runs
with their tools. No timing is asserted: gates hold each stage for as long as the test needs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tui_helpers import SIZE, ended_turns, make_world, wait_for

from cairn.app.config.resolver import resolve_config
from cairn.persistence.events import RequestHeader, UserMessage
from cairn.widgets.prompt_input import PromptInput
from cairn.widgets.status_bar import StatusBar
from cairn.widgets.transcript import Notice, Transcript

pytestmark = pytest.mark.anyio
SERVER = str(Path(__file__).with_name("mcp_server.py"))


def notices(app) -> list[str]:
    return [str(n.render()) for n in app.chat.query_one(Transcript).query(Notice)]


def status(app) -> str:
    return str(app.chat.query_one(StatusBar).render())


def test_importing_the_tui_leaves_the_agent_stack_and_other_screens_unloaded():
    code = ("import sys, cairn.app.tui; print(sorted(m for m in ('cairn.app.compose', 'cairn.app.agent.loop', "
            "'cairn.app.tools.registry', 'cairn.app.screens.approval', 'cairn.app.screens.sessions', 'mcp') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


async def test_the_prompt_takes_keys_before_the_agent_stack_is_built_and_a_prompt_sent_meanwhile_runs(
        tmp_path, monkeypatch):
    import cairn.app.screens.agent_lifetime as chat_module

    gate = threading.Event()
    real = chat_module.load_agent_stack

    async def held() -> None:  # the agent stack is not built until the test says so; the event loop keeps running
        while not gate.is_set():
            await asyncio.sleep(0.01)
        await real()

    monkeypatch.setattr(chat_module, "load_agent_stack", held)
    world = make_world(tmp_path, [{"text": "hello back"}])
    app = world.new_app()
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            prompt = app.chat.query_one(PromptInput)
            assert app.chat.agent is None and prompt.has_focus
            assert any("Type a prompt" in n for n in notices(app))  # the welcome line is drawn
            await pilot.press("h", "i")
            assert prompt.text == "hi"  # echoed with no agent yet
            enter = asyncio.ensure_future(pilot.press("enter"))
            await asyncio.sleep(0.2)
            assert app.chat.agent is None and not any(isinstance(e, UserMessage) for e in app.session.events)
            gate.set()
            await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the turn to end")
            await asyncio.wait_for(enter, 10)
            assert ended_turns(app.session.events)[0].reason == "completed"
            await pilot.press("ctrl+q")
    finally:
        gate.set()
        app.close_if_still_open()


async def test_mcp_servers_start_in_the_background_and_a_prompt_sent_before_they_are_ready_waits_for_them(
        tmp_path, monkeypatch):
    import cairn.app.tools.mcp as mcp_module

    gate = threading.Event()
    real = mcp_module._load_sdk

    def held() -> None:  # the SDK import (in a thread) is where a server's start begins: hold it
        gate.wait(30)
        real()

    monkeypatch.setattr(mcp_module, "_load_sdk", held)
    config_file = tmp_path / "config.toml"
    config_file.write_text(f"[mcp_servers.tix]\ncommand = {json.dumps(sys.executable)}\n"
                           f"args = [{json.dumps(SERVER)}]\n")
    world = make_world(tmp_path, [{"text": "done"}])
    world.config = resolve_config(home=str(world.config.home), provider="script", script=str(tmp_path / "script.json"),
                                  workspace=str(world.workspace), env={"CAIRN_CONFIG": str(config_file)})
    app = world.new_app()
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.chat.agent is not None, "the agent (built without waiting for MCP)")
            assert [s.status for s in app.chat.agent.mcp.states] == ["starting"]
            await wait_for(pilot, lambda: "MCP starting: tix" in status(app), "the status bar to show it starting")
            app.chat.query_one(PromptInput).insert("use the tickets")
            await pilot.press("enter")
            await wait_for(pilot, lambda: any("Waiting for MCP server tix" in n for n in notices(app)),
                           "the line saying the prompt waits for the server")
            assert any(isinstance(e, UserMessage) for e in app.session.events)  # the prompt is recorded meanwhile
            assert not any(isinstance(e, RequestHeader) for e in app.session.events)  # no request yet
            gate.set()
            await wait_for(pilot, lambda: len(ended_turns(app.session.events)) == 1, "the turn to end", 30)
            header = next(e for e in app.session.events if isinstance(e, RequestHeader))
            assert any(name.startswith("tix__") for name in header.tools), header.tools  # the model saw its tools
            assert "MCP starting" not in status(app)
            await pilot.press("ctrl+q")
    finally:
        gate.set()
        app.close_if_still_open()
