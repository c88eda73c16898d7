"""Project instructions in the system prompt (issue 42): AGENTS.md / CLAUDE.md / GEMINI.md per level from the
repository's top down to the workspace, the user's own AGENTS.md first; recorded as `context/instructions` once per
change, size-limited with a notice, unreadable files recorded as errors, secrets never stored nor sent; a crash right
after the context events repairs like any turn; `cairn config` lists the files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest

from agent_helpers import write_script
from openai_server import OpenAIServer, text
from waiting import wait_dead, wait_sync

from cairn.app.agent.approval import headless_approver
from cairn.app.agent.project_context import FILE_LIMIT, read_instructions, user_config_dir
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config
from cairn.persistence.events import ContextEnvironment, ContextInstructions

CAIRN = str(Path(sys.executable).parent / "cairn")
KEY = "sk-test-INSTRUCTIONS-SECRET-4d2e8b"
pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def context_on(monkeypatch, tmp_path):
    """Project context on (conftest turns it off for the rest of the suite), the user's config dir inside tmp_path."""
    monkeypatch.delenv("CAIRN_PROJECT_CONTEXT", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def git_init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, env={"PATH": os.environ["PATH"], "HOME": str(path)})


def user_file(text: str) -> Path:
    directory = user_config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "AGENTS.md").write_text(text)
    return directory / "AGENTS.md"


@asynccontextmanager
async def openai_agent(tmp_path: Path, server: OpenAIServer, workspace: Path, report: Any = None) -> AsyncIterator[Any]:
    config = resolve_config(home=str(tmp_path / "home"), provider="openai", base_url=server.base_url, model="m",
                            workspace=str(workspace), env={"CAIRN_SNAPSHOTS": "off", "CAIRN_API_KEY": KEY,
                                                           "CAIRN_MAX_RETRIES": "0"})
    async with open_agent(config, approver=headless_approver(True), report=report) as agent:
        yield agent


