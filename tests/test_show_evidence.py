"""Recovery evidence (SPEC §9 rev 3) where a recovered call is shown: `cairn show` prints it under the call.

The session is made for real: a `cairn run` child writes `notes.txt` in turn 1, a second one is SIGKILLed in turn 2 just
after `write_file` replaced the file and before its result was appended (the `tool-body-done` failpoint), so repair
calls the write OUTCOME_UNKNOWN and Cairn, comparing the file with the call's fingerprints, finds it `happened`.
`crash_after_a_write` is shared with the export, inspector and ACP tests.
"""

from __future__ import annotations

import pytest

from crash_harness import Rig

SID = "evidence"
CALL = "call_final"
EVIDENCE_DETAIL = "notes.txt holds the intended content"


def write_note(call_id: str, content: str) -> list[dict]:
    return [{"text": "Writing the notes.", "tool_calls": [
        {"call_id": call_id, "name": "write_file", "arguments": {"path": "notes.txt", "content": content}}]},
        {"text": "Written."}]


def crash_after_a_write(rig: Rig, sid: str = SID) -> None:
    """Turn 1 writes `draft`; turn 2's write of `final` reaches the disk, then the process is SIGKILLed before its
    result is appended."""
    first = rig.run("run", "--session-id", sid, "--yes", "--provider", "script", "--script",
                    rig.script(write_note("call_draft", "draft\n")), "write a draft")
    assert first.returncode == 0, first.stderr
    child = rig.spawn("run", "--resume", sid, "--yes", "--provider", "script", "--script",
                      rig.script(write_note(CALL, "final\n")), "make it final", failpoint="tool-body-done")
    child.wait_failpoint("tool-body-done", sid)
    child.kill()
    assert (rig.ws / "notes.txt").read_text() == "final\n"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path)
    yield rig
    rig.cleanup()


def test_show_prints_the_evidence_under_the_recovered_call(rig):
    crash_after_a_write(rig)
    before = rig.raw_log(SID)
    proc = rig.run("show", SID)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if f"← write_file {CALL}: OUTCOME_UNKNOWN" in line)
    assert lines[at + 1].startswith(f"    evidence: happened — {EVIDENCE_DETAIL}"), lines[at:at + 3]
    assert sum("evidence:" in line for line in lines) == 1  # shown once, with its call, not again at its own place
    as_json = [e for e in rig.show(SID) if e["type"] == "recovery/evidence"]
    assert [(e["call_id"], e["finding"]) for e in as_json] == [(CALL, "happened")]
    assert rig.raw_log(SID) == before, "show writes nothing"

    # resumed: the evidence is now in the log, after the repaired turn's end, and still shown under the call
    resumed = rig.run("run", "--resume", SID, "--provider", "script", "--script", rig.script([{"text": "ok"}]), "go on")
    assert resumed.returncode == 0, resumed.stderr
    lines = rig.run("show", SID).stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if f"← write_file {CALL}: OUTCOME_UNKNOWN" in line)
    assert "[repair]" not in lines[at] and lines[at + 1].startswith(f"    evidence: happened — {EVIDENCE_DETAIL}")


def test_show_escapes_control_characters_in_evidence(tmp_path):
    from cairn.app.render import render_session
    from cairn.persistence.events import RecoveryEvidence, ToolResult
    from cairn.widgets.terminal_text import safe_text

    events = [ToolResult(turn=1, step=1, call_id="c1", is_error=True, content="TOOL_OUTCOME_UNKNOWN: x",
                         error_code="TOOL_OUTCOME_UNKNOWN", source_seq=None),
              RecoveryEvidence(call_id="c1", finding="unknown", detail="evil\x1b[31mname holds neither")]
    shown = safe_text(render_session(events))
    assert "\x1b" not in shown and "evidence: unknown — evil" in shown
