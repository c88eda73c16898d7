"""A session belongs to its workspace (SPEC §10, issue: a resumed session worked in the wrong directory).

Resumed from another directory — `cairn run --resume`, the TUI's sessions screen, ACP `session/load`, the Python API —
a session's tools run in its own workspace (what `pwd` prints, where the file it writes lands, both read back from
the log and the disk); `--workspace DIR` on a resume moves it there with a durable `workspace/moved`; a recorded
workspace that is gone is refused, naming it. Real `cairn` child processes, a real ACP client over real pipes, the
real TUI under the pilot; the model is the `script` provider.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError

from acp_helpers import RecordingClient, connect, prompt, rig_fixture, script_env
from crash_harness import CAIRN, RUN_TIMEOUT, Rig
from tui_helpers import approval_ready, completed_turn, crashed_turn, make_world, top_screen, wait_for, write_log

from cairn.persistence.events import WorkspaceMoved

pytestmark = pytest.mark.anyio
rig = pytest.fixture(rig_fixture, name="rig")

WHERE = [{"tool_calls": [{"name": "run_command", "arguments": {"command": "pwd | tee where.txt"}}]}, {"text": "done"}]


def cairn_in(rig: Rig, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`cairn` as an operator runs it from `cwd` (the rig's environment: its home, its backend, nothing inherited)."""
    return subprocess.run([CAIRN, *args], env=rig.env({"CAIRN_SNAPSHOTS": "off"}), cwd=cwd, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)


def pwd_results(events: list[dict[str, Any]]) -> list[str]:
    """What each `pwd` printed, in order (from the stored tool results)."""
    return [e["content"].split("\n")[0] for e in events if e["type"] == "tool/result"]


def started_session(rig: Rig) -> tuple[str, Path]:
    """A session made by `cairn run` in the rig's workspace; returns its id and that workspace (resolved)."""
    workspace = rig.ws.resolve()
    made = cairn_in(rig, workspace, "run", "--provider", "script", "--script", rig.script(WHERE), "--session-id", "s",
                    "--yes", "where are you")
    assert made.returncode == 0, made.stderr
    (workspace / "where.txt").unlink()
    return "s", workspace


def elsewhere(rig: Rig, name: str = "elsewhere") -> Path:
    other = rig.root / name
    other.mkdir()
    return other.resolve()


# --------------------------------------------------------------------------------------------------- headless


def test_a_session_resumed_from_another_directory_runs_in_its_own_and_says_so(rig):
    sid, workspace = started_session(rig)
    other = elsewhere(rig)
    resumed = cairn_in(rig, other, "run", "--script", rig.script(WHERE), "--resume", sid, "--yes", "run pwd")
    assert resumed.returncode == 0, resumed.stderr
    assert f"cairn: session {sid} works in {workspace} (not the current directory)" in resumed.stderr.splitlines()
    assert pwd_results(rig.show(sid)) == [str(workspace), str(workspace)]
    assert (workspace / "where.txt").read_text().strip() == str(workspace)
    assert not (other / "where.txt").exists()
    assert "workspace/moved" not in [e["type"] for e in rig.show(sid)]  # no --workspace: nothing moved


def test_workspace_on_a_resume_moves_the_session_durably_before_the_turn_and_it_runs_there(rig):
    sid, workspace = started_session(rig)
    new = elsewhere(rig, "new")
    same = cairn_in(rig, rig.root, "run", "--script", rig.script(WHERE), "--resume", sid, "--workspace", str(workspace),
                    "--yes", "same place")
    assert same.returncode == 0, same.stderr
    assert "workspace/moved" not in [e["type"] for e in rig.show(sid)]  # the same directory records nothing

    moved = cairn_in(rig, rig.root, "run", "--script", rig.script(WHERE), "--resume", sid, "--workspace", str(new),
                     "--yes", "run pwd")
    assert moved.returncode == 0, moved.stderr
    assert f"cairn: session {sid} moved from {workspace} to {new} (--workspace)" in moved.stderr.splitlines()
    events = rig.show(sid)
    (move,) = [e for e in events if e["type"] == "workspace/moved"]
    assert (move["from"], move["to"], move["ignorable"]) == (str(workspace), str(new), True)
    last_start = [e for e in events if e["type"] == "turn/start"][-1]
    assert move["seq"] < last_start["seq"]  # recorded before the turn began
    assert pwd_results(events)[-1] == str(new) and (new / "where.txt").read_text().strip() == str(new)

    # from then on it belongs to the new place: resumed from anywhere, with no flag, it runs there
    again = cairn_in(rig, workspace, "run", "--script", rig.script(WHERE), "--resume", sid, "--yes", "and now")
    assert again.returncode == 0, again.stderr
    assert pwd_results(rig.show(sid))[-1] == str(new)
    listed = cairn_in(rig, new, "sessions", "--json")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [sid]  # listed under its new home


