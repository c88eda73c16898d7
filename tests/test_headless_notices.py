"""Issue 44: a headless run's notices sit on lines of their own. When the answer's line is still open on the terminal
or file both streams share (`2>&1`), the notice breaks it on stderr; stdout, the answer itself, is never changed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from openai_server import OpenAIServer, text, tool_calls

CAIRN = str(Path(sys.executable).parent / "cairn")


def run_env(tmp_path: Path, server: OpenAIServer) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home"),
            "CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": "sk-local", "CAIRN_PROVIDER": "openai",
            "CAIRN_MODEL": "m", "CAIRN_PROJECT_CONTEXT": "off"}


def test_the_waiting_notice_is_on_a_line_of_its_own_when_the_answer_shares_its_stream(tmp_path):
    """The server sends half a sentence, then nothing for over 10 s: the "waiting for the server" notice starts a
    line, and the answer goes on after it."""
    output = tmp_path / "both.txt"
    with OpenAIServer([text("", deltas=["Hello wor", "ld."], hold_after=2)]) as server, output.open("w") as both:
        child = subprocess.Popen([CAIRN, "run", "say hello"], env=run_env(tmp_path, server), cwd=tmp_path,
                                 stdout=both, stderr=both)
        try:
            deadline = time.monotonic() + 30
            while "waiting for the server" not in output.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            server.release()
            assert child.wait(30) == 0
        finally:
            child.kill()
    lines = output.read_text().splitlines()
    waiting = [line for line in lines if "waiting for the server" in line]
    assert waiting and all(line.startswith("cairn: waiting for the server (openai):") for line in waiting)
    at = lines.index(waiting[0])
    assert lines[at - 1].endswith("Hello wor") and lines[at + 1] == "ld."


def test_with_separate_streams_nothing_is_added_to_either(tmp_path):
    """A tool call's notice after the first part of an answer: stdout holds exactly the answer's text, stderr the
    notice with no line break of its own (the answer's open line is not on stderr)."""
    (tmp_path / "a.txt").write_text("hi\n")
    read = tool_calls([{"id": "call_1", "name": "read_file", "arguments": {"path": "a.txt"}}], text="Let me look")
    with OpenAIServer([read, text("Done.")]) as server:
        done = subprocess.run([CAIRN, "run", "read a.txt"], env=run_env(tmp_path, server), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Let me look\nDone.\n"
    assert "→ read_file" in done.stderr and "" not in done.stderr.splitlines()
