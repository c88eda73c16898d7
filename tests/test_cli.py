"""The `cairn` command through real subprocesses: outputs, exit codes (SPEC §6) and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.persistence.events import AssistantMessage, StepStart, ToolCall, TurnStart, UserMessage
from cairn.persistence.locks import SessionLock
from cairn.persistence.session import LiveSession
from cairn.persistence.store import SessionStore

from agent_helpers import write_script

CAIRN = str(Path(sys.executable).parent / "cairn")


@pytest.fixture
def env(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# demo readme\n")
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CAIRN_HOME": str(tmp_path / "home"),
        "CAIRN_DEMO_DELAY_MS": "0",
        "LANG": "C.UTF-8",
        "CAIRN_PROJECT_CONTEXT": os.environ.get("CAIRN_PROJECT_CONTEXT", "on"),  # (tests/conftest.py: off)
    }


def cairn(env: dict, *args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    cwd = cwd or Path(env["HOME"]) / "ws"
    return subprocess.run([CAIRN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, input=stdin)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) >= 1 and lines[-1].startswith(("cairn: ", "usage:", "cairn run: ", "cairn: error")), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def show_json(env: dict, session_id: str) -> list[dict]:
    proc = cairn(env, "show", session_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def only_session(env: dict) -> str:
    proc = cairn(env, "sessions", "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 1
    return rows[0]["id"]


def test_help_describes_commands_and_exit_codes(env):
    proc = cairn(env, "--help")
    assert proc.returncode == 0
    for word in ("run", "sessions", "show", "resume", "acp", "exit codes", "CAIRN_HOME"):
        assert word in proc.stdout
    assert cairn(env, "run", "--help").returncode == 0


def test_run_with_the_script_provider_streams_the_answer_and_show_prints_spec_events(env, tmp_path):
    script = write_script(tmp_path / "s.json", [
        {"text": "Running it.", "tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi > out.txt"}}]},
        {"text": "All done.", "chunks": 3},
    ])
    proc = cairn(env, "run", "--provider", "script", "--script", str(script), "--yes", "make", "a", "file")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Running it.\nAll done.\n"
    assert "run_command" in proc.stderr
    assert (tmp_path / "ws" / "out.txt").read_text() == "hi\n"
    events = show_json(env, only_session(env))
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(isinstance(e["time"], int) and isinstance(e["type"], str) for e in events)
    assert events[1]["type"] == "workspace/snapshot" and events[1]["at"] == "turn-start"  # git is there: on
    assert events[3] == {**events[3], "type": "user/message", "text": "make a file", "turn": 1, "step": 1}
    call = next(e for e in events if e["type"] == "tool/call")
    assert call["arguments"] == {"command": "echo hi > out.txt"} and call["safety"] == "side_effecting"
    assert call["parent_call_id"] is None
    assert events[-1] == {**events[-1], "type": "turn/end", "reason": "completed", "error": None}


def test_run_with_the_demo_provider_needs_no_key(env):
    proc = cairn(env, "run", "list", "files")
    assert proc.returncode == 0, proc.stderr
    assert "README.md" in proc.stdout
    assert "demo" in proc.stderr


def test_run_without_yes_denies_side_effects(env, tmp_path):
    proc = cairn(env, "run", "run touch should-not-exist")
    assert proc.returncode == 0
    assert "denied" in proc.stderr and "--yes" in proc.stderr
    assert not (tmp_path / "ws" / "should-not-exist").exists()


def test_run_json_prints_every_event_as_a_json_line(env):
    proc = cairn(env, "run", "--json", "read README.md")
    assert proc.returncode == 0, proc.stderr
    first, *events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert first["type"] == "session" and "seq" not in first  # rev 2: the session line, then the events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "turn/start" and events[-1]["type"] == "turn/end"
    assert any(e["type"] == "tool/result" and "demo readme" in e["content"] for e in events)


def test_sessions_lists_status_and_first_prompt(env):
    assert cairn(env, "run", "hello there").returncode == 0
    rows = [json.loads(line) for line in cairn(env, "sessions", "--all", "--json").stdout.splitlines()]
    assert rows[0]["status"] == "completed" and rows[0]["first_prompt"] == "hello there"
    table = cairn(env, "sessions", "--all")
    assert "completed" in table.stdout and "hello there" in table.stdout


def test_session_id_creates_and_refuses_an_existing_one(env):
    assert cairn(env, "run", "--session-id", "my-run", "hi").returncode == 0
    proc = cairn(env, "run", "--session-id", "my-run", "hi")
    assert_one_line_error(proc, 2, "my-run", "--resume")


def test_resume_repairs_an_interrupted_turn_and_continues(env, tmp_path):
    home = Path(env["CAIRN_HOME"])
    store = SessionStore(home)
    opened = store.create(cwd=str(tmp_path / "ws"), session_id="crashed")
    import anyio

    async def write_crashed_log() -> None:
        async with LiveSession(opened) as s:
            s.append(TurnStart(turn=1))
            s.append(StepStart(turn=1, step=1))
            s.append(UserMessage(turn=1, step=1, text="delete the temp files"))
            s.append(AssistantMessage(turn=1, step=1, text="", interrupted=False,
                                      tool_calls=[__import__("cairn.persistence.events").persistence.events.ToolCallRequest(
                                          "c1", "run_command", {"command": "rm -rf tmp"})]))
            s.append(ToolCall(turn=1, step=1, call_id="c1", name="run_command", arguments={"command": "rm -rf tmp"},
                              safety="side_effecting", parent_call_id=None))

    anyio.run(write_crashed_log)
    before = show_json(env, "crashed")
    assert [e["type"] for e in before][-3:] == ["tool/result", "step/end", "turn/end"]
    assert before[-3]["error_code"] == "TOOL_OUTCOME_UNKNOWN" and before[-3]["source_seq"] == 4
    assert len(cairn(env, "show", "crashed", "--json").stdout.splitlines()) == len(before)  # show wrote nothing

    proc = cairn(env, "run", "--resume", "crashed", "what happened?")
    assert proc.returncode == 0, proc.stderr
    assert "c1" in proc.stderr and "OUTCOME_UNKNOWN" in proc.stderr
    after = show_json(env, "crashed")
    assert after[: len(before)] == before  # repair was committed exactly as `show` predicted
    assert [e["seq"] for e in after] == list(range(len(after)))
    assert after[len(before)]["type"] == "turn/start" and after[len(before)]["turn"] == 2


def test_unknown_session_is_a_usage_error(env):
    assert_one_line_error(cairn(env, "show", "nope"), 2, "nope")
    assert_one_line_error(cairn(env, "run", "--resume", "nope", "hi"), 2, "nope")


def test_bad_options_and_config_are_usage_errors(env, tmp_path):
    assert cairn(env, "run", "--provider", "psychic", "hi").returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(cairn(env, "run", "--provider", "script", "--script", str(bad), "hi"), 2, "bad.json", "line 1")
    assert_one_line_error(cairn(env, "run", "--provider", "script", "hi"), 2, "--script")
    assert_one_line_error(cairn(env, "run", "--workspace", str(tmp_path / "missing"), "hi"), 2, "not a directory")
    assert_one_line_error(cairn(env, "show", "../etc"), 2, "invalid session id")
    assert cairn(env, "sessions", "--all", "--json").stdout == ""  # nothing was created by the failures


def test_locked_session_exits_3_naming_the_holder(env):
    assert cairn(env, "run", "--session-id", "busy", "hi").returncode == 0
    lock = SessionLock(Path(env["CAIRN_HOME"]) / "locks", "busy")
    lock.acquire()
    try:
        proc = cairn(env, "run", "--resume", "busy", "again")
        assert_one_line_error(proc, 3, "busy", str(os.getpid()))
        assert cairn(env, "show", "busy").returncode == 0  # reading is always allowed
        assert "live" in cairn(env, "show", "busy").stderr
    finally:
        lock.release()
    assert cairn(env, "run", "--resume", "busy", "again").returncode == 0


def test_corrupt_log_exits_4_with_path_and_line(env):
    assert cairn(env, "run", "--session-id", "c", "hi").returncode == 0
    path = Path(env["CAIRN_HOME"]) / "sessions" / "c.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"{garbage\n"
    path.write_bytes(b"".join(lines))
    proc = cairn(env, "show", "c")
    assert_one_line_error(proc, 4, f"{path}:4")
    assert_one_line_error(cairn(env, "run", "--resume", "c", "x"), 4, f"{path}:4")


def test_newer_format_version_exits_4_and_says_newer(env):
    assert cairn(env, "run", "--session-id", "future", "hi").returncode == 0
    path = Path(env["CAIRN_HOME"]) / "sessions" / "future.jsonl"
    data = path.read_bytes().replace(b'"version":1', b'"version":7', 1)
    path.write_bytes(data)
    assert_one_line_error(cairn(env, "show", "future"), 4, "newer")


def test_headless_commands_do_not_import_textual_or_acp(env):
    code = (
        "import sys; from cairn.app.cli import main; main(['sessions']);"
        "bad = [m for m in ('textual', 'acp', 'pydantic') if m in sys.modules]; print(bad)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().endswith("[]"), proc.stdout + proc.stderr
