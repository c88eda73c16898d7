"""Random-time SIGKILL fuzz (issue 10): a real `cairn run` killed at a random instant of a multi-step session, often.

The crash matrix (test_crash_matrix.py) proves the repair at seven chosen points; this covers the instants nobody chose.
Each kill runs one scripted session against the real local OpenAI-protocol server (strict): step 1 calls read-only tools
(list_dir, read_file), an idempotent write_file and a side-effecting run_command; step 2's request is answered 503 once
(so a `request/retry` happens) and then calls run_command and write_file; step 3 streams the final answer. Every
effect names its call (a marker written by the command, a file written by write_file), so what happened on disk can be
compared with what the log says. The child is SIGKILLed at a random instant of the span in which it writes the session
(measured from its "session ID" line; a calibration run measures the span), then, in fresh processes:

- `cairn show ID --json` exits 0 and its seq is contiguous from 0;
- every request the server saw is one the stored log announced first (`request/header`, or `request/retry` for a
  repeated attempt), in order and with the same message count;
- every call whose effect exists on disk has a result that is not TOOL_NOT_STARTED; every call has exactly one result;
- `cairn run --resume ID` against a second strict server exits 0 (the repaired conversation is one a strict server
  accepts), and "Traceback" is in no stderr.

The seed is random per run (or `CAIRN_FUZZ_SEED`), printed in every failure with the kill's number and delay, so a
failure can be replayed: `CAIRN_FUZZ_SEED=N .venv/bin/python -m pytest -q -m slow tests/test_kill_fuzz.py` (timing makes
a replay likely, not certain, to land on the same event). Bounded: up to `CAIRN_FUZZ_KILLS` (30) kills per backend, but
none past `CAIRN_FUZZ_BUDGET` (27) seconds per backend once 10 are done, so a loaded CI machine stays near a minute.
`-s` prints the figures: runs, where the kills landed, how many calls repair classified.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cairn.persistence.events import ToolProgress, ToolResult
from crash_harness import WAIT, Rig, assert_contiguous, json_lines, types, wait_until
from openai_server import OpenAIServer, failing, text, tool_calls

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("CAIRN_FUZZ_KILLS", "30"))  # per backend, at most
MIN_KILLS = min(KILLS, 10)  # per backend, at least, however loaded the machine
BUDGET = float(os.environ.get("CAIRN_FUZZ_BUDGET", "27"))  # seconds per backend; past it, no kill past MIN_KILLS
SEED = int(os.environ.get("CAIRN_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
KEY = "sk-kill-fuzz-test-key"
SID = "fuzz-{:02d}"

STEP1 = [
    {"id": "call_ls", "name": "list_dir", "arguments": {"path": "."}},
    {"id": "call_rd", "name": "read_file", "arguments": {"path": "notes.txt"}},
    {"id": "call_w1", "name": "write_file", "arguments": {"path": "w1.txt", "content": "call_w1"}},
    {"id": "call_c1", "name": "run_command", "arguments": {"command": "printf call_c1 > call_c1.marker"}},
]
STEP2 = [
    {"id": "call_c2", "name": "run_command", "arguments": {"command": "printf call_c2 > call_c2.marker; sleep 0.05"}},
    {"id": "call_w2", "name": "write_file", "arguments": {"path": "w2.txt", "content": "call_w2"}},
]
# call id -> the file its body creates (its content is the call id)
EFFECTS = {"call_w1": "w1.txt", "call_c1": "call_c1.marker", "call_c2": "call_c2.marker", "call_w2": "w2.txt"}
FINAL = "All done: two files written, two commands run."
SAFETY = {"call_ls": "read_only", "call_rd": "read_only", "call_w1": "idempotent", "call_c1": "side_effecting",
          "call_c2": "side_effecting", "call_w2": "idempotent"}


def scenario() -> list[dict[str, Any]]:
    return [
        tool_calls(STEP1, text="Looking around first."),
        *failing(503, 1, tool_calls(STEP2), retry_after=0.02),
        text(FINAL, chunks=4, delay_ms=5),
    ]


def openai_env(server: OpenAIServer) -> dict[str, str]:
    return {"CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": KEY, "CAIRN_MAX_RETRIES": "2"}


def new_rig(tmp_path: Path, backend: str, home: Path, name: str) -> Rig:
    """A world of its own (workspace, io) whose sessions all go to one shared home, as a real user's would."""
    rig = Rig(tmp_path / name, backend)
    rig.home = home
    (rig.ws / "notes.txt").write_text("hello\n")
    return rig


