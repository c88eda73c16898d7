"""Crash harness: real `cairn` child processes, stopped at a known point, SIGKILLed, then reopened cold in fresh ones.

A `Rig` is one isolated world (its own CAIRN_HOME, workspace and environment), so tests using it are parallel-safe.
`Rig.spawn()` starts `cairn` as a child process, optionally with a failpoint (app/agent/failpoints.py); `Child.wait_marker()`
waits for the marker file's exact *contents* (GUIDE §3: the file is created empty first and the child writes the whole
line, so its mere existence proves nothing); `Child.kill()` sends SIGKILL and asserts the child died by it.

Every wait is bounded (`WAIT`) and fails with what it saw and the child's stderr, never by hanging the suite. Polls
sleep a few milliseconds at most: the normal case costs what the child needs to get there, nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from cairn.persistence.events import event_type
from cairn.persistence.store import Inspection, SessionStore

CAIRN = str(Path(sys.executable).parent / "cairn")
WAIT = 20.0  # seconds; generous for a loaded 2-core CI machine; the normal case takes well under one
RUN_TIMEOUT = 60.0

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, *, timeout: float = WAIT, child: "Child | None" = None,
               seen: Callable[[], Any] | None = None) -> T:
    """Poll `condition` until it returns something truthy (returned). Fails early if `child` exits meanwhile."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        value = condition()
        if value:
            return value
        if child is not None and child.popen.poll() is not None:
            raise AssertionError(
                f"waiting for {what}: the child exited with {child.popen.returncode} first"
                f"{_seen(seen)}\n--- child stderr ---\n{child.stderr()}"
            )
        if time.monotonic() > deadline:
            extra = f"\n--- child stderr ---\n{child.stderr()}" if child is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{_seen(seen)}{extra}")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _seen(seen: Callable[[], Any] | None) -> str:
    return f"; last seen: {seen()!r}" if seen is not None else ""


def failpoint_line(name: str, session_id: str, pid: int) -> str:
    """The exact marker line app/agent/failpoints.py writes."""
    return json.dumps({"failpoint": name, "session": session_id, "pid": pid}) + "\n"


class Child:
    """A running `cairn` process; stdout/stderr go to files (no pipe can fill up and block it)."""

    def __init__(self, popen: subprocess.Popen, out: Path, err: Path, marker: Path | None) -> None:
        self.popen = popen
        self.out_path, self.err_path, self.marker = out, err, marker

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_marker(self, expected: str, timeout: float = WAIT) -> None:
        assert self.marker is not None, "spawned without a failpoint"
        marker = self.marker
        wait_until(lambda: marker.read_text() == expected, f"marker {marker.name} to read {expected!r}",
                   timeout=timeout, child=self, seen=marker.read_text)

    def wait_failpoint(self, name: str, session_id: str, timeout: float = WAIT) -> None:
        self.wait_marker(failpoint_line(name, session_id, self.pid), timeout)

    def kill(self) -> None:
        """SIGKILL, and prove that is what ended it (not an exit of its own just before)."""
        assert self.popen.poll() is None, f"the child already exited with {self.popen.returncode}:\n{self.stderr()}"
        os.kill(self.pid, signal.SIGKILL)
        rc = self.popen.wait(timeout=WAIT)
        assert rc == -signal.SIGKILL, f"the child ended with {rc}, not by SIGKILL:\n{self.stderr()}"

    def finish(self, timeout: float = RUN_TIMEOUT) -> int:
        return self.popen.wait(timeout=timeout)

    def ensure_dead(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=WAIT)


