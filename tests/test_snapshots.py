"""Workspace snapshots in a shadow git repository (SPEC §9 rev 3, issue 30), through the real CLI and real git: a
command's deletions and edits rewound, a crash in the middle of a command, the user's own repository untouched,
`.gitignore` and the size limit, git absent, a snapshot over its time budget, a SIGKILL during snapshots, pruning."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_world import CAIRN, World

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")


def run(command: str) -> dict:
    return {"name": "run_command", "arguments": {"command": command}}


def tree_of(world: World) -> dict[str, str]:
    """Every file of the workspace (outside .git) and its content."""
    found = {}
    for path in sorted(world.ws.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(world.ws).parts:
            found[path.relative_to(world.ws).as_posix()] = path.read_text(errors="replace")
    return found


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_rewind_takes_back_what_a_command_deleted_and_edited(tmp_path, backend):
    world = World(tmp_path, backend, "auto")
    (world.ws / "keep.txt").write_text("keep\n")
    (world.ws / "edit.txt").write_text("before\n")
    (world.ws / "sub").mkdir()
    (world.ws / "sub" / "gone.txt").write_text("gone\n")
    world.turn("tidy up", run("rm -r sub && echo after > edit.txt && echo new > made.txt"))
    before_turn = {"edit.txt": "before\n", "keep.txt": "keep\n", "sub/gone.txt": "gone\n"}
    assert tree_of(world) == {"edit.txt": "after\n", "keep.txt": "keep\n", "made.txt": "new\n"}
    kinds = [(e["type"], e.get("at")) for e in world.events() if e["type"] == "workspace/snapshot"]
    assert kinds == [("workspace/snapshot", "turn-start"), ("workspace/snapshot", "command"),
                     ("workspace/snapshot", "turn-end")]
    events = world.events()
    command_shot = next(e for e in events if e["type"] == "workspace/snapshot" and e["at"] == "command")
    call = next(e for e in events if e["type"] == "tool/call" and e["name"] == "run_command")
    assert command_shot["seq"] < call["seq"] and command_shot["call_id"] == call["call_id"]
    proc = world.cairn("rewind", "s", "--turn", "1")
    assert proc.returncode == 0, proc.stderr
    assert tree_of(world) == before_turn
    assert "commands ran" not in proc.stdout  # their changes were restored too


def test_rewind_after_a_crash_in_the_middle_of_a_command(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    (world.ws / "data.txt").write_text("original\n")
    world.turn("first")
    marker = world.ws / "started"
    child = subprocess.Popen([CAIRN, "run", "--script", world.script(run(
        f"echo changed > data.txt && rm -f data2.txt && touch {marker} && sleep 60")), "--yes", "--resume", "s", "go"],
        env=world.env(), cwd=world.ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    assert (world.ws / "data.txt").read_text() == "changed\n"
    # what the interrupted command did came after Cairn's last snapshot: Cairn cannot tell it from a hand edit
    asked = world.cairn("rewind", "s", "--turn", "2")
    assert asked.returncode == 3 and "data.txt" in asked.stderr and "interrupted" in asked.stderr
    assert (world.ws / "data.txt").read_text() == "changed\n"
    proc = world.cairn("rewind", "s", "--turn", "2", "--force")
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / "data.txt").read_text() == "original\n" and not marker.exists()


def git_state(repo: Path) -> dict[str, bytes]:
    """HEAD, index, config and every ref of a repository, byte for byte."""
    state = {}
    for path in sorted((repo / ".git").rglob("*")):
        rel = path.relative_to(repo / ".git").as_posix()
        if path.is_file() and (rel in ("HEAD", "index", "config", "packed-refs") or rel.startswith("refs/")):
            state[rel] = path.read_bytes()
    return state


def test_a_workspace_that_is_a_git_repository_is_untouched(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    git = lambda *a: subprocess.run(["git", *a], cwd=world.ws, env=env, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "me@example.com")
    git("config", "user.name", "Me")
    (world.ws / "tracked.txt").write_text("v1\n")
    git("add", "tracked.txt")
    git("commit", "-qm", "one")
    (world.ws / "staged.txt").write_text("staged\n")
    git("add", "staged.txt")  # the user's index holds something uncommitted
    before = git_state(world.ws)
    world.turn("change", run("echo v2 > tracked.txt && echo x > other.txt"))
    assert world.cairn("rewind", "s", "--turn", "1").returncode == 0
    assert (world.ws / "tracked.txt").read_text() == "v1\n" and not (world.ws / "other.txt").exists()
    assert git_state(world.ws) == before
    status = subprocess.run(["git", "status", "--porcelain"], cwd=world.ws, env=env, capture_output=True, text=True)
    assert status.stdout.splitlines() == ["A  staged.txt"]


def test_gitignore_is_honoured_and_large_files_are_left_out_and_listed(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    (world.ws / ".gitignore").write_text("*.log\n")
    world.turn("start")
    proc = world.turn("make files", run("echo noise > build.log && head -c 11000000 /dev/zero > big.bin "
                                        "&& echo small > small.txt"))
    shots = [e for e in world.events() if e["type"] == "workspace/snapshot"]
    assert shots[-1]["left_out"] == ["big.bin"]
    assert "left out of workspace snapshots" in proc.stderr and "big.bin" in proc.stderr
    rewound = world.cairn("rewind", "s", "--turn", "2", "--files")
    assert rewound.returncode == 0, rewound.stderr
    assert not (world.ws / "small.txt").exists()  # snapshotted, so taken back
    assert (world.ws / "build.log").exists() and (world.ws / "big.bin").exists()  # never in a snapshot: left alone


def test_a_file_changed_outside_cairn_since_the_last_snapshot_needs_force(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    world.turn("one", run("echo one > a.txt"))
    world.turn("two", run("echo two > a.txt"))
    (world.ws / "a.txt").write_text("mine\n")
    refused = world.cairn("rewind", "s", "--turn", "2")
    assert refused.returncode == 3 and "a.txt" in refused.stderr
    assert (world.ws / "a.txt").read_text() == "mine\n"
    assert world.cairn("rewind", "s", "--turn", "2", "--force").returncode == 0
    assert (world.ws / "a.txt").read_text() == "one\n"


def test_without_git_rewind_uses_the_file_tools_before_images_and_says_so_once(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "echo", "rm", "cat"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    no_git = {"PATH": str(bare)}
    first = world.cairn("run", "--script", world.script({"name": "write_file", "arguments": {
        "path": "a.txt", "content": "one\n"}}), "--yes", "--session-id", "s", "write", **no_git)
    second = world.cairn("run", "--script", world.script({"name": "write_file", "arguments": {
        "path": "a.txt", "content": "two\n"}}), "--yes", "--resume", "s", "again", **no_git)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    said = [line for line in first.stderr.splitlines() if "git is not installed" in line]
    assert len(said) == 1
    assert not [e for e in world.events() if e["type"] == "workspace/snapshot"]
    shown = world.cairn("config", **no_git)
    assert any(line.split()[:2] == ["snapshots", "auto"] and "git not found" in line for line in shown.stdout.splitlines())
    assert world.cairn("rewind", "s", "--turn", "2", **no_git).returncode == 0
    assert (world.ws / "a.txt").read_text() == "one\n"


def test_snapshots_off_by_variable_take_none(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    proc = world.cairn("run", "--script", world.script(run("echo x > x.txt")), "--yes", "--session-id", "s", "go",
                       CAIRN_SNAPSHOTS="off")
    assert proc.returncode == 0, proc.stderr
    assert not [e for e in world.events() if e["type"] == "workspace/snapshot"]
    bad = world.cairn("config", CAIRN_SNAPSHOTS="sometimes")
    assert bad.returncode == 2 and "CAIRN_SNAPSHOTS" in bad.stderr


@pytest.mark.anyio
async def test_a_snapshot_over_its_time_budget_turns_snapshots_off_with_one_line(tmp_path):
    from agent_helpers import write_script

    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config

    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(300):
        (ws / f"f{i}.txt").write_text(f"{i}\n" * 200)
    script = write_script(tmp_path / "s.json", [{"text": "one"}, {"text": "two"}])
    config = resolve_config(home=str(tmp_path / "home"), provider="script", script=str(script), workspace=str(ws),
                            env={})
    said: list[str] = []
    async with open_agent(config, report=said.append) as agent:
        agent.loop.snapshots.budget = 0.0001  # no git call can finish in it
        first = await agent.run("hello")
        second = await agent.run("again")
        assert agent.loop.snapshots is None
    assert first.reason == "completed" and second.reason == "completed"
    assert len([s for s in said if "snapshots are off for this session" in s]) == 1


def test_sigkill_during_snapshots_then_resume_still_snapshots_and_rewinds(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    for i in range(2000):
        (world.ws / f"f{i:04}.txt").write_text(f"content {i}\n" * 50)
    world.turn("first")
    for delay in (0.05, 0.15, 0.3):  # kill while git is at work on the turn-start snapshot (or just after)
        child = subprocess.Popen([CAIRN, "run", "--script", world.script(), "--resume", "s", "go"], env=world.env(),
                                 cwd=world.ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (world.ws / "f0000.txt").write_text(f"touched {delay}\n")
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    world.turn("after the kills", run("echo later > f0001.txt"))
    assert world.cairn("rewind", "s", "--turn", str(max(e["turn"] for e in world.events()
                                                         if e["type"] == "turn/start"))).returncode == 0
    assert (world.ws / "f0001.txt").read_text() == "content 1\n" * 50


def test_rm_prunes_snapshot_trees_no_remaining_session_needs(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    (world.ws / "seed.txt").write_text("seed\n")  # (an empty workspace's tree is the empty tree, which git always has)
    world.turn("a", run("echo a > a.txt"), sid="one")
    world.turn("b", run("echo b > b.txt"), sid="two")
    repos = list((world.home / "snapshots").glob("*.git"))
    assert len(repos) == 1
    trees = {sid: {e["tree"] for e in world.events(sid) if e["type"] == "workspace/snapshot"} for sid in ("one", "two")}
    has = lambda tree: subprocess.run(["git", "--git-dir", str(repos[0]), "cat-file", "-e", tree],  # noqa: E731
                                      capture_output=True).returncode == 0
    assert all(has(t) for t in trees["one"] | trees["two"])
    assert world.cairn("rm", "one").returncode == 0
    assert all(has(t) for t in trees["two"])
    assert not all(has(t) for t in trees["one"] - trees["two"])
    assert not list(repos[0].glob("index-one*"))
    assert world.cairn("rm", "two").returncode == 0
    assert not repos[0].exists()


def test_a_command_snapshot_looks_again_only_after_something_with_an_effect_ran(tmp_path):
    world = World(tmp_path, "jsonl", "auto")
    world.turn("two commands", run("echo one > a.txt"), run("echo two > b.txt"))
    world.turn("write then run", {"name": "write_file", "arguments": {"path": "c.txt", "content": "c\n"}},
               run("cat c.txt"))
    shots = [e for e in world.events() if e["type"] == "workspace/snapshot"]
    first, second = [s for s in shots if s["turn"] == 1], [s for s in shots if s["turn"] == 2]
    assert [s["at"] for s in first] == ["turn-start", "command", "command", "turn-end"]
    assert first[1]["tree"] == first[0]["tree"]  # nothing ran before the first command: the same tree, no git call
    assert first[2]["tree"] != first[1]["tree"]  # the first command wrote a.txt: looked again
    assert [s["at"] for s in second] == ["turn-start", "command", "turn-end"]
    assert second[1]["tree"] != second[0]["tree"]  # write_file ran before the command: c.txt is in its tree
