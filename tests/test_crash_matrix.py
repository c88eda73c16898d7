"""The SIGKILL crash matrix (issue 4): a real `cairn run` child, killed at seven points, on every backend.

For every case: the child runs a real turn through the CLI's composition (real backend, real checkpoint policy, the
`script` provider or a real local OpenAI-protocol HTTP server), reaches the point, publishes it (a failpoint marker's
exact contents, the server holding the request or the stream, or the tool body's own marker), and is SIGKILLed. Then,
in fresh processes: `cairn show ID --json` must give the EXACT repaired sequence (and write nothing), and
`cairn run --resume ID` must commit exactly that repair before its own turn.

Also here: resuming after the tool-side-effect crash shows the model the OUTCOME_UNKNOWN result (item 2), and two
writers on one session (item 4).

Run only these: `.venv/bin/python -m pytest -q -m slow tests/test_crash_matrix.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from crash_harness import Child, Rig, assert_contiguous, json_lines, types, wait_until
from openai_server import OpenAIServer, hang, text
from cairn.persistence.repair import not_started_text, outcome_unknown_text

pytestmark = pytest.mark.slow

PROMPT = "please do the thing"
KEY = "sk-crash-matrix-test-key"
TOOLS = ["list_dir", "read_file", "search_text", "find_files", "write_file", "edit_file", "run_command"]


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend_name(request):
    """Every backend; `postgres` gets a private schema through CAIRN_DATABASE_URL, which the rig hands its children."""
    if request.param == "postgres":
        request.getfixturevalue("pg_database_url")
    return request.param


@pytest.fixture
def rig(tmp_path, backend_name):
    rig = Rig(tmp_path, backend_name)
    yield rig
    rig.cleanup()


@pytest.fixture
def server():
    with OpenAIServer() as server:
        yield server


def openai_env(server: OpenAIServer) -> dict[str, str]:
    return {"CAIRN_BASE_URL": server.base_url, "CAIRN_API_KEY": KEY}


def script_run(rig: Rig, sid: str, responses: list[dict[str, Any]], *extra: str) -> list[str]:
    return ["run", "--session-id", sid, "--provider", "script", "--script", rig.script(responses), *extra, PROMPT]


def exited(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


# --------------------------------------------------------------------------------------------------- the seven points


def reach_prompt_accepted(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    child = rig.spawn(*script_run(rig, sid, [{"text": "never streamed"}]), failpoint="prompt-accepted")
    child.wait_failpoint("prompt-accepted", sid)
    return child


def reach_request_dispatched(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    server.push(hang())  # read the request, then hold it, answering nothing
    child = rig.spawn("run", "--session-id", sid, "--provider", "openai", "--model", "m-crash", PROMPT,
                      env=openai_env(server))
    wait_until(server.held.is_set, "the server to receive the request and hold it", child=child)
    assert server.requests[0].body["messages"][-1] == {"role": "user", "content": PROMPT}
    return child


def reach_mid_stream(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    # the role chunk and two text deltas go out, then the server holds the stream open
    server.push(text("", deltas=["Hello,", " brave", " new", " world"], hold_after=3))
    child = rig.spawn("run", "--session-id", sid, "--provider", "openai", "--model", "m-crash", PROMPT,
                      env=openai_env(server))
    wait_until(server.held.is_set, "the server to send two text deltas and hold the stream", child=child)
    # the chunks reach the OS within the write-behind window; kill only once they are in the store
    wait_until(lambda: rig.stored_types(sid).count("assistant/chunk") == 2, "two assistant/chunk events in the store",
               child=child, seen=lambda: rig.stored_types(sid))
    return child


SIDE_EFFECT = "echo $$ > side.pid; printf done > side.marker; sleep 60"
TWO_CALLS = [
    {"call_id": "call_side", "name": "run_command", "arguments": {"command": SIDE_EFFECT}},
    {"call_id": "call_later", "name": "write_file", "arguments": {"path": "later.txt", "content": "later"}},
]


def reach_tool_side_effect(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    marker = rig.ws / "side.marker"
    child = rig.spawn(*script_run(rig, sid, [{"text": "Two things.", "tool_calls": TWO_CALLS}], "--yes"))
    rig.process_groups.append(rig.ws / "side.pid")  # a safety net: the command now dies with cairn (parent-death)
    wait_until(lambda: marker.exists() and marker.read_text() == "done", "the command's side effect (side.marker)",
               child=child)
    # tool/progress is write-behind: wait until it reached the OS, so the stored part is the same every run
    wait_until(lambda: "tool/progress" in rig.stored_types(sid), "tool/progress written",
               child=child)
    return child


def reach_approval(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    calls = [
        {"call_id": "call_a", "name": "run_command", "arguments": {"command": "touch a.txt"}},
        {"call_id": "call_b", "name": "run_command", "arguments": {"command": "touch b.txt"}},
    ]
    child = rig.spawn(*script_run(rig, sid, [{"tool_calls": calls}]), failpoint="approval")
    child.wait_failpoint("approval", sid)
    # the answer and approval/asked are write-behind (no barrier until pre-tool; failpoints never flush): wait until
    # they reached the OS, as they do within the window while a real operator reads the dialog
    wait_until(lambda: rig.stored_types(sid)[-1:] == ["approval/asked"], "approval/asked written", child=child)
    return child


def reach_after_tool_result(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    calls = [
        {"call_id": "call_one", "name": "run_command", "arguments": {"command": "printf one > one.txt"}},
        {"call_id": "call_two", "name": "run_command", "arguments": {"command": "printf two > two.txt"}},
    ]
    child = rig.spawn(*script_run(rig, sid, [{"tool_calls": calls}], "--yes"), failpoint="after-tool-result")
    child.wait_failpoint("after-tool-result", sid)
    # the result is write-behind (durable at the next barrier; failpoints never flush): wait until it reached the OS
    wait_until(lambda: rig.stored_types(sid)[-1:] == ["tool/result"], "tool/result written", child=child)
    return child


def reach_turn_ended(rig: Rig, sid: str, server: OpenAIServer) -> Child:
    child = rig.spawn(*script_run(rig, sid, [{"text": "All done."}]), failpoint="turn-ended")
    child.wait_failpoint("turn-ended", sid)
    return child


# ------------------------------------------------------------------------------------------ key fields of each case


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def check_prompt_accepted(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    assert stored[3]["text"] == PROMPT and (stored[3]["turn"], stored[3]["step"]) == (1, 1)
    assert repair[0] == {**repair[0], "turn": 1, "step": 1}


def check_request_dispatched(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    header = stored[4]
    assert header["provider"] == "openai" and header["model"] == "m-crash"
    assert header["tools"] == TOOLS and header["message_count"] == 2  # system + the prompt
    assert KEY not in str(header)


def check_mid_stream(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    assert [e["delta"] for e in by_type(stored, "assistant/chunk")] == ["Hello,", " brave"]


def check_tool_side_effect(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    call = by_type(stored, "tool/call")[0]
    assert call["call_id"] == "call_side" and call["safety"] == "side_effecting" and call["parent_call_id"] is None
    assert (call["before_sha256"], call["after_sha256"]) == (None, None)  # not a file tool: no fingerprints
    assert [e["decision"] for e in by_type(stored, "approval/decided")] == ["allowed_once"]
    unknown, not_started = repair[0], repair[1]
    assert unknown == {**unknown, "call_id": "call_side", "is_error": True, "error_code": "TOOL_OUTCOME_UNKNOWN",
                       "source_seq": call["seq"], "content": outcome_unknown_text("run_command", "side_effecting")}
    assert "do NOT retry" in unknown["content"]
    assert not_started == {**not_started, "call_id": "call_later", "is_error": True,
                           "error_code": "TOOL_NOT_STARTED", "source_seq": None,
                           "content": not_started_text("write_file")}
    assert not (rig.ws / "later.txt").exists()  # NOT_STARTED is the truth: it never ran
    # SPEC §9 rev 3: after the closing turn/end, the evidence about the OUTCOME_UNKNOWN command: its recorded process
    # (the shell, pid in side.pid) was killed before `show`, so it is no longer running — still only `unknown`
    [progress] = by_type(stored, "tool/progress")
    pid = int((rig.ws / "side.pid").read_text())
    assert (progress["call_id"], progress["pid"]) == ("call_side", pid)
    evidence = repair[-1]
    assert evidence == {**evidence, "type": "recovery/evidence", "call_id": "call_side", "finding": "unknown",
                        "detail": f"its process (pid {pid}) is no longer running; what it did before it stopped is "
                                  "not known"}


def check_approval(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    assert stored[-1]["call_id"] == "call_a"  # approval/asked for the first call, never decided
    assert [(r["call_id"], r["error_code"], r["source_seq"]) for r in repair[:2]] == [
        ("call_a", "TOOL_NOT_STARTED", None), ("call_b", "TOOL_NOT_STARTED", None)]
    assert not (rig.ws / "a.txt").exists() and not (rig.ws / "b.txt").exists()


def check_after_tool_result(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    call, result = by_type(stored, "tool/call")[0], by_type(stored, "tool/result")[0]
    assert result == {**result, "call_id": "call_one", "is_error": False, "error_code": None,
                      "source_seq": call["seq"], "content": "[exit code 0]"}
    assert [(r["call_id"], r["error_code"]) for r in by_type(repair, "tool/result")] == [
        ("call_two", "TOOL_NOT_STARTED")]  # no synthetic result for call_one
    assert (rig.ws / "one.txt").read_text() == "one" and not (rig.ws / "two.txt").exists()


def check_turn_ended(stored: list[dict], repair: list[dict], rig: Rig) -> None:
    assert stored[-1] == {**stored[-1], "reason": "completed", "error": None}
    assert by_type(stored, "assistant/message")[0]["text"] == "All done."


@dataclass(frozen=True)
class Case:
    reach: Callable[[Rig, str, OpenAIServer], Child]
    stored: list[str]  # exact event types on disk when the child died
    repair: list[str]  # exact event types repair appends
    check: Callable[[list[dict], list[dict], Rig], None]


OPENING = ["turn/start", "workspace/snapshot", "step/start", "user/message"]  # the turn-start snapshot (SPEC §9)
REQUESTED = [*OPENING, "request/header"]
CLOSE = ["step/end", "turn/end"]
CASES = {
    "prompt-accepted": Case(reach_prompt_accepted, OPENING, CLOSE, check_prompt_accepted),
    "request-dispatched": Case(reach_request_dispatched, REQUESTED, CLOSE, check_request_dispatched),
    "mid-stream": Case(reach_mid_stream, [*REQUESTED, "assistant/chunk", "assistant/chunk"], CLOSE, check_mid_stream),
    "tool-side-effect": Case(
        reach_tool_side_effect,
        [*REQUESTED, "assistant/chunk", "assistant/message", "approval/asked", "approval/decided",
         "workspace/snapshot", "tool/call", "tool/progress"],  # the command's snapshot, durable with its tool/call
        ["tool/result", "tool/result", *CLOSE, "recovery/evidence"],  # evidence: the command had a recorded process
        check_tool_side_effect,
    ),
    "waiting-for-approval": Case(
        reach_approval, [*REQUESTED, "assistant/message", "approval/asked"], ["tool/result", "tool/result", *CLOSE],
        check_approval,
    ),
    "after-tool-result": Case(
        reach_after_tool_result,
        [*REQUESTED, "assistant/message", "approval/asked", "approval/decided", "workspace/snapshot", "tool/call",
         "tool/progress", "tool/result"],
        ["tool/result", *CLOSE],
        check_after_tool_result,
    ),
    "after-turn-end": Case(
        reach_turn_ended, [*REQUESTED, "assistant/chunk", "assistant/message", "step/end", "workspace/snapshot",
                           "turn/end"], [],
        check_turn_ended,
    ),
}


def crash_and_inspect(rig: Rig, sid: str, case: Case, server: OpenAIServer) -> tuple[list[dict], int]:
    """Reach the point, SIGKILL, then read the session cold. Returns `cairn show`'s events and how many are stored."""
    child = case.reach(rig, sid, server)
    child.kill()
    pid_files = list(rig.process_groups)
    rig.cleanup()  # a tool's own processes, which a SIGKILLed cairn cannot take down with it
    for pid_file in pid_files:  # dead (a zombie counts), so `show` and resume see the same world
        pid = int(pid_file.read_text().strip())
        wait_until(lambda: exited(pid), f"the killed command (pid {pid}) to exit")

    raw = rig.raw_log(sid)
    inspection = rig.inspect(sid)
    assert inspection.live_pid is None, "the kernel releases the lock of a killed process"
    before = rig.show(sid)
    assert rig.raw_log(sid) == raw, "`cairn show` must not write"

    n = len(inspection.events)
    assert types(before) == case.stored + case.repair, types(before)
    assert types(before[:n]) == case.stored, "the stored part"
    assert_contiguous(before)
    for event in before[n:]:
        assert event["time"] == before[n - 1]["time"], "repair reuses the last event's time"
    assert not any(e["type"] == "tool/result" and e["is_error"] and e["error_code"] is None for e in before)
    if case.repair:
        # repair closes the turn; only recovery/evidence (SPEC §9 rev 3) may follow its turn/end
        closing = max(i for i, e in enumerate(before) if e["type"] == "turn/end")
        end = before[closing]
        assert closing >= n, "the turn/end is repair's"
        assert end == {**end, "type": "turn/end", "turn": 1, "reason": "interrupted", "error": None}
        assert all(e["type"] == "recovery/evidence" for e in before[closing + 1:]), types(before)
    case.check(before[:n], before[n:], rig)
    return before, n


