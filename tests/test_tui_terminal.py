"""The TUI in a real terminal (tmux, or a pty read by pyte where tmux is absent: tests/terminal_driver.py): start
`cairn`, approve a command, SIGKILL the process while the command runs, then `cairn resume ID` and read the screen back.

The model's one response asks for two side-effecting calls: the first (approved) writes a marker and sleeps, so the
kill lands while it runs — OUTCOME_UNKNOWN after repair; the second never got as far as its approval — NOT_STARTED.
Both must be on screen before any new turn can start, and keys typed meanwhile must not start one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import write_script
from cairn.persistence.events import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, RecoveryEvidence, ToolResult, TurnEnd
from cairn.persistence.store import SessionStore
from terminal_driver import WAIT, terminal
from tui_helpers import iter_ids, types_of
from waiting import alive, wait_sync

CAIRN = str(Path(sys.executable).parent / "cairn")
AFTER_OPEN = 30  # keys typed after the modal opened (~2 s at a typist's pace): well past the typing window


def test_sigkilled_tui_resumes_showing_outcome_unknown_and_not_started_before_any_new_turn(tmp_path):
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "marker"
    marker.write_text("")  # exists empty from the start: only its contents say the command began
    script = write_script(tmp_path / "script.json", [{
        "text": "Deploying, then recording it.",
        "tool_calls": [
            {"name": "run_command", "arguments": {"command": f"printf 'started %s\\n' $$ > {marker}; sleep 60"}},
            {"name": "run_command", "arguments": {"command": "printf done > second.txt"}},
        ],
    }])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "TERM": "xterm-256color", "CAIRN_HOME": str(home)}
    cairn = f"{CAIRN} --provider script --script {script}"
    term = terminal(env)
    command_pid = None
    try:
        pid = term.start("first", ws, cairn)
        assert "cairn" in Path(f"/proc/{pid}/cmdline").read_text()
        term.wait_screen("first", "New session")
        term.send_keys("first", "deploy it", "Enter")
        # type-ahead: keep typing (a, s and d among the letters) across the modal's opening and 30 keys on after it
        typed, opened_after = "", None
        for char in "so save a draft as said and add dates " * 4:
            term.send_text("first", char)
            typed += char
            time.sleep(0.07)  # a typist's pace (the input, not a wait): each key within the typing window of the last
            if opened_after is None and "Allow run_command?" in term.screen("first"):
                opened_after = len(typed)
            if opened_after is not None and len(typed) - opened_after >= AFTER_OPEN:
                break
        assert opened_after is not None and len(typed) - opened_after >= AFTER_OPEN, "the modal did not open while typing"
        term.wait_screen("first", "Allow run_command?", "Tab to decide")  # it waits for the operator (SPEC §11)
        assert marker.read_text() == ""  # nothing typed decided it
        assert typed.split()[-1] in term.screen("first")  # the typing is in the prompt behind the modal
        term.send_keys("first", "Tab")  # the operator moves to the dialog on purpose
        term.wait_screen("first", "Allow run_command?", "Choose with a key")
        term.send_keys("first", "a")  # a deliberate key

        started = wait_sync(lambda: re.fullmatch(r"started (\d+)\n", marker.read_text()), "the command to start",
                            WAIT)
        command_pid = int(started.group(1))
        store = SessionStore(home)
        # tool/progress (the command's pid) is write-behind: let it reach the file so the stored log is the same each run
        wait_sync(lambda: "tool/progress" in types_of(store.backend.load(next(iter_ids(home))).events),
                  "tool/progress to be written", WAIT)
        os.kill(pid, signal.SIGKILL)
        wait_sync(lambda: not alive(pid), "cairn to die", WAIT)
        # the command dies with cairn (parent-death); wait for that too (a zombie counts as dead), so the evidence
        # resume gathers about it is the same every run
        wait_sync(lambda: not alive(command_pid), "the command to die with cairn", WAIT)

        listed = subprocess.run([CAIRN, "sessions", "--all", "--json"], env=env, capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0, listed.stderr
        [summary] = [json.loads(line) for line in listed.stdout.splitlines()]
        session_id = summary["id"]
        assert summary["status"] == "interrupted"
        stored = store.backend.load(session_id).events
        assert types_of(stored)[-2:] == ["tool/call", "tool/progress"]  # no repair yet
        assert (stored[-1].call_id, stored[-1].pid) == (stored[-2].call_id, command_pid)

        term.start("resume", ws, f"{CAIRN} resume {session_id} --provider script --script {script}")
        screen = term.wait_screen("resume", "OUTCOME_UNKNOWN", "NOT_STARTED")
        assert "was interrupted" in screen and "run_command" in screen

        # keys typed now reach the resume screen, not the prompt: no turn can start behind it
        term.send_keys("resume", "hello", "Enter")
        # `h` is none of its keys: the screen holds the keys for the prompt (`e` decides nothing), and says so
        term.wait_screen("resume", "OUTCOME_UNKNOWN", "Tab to decide")
        events = wait_sync(lambda: (loaded := store.backend.load(session_id).events)
                           and types_of(loaded)[-1] == "recovery/evidence" and loaded, "the repair and its evidence")
        assert types_of(events).count("turn/start") == 1
        # repair closed the turn; after its turn/end, the evidence (SPEC §9 rev 3) about the OUTCOME_UNKNOWN command
        # and nothing else: the typed "hello" decided nothing (no recovery/verdict from a stray `e`)
        assert types_of(events)[len(stored):] == ["tool/result", "tool/result", "step/end", "turn/end",
                                                  "recovery/evidence"], "typing on the resume screen wrote an event"
        end, evidence = events[-2:]
        assert isinstance(end, TurnEnd) and end.reason == "interrupted"
        assert isinstance(evidence, RecoveryEvidence) and (evidence.call_id, evidence.finding) == (
            stored[-2].call_id, "unknown")
        assert evidence.detail == (f"its process (pid {command_pid}) is no longer running; "
                                   "what it did before it stopped is not known")
        codes = [e.error_code for e in events if isinstance(e, ToolResult)]
        assert codes == [TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED]
        assert not (ws / "second.txt").exists()
        assert "OUTCOME_UNKNOWN" in term.screen("resume")  # still the resume screen

        term.send_keys("resume", "C-q")  # ordered quit: the lock is released, nothing else is written
        wait_sync(lambda: not term.running("resume"), "cairn resume to quit", WAIT)
        assert types_of(store.backend.load(session_id).events) == types_of(events)
    finally:
        term.close()
        if command_pid is not None:
            try:
                os.killpg(command_pid, signal.SIGKILL)  # a safety net: the command dies with cairn (parent-death)
            except ProcessLookupError:
                pass


def test_closing_the_terminal_mid_command_ends_the_turn_in_order_and_leaves_no_process(tmp_path):
    """Closing the terminal sends SIGHUP: the TUI does what Ctrl+Q does (issue 16), so the log ends in a real
    `turn/end cancelled`, nothing is left for repair, and the command's process group is gone."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "marker"
    marker.write_text("")
    script = write_script(tmp_path / "script.json", [{"tool_calls": [
        {"name": "run_command", "arguments": {"command": f"printf 'started %s\\n' $$ > {marker}; sleep 60"}}]}])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "TERM": "xterm-256color", "CAIRN_HOME": str(home)}
    term = terminal(env)
    command_pid = None
    try:
        pid = term.start("term", ws, f"{CAIRN} --provider script --script {script}")
        term.wait_screen("term", "New session")
        term.send_keys("term", "deploy it", "Enter")
        term.wait_screen("term", "Allow run_command?", "Choose with a key")  # opened on an idle prompt: keys at once
        term.send_keys("term", "a")
        started = wait_sync(lambda: re.fullmatch(r"started (\d+)\n", marker.read_text()), "the command to start", WAIT)
        command_pid = int(started.group(1))
        term.close_terminal("term")  # the terminal goes away: SIGHUP to the program in it
        wait_sync(lambda: not alive(pid), "cairn to exit", WAIT)
        wait_sync(lambda: not alive(command_pid), "the command to be stopped", WAIT)
        (session_id,) = iter_ids(home)
        events = SessionStore(home).backend.load(session_id).events
        assert isinstance(events[-1], TurnEnd) and events[-1].reason == "cancelled"
        assert SessionStore(home).inspect(session_id).repair == [], "an ordered exit leaves nothing to repair"
        codes = [e.error_code for e in events if isinstance(e, ToolResult)]
        assert codes == [TOOL_OUTCOME_UNKNOWN]
    finally:
        term.close()
        if command_pid is not None and alive(command_pid):
            os.killpg(command_pid, signal.SIGKILL)
