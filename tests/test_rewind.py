"""Recovery that checks itself, and a rewind that survives a crash (SPEC §9 rev 3, issue 27), through the real CLI on
every backend: fingerprints on file-tool intents, before-images, evidence after a crash on either side of the write,
`cairn rewind` of files / conversation / both, a hand-edited file refused, SIGKILL at each point of a rewind, fork."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from cli_world import World, edit, sha, write
from waiting import alive, wait_sync


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend(request):
    if request.param == "postgres":
        request.getfixturevalue("pg_database_url")  # CAIRN_DATABASE_URL: a private schema, inherited by children
    return request.param


def three_turns(world: World) -> None:
    """Turn 1 writes a.txt; turn 2 edits it and creates b.txt; turn 3 rewrites a.txt and runs a command."""
    world.turn("write a", write("a.txt", "one\n"))
    world.turn("change a, add b", edit("a.txt", "one", "two"), write("b.txt", "bee\n"))
    world.turn("three", write("a.txt", "three\n"), {"name": "run_command", "arguments": {"command": "echo x > c.txt"}})


# ------------------------------------------------------------------------------------------------ fingerprints


def test_file_tool_intents_carry_their_fingerprints_and_the_before_image_is_kept_once(tmp_path):
    world = World(tmp_path, "jsonl")
    world.turn("write", write("a.txt", "one\n"))
    world.turn("again", write("a.txt", "two\n"), edit("a.txt", "two", "three"))
    world.turn("same again", write("a.txt", "three\n"))
    calls = [e for e in world.events() if e["type"] == "tool/call"]
    assert [(c["before_sha256"], c["after_sha256"]) for c in calls] == [
        (None, sha("one\n")), (sha("one\n"), sha("two\n")), (sha("two\n"), sha("three\n")),
        (sha("three\n"), sha("three\n")),
    ]
    blobs = sorted(p.name for p in (world.home / "blobs").glob("??/*"))
    assert blobs == sorted({sha("one\n"), sha("two\n"), sha("three\n")})  # each content once
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in (world.home / "blobs").glob("??/*"))


@pytest.mark.anyio
async def test_the_body_refuses_when_the_file_changed_after_the_intent_was_recorded(tmp_path):
    """The seam: a hook inside the pre-tool barrier changes the file after the fingerprint; nothing is written."""
    from agent_helpers import write_script

    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    script = write_script(tmp_path / "s.json", [{"text": "", "tool_calls": [write("a.txt", "new\n")]}, {"text": "ok"}])
    config = resolve_config(home=str(tmp_path / "home"), provider="script", script=str(script), workspace=str(ws),
                            env={})
    async with open_agent(config, approver=lambda request: _allow()) as agent:
        async def meddle(ctx, call_next):
            (ws / "a.txt").write_text("someone else\n")
            return await call_next()

        agent.loop.hooks.add("around_tool", meddle)
        await agent.run("write a")
        results = [e for e in agent.session.events if type(e).__name__ == "ToolResult"]
    assert (ws / "a.txt").read_text() == "someone else\n"
    assert results[0].error_code == "TOOL_ERROR" and "changed after this call was recorded" in results[0].content


async def _allow():
    from cairn.app.agent.approval import ApprovalAnswer

    return ApprovalAnswer("allowed_once")


# ---------------------------------------------------------------------------------------------------- evidence


@pytest.mark.parametrize("point, finding, content", [
    ("tool-body-start", "did_not_happen", "one\n"),  # SIGKILL after the barrier, before the write
    ("tool-body-done", "happened", "two\n"),  # SIGKILL after the write, before its result
])
def test_a_crash_on_either_side_of_the_write_is_checked_on_resume(tmp_path, backend, point, finding, content):
    world = World(tmp_path, backend)
    world.turn("write a", write("a.txt", "one\n"))
    world.crash_at(point, "run", "--script", world.script(write("a.txt", "two\n")), "--yes", "--resume", "s", "again")
    assert (world.ws / "a.txt").read_text() == content
    shown = [e for e in world.events() if e["type"] == "recovery/evidence"]
    assert [(e["finding"], e["call_id"]) for e in shown] == [(finding, "call_2_1_1")]
    assert "a.txt" in shown[0]["detail"]
    world.turn("go on")  # the resume commits repair and evidence
    stored = [e for e in world.events() if e["type"] == "recovery/evidence"]
    assert [e["finding"] for e in stored] == [finding]
    text = world.cairn("show", "s").stdout
    assert finding.replace("_", " ") in text.replace("_", " ")


def test_a_file_changed_by_hand_after_the_crash_is_unknown_and_the_model_is_told(tmp_path):
    from openai_server import OpenAIServer, text

    world = World(tmp_path, "jsonl")
    world.turn("write a", write("a.txt", "one\n"))
    world.crash_at("tool-body-done", "run", "--script", world.script(write("a.txt", "two\n")), "--yes",
                   "--resume", "s", "again")
    (world.ws / "a.txt").write_text("by hand\n")
    with OpenAIServer([text("noted")]) as server:
        proc = world.cairn("run", "--resume", "s", "what happened?", CAIRN_PROVIDER="openai",
                           CAIRN_BASE_URL=server.base_url, CAIRN_MODEL="m", CAIRN_API_KEY="sk-rewind")
        sent = json.dumps(server.requests[-1].body["messages"])
    assert proc.returncode == 0, proc.stderr
    (evidence,) = [e for e in world.events() if e["type"] == "recovery/evidence"]
    assert evidence["finding"] == "unknown" and "neither" in evidence["detail"]
    assert "Cairn checked the interrupted call" in sent and "a.txt holds neither" in sent


# ------------------------------------------------------------------------------------------------------ rewind


def conversation_prompts(world: World) -> list[str]:
    """The user prompts the next request would carry (the derived conversation, from the log on disk)."""
    from cairn.app.agent.transcript import Transcript
    from cairn.persistence.store import SessionStore

    inspection = SessionStore(world.home, world.backend).inspect("s")
    events = inspection.events + inspection.repair
    transcript = Transcript(events)
    transcript.extend(events)
    return [m["content"] for m in transcript.messages if m["role"] == "user"]


@pytest.mark.parametrize("scope", ["files", "conversation", "both"])
def test_rewind_restores_files_conversation_or_both_over_three_turns(tmp_path, backend, scope):
    world = World(tmp_path, backend)
    three_turns(world)
    assert (world.ws / "a.txt").read_text() == "three\n" and (world.ws / "b.txt").exists()
    flag = {"files": ["--files"], "conversation": ["--conversation"], "both": []}[scope]
    proc = world.cairn("rewind", "s", "--turn", "2", *flag)
    assert proc.returncode == 0, proc.stderr
    files_back = scope in ("files", "both")
    assert (world.ws / "a.txt").read_text() == ("one\n" if files_back else "three\n")
    assert (world.ws / "b.txt").exists() is not files_back
    assert (world.ws / "c.txt").exists()  # a command's change is not Cairn's to restore
    assert "commands ran in turn 3" in proc.stdout
    prompts = conversation_prompts(world)
    if scope == "files":
        assert any("change a, add b" in p for p in prompts)
        assert "rewound files to how they were before turn 2" in prompts[-1]
    else:
        assert not any("change a, add b" in p or p.startswith("three") for p in prompts)
        assert prompts[0].startswith("write a")
    kinds = [e["type"] for e in world.events()]
    assert kinds.count("rewind/plan") == 1 and kinds[-1] == "rewind/end"
    assert ("conversation/rewind" in kinds) is (scope != "files")


def test_a_file_edited_by_hand_is_refused_and_left_as_it_is_unless_forced(tmp_path, backend):
    world = World(tmp_path, backend)
    three_turns(world)
    (world.ws / "a.txt").write_text("my own edit\n")
    refused = world.cairn("rewind", "s", "--turn", "2")
    assert refused.returncode == 3 and "a.txt" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert (world.ws / "a.txt").read_text() == "my own edit\n" and (world.ws / "b.txt").exists()
    assert "rewind/plan" not in [e["type"] for e in world.events()]  # nothing planned, nothing touched
    forced = world.cairn("rewind", "s", "--turn", "2", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (world.ws / "a.txt").read_text() == "one\n" and not (world.ws / "b.txt").exists()


def test_rewind_of_an_unknown_turn_is_one_line_exit_2(tmp_path):
    world = World(tmp_path, "jsonl")
    world.turn("write a", write("a.txt", "one\n"))
    proc = world.cairn("rewind", "s", "--turn", "7")
    assert proc.returncode == 2 and "no turn 7" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("point", ["rewind-planned", "rewind-restored"])
def test_a_rewind_killed_midway_is_shown_and_can_be_finished_or_abandoned(tmp_path, backend, point):
    world = World(tmp_path, backend)
    three_turns(world)
    world.crash_at(point, "rewind", "s", "--turn", "2", "--files")
    restored = [(world.ws / "a.txt").read_text() == "one\n", not (world.ws / "b.txt").exists()]
    assert sum(restored) == (0 if point == "rewind-planned" else 1)  # the plan was durable before any file moved
    again = world.cairn("rewind", "s", "--turn", "2")
    assert again.returncode == 2 and "interrupted" in again.stderr and "--finish" in again.stderr
    kinds = [e["type"] for e in world.events()]
    assert kinds.count("rewind/plan") == 1 and "rewind/end" not in kinds
    assert kinds.count("rewind/file") == (0 if point == "rewind-planned" else 1)
    finished = world.cairn("rewind", "s", "--finish")
    assert finished.returncode == 0, finished.stderr
    assert (world.ws / "a.txt").read_text() == "one\n" and not (world.ws / "b.txt").exists()
    assert [e["outcome"] for e in world.events() if e["type"] == "rewind/end"] == ["completed"]


def test_an_interrupted_rewind_can_be_abandoned_and_the_session_goes_on(tmp_path):
    world = World(tmp_path, "jsonl")
    three_turns(world)
    world.crash_at("rewind-restored", "rewind", "s", "--turn", "2", "--files")
    abandoned = world.cairn("rewind", "s", "--abandon")
    assert abandoned.returncode == 0 and "abandoned" in abandoned.stdout
    assert [e["outcome"] for e in world.events() if e["type"] == "rewind/end"] == ["abandoned"]
    world.turn("after")
    assert world.cairn("rewind", "s", "--turn", "3").returncode == 0


def test_a_file_over_the_size_limit_is_not_restorable_and_says_so(tmp_path):
    world = World(tmp_path, "jsonl")
    big = "x" * (10 * 1024 * 1024) + "\nend\n"
    (world.ws / "big.txt").write_text(big)
    world.turn("edit big", edit("big.txt", "end", "END"))
    assert not list((world.home / "blobs").glob("??/*"))  # over 10 MB: no before-image kept
    proc = world.cairn("rewind", "s", "--turn", "1", "--files")
    assert proc.returncode == 0 and "big.txt" in proc.stdout and "not kept" in proc.stdout
    assert (world.ws / "big.txt").read_text().endswith("END\n")


# -------------------------------------------------------------------------------------------------------- fork


def test_fork_keeps_the_turns_before_n_and_leaves_the_original_untouched(tmp_path, backend):
    world = World(tmp_path, backend)
    three_turns(world)
    before = world.events()
    proc = world.cairn("fork", "s", "--turn", "2", "--session-id", "f")
    assert proc.returncode == 0, proc.stderr
    forked = world.events("f")
    assert world.events() == before
    assert {e.get("turn") for e in forked if "turn" in e} == {1}
    assert forked == before[:len(forked)]
    world.turn("on the fork", sid="f")
    assert world.cairn("fork", "s", "--session-id", "f").returncode == 2  # the id exists


def test_rm_collects_before_images_no_remaining_session_needs(tmp_path):
    world = World(tmp_path, "jsonl")
    world.turn("a", write("a.txt", "shared\n"), sid="one")
    world.turn("a", write("a.txt", "only one\n"), sid="one")
    world.turn("b", write("a.txt", "shared\n"), sid="two")  # before-image "only one\n" -> kept for "two" too
    names = lambda: {p.name for p in (world.home / "blobs").glob("??/*")}  # noqa: E731
    assert names() == {sha("shared\n"), sha("only one\n")}
    assert world.cairn("rm", "one").returncode == 0
    assert names() == {sha("only one\n")}  # what session two still needs
    assert world.cairn("rm", "two").returncode == 0
    assert names() == set()


def test_a_commands_process_is_running_only_while_it_lives_and_is_the_one_recorded():
    from cairn.persistence.evidence import process_running

    now_ms = lambda: time.time_ns() // 1_000_000  # noqa: E731
    started = now_ms()
    live = subprocess.Popen(["sleep", "30"])
    try:
        assert process_running(live.pid, started) is True
        assert process_running(live.pid, started - 3_600_000) is False  # a pid reused by a later process is not ours
    finally:
        live.kill()
    wait_sync(lambda: not alive(live.pid), "the killed process to exit")  # not reaped yet: a zombie runs no more
    assert process_running(live.pid, started) is False
    live.wait()
    assert process_running(live.pid, started) is False


def test_a_file_holding_a_configured_secret_gets_no_before_image(tmp_path):
    """SPEC §5: nothing secret is stored — not even as a before-image; the rewind says the file is not restorable."""
    from openai_server import OpenAIServer, text, tool_calls

    world = World(tmp_path, "jsonl")
    key = "sk-live-0123456789abcdef"
    (world.ws / ".env").write_text(f"API_KEY={key}\nMODE=dev\n")
    calls = [{"id": "c1", "name": "edit_file", "arguments": {"path": ".env", "old": "dev", "new": "prod"}}]
    with OpenAIServer([tool_calls(calls), text("done")]) as server:
        proc = world.cairn("run", "--session-id", "s", "--yes", "set prod", CAIRN_PROVIDER="openai",
                           CAIRN_BASE_URL=server.base_url, CAIRN_MODEL="m", CAIRN_API_KEY=key)
    assert proc.returncode == 0, proc.stderr
    assert (world.ws / ".env").read_text().endswith("MODE=prod\n")
    stored = [p.read_bytes() for p in (world.home / "blobs").glob("??/*")]
    assert not any(key.encode() in data for data in stored)
    rewound = world.cairn("rewind", "s", "--turn", "1", "--files")
    assert rewound.returncode == 0 and "not restored: .env" in rewound.stdout and "secret" in rewound.stdout
