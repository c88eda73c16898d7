"""A workspace fuzz through the real CLI (SPEC §10 rev 4, §9): random workspaces, random turns of real `cairn run`
processes (file tools and shell commands doing random file operations), the operator's own edits between them, then
random `cairn rewind` / `--undo` / `--dry-run` / SIGKILL mid-rewind + `--finish` or `--abandon`, each followed by the
invariants below. Shared by tests/test_workspace_fuzz.py (a few fixed seeds per backend) and bench/workspace_fuzz.py
(many seeds).

The oracle never re-implements the engine: it only records, from the test side, the full workspace state (path -> kind,
bytes or link target, permission bits; `.git` directories skipped) around every turn, every hand edit and every rewind,
and checks:

1. every command exits 0, 2 or 3 and never prints a traceback; a refusal (exit 3, and exit 2 too) leaves the workspace
   byte-identical;
2. `--dry-run` changes neither the workspace nor the session log (`cairn show ID --json`);
3. after a rewind to N that exited 0: a path no Cairn activity since turn N's start changed is byte-identical to before
   (with `--force`: or back at a state it held since then); a path one changed and nobody changed by hand afterwards
   holds its state from the start of the first activity that changed it, or is named in a "not restored: <path>" line
   (a U+FFFD may stand for undecodable bytes; "sub/" names everything under it); a path a turn changed and the operator
   changed afterwards is a conflict, left alone without `--force` (only what Cairn changed after the operator's last
   change may be reversed); a path named "not restored" is left alone;
4. nothing outside the workspace changes (the `outside/` sibling, byte for byte and mode for mode);
5. `--undo` right after a rewind (or undo, or finish) that exited 0 puts back exactly the state before it (paths,
   bytes, link targets, the owner's x bit), unless it exited 3;
6. after a SIGKILL mid-rewind, `cairn rewind ID --turn 1` exits 2 naming the interrupted rewind; `--finish` then exits 0
   and its result satisfies 3 (or 5, for an undo) as if the rewind had run whole.

"Cairn activity" in 3: each turn from its start to its end, and each completed rewind, undo or finish from its start to
its end (the engine's own docstring: "inside a turn (or a rewind) the changes are Cairn's"). `literal=True` reads 3
over turns only: a path only an earlier rewind changed must then be byte-identical (the engine reverses earlier
rewinds that ran after turn N's start, so this reading flags those: a design question, not a bug).

Violations are counted by kind; two labels only sort them, they decide nothing: "-ignored" (the path was covered by
.gitignore then) and "-after-snapshots-off" (the rewind's plan had no snapshot: the file tools' before-images alone).

Every case is a list of steps (plain data), generated from a seed against the live workspace, and replayable:
`replay(steps)` runs the same commands again, so a failing case can be shrunk step by step (`minimize`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cli_world import CAIRN, World

from cairn.widgets.terminal_text import safe_text

FAILPOINTS = ("rewind-planned", "rewind-restored")
ODD = os.fsdecode(b"caf\xe9.txt")  # not UTF-8: shown as caf\ufffd.txt
ODD_SHELL = "\"$(printf 'caf\\351.txt')\""  # the same name, built by the shell from ASCII
LOOKALIKE = "caf\ufffd.txt"  # valid UTF-8 that renders like ODD: must never be taken for it
BIG = 11 * 1024 * 1024  # over the 10 MB snapshot limit

FILES = ["a.txt", "b.txt", "c.md", "d/e.txt", "d/f.txt", "new1.txt", "new2.txt", "g h.txt", "tool.sh", "x.log",
         "build/new.o", "e/deep/n.txt"]
DIRS = ["d", "e", "e/deep", "m", "build"]
LINKS = ["link_out", "lnk_in", "lnk_out2"]

# -------------------------------------------------------------------------------------------------------- state


State = dict[str, tuple]  # path -> ("file", content or ("sha256", hex), mode) | ("link", target, 0)


def _content(data: bytes) -> bytes | tuple[str, str]:
    return data if len(data) <= 4096 else ("sha256", hashlib.sha256(data).hexdigest())


def read_state(root: Path) -> State:
    """Every file and symbolic link under `root` (outside .git): kind, content (a link: its target), permission bits."""
    found: State = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            try:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    found[rel] = ("link", os.readlink(full), 0)
                elif stat.S_ISREG(st.st_mode):
                    with open(full, "rb") as f:
                        found[rel] = ("file", _content(f.read()), stat.S_IMODE(st.st_mode))
                else:
                    found[rel] = ("special", None, stat.S_IMODE(st.st_mode))
            except OSError as e:
                found[rel] = ("unreadable", str(e), 0)
    return found


def loose(entry: tuple | None) -> tuple | None:
    """What a snapshot can hold of a path: kind, content, and only the owner's x bit of the mode (git's 100755)."""
    if entry is None:
        return None
    kind, content, mode = entry
    return (kind, content, bool(mode & 0o100)) if kind == "file" else (kind, content)


def show_entry(entry: tuple | None) -> str:
    if entry is None:
        return "absent"
    kind, content, mode = entry
    if kind == "file":
        shown = content if isinstance(content, tuple) else bytes(content)[:60]
        return f"file {shown!r} {oct(mode)}"
    return f"{kind} {content!r}"


def diff_paths(a: State, b: State, key: Callable[[tuple | None], Any] = lambda e: e) -> list[str]:
    return sorted(p for p in set(a) | set(b) if key(a.get(p)) != key(b.get(p)))


# -------------------------------------------------------------------------------------------------------- world


@dataclass
class Result:
    rc: int
    out: str
    err: str
    args: list[str]

    @property
    def text(self) -> str:
        return f"`cairn {' '.join(self.args)}` -> exit {self.rc}\n--- stdout\n{self.out}--- stderr\n{self.err}"


class FuzzWorld(World):
    """World (tests/test_rewind.py) with snapshots on, a unique session id, byte-safe output and a crash helper that
    tolerates a command that ends before its failpoint (a refused rewind, or one with nothing to restore)."""

    def __init__(self, root: Path, backend: str, sid: str) -> None:
        super().__init__(root, backend, "auto")
        self.sid = sid
        self.outside = root / "outside"
        self.started = False

    def call(self, *args: str, **extra: str) -> Result:
        proc = subprocess.run([CAIRN, *args], env=self.env(**extra), cwd=self.ws, capture_output=True, timeout=120)
        return Result(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
                      list(args))

    def run_turn(self, prompt: str, calls: list[dict]) -> Result:
        first = not self.started
        self.started = True
        return self.call("run", "--script", self.script(*calls), "--yes",
                         *(["--session-id", self.sid] if first else ["--resume", self.sid]), prompt)

    def shown(self) -> str:
        return self.call("show", self.sid, "--json").out

    def crash(self, failpoint: str, *args: str) -> Result | None:
        """Run `cairn ARGS` until it stops at `failpoint`, then SIGKILL it: None. A command that ended before it got
        there: its Result."""
        marker = self.root / f"marker-{failpoint}"
        marker.write_text("")
        child = subprocess.Popen([CAIRN, *args], env=self.env(CAIRN_FAILPOINT=failpoint,
                                                               CAIRN_FAILPOINT_MARKER=str(marker)),
                                 cwd=self.ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not marker.read_text():
            if child.poll() is not None:
                out, err = child.communicate()
                return Result(child.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                              list(args))
            if time.monotonic() > deadline:
                child.kill()
                child.communicate()
                raise TimeoutError(f"`cairn {' '.join(args)}` never reached {failpoint}")
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
        return None


# ------------------------------------------------------------------------------------------------ hand edits


def apply_edit(ws: Path, outside: Path, edit: dict) -> None:
    """One edit by hand (also how a case's workspace is set up). Never follows a link: nothing outside is written."""
    kind, rel = edit["kind"], edit.get("path", "")
    full = os.path.join(ws, rel)
    parent = os.path.dirname(full)
    if kind in ("write", "append"):
        if os.path.islink(full) or os.path.isdir(full):
            return
        if not os.path.isdir(parent):
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError:
                return
        data = edit["data"].encode("utf-8", "surrogateescape") if isinstance(edit["data"], str) else edit["data"]
        with open(full, "ab" if kind == "append" else "wb") as f:
            f.write(data)
        if "mode" in edit:
            os.chmod(full, edit["mode"])
    elif kind == "big":
        if not os.path.islink(full) and not os.path.isdir(full):
            with open(full, "wb") as f:
                f.write(b"\0" * BIG)
    elif kind == "delete":
        if os.path.lexists(full) and not os.path.isdir(full) or os.path.islink(full):
            os.unlink(full)
    elif kind == "symlink":
        if not os.path.lexists(full):
            os.makedirs(parent, exist_ok=True)
            os.symlink(edit["target"], full)
    elif kind == "gitinit":
        os.makedirs(full, exist_ok=True)
        subprocess.run(["git", "init", "-q", full], check=True, capture_output=True,
                       env={"PATH": os.environ["PATH"], "HOME": str(ws.parent), "GIT_CONFIG_NOSYSTEM": "1"})
    elif kind == "outside":
        target = outside / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(edit["data"])
    else:
        raise ValueError(kind)


# ------------------------------------------------------------------------------------------------- generation


def _token(rng: random.Random) -> str:
    return f"w{rng.randrange(10**6):06d}"


def _text(rng: random.Random) -> str:
    words = ["alpha", "beta", "gamma", "delta"]
    return "".join(f"{_token(rng)} {rng.choice(words)}\n" for _ in range(rng.randint(1, 4)))


@dataclass
class Options:
    odd_names: bool = True  # non-UTF-8 names (b"caf\xe9.txt") in turns
    big_files: bool = True  # 11 MB files (over the snapshot limit)
    dir_swaps: bool = True  # a file replaced by a directory of the same name
    literal: bool = False  # invariant 3 over turns only (see the module docstring)
    min_turns: int = 3
    max_turns: int = 6
    min_actions: int = 4
    max_actions: int = 7


def gen_setup(rng: random.Random, opts: Options) -> list[dict]:
    edits: list[dict] = [{"kind": "outside", "path": "secret.txt", "data": "outside, never to change\n"},
                         {"kind": "outside", "path": "dir/other.txt", "data": "also outside\n"}]
    for path in rng.sample(["a.txt", "b.txt", "c.md", "d/e.txt", "g h.txt"], rng.randint(2, 5)):
        edits.append({"kind": "write", "path": path, "data": _text(rng)})
    if rng.random() < 0.3:
        edits.append({"kind": "write", "path": "tool.sh", "data": "#!/bin/sh\necho tool\n", "mode": 0o755})
    if rng.random() < 0.5:
        edits += [{"kind": "write", "path": ".gitignore", "data": "*.log\nbuild/\n"},
                  {"kind": "write", "path": "debug.log", "data": "a log the operator keeps\n"},
                  {"kind": "write", "path": "build/out.o", "data": "\x7fELF object\n"}]
    if rng.random() < 0.4:
        edits += [{"kind": "gitinit", "path": "sub"}, {"kind": "write", "path": "sub/inner.txt", "data": "inner\n"}]
    if rng.random() < 0.5:
        target = "../outside/secret.txt" if rng.random() < 0.5 else "ABS/outside/secret.txt"
        edits.append({"kind": "symlink", "path": "link_out", "target": target})
    if opts.odd_names and rng.random() < 0.15:
        edits.append({"kind": "write", "path": LOOKALIKE, "data": "odd\n"})  # a real file the odd name renders as
    return edits


def _q(path: str) -> str:
    return ODD_SHELL if path == ODD else shlex.quote(path)


def _shell_op(rng: random.Random, now: State, opts: Options) -> str:
    files = [p for p, e in now.items() if e[0] == "file" and not p.startswith("sub/")]
    pick = lambda: rng.choice(files + FILES) if files and rng.random() < 0.7 else rng.choice(FILES)  # noqa: E731

    def parent(path: str) -> str:
        d = os.path.dirname(path)
        return f"mkdir -p {shlex.quote(d)} 2>/dev/null; " if d else ""

    roll = rng.random()
    if roll < 0.16:
        p = pick()
        return f"{parent(p)}[ -L {_q(p)} ] || printf %s {shlex.quote(_text(rng))} > {_q(p)}"
    if roll < 0.30:
        p = pick()
        return f"{parent(p)}[ -L {_q(p)} ] || printf %s {shlex.quote(_text(rng))} >> {_q(p)}"
    if roll < 0.40:
        return f"rm -f {_q(pick())}"
    if roll < 0.50:
        src, dst = pick(), rng.choice(FILES)
        return f"{parent(dst)}[ -d {_q(dst)} ] || mv -fT {_q(src)} {_q(dst)} 2>/dev/null"
    if roll < 0.54:
        return f"mkdir -p {shlex.quote(rng.choice(DIRS))}"
    if roll < 0.62:
        p = pick()
        return f"[ -L {_q(p)} ] || chmod {rng.choice(['+x', '-x'])} {_q(p)} 2>/dev/null"
    if roll < 0.70:
        return rng.choice([
            "printf '%s\\n' a.txt >> .gitignore",
            "printf '%s\\n' 'd/' >> .gitignore",
            "rm -f .gitignore",
            "printf '*.log\\n' > .gitignore",
            "printf '*.md\\nnew*.txt\\n' > .gitignore",
        ])
    if roll < 0.75:
        return rng.choice(["[ -d sub/.git ] && printf 'more\\n' >> sub/inner.txt",
                           "[ -d sub/.git ] && printf 'new\\n' > sub/new.txt",
                           "[ -d sub/.git ] && rm -f sub/inner.txt"]) + "; true"
    if roll < 0.83:
        link = rng.choice(LINKS)
        target = rng.choice(["a.txt", "d/e.txt", "missing.txt", "../outside/secret.txt", "ABS/outside/secret.txt",
                             "../outside/dir"])
        return f"[ -d {link} ] && [ ! -L {link} ] || ln -sfn {shlex.quote(target)} {link}"
    if roll < 0.90 and opts.odd_names:
        return rng.choice([f"printf 'odd %s\\n' {_token(rng)} > {ODD_SHELL}",
                           f"printf 'more\\n' >> {ODD_SHELL}",
                           f"rm -f {ODD_SHELL}"])
    if roll < 0.94 and opts.big_files:
        return rng.choice([f"head -c {BIG} /dev/zero > big.bin", "printf 'small now\\n' > big.bin", "rm -f big.bin"])
    if roll < 0.97 and opts.dir_swaps:
        p = rng.choice(["a.txt", "b.txt", "new1.txt"])
        return f"rm -f {_q(p)} && mkdir -p {_q(p)} && printf 'in a dir\\n' > {_q(p + '/inner.txt')}"
    return f"rm -f {_q(pick())}; rmdir {shlex.quote(rng.choice(DIRS))} 2>/dev/null; true"


def gen_calls(rng: random.Random, now: State, opts: Options) -> list[dict]:
    calls = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        texts = {p: e[1] for p, e in now.items() if e[0] == "file" and isinstance(e[1], bytes)}
        if roll < 0.55:
            ops = [_shell_op(rng, now, opts) for _ in range(rng.randint(1, 4))]
            calls.append({"name": "run_command", "arguments": {"command": "; ".join(ops) + "; true"}})
        elif roll < 0.8 or not texts:
            path = rng.choice(FILES + LINKS + [p for p in texts if "\udce9" not in p and "\ufffd" not in p])
            calls.append({"name": "write_file", "arguments": {"path": path, "content": _text(rng)}})
        else:
            path = rng.choice(sorted(p for p in texts if "\udce9" not in p and "\ufffd" not in p) or ["a.txt"])
            text = texts.get(path, b"").decode("utf-8", "replace")
            lines = [line for line in text.splitlines(True) if text.count(line) == 1]  # edit_file wants one match
            old = rng.choice(lines) if lines and rng.random() < 0.85 else "no such text\n"
            calls.append({"name": "edit_file", "arguments": {"path": path, "old": old, "new": _text(rng)}})
    return calls


def gen_hand(rng: random.Random, now: State, recent: list[str], opts: Options) -> list[dict]:
    files = [p for p, e in now.items() if e[0] == "file" and not p.startswith("sub/")]
    edits = []
    for _ in range(rng.randint(1, 2)):
        roll = rng.random()
        pool = [p for p in recent if p in files] if recent and rng.random() < 0.6 else files
        if roll < 0.45 and pool:
            edits.append({"kind": "append", "path": rng.choice(pool), "data": f"by hand {_token(rng)}\n"})
        elif roll < 0.75:
            edits.append({"kind": "write", "path": rng.choice(["mine.txt", "notes/mine.md"] + FILES),
                          "data": f"the operator's {_token(rng)}\n"})
        elif pool:
            edits.append({"kind": "delete", "path": rng.choice(pool)})
    return edits


# -------------------------------------------------------------------------------------------------------- case


@dataclass
class Entry:
    """One stretch of the timeline: a Cairn activity (a turn, a completed rewind or undo) or the operator's hand."""

    kind: str  # "turn", "rewind", "hand", "killed"
    pre: State
    post: State
    label: str
    dirty: bool = False  # a killed rewind that was abandoned: what it changed counts as nobody's for sure


@dataclass
class Violation:
    kind: str
    message: str


@dataclass
class Counts:
    cases: int = 0
    turns: int = 0
    rewinds: int = 0
    undos: int = 0
    dry_runs: int = 0
    kills: int = 0
    finishes: int = 0
    abandons: int = 0
    hand_edits: int = 0
    refused_3: int = 0
    refused_2: int = 0
    violations: int = 0

    def add(self, other: "Counts") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Case:
    """One fuzz case: a FuzzWorld, the timeline of recorded states, the steps done so far and what they broke."""

    def __init__(self, root: Path, backend: str, sid: str, opts: Options | None = None) -> None:
        self.opts = opts or Options()
        self.world = FuzzWorld(root, backend, sid)
        self.world.outside.mkdir()
        self.steps: list[dict] = []
        self.violations: list[Violation] = []
        self.counts = Counts(cases=1)
        self.timeline: list[Entry] = []
        self.turn_at: dict[int, int] = {}  # turn number -> its index in the timeline
        self.turns = 0
        self.outside_state: State = {}
        self.undo_expect: State | None = None  # the state before the last completed rewind, while nothing else ran
        self.recent: list[str] = []  # paths the last turn changed (the operator's favourite targets for conflicts)

    # -- helpers --------------------------------------------------------------------------------------------------

    @property
    def ws(self) -> Path:
        return self.world.ws

    def state(self) -> State:
        return read_state(self.ws)

    def fail(self, kind: str, message: str) -> None:
        self.violations.append(Violation(kind, f"[step {len(self.steps)}: {json.dumps(self.steps[-1])[:300]}] "
                                               f"{message}"))
        self.counts.violations += 1

    def check_common(self, result: Result, allowed: tuple[int, ...] = (0, 2, 3)) -> None:
        if result.rc not in allowed:
            self.fail("exit-code", f"exit {result.rc} (allowed {allowed})\n{result.text}")
        if "Traceback" in result.err or "Traceback" in result.out:
            self.fail("traceback", result.text)
        self.check_outside()

    def check_outside(self) -> None:
        now = read_state(self.world.outside)
        if now != self.outside_state:
            self.fail("outside-changed", "outside/ changed: " + ", ".join(
                f"{p}: {show_entry(self.outside_state.get(p))} -> {show_entry(now.get(p))}"
                for p in diff_paths(self.outside_state, now)))
            self.outside_state = now

    def check_untouched(self, kind: str, before: State, after: State, result: Result) -> None:
        changed = diff_paths(before, after)
        if changed:
            self.fail(kind, "the workspace changed: " + "; ".join(
                f"{p!r}: {show_entry(before.get(p))} -> {show_entry(after.get(p))}" for p in changed[:8])
                + "\n" + result.text)

    # -- steps ----------------------------------------------------------------------------------------------------

    def do(self, step: dict) -> None:
        self.steps.append(step)
        getattr(self, "_" + step["op"])(step)

    def _setup(self, step: dict) -> None:
        for edit in step["edits"]:
            if edit.get("kind") == "symlink" and edit["target"].startswith("ABS/"):
                edit = {**edit, "target": str(self.world.root) + edit["target"][3:]}
            apply_edit(self.ws, self.world.outside, edit)
        self.outside_state = read_state(self.world.outside)

    def _turn(self, step: dict) -> None:
        calls = [self._resolve(c) for c in step["calls"]]
        pre = self.state()
        result = self.world.run_turn(f"turn {self.turns + 1}", calls)
        self.check_common(result, (0,))
        post = self.state()
        self.turns += 1
        self.counts.turns += 1
        self.turn_at[self.turns] = len(self.timeline)
        self.timeline.append(Entry("turn", pre, post, f"turn {self.turns}"))
        self.recent = diff_paths(pre, post)
        self.undo_expect = None

    def _resolve(self, call: dict) -> dict:
        args = call["arguments"]
        if "command" in args:
            return {**call, "arguments": {"command": args["command"].replace("ABS/", str(self.world.root) + "/")}}
        return call

    def _hand(self, step: dict) -> None:
        pre = self.state()
        for edit in step["edits"]:
            apply_edit(self.ws, self.world.outside, edit)
        post = self.state()
        self.counts.hand_edits += 1
        self.timeline.append(Entry("hand", pre, post, "by hand"))
        if pre != post:
            self.undo_expect = None

    def _rewind_args(self, step: dict) -> list[str]:
        if step.get("undo"):
            args = ["rewind", self.world.sid, "--undo"]
        else:
            args = ["rewind", self.world.sid, "--turn", str(step["turn"])]
            if step.get("scope") == "conversation":
                args.append("--conversation")
        return args + (["--force"] if step.get("force") else [])

    def _rewind(self, step: dict) -> None:
        args = self._rewind_args(step)
        before = self.state()
        result = self.world.call(*args)
        self._settle(step, result, before, self.state())

    def _settle(self, step: dict, result: Result, before: State, after: State, label: str = "") -> None:
        """Check a rewind or undo that ran to its end (or a --finish, when `label` says so)."""
        undo = bool(step.get("undo"))
        if undo:
            self.counts.undos += 1
        else:
            self.counts.rewinds += 1
        self.check_common(result)
        if result.rc != 0:
            if result.rc == 3:
                self.counts.refused_3 += 1
                self.check_untouched("exit3-changed", before, after, result)
            elif result.rc == 2:
                self.counts.refused_2 += 1
                self.check_untouched("exit2-changed", before, after, result)
            if after != before:  # (already a violation) what it changed is nobody's for sure from here on
                self.timeline.append(Entry("killed", before, after, "failed " + " ".join(result.args[2:]), dirty=True))
                self.undo_expect = None
            return
        if step.get("scope") == "conversation":
            self.check_untouched("conversation-only-changed-files", before, after, result)
        elif undo:
            if self.undo_expect is not None:
                self.check_undo(self.undo_expect, after, result)
        else:
            self.check_rewind(step["turn"], before, after, result, bool(step.get("force")))
        self.timeline.append(Entry("rewind", before, after, label or " ".join(self._rewind_args(step)[2:])))
        self.undo_expect = before

    def _dry(self, step: dict) -> None:
        args = self._rewind_args(step) + ["--dry-run"]
        before, log = self.state(), self.world.shown()
        result = self.world.call(*args)
        self.counts.dry_runs += 1
        self.check_common(result)
        after, log_after = self.state(), self.world.shown()
        self.check_untouched("dry-run-changed-workspace", before, after, result)
        if log_after != log:
            self.fail("dry-run-changed-log", f"`cairn show --json` changed\n{result.text}")

    def _kill(self, step: dict) -> None:
        args = self._rewind_args(step)
        before = self.state()
        expect_undo = self.undo_expect
        crashed = self.world.crash(step["point"], *args)
        if crashed is not None:  # it ended before the failpoint: an ordinary rewind
            self._settle(step, crashed, before, self.state())
            return
        self.counts.kills += 1
        killed = self.state()
        self.check_outside()
        self.timeline.append(Entry("killed", before, killed, "killed " + " ".join(args[2:])))
        self.undo_expect = None
        blocked = self.world.call("rewind", self.world.sid, "--turn", "1")
        self.check_common(blocked)
        if blocked.rc != 2 or "interrupted" not in blocked.err:
            self.fail("interrupted-not-blocking", "after a SIGKILL mid-rewind, `rewind --turn 1` should exit 2 naming "
                                                  f"the interrupted rewind\n{blocked.text}")
        self.check_untouched("blocked-rewind-changed", killed, self.state(), blocked)
        if step["then"] == "abandon":
            result = self.world.call("rewind", self.world.sid, "--abandon")
            self.counts.abandons += 1
            self.check_common(result, (0,))
            self.check_untouched("abandon-changed", killed, self.state(), result)
            self.timeline[-1].dirty = True
            return
        result = self.world.call("rewind", self.world.sid, "--finish")
        self.counts.finishes += 1
        self.check_common(result, (0,))
        after = self.state()
        if result.rc != 0:
            self.fail("finish-refused", f"--finish refused although nothing changed since the kill\n{result.text}")
            self.world.call("rewind", self.world.sid, "--abandon")
            self.timeline[-1].dirty = True
            return
        if step.get("undo"):
            if expect_undo is not None:
                self.check_undo(expect_undo, after, result)
        else:
            # as if the rewind had run whole: judged from the state before it was killed, on the timeline before it
            self.check_rewind(step["turn"], before, after, result, bool(step.get("force")), upto=len(self.timeline) - 1)
        self.timeline.append(Entry("rewind", killed, after, "finish"))
        self.undo_expect = before

    # -- the oracle -----------------------------------------------------------------------------------------------

    def fell_back(self) -> bool:
        """Whether the last rewind was planned without a snapshot of the workspace (its plan has no `before_tree`):
        the file tools' before-images alone. Used only to count violations apart."""
        plans = [e for e in map(json.loads, self.world.shown().splitlines()) if e.get("type") == "rewind/plan"]
        return bool(plans) and plans[-1].get("before_tree") is None

    def check_undo(self, expected: State, after: State, result: Result) -> None:
        wrong = diff_paths(expected, after, loose)
        if wrong:
            self.fail("undo-not-exact", "the undo did not put back the state before the rewind: " + "; ".join(
                f"{p!r}: expected {show_entry(expected.get(p))}, got {show_entry(after.get(p))}" for p in wrong[:8])
                + "\n" + result.text)

    def check_rewind(self, turn: int, before: State, after: State, result: Result, force: bool,
                     upto: int | None = None) -> None:
        if turn not in self.turn_at:
            return
        entries = self.timeline[self.turn_at[turn]:upto]
        named = named_paths(result.out)
        restored = restored_paths(result.out)
        paths = set(before) | set(after)
        for e in entries:
            paths |= set(e.pre) | set(e.post)
        problems, unnamed, unnamed_ignored = [], [], []
        for p in sorted(paths):
            changes = [(i, e) for i, e in enumerate(entries) if e.pre.get(p) != e.post.get(p)]
            cairn = [i for i, e in changes if e.kind == "turn" or (e.kind in ("rewind", "killed")
                                                                   and not self.opts.literal)]
            is_named = is_named_path(p, named)
            now, was = after.get(p), before.get(p)
            if is_named and not is_restored(p, restored) and now != was and unique_rendering(p, paths):
                problems.append(f"{p!r} is named 'not restored' but changed: {show_entry(was)} -> {show_entry(now)}")
                continue
            if not cairn:  # only the operator (or nobody) changed it since turn N began: left alone
                if now == was:
                    continue
                if force and any(loose(now) == loose(e.pre.get(p)) for e in entries):
                    continue
                problems.append(f"{p!r}: no turn >= {turn} changed it, yet the rewind changed it: "
                                f"{show_entry(was)} -> {show_entry(now)}")
                continue
            first = cairn[0]
            target = entries[first].pre.get(p)
            dirty = entries[first].dirty or any(
                i > first and (e.kind == "hand" or e.dirty) for i, e in changes)
            if dirty:  # a conflict: never merged, left alone without --force
                # ... except that what Cairn changed after the last outside change may be reversed (back to the state
                # it found then: the outside change is kept), e.g. a file the operator deleted that a later turn made
                last = max(i for i, e in changes if e.kind == "hand" or e.dirty)
                after_last = [i for i in cairn if i > last and not entries[i].dirty]
                if after_last and loose(now) == loose(entries[after_last[0]].pre.get(p)):
                    continue
                if not force and now != was and loose(now) != loose(was):
                    problems.append(f"{p!r} was changed by {entries[first].label} and by hand afterwards (a "
                                    f"conflict) but the rewind changed it without --force: "
                                    f"{show_entry(was)} -> {show_entry(now)}")
                continue
            if loose(now) == loose(target) or is_named:
                continue
            if now == was:  # left alone, silently: the operator is not told it was not restored
                ignored = ignored_at(entries[first].pre, p) or ignored_at(entries[first].post, p)
                (unnamed_ignored if ignored else unnamed).append(
                    f"{p!r}: changed by {entries[first].label} (first, since turn {turn}) and not by hand afterwards; "
                    f"left as it is ({show_entry(now)}) without a 'not restored' line (its state then: "
                    f"{show_entry(target)})")
                continue
            problems.append(f"{p!r}: changed by {entries[first].label} (first, since turn {turn}) and not by hand "
                            f"afterwards: expected its state at that start ({show_entry(target)}) or a "
                            f"'not restored' line; it is {show_entry(now)} (was {show_entry(was)} before the rewind)")
        # the rewind fell back to the file tools' before-images (snapshots could not be taken): counted apart
        suffix = "-after-snapshots-off" if (problems or unnamed or unnamed_ignored) and self.fell_back() else ""
        if problems:
            self.fail("rewind-wrong" + suffix, "\n  ".join(problems) + "\n" + result.text)
        if unnamed:
            self.fail("rewind-unnamed" + suffix, "\n  ".join(unnamed) + "\n" + result.text)
        if unnamed_ignored:  # the same, for paths .gitignore covered then (told apart only to count them apart)
            self.fail("rewind-unnamed-ignored" + suffix, "\n  ".join(unnamed_ignored) + "\n" + result.text)


def ignored_at(state: State, path: str) -> bool:
    """Whether the .gitignore of `state` covers `path` (asked of git itself in a scratch directory; used only to tell
    violations apart in the counts, never to decide one)."""
    entry = state.get(".gitignore")
    if entry is None or entry[0] != "file" or not isinstance(entry[1], bytes):
        return False
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        env = {"PATH": os.environ["PATH"], "HOME": scratch, "GIT_CONFIG_NOSYSTEM": "1"}
        subprocess.run(["git", "init", "-q", scratch], capture_output=True, env=env)
        Path(scratch, ".gitignore").write_bytes(entry[1])
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=scratch, capture_output=True,
                              env=env)
        return proc.returncode == 0