def test_a_workspace_that_no_longer_exists_is_exit_2_naming_it_and_workspace_continues_it(rig):
    sid, _ = started_session(rig)
    gone = elsewhere(rig, "gone")
    assert cairn_in(rig, rig.root, "run", "--script", rig.script(WHERE), "--resume", sid, "--workspace", str(gone),
                    "--yes", "move").returncode == 0
    shutil.rmtree(gone)
    before = rig.show(sid)

    refused = cairn_in(rig, rig.root, "run", "--script", rig.script(WHERE), "--resume", sid, "--yes", "run pwd")
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert str(gone) in line and "--workspace DIR" in line and "Traceback" not in refused.stderr
    assert rig.show(sid) == before  # nothing written, and the lock let go (show would say it is live)

    fresh = elsewhere(rig, "fresh")
    continued = cairn_in(rig, rig.root, "run", "--script", rig.script(WHERE), "--resume", sid, "--workspace",
                         str(fresh), "--yes", "run pwd")
    assert continued.returncode == 0, continued.stderr
    assert pwd_results(rig.show(sid))[-1] == str(fresh)


def test_cairn_rm_keeps_the_snapshots_a_moved_session_took_in_its_new_workspace(rig):
    """Snapshots taken after a move live in the new workspace's shadow repository: collecting after `cairn rm` must
    count the session there too, or it deletes them (and with them the way back)."""
    from cairn.app.agent.snapshots import ShadowRepo, git_path

    if git_path() is None:
        pytest.skip("git is not installed: no workspace snapshots")
    sid, _ = started_session(rig)
    new = elsewhere(rig, "new")
    env = {"CAIRN_SNAPSHOTS": "auto"}
    args = ("--script", rig.script(WHERE), "--yes")
    moved = subprocess.run([CAIRN, "run", *args, "--resume", sid, "--workspace", str(new), "run pwd"],
                           env=rig.env(env), cwd=rig.root, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert moved.returncode == 0, moved.stderr
    taken = [e["tree"] for e in rig.show(sid) if e["type"] == "workspace/snapshot"]
    assert taken, "snapshots were taken in the new workspace"
    other = cairn_in(rig, new, "run", "--provider", "script", *args, "--session-id", "other", "hello")
    assert other.returncode == 0, other.stderr
    assert cairn_in(rig, rig.root, "rm", "other").returncode == 0
    repo = ShadowRepo(rig.home, new)
    assert repo.git_dir.is_dir()
    kept = subprocess.run(["git", "--git-dir", str(repo.git_dir), "cat-file", "-e", taken[-1]], capture_output=True)
    assert kept.returncode == 0, "the moved session's last snapshot tree is still there"


# --------------------------------------------------------------------------------------------------- Python API


async def test_open_session_resumes_in_the_sessions_workspace_and_its_rewind_acts_there(rig, monkeypatch):
    from cairn import open_session

    sid, workspace = started_session(rig)
    other = elsewhere(rig)
    script = rig.script([{"tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt", "content": "x"}}]},
                         {"text": "written"}])
    monkeypatch.setenv("CAIRN_SNAPSHOTS", "off")  # the file tools' before-images are what this rewind restores
    monkeypatch.chdir(other)
    async with open_session(resume=sid, home=str(rig.home), script=script, approve=True) as session:
        assert session.config is not None and session.config.workspace == workspace
        result = await session.run("write notes")
        assert result.reason == "completed" and (workspace / "notes.txt").read_text() == "x"
        await session.rewind(2, scope="files")
    assert not (workspace / "notes.txt").exists() and list(other.iterdir()) == []


async def test_open_session_with_a_workspace_moves_it_durably_before_any_turn(rig):
    from cairn import open_session

    sid, workspace = started_session(rig)
    new = elsewhere(rig, "new")
    async with open_session(str(new), resume=sid, home=str(rig.home), script=rig.script(WHERE)) as session:
        on_disk = rig.store().backend.load(sid).events  # read back from the file, before the first turn
        moves = [(e.from_, e.to) for e in on_disk if isinstance(e, WorkspaceMoved)]
        assert moves == [(str(workspace), str(new))]
        assert session.config is not None and session.config.workspace == new


# --------------------------------------------------------------------------------------------------- the TUI