def system_of(request: Any) -> str:
    first = request.body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def of_type(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# -- which files, in which order ------------------------------------------------------------------------------------


def test_each_level_reads_agents_md_else_claude_md_else_gemini_md_user_file_first_nearest_last(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    top = tmp_path / "repo"
    git_init(top)
    workspace = top / "a" / "b" / "c"
    workspace.mkdir(parents=True)
    (tmp_path / "AGENTS.md").write_text("above the repository: never read")
    (top / "AGENTS.md").write_text("top agents")
    (top / "CLAUDE.md").write_text("top claude: AGENTS.md wins at this level")
    (top / "a" / "CLAUDE.md").write_text("a claude")
    (top / "a" / "GEMINI.md").write_text("a gemini: CLAUDE.md wins at this level")
    (top / "a" / "b" / "GEMINI.md").write_text("b gemini")
    (workspace / "AGENTS.md").write_text("c agents")
    (workspace / "GEMINI.md").write_text("c gemini: not read")
    user_file("my own rules")

    files, sent, notices = read_instructions(workspace, user_config_dir())

    assert [(f.path, f.scope) for f in files] == [
        ("~/xdg/cairn/AGENTS.md", "user"),
        ("../../../AGENTS.md", "project"), ("../../CLAUDE.md", "project"), ("../GEMINI.md", "project"),
        ("AGENTS.md", "project"),
    ]
    order = [sent.index(t) for t in ("my own rules", "top agents", "a claude", "b gemini", "c agents")]
    assert order == sorted(order)
    for never in ("never read", "AGENTS.md wins", "CLAUDE.md wins", "c gemini"):
        assert never not in sent
    assert "--- AGENTS.md ---\nc agents" in sent and notices == []
    assert all(f.sha256 and f.error is None and not f.truncated for f in files)


def test_a_user_file_under_home_is_shown_as_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    user_file("mine")
    files, _, _ = read_instructions(workspace, user_config_dir())
    assert [f.path for f in files] == ["~/xdg/cairn/AGENTS.md"]


def test_outside_a_repository_only_the_workspace_level_is_read(tmp_path):
    workspace = tmp_path / "plain" / "ws"
    workspace.mkdir(parents=True)
    (tmp_path / "plain" / "AGENTS.md").write_text("parent: no repository, not read")
    (workspace / "CLAUDE.md").write_text("workspace claude")
    files, sent, _ = read_instructions(workspace, None)
    assert [f.path for f in files] == ["CLAUDE.md"] and "workspace claude" in sent and "parent" not in sent


def test_no_instruction_files_record_no_instructions_event(tmp_path):
    async def main() -> None:
        with OpenAIServer([text("hi")]) as server:
            async with openai_agent(tmp_path, server, tmp_path / "ws") as agent:
                await agent.run("hello")
                events = agent.session.events
                assert of_type(events, ContextInstructions) == []
                assert len(of_type(events, ContextEnvironment)) == 1
                assert "Project instructions" not in system_of(server.requests[0])
    (tmp_path / "ws").mkdir()
    anyio.run(main)


# -- recorded once per change, sent from the log --------------------------------------------------------------------


def test_instructions_changed_mid_session_are_recorded_again_and_the_next_request_tells_the_new_text(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Always answer in French.\n")

    async def main() -> None:
        with OpenAIServer([text("un"), text("deux"), text("trois")]) as server:
            async with openai_agent(tmp_path, server, workspace) as agent:
                await agent.run("first")
                (workspace / "AGENTS.md").write_text("Always answer in German.\n")
                await agent.run("second")
                await agent.run("third")  # nothing changed: nothing recorded
                events = agent.session.events
                requests = list(server.requests)
        recorded = of_type(events, ContextInstructions)
        assert [e.turn for e in recorded] == [1, 2]
        assert "French" in recorded[0].text and "German" in recorded[1].text
        assert recorded[0].files[0].sha256 != recorded[1].files[0].sha256
        assert [e.turn for e in of_type(events, ContextEnvironment)] == [1]
        assert "Always answer in French." in system_of(requests[0])
        assert "German" in system_of(requests[1]) and "French" not in system_of(requests[1])
        assert system_of(requests[2]) == system_of(requests[1])
        assert system_of(requests[0]).startswith("You are Cairn, a careful coding agent working in the workspace")
    anyio.run(main)


def test_a_secret_inside_an_instruction_file_is_never_stored_nor_sent(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text(f"Deploy with the key {KEY} please.\n")

    async def main() -> None:
        with OpenAIServer([text("ok"), text("ok again")]) as server:
            async with openai_agent(tmp_path, server, workspace) as agent:
                await agent.run("deploy")
                await agent.run("again")  # the scrubbed record still matches the file: not recorded again
                await agent.session.flush()
                events = agent.session.events
            requests = list(server.requests)
        recorded = of_type(events, ContextInstructions)
        assert len(recorded) == 1 and "***" in recorded[0].text and KEY not in recorded[0].text
        for request in requests:
            assert KEY not in json.dumps(request.body["messages"])
            assert "Deploy with the key *** please." in system_of(request)
        for path in (tmp_path / "home").rglob("*"):
            if path.is_file():
                assert KEY.encode() not in path.read_bytes(), f"the key leaked into {path}"
    anyio.run(main)


# -- limits and unreadable files -------------------------------------------------------------------------------------


def test_a_file_over_the_limit_is_cut_with_a_notice_the_operator_sees(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Q" * (80 * 1024 - 1) + "\n")
    reported: list[str] = []

    async def main() -> None:
        with OpenAIServer([text("ok")]) as server:
            async with openai_agent(tmp_path, server, workspace, report=reported.append) as agent:
                await agent.run("go")
                events = agent.session.events
            system = system_of(server.requests[0])
        (recorded,) = of_type(events, ContextInstructions)
        (f,) = recorded.files
        assert f.truncated and f.size == 80 * 1024 and f.error is None
        assert recorded.notices == ["AGENTS.md is 80 KB: only its first 32 KB are sent"]
        assert recorded.notices[0] in reported
        assert system.count("Q") == FILE_LIMIT
    anyio.run(main)


def test_the_total_limit_leaves_later_files_cut_or_out(tmp_path):
    top = tmp_path / "repo"
    git_init(top)
    workspace = top / "a" / "b"
    workspace.mkdir(parents=True)
    for level in (top, top / "a", workspace):
        (level / "AGENTS.md").write_text("y" * FILE_LIMIT)
    files, sent, notices = read_instructions(workspace, None)
    assert [f.truncated for f in files] == [False, False, True]
    assert sent.count("y") == 2 * FILE_LIMIT
    assert notices == ["AGENTS.md is not sent: the instructions are over 64 KB in total"]


def test_a_fifo_and_a_directory_named_like_instructions_are_errors_not_hangs(tmp_path):
    top = tmp_path / "repo"
    git_init(top)
    workspace = top / "ws"
    workspace.mkdir()
    (top / "AGENTS.md").mkdir()
    os.mkfifo(workspace / "AGENTS.md")
    reported: list[str] = []

    async def main() -> None:
        with OpenAIServer([text("still fine")]) as server:
            async with openai_agent(tmp_path, server, workspace, report=reported.append) as agent:
                with anyio.fail_after(20):
                    result = await agent.run("go")
                events = agent.session.events
        assert result.reason == "completed"
        (recorded,) = of_type(events, ContextInstructions)
        assert [(f.path, f.sha256, f.error is not None) for f in recorded.files] == [
            ("../AGENTS.md", None, True), ("AGENTS.md", None, True)]
        assert "directory" in (recorded.files[0].error or "") and "FIFO" in (recorded.files[1].error or "")
        assert recorded.text == "" and len(recorded.notices) == 2
        assert all(n in reported for n in recorded.notices)
    anyio.run(main)


# -- crash and resume ------------------------------------------------------------------------------------------------


def test_a_kill_right_after_the_context_events_repairs_the_turn_and_a_resume_records_nothing_unchanged(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Be brief.\n")
    marker = tmp_path / "failpoint.jsonl"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "CAIRN_SNAPSHOTS": "off"}
    script = write_script(tmp_path / "s.json", [{"text": "never sent"}])
    child = subprocess.Popen([CAIRN, "run", "--provider", "script", "--script", str(script), "hello"], cwd=workspace,
                             env={**env, "CAIRN_FAILPOINT": "prompt-accepted", "CAIRN_FAILPOINT_MARKER": str(marker)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        line = wait_sync(lambda: marker.exists() and marker.read_text().strip(), "the failpoint marker", timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    wait_dead(child.pid)
    session_id = json.loads(line.splitlines()[0])["session"]

    def show() -> list[dict[str, Any]]:
        proc = subprocess.run([CAIRN, "show", session_id, "--json"], env=env, cwd=workspace, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(x) for x in proc.stdout.splitlines()]

    events = show()
    kinds = [e["type"] for e in events]
    assert kinds == ["turn/start", "context/environment", "context/instructions", "step/start", "user/message",
                     "step/end", "turn/end"]
    assert events[-1]["reason"] == "interrupted" and "Be brief." in events[2]["text"]
    second = write_script(tmp_path / "s2.json", [{"text": "Resumed."}])
    proc = subprocess.run([CAIRN, "run", "--resume", session_id, "--provider", "script", "--script", str(second),
                           "again"], env=env, cwd=workspace, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "Resumed.\n", proc.stderr
    kinds = [e["type"] for e in show()]
    assert kinds[7:] == ["turn/start", "step/start", "user/message", "request/header", "assistant/chunk",
                         "assistant/message", "step/end", "turn/end"]
    assert "tool/result" not in kinds


async def test_a_resumed_session_tells_the_recorded_instructions_before_its_first_turn(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Recorded rules.\n")
    with OpenAIServer([text("one"), text("two")]) as server:
        async with openai_agent(tmp_path, server, workspace) as agent:
            await agent.run("first")
            session_id = agent.session.id
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", base_url=server.base_url, model="m",
                                workspace=str(workspace), env={"CAIRN_SNAPSHOTS": "off", "CAIRN_API_KEY": KEY})
        async with open_agent(config, resume=session_id, approver=headless_approver(True)) as agent:
            assert "Recorded rules." in agent.loop.exchange.system_prompt  # from the log, before anything is read
            await agent.run("second")
            assert len(of_type(agent.session.events, ContextInstructions)) == 1
        assert system_of(server.requests[1]) == system_of(server.requests[0])


async def test_turned_off_nothing_is_read_or_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("CAIRN_PROJECT_CONTEXT", "off")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("ignored")
    with OpenAIServer([text("ok")]) as server:
        async with openai_agent(tmp_path, server, workspace) as agent:
            assert agent.loop.project_context is None
            await agent.run("go")
            events = agent.session.events
        assert of_type(events, ContextInstructions) == of_type(events, ContextEnvironment) == []
        assert "ignored" not in system_of(server.requests[0])


# -- the faces: cairn config, cairn show, /instructions --------------------------------------------------------------


def test_cairn_config_lists_the_instruction_files_in_text_and_json(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg")}

    def config(*args: str) -> str:
        proc = subprocess.run([CAIRN, "config", *args], env=env, cwd=workspace, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert [line.split()[:2] for line in config().splitlines() if line.startswith("instructions")] == [
        ["instructions", "none"]]
    assert json.loads(config("--json"))["instructions"]["value"] == []
    (workspace / "AGENTS.md").write_text("z" * 2150)
    (tmp_path / "xdg" / "cairn").mkdir(parents=True)
    (tmp_path / "xdg" / "cairn" / "AGENTS.md").write_text("mine")
    out = config()
    assert "  ~/xdg/cairn/AGENTS.md  (user, 4 B)\n  AGENTS.md  (project, 2.1 KB)\n" in out
    files = json.loads(config("--json"))["instructions"]["value"]
    assert files == [
        {"path": "~/xdg/cairn/AGENTS.md", "scope": "user", "size": 4, "truncated": False, "error": None},
        {"path": "AGENTS.md", "scope": "project", "size": 2150, "truncated": False, "error": None},
    ]



def test_the_setting_is_validated_shown_and_obeyed_from_env_and_profile(tmp_path):
    """`project_context` is a setting like the others (SPEC §6: every variable validated): a bad value is exit 2 with
    one line; `cairn config` shows where it came from; off, no instruction file is listed."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("be brief")
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "XDG_CONFIG_HOME": str(tmp_path / "xdg")}

    def config(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CAIRN, "config", "--json"], env={**base, **extra}, cwd=workspace, capture_output=True,
                              text=True, timeout=60)

    bad = config(CAIRN_PROJECT_CONTEXT="maybe")
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "CAIRN_PROJECT_CONTEXT must be on or off" in bad.stderr
    on = json.loads(config().stdout)
    assert on["project_context"] == {"value": "on", "source": "default"}
    assert [f["path"] for f in on["instructions"]["value"]] == ["AGENTS.md"]
    off = json.loads(config(CAIRN_PROJECT_CONTEXT="off").stdout)
    assert off["project_context"] == {"value": "off", "source": "env CAIRN_PROJECT_CONTEXT"}
    assert off["instructions"]["value"] == []
    profile = tmp_path / "cairn.toml"
    profile.write_text('default_profile = "quiet"\n[profiles.quiet]\nproject_context = "off"\n')
    from_file = json.loads(config(CAIRN_CONFIG=str(profile)).stdout)
    assert from_file["project_context"] == {"value": "off", "source": "profile quiet"}
    assert from_file["instructions"]["value"] == []

async def test_cairn_show_renders_the_context_events_as_one_line_each(tmp_path):
    from cairn.app.render import render_session

    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    git_init(workspace)
    (workspace / "AGENTS.md").write_text("a" * 2150)
    with OpenAIServer([text("ok")]) as server:
        async with openai_agent(tmp_path, server, workspace / "sub") as agent:
            await agent.run("go")
            shown = render_session(agent.session.events)
    assert "  ≡ instructions: ../AGENTS.md (2.1 KB)" in shown
    assert "  ≡ environment: Date: " in shown and "Git status: " in shown


async def test_instructions_report_says_what_is_loaded_or_would_be(tmp_path):
    from cairn.app.agent.project_context import instructions_report

    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert instructions_report([], workspace).startswith("No project instructions are loaded")
    (workspace / "AGENTS.md").write_text("b" * (40 * 1024))
    before = instructions_report([], workspace)
    assert before.splitlines() == ["Project instructions the next turn will send (not recorded yet):",
                                   "AGENTS.md  (project, 40 KB, cut at the size limit)",
                                   "! AGENTS.md is 40 KB: only its first 32 KB are sent"]
    with OpenAIServer([text("ok")]) as server:
        async with openai_agent(tmp_path, server, workspace) as agent:
            await agent.run("go")
            report = instructions_report(agent.session.events, workspace)
    assert report.splitlines()[0].startswith("Project instructions the model is told (recorded at turn 1")
    assert report.splitlines()[1:] == before.splitlines()[1:]


async def test_acp_replay_and_live_updates_pass_over_the_context_events(tmp_path):
    """An editor is told nothing about them (the system prompt is not the conversation), and nothing chokes on them."""
    from cairn.app.acp.updates import LiveView, replay

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("rules")
    with OpenAIServer([text("The answer.")]) as server:
        async with openai_agent(tmp_path, server, workspace) as agent:
            await agent.run("go")
            events = list(agent.session.events)
    context = [e for e in events if isinstance(e, (ContextInstructions, ContextEnvironment))]
    assert len(context) == 2
    view = LiveView(workspace)
    assert [view.updates(e) for e in context] == [[], []]
    plain = [e for e in events if e not in context]
    assert [u.model_dump() for u in replay(events, workspace)] == [u.model_dump() for u in replay(plain, workspace)]


def test_cairn_run_prints_the_size_notice_as_one_line_on_stderr(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("n" * (33 * 1024))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    script = write_script(tmp_path / "s.json", [{"text": "Done."}])
    proc = subprocess.run([CAIRN, "run", "--provider", "script", "--script", str(script), "go"], cwd=workspace,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "Done.\n", proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "AGENTS.md is 33 KB" in line]
    assert len(lines) == 1 and lines[0].endswith("AGENTS.md is 33 KB: only its first 32 KB are sent")
    assert "Traceback" not in proc.stderr