def named_paths(out: str) -> list[str]:
    found = []
    for line in out.splitlines():
        if line.startswith("not restored: "):
            found.append(line[len("not restored: "):].split(": ", 1)[0])
    return found


def restored_paths(out: str) -> set[str]:
    for line in out.splitlines():
        for head in ("restored to before turn ", "undid the last rewind: "):
            if line.startswith(head):
                return set(line.split(": ", 1)[1].split(", "))
    return set()


def is_named_path(path: str, named: list[str]) -> bool:
    shown = safe_text(path)
    return any(n == shown or (n.endswith("/") and shown.startswith(n)) for n in named)


def is_restored(path: str, restored: set[str]) -> bool:
    return safe_text(path) in restored


def unique_rendering(path: str, paths: set[str]) -> bool:
    shown = safe_text(path)
    return sum(1 for p in paths if safe_text(p) == shown) == 1


# ------------------------------------------------------------------------------------------------- a whole case


def next_action(rng: random.Random, case: Case) -> dict:
    turns = case.turns
    last = case.steps[-1]
    just_rewound = last["op"] in ("rewind", "kill") and case.undo_expect is not None
    roll = rng.random()
    if just_rewound and roll < 0.45:
        return {"op": "rewind", "undo": True, "force": rng.random() < 0.1}
    roll = rng.random()
    turn = rng.randint(1, turns)
    force = rng.random() < 0.2
    if roll < 0.36:
        step = {"op": "rewind", "turn": turn, "force": force}
        if rng.random() < 0.06:
            step["scope"] = "conversation"
        return step
    if roll < 0.46:
        return {"op": "rewind", "undo": True, "force": force}
    if roll < 0.58:
        return {"op": "dry", "turn": turn, "force": force} if rng.random() < 0.8 else {"op": "dry", "undo": True}
    if roll < 0.76:
        step = {"op": "kill", "point": rng.choice(FAILPOINTS), "then": "finish" if rng.random() < 0.75 else "abandon",
                "turn": turn, "force": force}
        if case.undo_expect is not None and rng.random() < 0.3:
            step = {**step, "undo": True, "force": False}
            step.pop("turn")
        return step
    if roll < 0.9:
        return {"op": "hand", "edits": gen_hand(rng, case.state(), case.recent, case.opts)}
    return {"op": "turn", "calls": gen_calls(rng, case.state(), case.opts)}