@pytest.mark.parametrize("point", list(CASES))
def test_sigkill_at_each_point_repairs_exactly_and_resume_commits_the_same_repair(rig, server, point):
    case = CASES[point]
    sid = f"crash-{point}"
    before, n = crash_and_inspect(rig, sid, case, server)

    resumed = rig.run("run", "--resume", sid, "--json", "--provider", "script", "--script",
                      rig.script([{"text": "Resumed."}]), "carry on")

    assert resumed.returncode == 0, resumed.stderr
    printed = json_lines(resumed.stdout)
    assert printed[: len(case.repair)] == before[n:], "the repair committed is the one `show` predicted, byte for byte"
    after = rig.show(sid)
    assert after[: len(before)] == before
    assert_contiguous(after)
    assert after[len(before)] == {**after[len(before)], "type": "turn/start", "turn": 2}
    assert after[-1] == {**after[-1], "type": "turn/end", "turn": 2, "reason": "completed"}
    assert rig.inspect(sid).repair == []


# ------------------------------------------------------------------------------------------- item 2: resume honestly


def test_resume_after_a_side_effect_crash_tells_the_model_the_outcome_is_unknown(rig, server):
    sid = "side-effect"
    before, n = crash_and_inspect(rig, sid, CASES["tool-side-effect"], server)
    unknown, not_started, evidence = before[n], before[n + 1], before[n + 4]
    assert (evidence["type"], evidence["call_id"]) == ("recovery/evidence", "call_side")
    server.push(text("I will check side.marker before anything else.", chunks=2), text("Still checking."))

    first = rig.run("run", "--resume", sid, "--provider", "openai", "--model", "m", "what happened?",
                    env=openai_env(server))

    assert first.returncode == 0, first.stderr
    assert "recovered call call_side" in first.stderr and "OUTCOME_UNKNOWN" in first.stderr
    messages = server.wait_for_requests(1).body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_side", "call_later"]
    assert messages[3] == {"role": "tool", "tool_call_id": "call_side", "content": unknown["content"]}
    assert messages[4] == {"role": "tool", "tool_call_id": "call_later", "content": not_started["content"]}
    assert "TOOL_OUTCOME_UNKNOWN" in messages[3]["content"] and "do NOT retry" in messages[3]["content"]
    # SPEC §9 rev 3: what Cairn checked is told to the model in the recovery note, before the operator's prompt
    note = f"[Cairn recovery] Cairn checked the interrupted call call_side (`run_command`): {evidence['detail']}."
    assert "is no longer running" in note
    assert messages[5] == {"role": "user", "content": f"{note}\n\nwhat happened?"}

    second = rig.run("run", "--resume", sid, "--json", "--provider", "openai", "--model", "m", "and now?",
                     env=openai_env(server))

    assert second.returncode == 0, second.stderr
    assert json_lines(second.stdout)[0]["type"] == "turn/start", "nothing left to repair"
    assert server.wait_for_requests(2).body["messages"][3:6] == messages[3:6]  # the results and the note stay
    after = rig.show(sid)
    assert after[: len(before)] == before
    assert_contiguous(after)
    assert len({e["seq"] for e in after}) == len(after)
    assert [(e["turn"], e["reason"]) for e in after if e["type"] == "turn/end"] == [
        (1, "interrupted"), (2, "completed"), (3, "completed")]