class Rig:
    """One isolated Cairn world under `root`: `home/` (CAIRN_HOME), `ws/` (workspace and cwd), `io/` (markers, logs).

    Children get a minimal environment (nothing inherited but PATH), so no key or setting leaks in from the outside.
    """

    def __init__(self, root: Path, backend: str = "jsonl", env: dict[str, str] | None = None) -> None:
        self.root = root
        self.backend = backend
        self.home = root / "home"
        self.ws = root / "ws"
        self.io = root / "io"
        for d in (self.ws, self.io):
            d.mkdir(parents=True, exist_ok=True)
        self.extra_env = dict(env or {})
        self.children: list[Child] = []
        self.process_groups: list[Path] = []  # pid files of shells a tool started (killed at teardown)
        self._n = 0

    # -- environment and files -------------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "CAIRN_HOME": str(self.home),
            "CAIRN_BACKEND": self.backend,
            "CAIRN_DEMO_DELAY_MS": "0",
            "CAIRN_PROJECT_CONTEXT": os.environ.get("CAIRN_PROJECT_CONTEXT", "on"),  # (tests/conftest.py: off)
        }
        if self.backend == "postgres":  # the test's private schema (tests/conftest.py `pg_database_url`)
            env["CAIRN_DATABASE_URL"] = os.environ["CAIRN_DATABASE_URL"]
        env.update(self.extra_env)
        env.update(extra or {})
        return env

    def _next(self, stem: str) -> Path:
        self._n += 1
        return self.io / f"{self._n:02d}-{stem}"

    def script(self, responses: list[dict[str, Any]]) -> str:
        path = self._next("script.json")
        path.write_text(json.dumps({"responses": responses}))
        return str(path)

    # -- processes -------------------------------------------------------------------------------------------------

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([CAIRN, *args], env=self.env(env), cwd=self.ws, capture_output=True, text=True,
                              timeout=timeout, input=stdin)

    def spawn(self, *args: str, failpoint: str | None = None, env: dict[str, str] | None = None) -> Child:
        extra = dict(env or {})
        marker = None
        if failpoint is not None:
            marker = self._next(f"{failpoint}.marker")
            marker.write_text("")  # exists, empty, before the child can write a byte (GUIDE §3)
            extra.update(CAIRN_FAILPOINT=failpoint, CAIRN_FAILPOINT_MARKER=str(marker))
        out, err = self._next("stdout"), self._next("stderr")
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen([CAIRN, *args], env=self.env(extra), cwd=self.ws, stdin=subprocess.DEVNULL,
                                     stdout=o, stderr=e)
        child = Child(popen, out, err, marker)
        self.children.append(child)
        return child

    def cleanup(self) -> None:
        for child in self.children:
            child.ensure_dead()
        while self.process_groups:
            pid_file = self.process_groups.pop()
            try:
                os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    # -- reading sessions ------------------------------------------------------------------------------------------

    def show(self, session_id: str) -> list[dict[str, Any]]:
        """`cairn show ID --json` in a fresh process: the session as repair would leave it (nothing is written)."""
        proc = self.run("show", session_id, "--json")
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert " is live " not in proc.stderr, f"no process should hold {session_id} now: {proc.stderr}"
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def store(self) -> SessionStore:
        return SessionStore(self.home, self.backend)

    def inspect(self, session_id: str) -> Inspection:
        """Read-only, in this process: what is stored, and separately what repair would append."""
        return self.store().inspect(session_id)

    def stored_types(self, session_id: str) -> list[str]:
        try:
            return [event_type(e) for e in self.store().backend.load(session_id).events]
        except Exception:  # not created yet, or caught between the header and the first event
            return []

    def raw_log(self, session_id: str) -> Any:
        """The session's bytes as stored (to prove a reader wrote nothing)."""
        if self.backend == "jsonl":
            return (self.home / "sessions" / f"{session_id}.jsonl").read_bytes()
        if self.backend == "postgres":
            import psycopg

            with psycopg.connect(self.env()["CAIRN_DATABASE_URL"], autocommit=True) as conn:
                return conn.execute("SELECT seq, time, type, body FROM events WHERE session_id = %s ORDER BY seq",
                                    (session_id,)).fetchall()
        import sqlite3

        conn = sqlite3.connect(f"file:{self.home / 'sessions.sqlite3'}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT seq, body FROM events WHERE session_id = ? ORDER BY seq",
                                (session_id,)).fetchall()
        finally:
            conn.close()


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def json_lines(text: str) -> list[dict[str, Any]]:
    """The events `cairn run --json` printed (its first line, `{"type": "session", …}`, is not an event: no seq)."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [line for line in lines if "seq" in line]


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(events))), f"seq is not contiguous from 0: {seqs}"
