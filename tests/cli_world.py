"""A Cairn world driven through the real `cairn` command: a workspace, a home and a backend; each turn runs `cairn run`
with its own one-turn script (the script provider). Shared by the rewind, workspace-snapshot and fuzz tests, with the
tool calls such scripts ask for."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from waiting import wait_sync

CAIRN = str(Path(sys.executable).parent / "cairn")


class World:
    """A workspace, a home and a backend; each turn runs `cairn run` with its own one-turn script."""

    def __init__(self, tmp_path: Path, backend: str, snapshots: str = "off") -> None:
        """`snapshots`: off by default here, so a rewind restores from the file tools' before-images alone (the
        workspace-snapshot rewind has its own tests in test_snapshots.py)."""
        self.root, self.backend, self.snapshots = tmp_path, backend, snapshots
        self.ws = tmp_path / "ws"
        self.ws.mkdir()
        self.home = tmp_path / "home"
        self.scripts = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root), "CAIRN_HOME": str(self.home), "LANG": "C.UTF-8",
               "CAIRN_BACKEND": self.backend, "CAIRN_PROVIDER": "script", "CAIRN_SNAPSHOTS": self.snapshots,
               "CAIRN_PROJECT_CONTEXT": os.environ.get("CAIRN_PROJECT_CONTEXT", "on"), **extra}  # (conftest: off)
        if "CAIRN_DATABASE_URL" in os.environ:
            env["CAIRN_DATABASE_URL"] = os.environ["CAIRN_DATABASE_URL"]
        return env

    def script(self, *calls: dict, answer: str = "done") -> str:
        self.scripts += 1
        path = self.root / f"script{self.scripts}.json"
        responses = [{"text": "", "tool_calls": list(calls)}] if calls else []
        path.write_text(json.dumps({"responses": [*responses, {"text": answer}]}))
        return str(path)

    def cairn(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([CAIRN, *args], env=self.env(**extra), cwd=self.ws, capture_output=True, text=True,
                              timeout=60)

    def turn(self, prompt: str, *calls: dict, sid: str = "s") -> subprocess.CompletedProcess:
        first = not self.exists(sid)
        proc = self.cairn("run", "--script", self.script(*calls), "--yes",
                          *(["--session-id", sid] if first else ["--resume", sid]), prompt)
        assert proc.returncode == 0, proc.stderr
        return proc

    def exists(self, sid: str) -> bool:
        return self.cairn("show", sid).returncode == 0

    def events(self, sid: str = "s") -> list[dict]:
        shown = self.cairn("show", sid, "--json")
        assert shown.returncode == 0, shown.stderr
        return [json.loads(line) for line in shown.stdout.splitlines()]

    def crash_at(self, failpoint: str, *args: str) -> None:
        """Run `cairn ARGS` until it stops at `failpoint`, then SIGKILL it."""
        marker = self.root / f"marker-{failpoint}"
        marker.write_text("")
        child = subprocess.Popen([CAIRN, *args], env=self.env(CAIRN_FAILPOINT=failpoint,
                                                               CAIRN_FAILPOINT_MARKER=str(marker)),
                                 cwd=self.ws, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_sync(lambda: marker.read_text() or child.poll() is not None, f"{failpoint} (or the child's end)", 30)
        assert marker.read_text(), f"never reached {failpoint}: {child.stderr.read() if child.stderr else ''}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)


def write(path: str, content: str) -> dict:
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def edit(path: str, old: str, new: str) -> dict:
    return {"name": "edit_file", "arguments": {"path": path, "old": old, "new": new}}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