# ------------------------------------------------------------------------------------------------ item 4: two writers


def test_a_second_writer_is_refused_while_the_first_lives_and_resumes_once_it_is_killed(rig):
    sid = "two-writers"
    first = rig.spawn(*script_run(rig, sid, [{"text": "never streamed"}]), failpoint="prompt-accepted")
    first.wait_failpoint("prompt-accepted", sid)
    raw = rig.raw_log(sid)

    second = rig.run("run", "--resume", sid, "--provider", "script", "--script", rig.script([]), "x")

    assert second.returncode == 3, second.stderr
    assert "Traceback" not in second.stderr and second.stdout == ""
    assert second.stderr.strip().count("\n") == 0, second.stderr
    assert sid in second.stderr and f"process {first.pid}" in second.stderr
    assert rig.raw_log(sid) == raw, "the refused writer wrote nothing"
    reader = rig.run("show", sid, "--json")  # reading a live session is always allowed, shown as it stands
    assert reader.returncode == 0 and f"live in process {first.pid}" in reader.stderr
    assert types(json_lines(reader.stdout)) == OPENING

    first.kill()
    third = rig.run("run", "--resume", sid, "--provider", "script", "--script", rig.script([{"text": "Hi."}]), "x")

    assert third.returncode == 0, third.stderr
    after = rig.show(sid)
    assert_contiguous(after)
    assert types(after) == [*OPENING, *CLOSE, *OPENING, "request/header", "assistant/chunk", "assistant/message",
                            "step/end", "workspace/snapshot", "turn/end"]  # the second turn ended: its end snapshot
    assert [e["reason"] for e in after if e["type"] == "turn/end"] == ["interrupted", "completed"]
