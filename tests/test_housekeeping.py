"""Sessions that end well (issue 16, SPEC §6 rev 2): `cairn rm`, `cairn export`, `cairn sessions --all` and sizes,
through the real `cairn` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_helpers import write_script

CAIRN = str(Path(sys.executable).parent / "cairn")


@pytest.fixture(params=["jsonl", "sqlite"])
def env(request, tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "other").mkdir()
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "CAIRN_BACKEND": request.param, "CAIRN_PROVIDER": "demo", "CAIRN_DEMO_DELAY_MS": "0"}


def cairn(env: dict, *args: str, cwd: str = "ws") -> subprocess.CompletedProcess:
    return subprocess.run([CAIRN, *args], env=env, cwd=Path(env["HOME"]) / cwd, capture_output=True, text=True,
                          timeout=60)


def ids(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return sorted(json.loads(line)["id"] for line in proc.stdout.splitlines())


def test_sessions_lists_this_workspace_by_default_and_every_one_with_all(env):
    assert cairn(env, "run", "--session-id", "here", "list files").returncode == 0
    assert cairn(env, "run", "--session-id", "there", "list files", cwd="other").returncode == 0
    assert ids(cairn(env, "sessions", "--json")) == ["here"]
    assert ids(cairn(env, "sessions", "--json", cwd="other")) == ["there"]
    assert ids(cairn(env, "sessions", "--all", "--json")) == ["here", "there"]
    table = cairn(env, "sessions", "--all")
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "STATUS", "EVENTS", "SIZE"]
    rows = [json.loads(line) for line in cairn(env, "sessions", "--json").stdout.splitlines()]
    assert rows[0]["size"] > 100


def test_rm_deletes_finished_sessions_and_refuses_a_live_one(env, tmp_path):
    assert cairn(env, "run", "--session-id", "old", "list files").returncode == 0
    script = write_script(tmp_path / "slow.json", [{"tool_calls": [
        {"name": "run_command", "arguments": {"command": "echo up > up.txt; sleep 30"}}]}])
    live = subprocess.Popen([CAIRN, "run", "--session-id", "busy", "--yes", "--provider", "script", "--script",
                             str(script), "go"], env=env, cwd=tmp_path / "ws", stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        up = tmp_path / "ws" / "up.txt"
        for _ in range(400):
            if up.exists() and up.read_text() == "up\n":
                break
            subprocess.run(["sleep", "0.05"])
        proc = cairn(env, "rm", "old", "busy", "nope")
        assert proc.returncode == 3, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 2 and "busy" in lines[0] and "live" in lines[0] and "nope" in lines[1]
        assert "Traceback" not in proc.stderr and proc.stdout == "deleted old\n"
        assert ids(cairn(env, "sessions", "--json")) == ["busy"]
        assert cairn(env, "show", "busy").returncode == 0, "the live session was left alone"
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(10)
    assert cairn(env, "rm", "busy").returncode == 0
    assert cairn(env, "sessions", "--all", "--json").stdout == ""
    assert cairn(env, "show", "busy").returncode == 2


def stored_log(env: dict, session_id: str) -> list[bytes]:
    """The session's events exactly as stored (read-only), to prove a reader wrote nothing."""
    from cairn.persistence.events import encode_event
    from cairn.persistence.store import SessionStore

    store = SessionStore(Path(env["CAIRN_HOME"]), env["CAIRN_BACKEND"])
    return [encode_event(e) for e in store.backend.load(session_id).events]


def test_export_marks_recovered_calls_and_verdict_free_sessions_read_cleanly(env, tmp_path):
    script = write_script(tmp_path / "crash.json", [{"text": "Deploying.", "tool_calls": [
        {"name": "run_command", "call_id": "call_deploy", "arguments": {"command": "echo up > up.txt; sleep 30"}},
        {"name": "write_file", "call_id": "call_note", "arguments": {"path": "n.txt", "content": "x"}}]}])
    child = subprocess.Popen([CAIRN, "run", "--session-id", "crashed", "--yes", "--provider", "script", "--script",
                              str(script), "deploy it"], env=env, cwd=tmp_path / "ws", stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    up = tmp_path / "ws" / "up.txt"
    for _ in range(400):
        if up.exists() and up.read_text() == "up\n":
            break
        subprocess.run(["sleep", "0.05"])
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    before = stored_log(env, "crashed")

    md = cairn(env, "export", "crashed")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# Cairn session crashed")
    assert "> deploy it" in md.stdout and "Deploying." in md.stdout
    assert "`call_deploy` → OUTCOME_UNKNOWN **(recovered after a crash)**" in md.stdout
    assert "`call_note` → NOT_STARTED **(recovered after a crash)**" in md.stdout
    assert "_Turn 1 ended interrupted_" in md.stdout

    lines = [json.loads(x) for x in cairn(env, "export", "crashed", "--format", "json").stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(len(lines)))
    repaired = [e for e in lines if e.get("repair")]
    # repair's four closing events; then, when the command's process was recorded before the kill (its tool/progress
    # is written behind the barrier, so the kill may come first), the evidence Cairn gathered about it (SPEC §9)
    progress = [e for e in lines if e["type"] == "tool/progress" and not e.get("repair")]
    assert [e["call_id"] for e in progress] in ([], ["call_deploy"])
    assert [e["type"] for e in repaired] == ["tool/result", "tool/result", "step/end", "turn/end"] + (
        ["recovery/evidence"] if progress else [])
    if progress:
        evidence = repaired[-1]
        assert (evidence["call_id"], evidence["finding"]) == ("call_deploy", "unknown")
        assert f"pid {progress[0]['pid']}" in evidence["detail"]
        # (gathered anew by each read: whether the process still runs may change between the two exports)
        assert f"**Evidence** on `call_deploy` (Cairn checked): unknown — its process (pid {progress[0]['pid']})" \
            in md.stdout
    else:
        assert "**Evidence**" not in md.stdout
    # (compared as stored: `show` gathers the evidence anew, and whether the command's process still runs may change)
    assert stored_log(env, "crashed") == before, "export writes nothing"

    bad = cairn(env, "export", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_export_marks_the_evidence_next_to_the_recovered_call(tmp_path):
    """A write that reached the disk before a SIGKILL: the export says so beside the call, as `cairn show` does."""
    from crash_harness import Rig
    from test_show_evidence import CALL, EVIDENCE_DETAIL, SID, crash_after_a_write

    rig = Rig(tmp_path)
    try:
        crash_after_a_write(rig)
        md = rig.run("export", SID)
        assert md.returncode == 0, md.stderr
        text = md.stdout
        call_at = text.index(f"`{CALL}` → OUTCOME_UNKNOWN **(recovered after a crash)**")
        evidence_at = text.index(f"**Evidence** on `{CALL}` (Cairn checked): happened — {EVIDENCE_DETAIL}")
        assert call_at < evidence_at < text.index("_Turn 2 ended interrupted_")
        assert text.count("**Evidence**") == 1
        as_json = [json.loads(x) for x in rig.run("export", SID, "--format", "json").stdout.splitlines()]
        assert [(e["type"], e.get("repair")) for e in as_json][-2:] == [("turn/end", True), ("recovery/evidence", True)]
    finally:
        rig.cleanup()