async def test_the_sessions_screen_resumes_a_session_of_another_directory_in_its_own(tmp_path):
    from cairn.app.cli import tui_open_chosen
    from cairn.app.screens.sessions import SessionChoice, SessionsScreen
    from cairn.app.tui import CairnApp
    from cairn.widgets.status_bar import StatusBar

    world = make_world(tmp_path, [*WHERE])  # started in world.workspace: the "current directory"
    own = tmp_path / "own"
    own.mkdir()
    own = own.resolve()
    write_log(world.store, "theirs", completed_turn(1, "set things up", "Done."), cwd=str(own))

    picker = world.sessions_app()
    async with picker.run_test() as pilot:
        await wait_for(pilot, lambda: isinstance(picker.screen, SessionsScreen), "the sessions screen")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not picker.is_running, "the choice")
    assert picker.return_value == SessionChoice("open", "theirs")

    opened, config, unavailable, provider = tui_open_chosen(world.store, world.config, "theirs")  # what `cairn` does
    assert unavailable is None and config.workspace == own
    app = CairnApp(config, opened, world.store, provider=provider)
    try:
        async with app.run_test(size=(200, 30)) as pilot:  # (the tmp path is long: at 80 columns the part drops)
            await wait_for(pilot, lambda: app.chat is not None and app.chat.is_attached, "the chat")
            assert f"in {own}" in str(app.chat.query_one(StatusBar).render())
            await pilot.press(*"run pwd", "enter")
            await approval_ready(pilot, app)
            await pilot.press("a")
            await wait_for(pilot, lambda: (own / "where.txt").exists() and app.chat.agent is not None
                           and not app.chat.agent.loop.busy, "the command to run")
            await pilot.press("ctrl+q")
    finally:
        app.close_if_still_open()
    assert (own / "where.txt").read_text().strip() == str(own)
    assert not (world.workspace / "where.txt").exists()


async def test_the_resume_screen_names_the_sessions_workspace_and_a_gone_one_is_not_resumed(tmp_path):
    from cairn.app.cli import tui_open_chosen
    from cairn.app.config.checks import ConfigError
    from cairn.app.screens.resume import ResumeScreen
    from cairn.app.tui import CairnApp

    world = make_world(tmp_path, [])
    own = tmp_path / "own"
    own.mkdir()
    own = own.resolve()
    write_log(world.store, "crashed", crashed_turn(), cwd=str(own))
    opened, config, _, provider = tui_open_chosen(world.store, world.config, "crashed")
    app = CairnApp(config, opened, world.store, provider=provider)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await wait_for(pilot, lambda: top_screen(app, ResumeScreen), "the resume screen")
            said = str(screen.query_one("#workspace").render())
            assert said.startswith(f"Runs in {own} ") and str(world.workspace) not in said
            await pilot.press("ctrl+q")
    finally:
        app.close_if_still_open()

    gone = tmp_path / "gone"
    gone.mkdir()
    write_log(world.store, "orphan", completed_turn(1, "hello", "Hi."), cwd=str(gone))
    gone.rmdir()
    with pytest.raises(ConfigError) as refused:
        tui_open_chosen(world.store, world.config, "orphan")
    assert str(gone) in str(refused.value) and "--workspace DIR" in str(refused.value)
    world.store.open_for_resume("orphan").lock.release()  # not left locked: the screen stays, nothing resumed


# --------------------------------------------------------------------------------------------------- ACP


async def test_acp_session_load_runs_tools_in_the_sessions_workspace_whatever_cwd_says(rig):
    workspace, other = rig.ws.resolve(), elsewhere(rig)
    async with connect(rig, RecordingClient(["allow_once"]), script_env(rig, WHERE)) as agent:
        sid = (await agent.conn.new_session(cwd=str(workspace))).session_id
        await prompt(agent.conn, sid, "where are you")
    (workspace / "where.txt").unlink()

    client = RecordingClient(["allow_once"])
    async with connect(rig, client, script_env(rig, WHERE)) as agent:
        await agent.conn.load_session(cwd=str(other), session_id=sid)
        await prompt(agent.conn, sid, "run pwd")
    assert pwd_results(rig.show(sid)) == [str(workspace), str(workspace)]
    assert (workspace / "where.txt").read_text().strip() == str(workspace) and not (other / "where.txt").exists()
    said = [u.content.text for u in client.session_updates("agent_message_chunk")]
    assert any(f"works in its own workspace, {workspace}" in text for text in said)


async def test_acp_session_load_of_a_session_whose_workspace_is_gone_is_an_error_naming_it(rig):
    gone = elsewhere(rig, "gone")
    async with connect(rig, RecordingClient(), script_env(rig, [{"text": "hi"}])) as agent:
        sid = (await agent.conn.new_session(cwd=str(gone))).session_id
        await prompt(agent.conn, sid, "hello")
    shutil.rmtree(gone)
    async with connect(rig, RecordingClient(), script_env(rig, [])) as agent:
        with pytest.raises(RequestError) as refused:
            await agent.conn.load_session(cwd=str(rig.ws), session_id=sid)
    assert refused.value.code == -32602 and str(gone) in refused.value.data["details"]
