"""The environment lines of the system prompt (issue 42): date, OS, shell, workspace, and on a git workspace the branch
and a short status; git run on a hostile repository never runs its programs; recorded as `context/environment` only
when the lines change."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import anyio
import pytest

from openai_server import OpenAIServer, text
from test_project_instructions import of_type, openai_agent, system_of

from cairn.app.agent.project_context import environment_text, git_lines
from cairn.persistence.events import ContextEnvironment

GIT_ENV = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture(autouse=True)
def context_on(monkeypatch, tmp_path):
    monkeypatch.delenv("CAIRN_PROJECT_CONTEXT", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def repository(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name in ("kept.txt", "changed.txt", "gone.txt"):
        (path / name).write_text(name + "\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "one")
    return path


def test_a_git_workspace_tells_branch_and_status_counts_in_the_request(tmp_path):
    ws = repository(tmp_path / "ws")
    (ws / "changed.txt").write_text("changed a lot\n")
    (ws / "gone.txt").unlink()
    (ws / "new.txt").write_text("new\n")
    git(ws, "add", "new.txt")
    (ws / "loose.txt").write_text("untracked\n")

    async def main() -> None:
        with OpenAIServer([text("ok")]) as server:
            async with openai_agent(tmp_path, server, ws) as agent:
                await agent.run("go")
                events = agent.session.events
            system = system_of(server.requests[0])
        (recorded,) = of_type(events, ContextEnvironment)
        assert recorded.text.splitlines() == [
            f"Date: {datetime.date.today().isoformat()}",
            f"OS: {platform.system()} {platform.release()}",
            "Shell (run_command): /bin/sh",
            f"Workspace: {ws.resolve()}",
            "Git branch: main",
            "Git status: 1 modified, 1 added, 1 deleted, 1 untracked",
        ]
        assert "Environment:\n" + recorded.text in system
    anyio.run(main)


def test_a_clean_repository_and_a_detached_head(tmp_path):
    ws = repository(tmp_path / "ws")
    assert git_lines(ws) == ["Git branch: main", "Git status: clean"]
    sha = git(ws, "rev-parse", "HEAD").strip()
    git(ws, "checkout", "-q", "--detach")
    assert git_lines(ws) == [f"Git branch: detached at {sha[:7]}", "Git status: clean"]
    sub = ws / "deeper" / "down"
    sub.mkdir(parents=True)
    assert git_lines(sub) == [f"Git branch: detached at {sha[:7]}", "Git status: clean"]  # empty dirs: not untracked


def test_a_repository_without_commits(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "trunk")
    (ws / "a").write_text("a")
    assert git_lines(ws) == ["Git branch: trunk (no commits yet)", "Git status: 1 untracked"]


def test_a_workspace_outside_any_repository_has_no_git_lines(tmp_path):
    ws = tmp_path / "plain"
    ws.mkdir()
    lines = environment_text(ws).splitlines()
    assert [line.split(":")[0] for line in lines] == ["Date", "OS", "Shell (run_command)", "Workspace"]


def test_a_hostile_repository_config_never_runs_its_programs(tmp_path):
    ws = repository(tmp_path / "ws")
    fsmonitor_marker, filter_marker = tmp_path / "fsmonitor-ran", tmp_path / "filter-ran"
    git(ws, "config", "core.fsmonitor", f"touch {fsmonitor_marker}; false")
    git(ws, "config", "filter.evil.clean", f"touch {filter_marker}; cat")
    git(ws, "config", "core.pager", f"touch {tmp_path / 'pager-ran'}; cat")
    (ws / ".gitattributes").write_text("*.txt filter=evil\n")
    future = (ws / "kept.txt").stat().st_mtime + 100
    os.utime(ws / "kept.txt", (future, future))  # same size, new mtime: status must compare its content

    lines = git_lines(ws)

    assert lines == ["Git branch: main", "Git status: 1 untracked"]  # .gitattributes
    assert not fsmonitor_marker.exists() and not filter_marker.exists() and not (tmp_path / "pager-ran").exists()
    # the same repository under a plain `git status` does run them: the test above would have seen it
    subprocess.run(["git", "status"], cwd=ws, env=GIT_ENV, capture_output=True)
    assert fsmonitor_marker.exists() or filter_marker.exists()


def test_the_environment_is_recorded_again_only_when_it_changed(tmp_path):
    ws = repository(tmp_path / "ws")

    async def main() -> None:
        with OpenAIServer([text("1"), text("2"), text("3")]) as server:
            async with openai_agent(tmp_path, server, ws) as agent:
                await agent.run("one")
                await agent.run("two")  # nothing changed
                (ws / "fresh.txt").write_text("new file\n")
                await agent.run("three")
                events = agent.session.events
            requests = list(server.requests)
        recorded = of_type(events, ContextEnvironment)
        assert [e.turn for e in recorded] == [1, 3]
        assert recorded[0].text.endswith("Git status: clean") and recorded[1].text.endswith("Git status: 1 untracked")
        assert "Git status: clean" in system_of(requests[1]) and "Git status: 1 untracked" in system_of(requests[2])
    anyio.run(main)
