"""The operator's own shell command (`!command`, app/agent/operator_command.py): a turn of its own with real
processes, real files, real git snapshots and a real SIGKILL — events and their durability, what the model is told,
limits, keys, cancel, rewind, and a crash in the middle of it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest
from agent_helpers import types, write_script
from cli_world import World
from waiting import wait_sync, wait_until

from cairn.app.agent import operator_command
from cairn.app.agent.operator_command import CANCELLED, OperatorCommandRequest, parse
from cairn.app.agent.operator_text import UNKNOWN
from cairn.app.agent.rewind_plan import prompts
from cairn.app.compose import Agent, open_agent
from cairn.app.config.resolver import resolve_config
from cairn.app.tools.base import OUTPUT_LIMIT
from cairn.app.tools.command import _group_running
from cairn.persistence.events import OperatorCommand, OperatorResult, TurnEnd, TurnStart

pytestmark = pytest.mark.anyio
ANSWER = {"text": "noted"}


@asynccontextmanager
async def agent_in(home: Path, ws: Path, responses: list[dict[str, Any]], *, snapshots: str = "off",
                   session_id: str | None = None, resume: str | None = None, with_policy: bool = True,
                   ) -> AsyncIterator[Agent]:
    ws.mkdir(exist_ok=True)
    script = write_script(home.parent / f"script-{len(list(home.parent.glob('script-*')))}.json", responses)
    config = resolve_config(home=str(home), backend="jsonl", provider="script", script=str(script),
                            workspace=str(ws), env={"CAIRN_SNAPSHOTS": snapshots})
    async with open_agent(config, session_id=session_id, resume=resume, with_policy=with_policy) as agent:
        yield agent


def requests_of(agent: Agent) -> list[list[dict[str, Any]]]:
    """The messages of every request the provider receives from now on."""
    seen: list[list[dict[str, Any]]] = []
    provider = agent.loop.provider
    stream = provider.stream

    def recording(request: Any) -> Any:
        seen.append([dict(m) for m in request.messages])
        return stream(request)

    provider.stream = recording  # type: ignore[method-assign]
    return seen


def test_bang_text_parses_to_a_command_and_a_lone_bang_stays_a_prompt():
    assert parse("!ls -la") == OperatorCommandRequest("ls -la")
    assert parse("!  make test ") == OperatorCommandRequest("make test")
    assert parse("!") is None and parse("!   ") is None and parse("ls !x") is None


@pytest.mark.parametrize("with_policy", [True, False])
async def test_the_command_is_a_turn_whose_intent_is_durable_before_the_process_starts(tmp_path, monkeypatch,
                                                                                      with_policy):
    durable_at_start: list[tuple[int, int]] = []
    real = operator_command.run_shell

    async def watched(*args: Any, **kwargs: Any) -> Any:
        session = agent.session
        command = next(e for e in session.events if isinstance(e, OperatorCommand))
        durable_at_start.append((session.coordinator.durable_seq, command.seq))
        return await real(*args, **kwargs)

    monkeypatch.setattr(operator_command, "run_shell", watched)
    home = tmp_path / "home"
    async with agent_in(home, tmp_path / "ws", [], with_policy=with_policy) as agent:
        log = home / "sessions" / f"{agent.session.id}.jsonl"
        result = await agent.loop.run_turn(OperatorCommandRequest(f"grep -c operator/command {log}"))
        events = list(agent.session.events)
    assert result.reason == "completed"
    assert types(events) == ["turn/start", "operator/command", "operator/result", "turn/end"]
    [(durable, command_seq)] = durable_at_start
    assert durable >= command_seq  # the intent was on disk when the process was about to start
    ended = events[2]
    assert isinstance(ended, OperatorResult) and ended.exit_code == 0
    assert ended.output == "1\n"  # the command itself found its intent in the log file


async def test_output_and_exit_code_are_recorded_and_reach_the_next_request(tmp_path):
    async with agent_in(tmp_path / "home", tmp_path / "ws", [ANSWER]) as agent:
        seen = requests_of(agent)
        await agent.loop.run_turn(OperatorCommandRequest("echo from-the-shell; exit 3"))
        result = next(e for e in agent.session.events if isinstance(e, OperatorResult))
        assert (result.exit_code, result.output) == (3, "from-the-shell\n")
        assert seen == []  # no model request for the command itself
        await agent.loop.run_turn("what did it print?")
    [messages] = seen
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1  # the command's report and the prompt are one user message
    assert users[0]["content"] == ("[The operator ran `echo from-the-shell; exit 3` in the workspace: exit code 3]\n"
                                   "```\nfrom-the-shell\n```\n\nwhat did it print?")


async def test_output_over_the_limit_is_cut_with_a_notice(tmp_path):
    async with agent_in(tmp_path / "home", tmp_path / "ws", []) as agent:
        await agent.loop.run_turn(OperatorCommandRequest(f"head -c {OUTPUT_LIMIT + 5000} /dev/zero | tr '\\0' a"))
        result = next(e for e in agent.session.events if isinstance(e, OperatorResult))
    assert result.exit_code == 0
    assert result.output == "a" * OUTPUT_LIMIT + "\n[output truncated: 5000 more bytes not shown]"


async def test_cairns_keys_are_not_in_the_commands_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-test-key-0123456789")
    monkeypatch.setenv("A_COPY_OF_IT", "sk-operator-test-key-0123456789")
    monkeypatch.setenv("PLAIN_SETTING", "kept")
    async with agent_in(tmp_path / "home", tmp_path / "ws", []) as agent:
        await agent.loop.run_turn(OperatorCommandRequest("env"))
        result = next(e for e in agent.session.events if isinstance(e, OperatorResult))
    assert "PLAIN_SETTING=kept" in result.output
    assert "OPENAI_API_KEY" not in result.output and "A_COPY_OF_IT" not in result.output
    assert "sk-operator-test-key" not in result.output


async def test_cancel_stops_the_whole_process_group_and_keeps_the_output_so_far(tmp_path):
    ws = tmp_path / "ws"
    async with agent_in(tmp_path / "home", ws, []) as agent:
        async with anyio.create_task_group() as tg:
            ended: list[Any] = []

            async def run() -> None:
                ended.append(await agent.loop.run_turn(OperatorCommandRequest(
                    "echo started; echo $$ > group; sleep 30 & sleep 30")))

            tg.start_soon(run)
            await wait_until(lambda: (ws / "group").exists() and (ws / "group").read_text().strip(), "the command ran")
            group = int((ws / "group").read_text())
            assert _group_running(group)
            agent.loop.cancel()
        events = list(agent.session.events)
    assert ended[0].reason == "cancelled"
    assert not _group_running(group)  # both sleeps are gone with the shell
    result = next(e for e in events if isinstance(e, OperatorResult))
    assert result.exit_code is None and result.output == f"started\n{CANCELLED}"
    assert types(events)[-2:] == ["operator/result", "turn/end"]
    assert isinstance(events[-1], TurnEnd) and events[-1].reason == "cancelled"


async def test_a_command_that_cannot_start_ends_its_turn_in_error(tmp_path):
    async with agent_in(tmp_path / "home", tmp_path / "ws", []) as agent:
        (tmp_path / "ws").rmdir()  # its working directory is gone
        result = await agent.loop.run_turn(OperatorCommandRequest("true"))
        events = list(agent.session.events)
    assert result.reason == "error" and result.error is not None and result.error.code == "COMMAND_FAILED"
    ended = next(e for e in events if isinstance(e, OperatorResult))
    assert ended.exit_code is None and ended.output.startswith("could not start the command")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
async def test_rewinding_the_commands_turn_puts_the_files_back(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    (world.ws / "edit.txt").write_text("before\n")
    async with agent_in(world.home, world.ws, [ANSWER], snapshots="auto", session_id="s") as agent:
        await agent.loop.run_turn("hello")
        await agent.loop.run_turn(OperatorCommandRequest("echo after > edit.txt && echo new > made.txt"))
        listed = prompts(agent.session.events)  # what the /rewind dialog (TUI and ACP) offers
    assert listed == [(1, "hello"), (2, "!echo after > edit.txt && echo new > made.txt")]
    assert (world.ws / "edit.txt").read_text() == "after\n" and (world.ws / "made.txt").exists()
    shots = [(e["type"], e.get("at"), e.get("turn")) for e in world.events()
             if e["type"] in ("workspace/snapshot", "operator/command", "operator/result")]
    assert shots == [("workspace/snapshot", "turn-start", 1), ("workspace/snapshot", "turn-end", 1),
                     ("workspace/snapshot", "turn-start", 2), ("operator/command", None, 2),
                     ("operator/result", None, 2), ("workspace/snapshot", "turn-end", 2)]
    proc = world.cairn("rewind", "s", "--turn", "2")
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / "edit.txt").read_text() == "before\n" and not (world.ws / "made.txt").exists()


CHILD = """
import sys, anyio
from cairn.app.agent.operator_command import OperatorCommandRequest
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config