def run_case(root: Path, backend: str, seed: int, opts: Options | None = None, sid: str | None = None) -> Case:
    """Generate and run the case of `seed` in `root` (an empty directory)."""
    opts = opts or Options()
    rng = random.Random(seed)
    case = Case(root, backend, sid or f"fz{seed}", opts)
    case.do({"op": "setup", "edits": gen_setup(rng, opts)})
    for n in range(rng.randint(opts.min_turns, opts.max_turns)):
        if n and rng.random() < 0.45:
            case.do({"op": "hand", "edits": gen_hand(rng, case.state(), case.recent, opts)})
        case.do({"op": "turn", "calls": gen_calls(rng, case.state(), opts)})
    for _ in range(rng.randint(opts.min_actions, opts.max_actions)):
        case.do(next_action(rng, case))
    return case


def replay(root: Path, backend: str, steps: list[dict], opts: Options | None = None, sid: str | None = None) -> Case:
    case = Case(root, backend, sid or f"r{secrets.token_hex(4)}", opts)
    for step in steps:
        case.do(json.loads(json.dumps(step)))
    return case


def minimize(make_root: Callable[[], Path], backend: str, steps: list[dict], kind: str,
             opts: Options | None = None, budget: int = 60) -> list[dict]:
    """Shrink `steps` while a violation of `kind` remains: drop whole steps, then single edits and calls."""
    def fails(candidate: list[dict]) -> bool:
        nonlocal budget
        if budget <= 0:
            return False
        budget -= 1
        try:
            case = replay(make_root(), backend, candidate, opts)
        except Exception:
            return False
        return any(v.kind == kind for v in case.violations)

    current = steps
    changed = True
    while changed and budget > 0:
        changed = False
        for i in range(len(current) - 1, 0, -1):  # never the setup step itself
            candidate = current[:i] + current[i + 1:]
            if fails(candidate):
                current, changed = candidate, True
        for i, step in enumerate(current):
            for key in ("edits", "calls"):
                items = step.get(key) or []
                for j in range(len(items) - 1, -1, -1):
                    if len(items) == 1 and key == "calls":
                        break
                    candidate = current[:i] + [{**step, key: items[:j] + items[j + 1:]}] + current[i + 1:]
                    if fails(candidate):
                        current, changed, items = candidate, True, items[:j] + items[j + 1:]
                        step = current[i]
            if step["op"] == "turn":  # commands: drop single shell operations
                for j, call in enumerate(step["calls"]):
                    command = call["arguments"].get("command")
                    if not command:
                        continue
                    ops = command.split("; ")
                    for k in range(len(ops) - 2, -1, -1):
                        fewer = ops[:k] + ops[k + 1:]
                        new_call = {**call, "arguments": {"command": "; ".join(fewer)}}
                        new_step = {**step, "calls": step["calls"][:j] + [new_call] + step["calls"][j + 1:]}
                        candidate = current[:i] + [new_step] + current[i + 1:]
                        if fails(candidate):
                            current, changed, step, ops = candidate, True, new_step, fewer
                            call = new_call
    return current


def describe_steps(steps: list[dict]) -> str:
    return "\n".join(json.dumps(step, ensure_ascii=True) for step in steps)


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