def run_args(sid: str) -> list[str]:
    return ["run", "--session-id", sid, "--yes", "--provider", "openai", "--model", "m-fuzz", "do the chores"]


def exited(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def announced_attempts(stored: list[dict[str, Any]]) -> list[int]:
    """The message count of every request attempt the stored log announced, in order: a `request/header` opens a step's
    first attempt, each `request/retry` after it one more of the same request."""
    counts: list[int] = []
    for event in stored:
        if event["type"] == "request/header":
            counts.append(event["message_count"])
        elif event["type"] == "request/retry":
            assert counts, f"request/retry before any request/header: {types(stored)}"
            counts.append(counts[-1])
    return counts


def check_session(rig: Rig, sid: str, events: list[dict[str, Any]], stored_n: int, server: OpenAIServer) -> None:
    """What must hold after any kill, given `cairn show`'s events (stored part first, then what repair appends)."""
    assert_contiguous(events)
    stored = events[:stored_n]

    posts = [r for r in server.requests if r.method == "POST"]
    # a request whose body never fully arrived (the child died sending it) still counts as seen, its size unknown
    partial = [r for r in posts if len(r.raw) < int(r.header("content-length") or 0)]
    refused = [(r.n, r.refused, r.violations) for r in server.refusals if r not in partial]
    assert not refused, f"the strict server refused {refused}"
    assert all(r is posts[-1] for r in partial), "only the last request can have been cut short"
    seen = [None if r in partial else len(r.body["messages"]) for r in posts]
    announced = announced_attempts(stored)
    assert len(seen) <= len(announced) and all(s in (None, a) for s, a in zip(seen, announced)), (
        f"the server saw requests with message counts {seen}; the stored log announced only {announced}")
    for req in posts:
        assert req in partial or req.body["model"] == "m-fuzz"

    calls = {e["call_id"]: e for e in events if e["type"] == "tool/call"}
    results: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e["type"] == "tool/result":
            results.setdefault(e["call_id"], []).append(e)
    for call_id, call in calls.items():
        assert call["safety"] == SAFETY[call_id], call
        assert len(results.get(call_id, [])) == 1, f"{call_id}: {len(results.get(call_id, []))} results"
    for call_id, (result, *more) in results.items():
        assert not more, f"{call_id} has {1 + len(more)} results"
        if result["error_code"] == "TOOL_NOT_STARTED":
            assert call_id not in calls and result["source_seq"] is None, result
        else:
            assert call_id in calls and result["source_seq"] == calls[call_id]["seq"], result
    for call_id, name in EFFECTS.items():
        effect = rig.ws / name
        if not effect.exists():
            continue
        assert effect.read_text() in ("", call_id), f"{name} holds {effect.read_text()!r}"
        assert call_id in results, f"{name} exists but {call_id} has no result at all"
        assert results[call_id][0]["error_code"] != "TOOL_NOT_STARTED", (
            f"{name} exists, so {call_id}'s body ran, yet it is reported TOOL_NOT_STARTED")
    if events:
        # the last turn/end closes the session; only recovery/evidence (SPEC §9 rev 3) may follow it
        closing = max((i for i, e in enumerate(events) if e["type"] == "turn/end"), default=None)
        assert closing is not None, f"the session has no turn/end: {types(events)}"
        after_end = events[closing + 1:]
        assert all(e["type"] == "recovery/evidence" for e in after_end), (
            f"the session does not end with turn/end (then evidence only): {types(events)}")
        check_evidence(rig, events, stored_n, closing, calls)


def check_evidence(rig: Rig, events: list[dict[str, Any]], stored_n: int, closing: int,
                   calls: dict[str, dict[str, Any]]) -> None:
    """Fingerprints on every tool/call, and exactly the evidence SPEC §9 rev 3 asks repair to append: one
    `recovery/evidence` per OUTCOME_UNKNOWN call Cairn can check (a fingerprinted write_file, or a run_command with a
    recorded process), right after repair's turn/end, telling what is on disk now."""
    for call_id, call in calls.items():
        if call["name"] == "write_file":  # every file here is new: nothing before, the call id after
            assert (call["before_sha256"], call["after_sha256"]) == (
                None, hashlib.sha256(call_id.encode()).hexdigest()), call
        else:
            assert (call["before_sha256"], call["after_sha256"]) == (None, None), call
    progress = {e["call_id"]: e for e in events[:stored_n] if e["type"] == "tool/progress"}
    expected = [e["call_id"] for e in events[stored_n:] if e["type"] == "tool/result"
                and e["error_code"] == "TOOL_OUTCOME_UNKNOWN"
                and (calls[e["call_id"]]["name"] == "write_file"
                     or (calls[e["call_id"]]["name"] == "run_command" and e["call_id"] in progress))]
    evidence = [e for e in events if e["type"] == "recovery/evidence"]
    assert [e["call_id"] for e in evidence] == expected, f"evidence {evidence} for the unknown calls {expected}"
    if evidence:
        assert closing >= stored_n and events[closing + 1:] == evidence, "evidence follows repair's turn/end"
    for e in evidence:
        call_id = e["call_id"]
        if calls[call_id]["name"] == "run_command":  # its process had exited before `show` (see kill_once)
            pid = progress[call_id]["pid"]
            assert (e["finding"], e["detail"]) == (
                "unknown", f"its process (pid {pid}) is no longer running; what it did before it stopped is not "
                           "known"), e
            continue
        path = EFFECTS[call_id]
        effect = rig.ws / path
        if not effect.exists():
            assert (e["finding"], e["detail"]) == (
                "did_not_happen", f"{path} still does not exist, so the write did not take effect"), e
        elif effect.read_text() == call_id:
            assert e["finding"] == "happened" and e["detail"].startswith(f"{path} holds the intended content"), e
        else:
            assert e["finding"] == "unknown" and e["detail"].startswith(f"{path} holds neither"), e


def kill_once(tmp_path: Path, backend: str, home: Path, i: int, delay: float, tally: Counter, landed: Counter) -> None:
    sid = SID.format(i)
    rig = new_rig(tmp_path, backend, home, sid)
    try:
        with OpenAIServer(scenario()) as server:
            child = rig.spawn(*run_args(sid), env=openai_env(server))
            wait_until(lambda: f"session {sid}" in child.stderr(), "the session to be created", child=child)
            time.sleep(delay)
            if child.popen.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                rc = child.popen.wait(timeout=WAIT)
                assert rc in (-signal.SIGKILL, 0), f"the child ended with {rc}:\n{child.stderr()}"
            else:
                rc = child.popen.returncode
                assert rc == 0, f"the child ended with {rc} before the kill:\n{child.stderr()}"
            tally["killed" if rc == -signal.SIGKILL else "finished first"] += 1
            assert "Traceback" not in child.stderr(), child.stderr()
            # a command cut off by the kill dies with cairn (parent-death); wait until it has exited (a zombie
            # counts), so the evidence `show` predicts and the evidence resume commits look at the same world
            stored = rig.inspect(sid).events
            ended = {e.call_id for e in stored if isinstance(e, ToolResult)}
            for e in stored:
                if isinstance(e, ToolProgress) and e.call_id not in ended:
                    pid = e.pid
                    wait_until(lambda: exited(pid), f"{e.call_id}'s process to exit")

            shown = rig.run("show", sid, "--json")
            assert "Traceback" not in shown.stderr, shown.stderr
            assert shown.returncode == 0, shown.stderr
            events = [json.loads(line) for line in shown.stdout.splitlines()]
            stored_n = len(rig.inspect(sid).events)
            repaired = events[stored_n:]
            if rc == -signal.SIGKILL:  # where the kill landed: the last event stored
                landed[events[stored_n - 1]["type"] if stored_n else "(header only)"] += 1
            tally["repaired"] += bool(repaired)
            tally["OUTCOME_UNKNOWN"] += sum(e.get("error_code") == "TOOL_OUTCOME_UNKNOWN" for e in repaired)
            tally["NOT_STARTED"] += sum(e.get("error_code") == "TOOL_NOT_STARTED" for e in repaired)
            tally["evidence"] += sum(e["type"] == "recovery/evidence" for e in repaired)

            with OpenAIServer([text("Picking up where we left off.")]) as again:
                resumed = rig.run("run", "--resume", sid, "--json", "carry on", env=openai_env(again))
                assert "Traceback" not in resumed.stderr, resumed.stderr
                assert resumed.returncode == 0, resumed.stderr
                printed = json_lines(resumed.stdout)
                assert printed[: len(repaired)] == repaired, "resume committed the repair `show` predicted"
                assert printed[-1]["type"] == "turn/end" and printed[-1]["reason"] == "completed", printed[-1]
                assert not again.refusals, [r.violations for r in again.refusals]
            # last: the kill's server has by now read everything the dead child had sent it
            check_session(rig, sid, events, stored_n, server)
    finally:
        rig.cleanup()


def calibrate(tmp_path: Path, backend: str, home: Path) -> float:
    """One uninterrupted run; returns the seconds from the session's creation to the final answer's last byte: the span
    in which the session is being written, where the kills should fall. Also proves the scenario completes as
    scripted."""
    rig = new_rig(tmp_path, backend, home, "calibration")
    sid = "fuzz-calibration"
    try:
        with OpenAIServer(scenario()) as server:
            child = rig.spawn(*run_args(sid), env=openai_env(server))
            wait_until(lambda: f"session {sid}" in child.stderr(), "the session to be created", child=child)
            created = time.monotonic()
            wait_until(lambda: FINAL in child.stdout(), "the final answer", child=child)
            span = time.monotonic() - created
            assert child.finish() == 0, child.stderr()
            events = rig.show(sid)
            check_session(rig, sid, events, len(events), server)
        assert events[-1]["reason"] == "completed" and types(events).count("request/retry") == 1
        assert all((rig.ws / name).read_text() == call_id for call_id, name in EFFECTS.items())
        assert len(server.requests) == 4
        return span
    finally:
        rig.cleanup()


@pytest.mark.parametrize("backend_name", ["jsonl", "sqlite"])
def test_random_time_sigkills_never_lose_a_request_or_misreport_a_tool(tmp_path, backend_name):
    home = tmp_path / "home"
    started = time.monotonic()
    span = calibrate(tmp_path, backend_name, home)
    tally: Counter = Counter()
    landed: Counter = Counter()
    done = 0
    for i in range(KILLS):
        if i >= MIN_KILLS and time.monotonic() - started > BUDGET:
            break
        rng = random.Random(f"{SEED}:{backend_name}:{i}")
        delay = rng.uniform(0.0, span * 1.1)
        try:
            kill_once(tmp_path, backend_name, home, i, delay, tally, landed)
        except Exception as e:  # any failure, with what replays it
            raise AssertionError(f"kill fuzz seed {SEED}, {backend_name} kill {i} after {delay:.3f} s "
                                 f"after the session was created (calibrated span {span:.3f} s): {e}") from e
        done += 1

    listing = Rig(tmp_path / "listing", backend_name)
    listing.home = home
    sessions = listing.run("sessions", "--all")
    assert sessions.returncode == 0 and "Traceback" not in sessions.stderr, sessions.stderr
    assert all(SID.format(i) in sessions.stdout for i in range(done)), sessions.stdout
    print(f"\nkill fuzz seed {SEED}, {backend_name}: {done} runs in {time.monotonic() - started:.1f} s "
          f"(span {span:.3f} s): {dict(tally)}; killed after {dict(landed)}")
    assert tally["killed"] >= done // 2, f"seed {SEED}: most runs should die by the kill: {dict(tally)}"