home, ws, script = sys.argv[1:4]

async def main():
    config = resolve_config(home=home, backend="jsonl", provider="script", script=script, workspace=ws,
                            env={"CAIRN_SNAPSHOTS": "off"})
    async with open_agent(config, session_id="s") as agent:
        await agent.loop.run_turn(OperatorCommandRequest("echo $$ > group; sleep 30"))

anyio.run(main)
"""


async def test_a_crash_while_the_command_runs_leaves_its_outcome_unknown_and_kills_it(tmp_path):
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "child.json", [])
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(home), str(ws), str(script)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_sync(lambda: (ws / "group").exists() and (ws / "group").read_text().strip() or child.poll() is not None,
                  "the command ran", 30)
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        group = int((ws / "group").read_text())
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    wait_sync(lambda: not _group_running(group), "the sleep died with Cairn")

    shown = subprocess.run([str(Path(sys.executable).parent / "cairn"), "show", "s"], capture_output=True, text=True,
                           env={**os.environ, "CAIRN_HOME": str(home)}, timeout=60)
    assert "! echo $$ > group; sleep 30  (the operator's shell command)  — outcome unknown" in shown.stdout

    async with agent_in(home, ws, [ANSWER], resume="s") as agent:
        repaired = list(agent.session.events)
        seen = requests_of(agent)
        await agent.loop.run_turn("did it finish?")
    assert types(repaired) == ["turn/start", "operator/command", "turn/end"]  # nothing lost, nothing invented
    assert isinstance(repaired[-1], TurnEnd) and repaired[-1].reason == "interrupted"
    [messages] = seen
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        f"[The operator ran `echo $$ > group; sleep 30` in the workspace: {UNKNOWN}]\n\ndid it finish?"]


def test_cairn_show_and_export_render_the_command_and_its_result(tmp_path):
    world = World(tmp_path, "jsonl")

    async def run() -> None:
        async with agent_in(world.home, world.ws, [], session_id="s") as agent:
            await agent.loop.run_turn(OperatorCommandRequest("echo shown; exit 2"))

    anyio.run(run)
    shown = world.cairn("show", "s")
    assert "  ! echo shown; exit 2  (the operator's shell command)\n  ⇐ exit code 2 — shown" in shown.stdout
    exported = world.cairn("export", "s")
    assert "**Operator command** `!echo shown; exit 2`\n→ exit code 2\n```text\nshown\n```" in exported.stdout
    lines = [json.loads(line) for line in world.cairn("export", "s", "--format", "json").stdout.splitlines()]
    assert [e["type"] for e in lines if e["type"].startswith("operator/")] == ["operator/command", "operator/result"]


def test_acp_replays_operator_commands_as_the_operators_text_and_a_crashed_one_as_unknown():
    from cairn.app.acp.updates import STOPPED_HERE, replay
    from cairn.persistence.repair import repair_interrupted_turn

    events: list[Any] = [TurnStart(turn=1), OperatorCommand(turn=1, command="ls"),
                         OperatorResult(turn=1, exit_code=0, output="a.txt\n"), TurnEnd(turn=1, reason="completed",
                                                                                         error=None),
                         TurnStart(turn=2), OperatorCommand(turn=2, command="make deploy")]
    for seq, event in enumerate(events):
        event.seq = seq
    events += repair_interrupted_turn(events)
    updates = replay(events, Path("/ws"))
    said = [(u.session_update, u.content.text) for u in updates]
    assert said == [
        ("user_message_chunk", "[The operator ran `ls` in the workspace: exit code 0]\n```\na.txt\n```"),
        ("user_message_chunk", f"[The operator ran `make deploy` in the workspace: {UNKNOWN}]"),
        ("agent_message_chunk", f"{STOPPED_HERE}."),
    ]
