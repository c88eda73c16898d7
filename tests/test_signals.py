"""An ordered exit on any signal (issue 16): SIGHUP (the terminal closed), SIGTERM and SIGINT end `cairn run` the way
a cancel does — the running command's process group stopped, the real `turn/end cancelled` written, no repair needed,
no process left behind — and a second signal exits at once, leaving a log that repair handles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_helpers import write_script
from waiting import wait_dead

CAIRN = str(Path(sys.executable).parent / "cairn")

pytestmark = pytest.mark.slow


def start(tmp_path: Path) -> tuple[subprocess.Popen, dict, int]:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "s.json", [{"tool_calls": [
        {"name": "run_command", "call_id": "call_long", "arguments": {"command": "echo $$ > pid.txt; sleep 60"}}]}])
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home")}
    child = subprocess.Popen([CAIRN, "run", "--session-id", "s", "--yes", "--provider", "script", "--script",
                              str(script), "go"], env=env, cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    pid_file = ws / "pid.txt"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and child.poll() is None, "the command never started"
        time.sleep(0.02)
    return child, env, int(pid_file.read_text())


def stored(env: dict) -> list[dict]:
    proc = subprocess.run([CAIRN, "show", "s", "--json"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_turn_in_order_and_leaves_no_process(tmp_path, signum):
    child, env, command_pid = start(tmp_path)
    child.send_signal(signum)
    _, err = child.communicate(timeout=10)
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert wait_dead(command_pid), "the command's process group was stopped"
    events = stored(env)
    assert events[-1]["type"] == "turn/end" and events[-1]["reason"] == "cancelled"
    (result,) = [e for e in events if e["type"] == "tool/result"]
    assert result["error_code"] == "TOOL_OUTCOME_UNKNOWN", "it was running: it may have had an effect"
    shown = subprocess.run([CAIRN, "show", "s"], env=env, capture_output=True, text=True, timeout=30)
    assert "[repair]" not in shown.stdout, "nothing left for repair"


def test_two_signals_in_a_row_exit_130_and_the_log_stays_resumable(tmp_path):
    child, env, command_pid = start(tmp_path)
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=10)
    assert child.returncode == 130 and "Traceback" not in err
    events = stored(env)
    assert [e["seq"] for e in events] == list(range(len(events)))
    # The turn is closed: in order when the kernel merged the two signals into one, else by the repair `show` computes,
    # whose evidence on the interrupted command follows its turn/end (SPEC §9).
    types = [e["type"] for e in events]
    evidence = [e for e in events if e["type"] == "recovery/evidence"]
    assert types[len(types) - len(evidence) - 1] == "turn/end"
    assert types[len(types) - len(evidence):] == ["recovery/evidence"] * len(evidence)
    assert all(e["call_id"] == "call_long" for e in evidence)
    resumed = subprocess.run([CAIRN, "run", "--resume", "s", "--provider", "demo", "hello"], env=env,
                             capture_output=True, text=True, timeout=60, cwd=tmp_path / "ws")
    assert resumed.returncode == 0, resumed.stderr
    assert wait_dead(command_pid), "even an abrupt exit leaves no command running (it dies with cairn)"
