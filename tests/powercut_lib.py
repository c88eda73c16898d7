"""The power-cut matrix (SPEC §12 rev 4): real `cairn` processes with CAIRN_HOME and the workspace on the power-cut file
system (tests/powercut_fs.py), cut at barrier points (failpoints) and at random moments, then checked. Shared by
tests/test_power_cut.py (a small fixed set) and bench/power_cut_matrix.py (many seeds).

A case is a seeded list of steps on one session: turns (`cairn run`, new then `--resume`, with file tools and a shell
command whose side effect lands *outside* the cut file system), rewinds and undos. Each step either runs to its end, or
is cut: the child stops at a failpoint (the barrier before it is complete) or after a random delay, every process using
the mount is SIGKILLed, and the file system drops everything not fsync'd — optionally keeping a random prefix of each
file's unsynced writes, as disks do. The case then goes on from what survived.

What the oracle knows comes from outside the cut file system, never from Cairn's word:
- a step that **exited 0** completed its turn-end barrier: every event `cairn show --json` printed after it;
- a **failpoint** sits just after a barrier: every event up to its anchor event (the prompt, the call, the plan, the
  turn's end) as read at that moment;
- a **shell command's effect** (a token appended to a file outside the mount) happened after the pre-tool barrier: its
  `tool/call` must be durable.

After every cut: `cairn show ID --json` exits 0 (a torn or NUL tail at most, repaired in view) or 4, never a traceback;
what the oracle knows is there, unchanged, seq for seq; every before-image blob and every snapshot tree or manifest
that a shown event names is readable; `cairn sessions` answers; and the next step must work on what survived (a
rewind a cut interrupted is finished first, as an operator would).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powercut_fs import PowerCutFS, fsync_dir

from cairn.app.agent.snapshots import ShadowRepo
from cairn.persistence.blobs import names_needed
from cairn.persistence.store import SessionStore

CAIRN = str(Path(sys.executable).parent / "cairn")
STEP_TIMEOUT = 60.0

# failpoint -> the event type whose last occurrence (read at the failpoint) and everything before it must survive a cut
ANCHORS = {
    "prompt-accepted": "user/message",
    "tool-body-start": "tool/call",
    "tool-body-done": "tool/call",
    "turn-ended": "turn/end",
    "rewind-planned": "rewind/plan",
    "rewind-restored": "rewind/plan",
}
TURN_POINTS = ("prompt-accepted", "tool-body-start", "tool-body-done", "turn-ended")
REWIND_POINTS = ("rewind-planned", "rewind-restored")


@dataclass
class Tally:
    cuts: int = 0
    failpoint_cuts: int = 0
    random_cuts: int = 0
    kept_prefix_cuts: int = 0
    steps: int = 0
    effects_checked: int = 0
    events_checked: int = 0
    refused: int = 0  # show exit 4 after a cut (allowed only when nothing known was lost)
    compactions: int = 0  # context/compaction events seen (a small window makes later turns compact)
    violations: list[str] = field(default_factory=list)

    def add(self, other: "Tally") -> None:
        for name in ("cuts", "failpoint_cuts", "random_cuts", "kept_prefix_cuts", "steps", "effects_checked",
                     "events_checked", "refused", "compactions"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.violations.extend(other.violations)


class CutWorld:
    """One mount (home/ and ws/ on it), an outside io/ directory, one session, one backend."""

    def __init__(self, root: Path, backend: str, seed: int, window: int | None = None) -> None:
        self.root, self.backend, self.seed = root, backend, seed
        self.window = window  # CAIRN_CONTEXT_WINDOW: small enough that turns compact their history
        self.rng = random.Random(seed)
        self.mount = root / "mnt"
        self.io = root / "io"
        self.mount.mkdir(parents=True, exist_ok=True)
        self.io.mkdir(parents=True, exist_ok=True)
        self.fs = PowerCutFS(self.mount, seed=seed)
        self.home = self.mount / "home"  # not made here: a fresh CAIRN_HOME is part of what is cut
        self.ws = self.mount / "ws"
        self.session = f"cut{seed:06d}"
        self.effects = self.io / "effects"
        self.effects.write_text("")
        self.known: list[dict[str, Any]] = []  # events known durable (seq-ordered prefix)
        self.tally = Tally()
        self.turns = 0
        self.created = False
        self._n = 0

    # -- set-up -------------------------------------------------------------------------------------------------

    def start(self) -> "CutWorld":
        self.fs.start()
        self.ws.mkdir()
        for i in range(3):
            (self.ws / f"seed{i}.txt").write_text(f"alpha {i}\n")
        (self.ws / ".gitignore").write_text("build/\n")
        _sync_tree(self.ws)
        fsync_dir(self.mount)
        return self

    def stop(self) -> None:
        self.kill_users()
        self.fs.stop()

    # -- running Cairn ------------------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.io), "LANG": "C.UTF-8",
               "CAIRN_HOME": str(self.home), "CAIRN_BACKEND": self.backend, "CAIRN_DEMO_DELAY_MS": "0"}
        if self.window:
            env["CAIRN_CONTEXT_WINDOW"] = str(self.window)
        env.update(extra or {})
        return env

    def _next(self, stem: str) -> Path:
        self._n += 1
        return self.io / f"{self._n:03d}-{stem}"

    def run(self, *args: str, timeout: float = STEP_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CAIRN, *args], env=self.env(), cwd=self.ws, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def show(self) -> tuple[int, list[dict[str, Any]], str]:
        proc = self.run("show", self.session, "--json")
        events = []
        if proc.returncode == 0:
            events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        return proc.returncode, events, proc.stderr

    def turn_args(self) -> list[str]:
        """A turn whose calls write a new file in a new directory, run a shell command with an outside effect, and
        edit a seed file: before-images, a snapshot before the command, and something to rewind."""
        self.turns += 1
        t, token = self.turns, f"effect-{self.seed}-{self.turns}-{self.rng.randrange(10**9)}"
        calls = [
            {"name": "write_file", "arguments": {"path": f"d{t}/new{t}.txt", "content": f"turn {t}\n" * 50}},
            {"name": "run_command",
             "arguments": {"command": f"echo {token} >> {self.effects}; echo {t} > cmd{t}.txt; mkdir -p build; "
                                      f"echo {t} > build/out{t}"}},
            {"name": "edit_file", "arguments": {"path": f"seed{t % 3}.txt", "old": "alpha", "new": f"beta{t}"}},
        ]
        self.rng.shuffle(calls)
        script = self._next("script.json")
        script.write_text(json.dumps({"responses": [
            {"text": f"turn {t}: working. " * 8, "chunks": 6, "delay_ms": 15, "tool_calls": calls},
            {"text": f"turn {t} done. " * 10, "chunks": 8, "delay_ms": 15},
        ]}))
        first = ["--session-id", self.session] if not self.created else ["--resume", self.session]
        return ["run", *first, "--yes", "--provider", "script", "--script", str(script), f"turn {t} please"]

    def rewind_args(self, undo: bool) -> list[str]:
        if undo:
            return ["rewind", self.session, "--undo", "--force"]
        return ["rewind", self.session, "--turn", str(self.rng.randint(1, max(1, self.turns))), "--force"]

    # -- one step, maybe cut -------------------------------------------------------------------------------------

    def step(self, args: list[str], cut: str | None, points: tuple[str, ...]) -> None:
        """Run `args`; `cut` is None (run to the end), "random", "failpoint" (one of `points`) or a failpoint's name."""
        self.tally.steps += 1
        extra: dict[str, str] = {}
        point = None
        marker = None
        if cut is not None and cut != "random":
            point = self.rng.choice(points) if cut == "failpoint" else cut
            marker = self._next(f"{point}.marker")
            marker.write_text("")
            extra = {"CAIRN_FAILPOINT": point, "CAIRN_FAILPOINT_MARKER": str(marker)}
        out, err = self._next("stdout"), self._next("stderr")
        with open(out, "wb") as o, open(err, "wb") as e:
            child = subprocess.Popen([CAIRN, *args], env=self.env(extra), cwd=self.ws, stdin=subprocess.DEVNULL,
                                     stdout=o, stderr=e)
        try:
            if cut is None:
                rc = child.wait(timeout=STEP_TIMEOUT)
                self._after_exit(args, rc, err)
                return
            if point is not None and marker is not None:
                reached = _wait(lambda: marker.read_text().endswith("\n") or child.poll() is not None, STEP_TIMEOUT)
                if not reached or child.poll() is not None:  # the step never got there (nothing of that kind in it)
                    rc = child.wait(timeout=STEP_TIMEOUT)
                    self._after_exit(args, rc, err)
                    return
                anchored = self._anchored(ANCHORS[point])
                self.tally.failpoint_cuts += 1
            else:
                time.sleep(self.rng.uniform(0.0, 1.5))
                anchored = []
                self.tally.random_cuts += 1
                if child.poll() is not None:  # it finished first: what it completed is known
                    self._after_exit(args, child.returncode, err)
            self.power_cut(child)
            self.check_after_cut(anchored, f"{' '.join(args[:3])} cut at {point or 'random'}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()

    def _after_exit(self, args: list[str], rc: int, err: Path) -> None:
        stderr = err.read_text(errors="replace")
        if "Traceback" in stderr or rc not in (0, 2, 3):
            self.tally.violations.append(f"seed {self.seed}: {' '.join(args[:3])} exit {rc}: {stderr.strip()[-300:]}")
            return
        if args[0] == "run" and rc == 0:
            self.created = True
        code, events, stderr = self.show()
        if code == 0:
            self.known = events  # a command that exited 0 passed its last barrier: all of this is durable
        elif self.created:
            self.tally.violations.append(f"seed {self.seed}: show after a clean exit: {code} {stderr.strip()[:200]}")

    def _anchored(self, anchor: str) -> list[dict[str, Any]]:
        """The events up to the last `anchor` event, read now (the child is stopped just after that barrier)."""
        code, events, _ = self.show()
        if code != 0:
            return []
        last = max((i for i, e in enumerate(events) if e.get("type") == anchor), default=-1)
        return events[: last + 1]

    def kill_users(self) -> None:
        """SIGKILL every process whose working directory or open files are on the mount (the child, its shells)."""
        mount = str(self.mount)
        for _ in range(3):
            found = False
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == os.getpid():
                    continue
                try:
                    cwd = os.readlink(f"/proc/{pid}/cwd")
                    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                except OSError:
                    continue
                if any(f == mount or f.startswith(mount + "/") for f in [cwd, *fds]):
                    found = True
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            if not found:
                return
            time.sleep(0.05)

    def power_cut(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=STEP_TIMEOUT)
        self.kill_users()
        keep = self.rng.random() < 0.5
        self.fs.cut(keep_prefix=keep)
        self.tally.cuts += 1
        self.tally.kept_prefix_cuts += keep

    # -- the oracle ----------------------------------------------------------------------------------------------

    def check_after_cut(self, anchored: list[dict[str, Any]], what: str) -> None:
        where = f"seed {self.seed} ({self.backend}), {what}"
        code, events, stderr = self.show()
        if "Traceback" in stderr or code not in (0, 2, 4):
            self.tally.violations.append(f"{where}: show exit {code}: {stderr.strip()[-300:]}")
            return
        must = self.known if len(self.known) >= len(anchored) else anchored
        effects = [t for t in self.effects.read_text().split() if t]
        if code != 0:
            if code == 4:
                self.tally.refused += 1
            if must or effects:
                self.tally.violations.append(f"{where}: show exit {code} although {len(must)} events were durable: "
                                             f"{stderr.strip()[:200]}")
            self.created = False if code == 2 else self.created
            self.known = []
            return
        self.created = True
        for i, expected in enumerate(must):
            self.tally.events_checked += 1
            if i >= len(events) or events[i] != expected:
                got = events[i] if i < len(events) else None
                self.tally.violations.append(f"{where}: durable event {i} lost or changed: {expected} -> {got}")
                break
        calls = [json.dumps(e) for e in events if e.get("type") == "tool/call"]
        for token in effects:
            self.tally.effects_checked += 1
            if not any(token in c for c in calls):
                self.tally.violations.append(f"{where}: a command's effect {token} happened, its call is not durable")
        self.tally.violations.extend(f"{where}: {v}" for v in self.unreadable_references(events))
        self.tally.violations.extend(f"{where}: {v}" for v in self.torn_small_files())
        sessions = self.run("sessions")
        if sessions.returncode != 0 or "Traceback" in sessions.stderr:
            self.tally.violations.append(f"{where}: sessions exit {sessions.returncode}: {sessions.stderr[-200:]}")
        self.known = events[: len(self.stored())]  # what survived a cut is on the disk (repair's view is not stored)
        self.effects.write_text("")  # their calls are now in self.known

    def torn_small_files(self) -> list[str]:
        """Lock files hold a pid line or nothing; settings and history hold whole JSON (SPEC §12: whole or absent)."""
        problems = []
        for lock in sorted((self.home / "locks").glob("*.lock")) if (self.home / "locks").is_dir() else []:
            text = lock.read_text(errors="replace")
            if text and not (text.endswith("\n") and text.strip().isdigit()):
                problems.append(f"lock file {lock.name} is half-written: {text!r}")
        settings = self.home / "tui.json"
        if settings.exists():
            try:
                json.loads(settings.read_text())
            except ValueError:
                problems.append("tui.json is half-written")
        return problems

    def stored(self) -> list[Any]:
        try:
            return SessionStore(self.home, self.backend).backend.load(self.session).events
        except Exception:
            return []

    def unreadable_references(self, shown: list[dict[str, Any]]) -> list[str]:
        """Every before-image blob and snapshot tree / manifest a durable event names must be readable."""
        problems = []
        store = SessionStore(self.home, self.backend)
        try:
            events = store.backend.load(self.session).events
            from cairn.persistence.blobs import blob_store_for

            blobs = blob_store_for(store.backend)
            for sha in sorted(names_needed(events)):
                if blobs.get(sha) is None:
                    problems.append(f"blob {sha[:12]} named by the log is missing")
            blobs.close()
        except Exception as e:  # noqa: BLE001 - reported, not raised: the oracle counts
            problems.append(f"reading the blobs failed: {type(e).__name__}: {e}")
        repo = ShadowRepo(self.home, self.ws)
        objects = set()
        for e in shown:
            if e.get("type") == "workspace/snapshot":
                objects.add(e.get("tree"))
                objects.add(e.get("manifest"))
            elif e.get("type") == "rewind/plan":
                objects.add(e.get("tree"))
                objects.add(e.get("before_tree"))
        for obj in sorted(o for o in objects if o):
            try:
                repo.run("cat-file", "-e", obj)
            except Exception as ex:  # noqa: BLE001
                problems.append(f"snapshot object {obj[:12]} named by the log is unreadable: {ex}")
        return problems


def run_case(root: Path, backend: str, seed: int, steps: int = 5, cut_every: float = 0.6,
             plan: list[tuple[str, str | None]] | None = None, window: int | None = None) -> Tally:
    """One seeded case: a first turn, then random turns, rewinds and undos, each cut with probability `cut_every`;
    or exactly `plan`: (kind, cut) pairs, kind "turn" / "rewind" / "undo", cut None / "random" / a failpoint."""
    world = CutWorld(root, backend, seed, window).start()
    try:
        rng = world.rng
        for n in range(len(plan) if plan is not None else steps):
            if plan is not None:
                kind, cut = plan[n]
            else:
                kind = "turn" if n == 0 or not world.created else rng.choice(["turn", "turn", "rewind", "undo"])
                cut = None if rng.random() >= cut_every else rng.choice(["random", "failpoint", "failpoint"])
            if kind == "turn":
                world.step(world.turn_args(), cut, TURN_POINTS)
            else:
                finish = world.run("rewind", world.session, "--finish", "--force")
                if "Traceback" in finish.stderr:
                    world.tally.violations.append(f"seed {seed}: rewind --finish: {finish.stderr[-300:]}")
                world.step(world.rewind_args(kind == "undo"), cut, REWIND_POINTS)
        code, events, _ = world.show()
        world.tally.compactions += sum(e.get("type") == "context/compaction" for e in events)
        return world.tally
    finally:
        world.stop()


def _wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def _sync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
