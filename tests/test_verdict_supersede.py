"""A later verdict supersedes the earlier one (SPEC §11 rev 4): the model is told only the current verdict on a call,
with its note; the log keeps every verdict, and wherever the log is shown the earlier ones are marked superseded.

The session is a real one: a turn cut while `run_command` ran (repair makes it OUTCOME_UNKNOWN), resumed through the
real composition against the strict local OpenAI server, the operator recording verdict after verdict on the call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openai_server import OpenAIServer, text
from tui_helpers import DEPLOY, completed_turn, crashed_turn, make_world, wait_for, write_log

from cairn.app.agent.transcript import Transcript
from cairn.app.compose import open_agent
from cairn.app.config.resolver import resolve_config
from cairn.app.render import superseded_verdicts
from cairn.persistence.events import (
    AnyEvent,
    ContextCompaction,
    RecoveryVerdict,
    ToolCall,
    ToolResult,
)
from cairn.persistence.repair import repair_interrupted_turn
from cairn.persistence.store import SessionStore

CAIRN = str(Path(sys.executable).parent / "cairn")
CALL = DEPLOY.call_id
RECOVERY = "[Cairn recovery] The operator checked the interrupted call"
# what the operator recorded, one after another (the sequence: DID, did NOT, unknown, DID)
VERDICTS = [("happened", "the site answered"), ("did_not_happen", "no, that was the old build"),
            ("unknown", ""), ("happened", "release 1.4.0 is live")]


def recovered_log() -> list[AnyEvent]:
    """Turn 1 cut while `make deploy` ran, with what repair appended on resume."""
    events = crashed_turn()
    return events + repair_interrupted_turn(events)


def verdicts(pairs: list[tuple[str, str]]) -> list[RecoveryVerdict]:
    return [RecoveryVerdict(call_id=CALL, verdict=v, note=n) for v, n in pairs]  # type: ignore[arg-type]


def recovery_paragraphs(messages: list[dict]) -> list[str]:
    return [part for m in messages if m["role"] == "user" for part in str(m["content"]).split("\n\n")
            if part.startswith(RECOVERY)]


# -- what the model is told -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_several_verdicts_on_one_call_the_request_carries_only_the_newest_with_its_note(tmp_path):
    home = tmp_path / "home"
    store = SessionStore(home, "jsonl")
    write_log(store, "s", recovered_log())
    with OpenAIServer([text("Noted: it is live."), text("Tagging."), text("Done.")]) as server:
        config = resolve_config(home=str(home), provider="openai", model="strict", base_url=server.base_url,
                                workspace=str(tmp_path), env={"CAIRN_API_KEY": "sk-test", "CAIRN_SNAPSHOTS": "off"})
        async with open_agent(config, resume="s") as agent:
            for verdict, note in VERDICTS:  # all before the next turn, as the resume screen records them
                agent.loop.record_verdict(CALL, verdict, note)
            assert (await agent.run("so, is it deployed?")).reason == "completed"
            first = server.requests[-1].body["messages"]

            # later verdicts, turns later: the one told in turn 2 is taken back, the newest is told instead
            agent.loop.record_verdict(CALL, "did_not_happen", "rolled back by the on-call")
            assert (await agent.run("tag it anyway")).reason == "completed"
            agent.loop.record_verdict(CALL, "unknown", "the dashboard is down")
            agent.loop.record_verdict(CALL, "happened", "checked by hand: 1.4.0 again")
            assert (await agent.run("and now?")).reason == "completed"
            last = server.requests[-1].body["messages"]
            log = list(agent.session.events)
    assert not server.refusals, [(r.refused, r.violations) for r in server.refusals]

    assert recovery_paragraphs(first) == [
        f"{RECOVERY} {CALL} (`run_command`): it DID take effect. Operator's note: release 1.4.0 is live"]
    assert recovery_paragraphs(last) == [
        f"{RECOVERY} {CALL} (`run_command`): it DID take effect. Operator's note: checked by hand: 1.4.0 again"]
    prompts = [m["content"] for m in last if m["role"] == "user"]
    assert prompts[-1].endswith("and now?") and "so, is it deployed?" in prompts[1] and "tag it anyway" == prompts[2]
    # the log keeps every verdict, in order; all but the newest are superseded
    kept = [(e.verdict, e.note) for e in log if isinstance(e, RecoveryVerdict)]
    assert kept == [*VERDICTS, ("did_not_happen", "rolled back by the on-call"), ("unknown", "the dashboard is down"),
                    ("happened", "checked by hand: 1.4.0 again")]
    seqs = [e.seq for e in log if isinstance(e, RecoveryVerdict)]
    assert superseded_verdicts(log) == dict(zip(seqs[:-1], seqs[1:]))


def test_verdicts_on_two_calls_each_keep_their_own_current_one():
    events = recovered_log()
    other = ToolResult(turn=1, step=1, call_id="other", is_error=True, content="x", error_code="TOOL_OUTCOME_UNKNOWN",
                       source_seq=None)
    log = [*events, other, RecoveryVerdict(call_id=CALL, verdict="happened", note="a"),
           RecoveryVerdict(call_id="other", verdict="did_not_happen", note="b"),
           RecoveryVerdict(call_id=CALL, verdict="unknown", note="c"), *completed_turn(2, "next", "ok")]
    for seq, e in enumerate(log):
        e.seq = seq
    transcript = Transcript(log)
    transcript.extend(log)
    told = recovery_paragraphs(transcript.messages)
    assert told == [f"{RECOVERY} other (`a tool`): it did NOT take effect. Operator's note: b",
                    f"{RECOVERY} {CALL} (`run_command`): it is still unknown whether it took effect. Operator's note: c"]


def test_a_verdict_after_a_compaction_supersedes_the_verdict_its_summary_carried():
    call = ToolCall(turn=1, step=1, call_id="c1", name="run_command", arguments={"command": "deploy"},
                    safety="side_effecting", parent_call_id=None)
    fact = {"call_id": "c1", "name": "run_command", "arguments": {"command": "deploy"}, "status": "OUTCOME_UNKNOWN",
            "told": "may have run; do NOT retry", "verdict": "happened", "note": "it looked live"}
    compaction = ContextCompaction(summary="We deployed.", through_seq=5, model="m", carried=[fact])
    later = RecoveryVerdict(call_id="c1", verdict="did_not_happen", note="it was the old build")
    for seq, e in ((3, call), (6, compaction), (7, later)):
        e.seq = seq
    transcript = Transcript([call, compaction, later])
    transcript.add(compaction)
    assert "Operator's verdict: happened" in transcript.messages[0]["content"]
    transcript.add(later)
    (message,) = transcript.messages
    assert "Operator's verdict" not in message["content"] and "it looked live" not in message["content"]
    assert "call c1 `run_command`" in message["content"]  # the call itself is still carried, verbatim
    assert message["content"].endswith(f"{RECOVERY} c1 (`run_command`): it did NOT take effect. "
                                       "Operator's note: it was the old build")
    assert compaction.carried[0]["verdict"] == "happened"  # the event itself (the log) is not changed


def test_two_verdicts_in_one_message_leave_the_prompt_and_the_newest():
    log = [*recovered_log(), *verdicts(VERDICTS[:2]), *completed_turn(2, "go on", "ok")]
    transcript = Transcript(log)
    transcript.extend(log)
    assert transcript.messages[-2]["content"] == (
        f"{RECOVERY} {CALL} (`run_command`): it did NOT take effect. Operator's note: no, that was the old build"
        "\n\ngo on")


# -- where the log is shown -----------------------------------------------------------------------------------------


def shown_log(tmp_path: Path) -> tuple[SessionStore, list[AnyEvent]]:
    home = tmp_path / "home"
    store = SessionStore(home, "jsonl")
    log = [*recovered_log(), *verdicts(VERDICTS), *completed_turn(2, "so?", "Live.")]
    write_log(store, "s", log)
    return store, store.backend.load("s").events


def test_cairn_show_marks_the_earlier_verdicts_superseded(tmp_path):
    _, events = shown_log(tmp_path)
    seqs = [e.seq for e in events if isinstance(e, RecoveryVerdict)]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CAIRN_HOME": str(tmp_path / "home")}
    shown = subprocess.run([CAIRN, "show", "s"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "verdict on" in line]
    assert lines == [
        f"  ✓ verdict on {CALL}: happened (the site answered) [superseded by the verdict at seq {seqs[1]}]",
        f"  ✓ verdict on {CALL}: did_not_happen (no, that was the old build) [superseded by the verdict at seq "
        f"{seqs[2]}]",
        f"  ✓ verdict on {CALL}: unknown [superseded by the verdict at seq {seqs[3]}]",
        f"  ✓ verdict on {CALL}: happened (release 1.4.0 is live)",
    ]
    export = subprocess.run([CAIRN, "export", "s"], env=env, capture_output=True, text=True, timeout=60)
    assert export.returncode == 0, export.stderr
    marked = [line for line in export.stdout.splitlines() if line.startswith("**Operator verdict**")]
    assert len(marked) == 4 and all("superseded" in line for line in marked[:3]) and "superseded" not in marked[3]


def test_the_inspector_marks_the_earlier_verdicts_superseded(tmp_path):
    from cairn.app.inspect.model import InspectorModel

    _, events = shown_log(tmp_path)
    model = InspectorModel("s", events)
    rows = [model.summary(i) for i, e in enumerate(events) if isinstance(e, RecoveryVerdict)]
    seqs = [e.seq for e in events if isinstance(e, RecoveryVerdict)]
    assert rows == [f"verdict: happened (the site answered) · superseded by seq {seqs[1]}",
                    f"verdict: did_not_happen (no, that was the old build) · superseded by seq {seqs[2]}",
                    f"verdict: unknown · superseded by seq {seqs[3]}",
                    "verdict: happened (release 1.4.0 is live)"]


@pytest.mark.anyio
async def test_the_resumed_chat_marks_the_earlier_verdicts_superseded_and_a_new_one_supersedes_live(tmp_path):
    from cairn.widgets.transcript import VerdictNotice

    world = make_world(tmp_path, [{"text": "ok"}])
    # many turns after the verdicts, so the verdicts' turn is built after the newer ones (history from the tail)
    later = [e for turn in range(3, 40) for e in completed_turn(turn, f"prompt {turn}", "answer\n" * 3)]
    log = [*recovered_log(), *verdicts(VERDICTS[:2]), *completed_turn(2, "so?", "Live."),
           *verdicts(VERDICTS[2:]), *later]
    write_log(world.store, "s", log)
    app = world.resume_app("s")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat and app.chat.agent is not None, "the chat")
        transcript = app.chat.query_one("#transcript")
        await transcript.scroll_to_start()
        await wait_for(pilot, lambda: len(app.chat.query(VerdictNotice)) == 4, "the four verdicts")
        notices = list(app.chat.query(VerdictNotice))
        texts = [str(n.render()) for n in notices]
        assert [("superseded" in t) for t in texts] == [True, True, True, False], texts
        assert [n.has_class("-superseded") for n in notices] == [True, True, True, False]
        assert texts[3] == f"verdict on {CALL}: happened — release 1.4.0 is live"

        app.chat.agent.loop.record_verdict(CALL, "did_not_happen", "rolled back")
        await wait_for(pilot, lambda: len(app.chat.query(VerdictNotice)) == 5, "the new verdict")
        notices = list(app.chat.query(VerdictNotice))
        await wait_for(pilot, lambda: notices[3].has_class("-superseded"), "the old current one superseded")
        assert "superseded" in str(notices[3].render()) and "superseded" not in str(notices[4].render())
        await pilot.press("ctrl+q")
