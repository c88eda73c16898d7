"""The derived conversation is always one a strict server accepts (SPEC §7 "A session is always continuable").

Three parts: the rules checker itself (tests/conversation_rules.py) on hand-made good and bad conversations; the
transcript on targeted logs, asserting the exact messages it derives; and a property test over random logs written the
way the loop and repair write them (crash cut anywhere, repaired, resumed), checked before every request.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from conversation_rules import KINDS, Violation, conversation_violations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.app.agent.transcript import NO_RESULT, Transcript
from cairn.persistence.events import (
    ABORTED_BEFORE_DISPATCH,
    BAD_ARGUMENTS,
    DENIED,
    TOOL_OUTCOME_UNKNOWN,
    TRUNCATED,
    UNKNOWN_TOOL,
    AnyEvent,
    ApprovalAsked,
    ApprovalDecided,
    AssistantChunk,
    AssistantMessage,
    ReasoningChunk,
    RecoveryVerdict,
    RequestHeader,
    RequestRetry,
    StepEnd,
    StepStart,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    TurnEnd,
    TurnError,
    TurnStart,
    UserMessage,
)
from cairn.persistence.repair import outcome_unknown_text, repair_interrupted_turn

SYSTEM = {"role": "system", "content": "You are Cairn."}


def call(call_id: str, name: str = "read_file", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    message.update(extra)
    return message


def tool(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def kinds(messages: list[dict[str, Any]], **options: Any) -> list[str]:
    return [v.kind for v in conversation_violations(messages, **options)]


# -- the rules checker ----------------------------------------------------------------------------------------------

GOOD = {
    "one prompt": [SYSTEM, user("hi")],
    "no system message": [user("hi")],
    "text answer then prompt": [SYSTEM, user("hi"), assistant("hello"), user("bye")],
    "two calls answered in order": [
        SYSTEM, user("hi"), assistant(None, call("a"), call("b")), tool("a"), tool("b"),
    ],
    "tool run then answer then prompt": [
        SYSTEM, user("hi"), assistant("look", call("a", arguments='{"path": "x"}')), tool("a"), assistant("done"),
        user("more"),
    ],
    "tool run then prompt": [SYSTEM, user("hi"), assistant(None, call("a")), tool("a"), user("go on")],
    "reasoning where required": [
        SYSTEM, user("hi"), assistant(None, call("a"), reasoning_content="think"), tool("a"),
    ],
}


@pytest.mark.parametrize("name", GOOD)
def test_rules_accept_good_conversations(name):
    assert conversation_violations(GOOD[name]) == []
    if name == "reasoning where required":
        assert conversation_violations(GOOD[name], require_reasoning=True) == []


def test_rules_name_first_not_user():
    assert kinds([SYSTEM, assistant("hello"), user("hi")]) == ["first_not_user"]
    assert kinds([SYSTEM]) == ["first_not_user"]


def test_rules_name_alternation():
    assert kinds([SYSTEM, user("a"), user("b")]) == ["alternation"]
    assert kinds([SYSTEM, user("a"), assistant("x"), assistant("y"), user("b")]) == ["alternation"]
    # a request must end with user or tool: an assistant message last is the model talking to itself
    assert conversation_violations([SYSTEM, user("a"), assistant("x")]) == [
        Violation("alternation", 2, "a request must end with a user or tool message, not 'assistant'")
    ]
    assert kinds([SYSTEM, user("a"), SYSTEM]) == ["alternation", "alternation"]  # misplaced, and ends the request


def test_rules_name_unanswered_tool_call():
    assert kinds([SYSTEM, user("a"), assistant(None, call("x"), call("y")), tool("x"), user("b")]) == [
        "unanswered_tool_call"
    ]
    assert kinds([SYSTEM, user("a"), assistant(None, call("x"), call("y")), tool("y"), tool("x")]) == [
        "unanswered_tool_call", "orphan_tool_message"  # out of order: y answered first, then x has no open call
    ]


def test_rules_name_orphan_tool_message():
    assert conversation_violations([SYSTEM, user("a"), tool("x")]) == [
        Violation("orphan_tool_message", 2, "tool message for 'x' answers no open tool call")
    ]
    assert kinds([SYSTEM, user("a"), assistant(None, call("x")), tool("x"), tool("x")]) == ["orphan_tool_message"]


def test_rules_name_bad_arguments():
    for arguments in ["{not json", "[1, 2]", "3", '{"a": NaN}', ""]:
        assert kinds([SYSTEM, user("a"), assistant(None, call("x", arguments=arguments)), tool("x")]) == [
            "bad_arguments"
        ], arguments
    not_a_string = {"id": "x", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert kinds([SYSTEM, user("a"), assistant(None, not_a_string), tool("x")]) == ["bad_arguments"]


def test_rules_name_duplicate_id():
    within = [SYSTEM, user("a"), assistant(None, call("x"), call("x")), tool("x"), tool("x")]
    assert kinds(within) == ["duplicate_id"]
    across = [SYSTEM, user("a"), assistant(None, call("x")), tool("x"), assistant("ok"), user("b"),
              assistant(None, call("x")), tool("x")]
    assert kinds(across) == ["duplicate_id"]
    assert kinds([SYSTEM, user("a"), assistant(None, call("")), tool("")]) == ["duplicate_id", "orphan_tool_message"]


def test_rules_name_missing_reasoning_only_when_required_and_only_in_the_current_turn():
    earlier_turn_without = [SYSTEM, user("a"), assistant(None, call("x")), tool("x"), assistant("done"), user("b"),
                            assistant(None, call("y"), reasoning_content="why"), tool("y")]
    assert kinds(earlier_turn_without, require_reasoning=True) == []
    current_without = [SYSTEM, user("a"), assistant(None, call("x"), reasoning_content=""), tool("x")]
    assert kinds(current_without, require_reasoning=True) == ["missing_reasoning"]
    assert kinds(current_without) == []


def test_rules_name_bad_content():
    assert kinds([SYSTEM, user("")]) == ["bad_content"]
    assert kinds([SYSTEM, user("a"), assistant(""), user("b")]) == ["bad_content"]
    assert kinds([SYSTEM, user("a"), assistant(None), user("b")]) == ["bad_content"]
    assert kinds([SYSTEM, user("a"), assistant(None, call("x")), tool("x", "")]) == ["bad_content"]
    assert kinds([SYSTEM, {"role": "user", "content": None}]) == ["bad_content"]


def test_every_kind_is_exercised():
    seen = {v.kind for case in [
        [SYSTEM, assistant("x")], [SYSTEM, user("a"), user("b")], [SYSTEM, user("a"), tool("x")],
        [SYSTEM, user("a"), assistant(None, call("x", arguments="[]"), call("x"), call("y"))],
        [SYSTEM, user("")],
    ] for v in conversation_violations(case, require_reasoning=True)}
    assert seen == set(KINDS)


# -- targeted logs --------------------------------------------------------------------------------------------------


class Log:
    """Events appended the way the live session does it: seq contiguous from 0, time increasing."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []

    def __call__(self, event: AnyEvent) -> AnyEvent:
        event.seq, event.time = len(self.events), 1_000 + 5 * len(self.events)
        self.events.append(event)
        return event

    def prompt(self, turn: int, text: str) -> None:
        self(TurnStart(turn=turn))
        self(StepStart(turn=turn, step=1))
        self(UserMessage(turn=turn, step=1, text=text))
        self(RequestHeader(turn=turn, step=1, provider="p", model="m", params={}, tools=[], message_count=0))

    def next_step(self, turn: int, step: int) -> None:
        self(StepEnd(turn=turn, step=step - 1))
        self(StepStart(turn=turn, step=step))
        self(RequestHeader(turn=turn, step=step, provider="p", model="m", params={}, tools=[], message_count=0))

    def answer(self, turn: int, step: int, text: str, *calls: tuple[str, str, Any], **fields: Any) -> None:
        requests = [ToolCallRequest(i, name, args) for i, name, args in calls]
        finish = fields.pop("finish_reason", "tool_calls" if calls else "stop")
        self(AssistantMessage(turn=turn, step=step, text=text, tool_calls=requests, interrupted=False,
                              finish_reason=finish, **fields))

    def run(self, turn: int, step: int, call_id: str, name: str, arguments: Any, content: str,
            error_code: str | None = None) -> ToolCall:
        recorded = self(ToolCall(turn=turn, step=step, call_id=call_id, name=name, arguments=arguments,
                                 safety="read_only", parent_call_id=None))
        self(ToolResult(turn=turn, step=step, call_id=call_id, is_error=error_code is not None, content=content,
                        error_code=error_code, source_seq=recorded.seq))
        return recorded

    def unrun(self, turn: int, step: int, call_id: str, code: str, content: str) -> None:
        self(ToolResult(turn=turn, step=step, call_id=call_id, is_error=True, content=content, error_code=code,
                        source_seq=None))

    def end(self, turn: int, step: int | None, reason: str = "completed", error: TurnError | None = None) -> None:
        if step is not None:
            self(StepEnd(turn=turn, step=step))
        self(TurnEnd(turn=turn, reason=reason, error=error))

    def repair(self) -> None:
        for event in repair_interrupted_turn(self.events):
            self.events.append(event)

    def conversation(self) -> list[dict[str, Any]]:
        transcript = Transcript()
        transcript.extend(self.events)
        assert conversation_violations([SYSTEM, *transcript.messages]) == []
        return transcript.messages


def test_a_step_one_http_error_then_a_new_prompt_is_one_user_message():
    log = Log()
    log.prompt(1, "fix the bug")
    log(AssistantMessage(turn=1, step=1, text="", tool_calls=[], interrupted=True))  # the stream had begun
    log.end(1, 1, "error", TurnError("HTTP_400", "bad request"))
    log.prompt(2, "try again")
    assert log.conversation() == [user("fix the bug\n\ntry again")]


def test_a_crash_mid_stream_repaired_then_resumed_keeps_roles_alternating():
    log = Log()
    log.prompt(1, "write it")
    log(AssistantChunk(turn=1, step=1, delta="Half an ans"))  # SIGKILL here: no assistant/message
    log.repair()
    assert [type(e).__name__ for e in log.events[-2:]] == ["StepEnd", "TurnEnd"]
    log.prompt(2, "continue")
    assert log.conversation() == [user("write it\n\ncontinue")]


def test_an_empty_answer_vanishes_and_an_interrupted_one_keeps_its_text():
    log = Log()
    log.prompt(1, "one")
    log.answer(1, 1, "")
    log.end(1, 1)
    log.prompt(2, "two")
    log(AssistantMessage(turn=2, step=1, text="I was say", tool_calls=[], interrupted=True))
    log.end(2, 1, "cancelled")
    log.prompt(3, "three")
    log(AssistantMessage(turn=3, step=1, text="", tool_calls=[], interrupted=True))
    log.end(3, 1, "cancelled")
    log.prompt(4, "four")
    assert log.conversation() == [user("one\n\ntwo"), assistant("I was say"), user("three\n\nfour")]


def test_arguments_that_are_not_a_json_object_are_sent_back_as_an_empty_object():
    log = Log()
    log.prompt(1, "go")
    log.answer(1, 1, "", ("a", "write_file", '{"path": "x", '), ("b", "read_file", [1, 2]),
               ("c", "read_file", {"path": "ü"}))
    log.run(1, 1, "a", "write_file", '{"path": "x", ', "The arguments are not valid JSON; send a JSON object.",
            BAD_ARGUMENTS)
    log.run(1, 1, "b", "read_file", [1, 2], "The arguments are not a JSON object; send a JSON object.", BAD_ARGUMENTS)
    log.run(1, 1, "c", "read_file", {"path": "ü"}, "text")
    log.next_step(1, 2)
    log.answer(1, 2, "done")
    log.end(1, 2)
    log.prompt(2, "next")
    assert log.conversation() == [
        user("go"),
        assistant(None, call("a", "write_file", "{}"), call("b", "read_file", "{}"),
                  call("c", "read_file", '{"path": "ü"}')),
        tool("a", "The arguments are not valid JSON; send a JSON object."),
        tool("b", "The arguments are not a JSON object; send a JSON object."),
        tool("c", "text"),
        assistant("done"),
        user("next"),
    ]


def test_an_id_repeated_within_one_answer_is_renamed_and_each_result_follows_its_call():
    log = Log()
    log.prompt(1, "go")
    log.answer(1, 1, "", ("a", "run_command", {"command": "rm x"}), ("a", "read_file", {"path": "y"}),
               ("a", "read_file", {"path": "z"}))
    log.unrun(1, 1, "a", DENIED, "The operator denied this call; it did not run.")
    first = log(ToolCall(turn=1, step=1, call_id="a", name="read_file", arguments={"path": "y"}, safety="read_only",
                         parent_call_id=None))  # SIGKILL while it runs; the third call never began
    log.repair()
    log.prompt(2, "what happened?")
    messages = log.conversation()
    assert messages == [
        user("go"),
        assistant(None, call("a", "run_command", '{"command": "rm x"}'), call("a-dup", "read_file", '{"path": "y"}'),
                  call("a-dup#2", "read_file", '{"path": "z"}')),
        tool("a", "The operator denied this call; it did not run."),
        tool("a-dup", outcome_unknown_text("read_file", "read_only")),
        tool("a-dup#2", messages[4]["content"]),
        user("what happened?"),
    ]
    assert messages[4]["content"].startswith("TOOL_NOT_STARTED")
    repaired = [e for e in log.events if isinstance(e, ToolResult) and e.error_code == TOOL_OUTCOME_UNKNOWN]
    assert [r.source_seq for r in repaired] == [first.seq]


def test_an_id_reused_across_answers_is_renamed_past_every_id_already_shown():
    log = Log()
    log.prompt(1, "one")
    log.answer(1, 1, "", ("a", "read_file", {}))
    log.run(1, 1, "a", "read_file", {}, "first")
    log.next_step(1, 2)
    log.answer(1, 2, "", ("a", "read_file", {}), ("a-dup", "read_file", {}))  # a server counting from scratch
    log.run(1, 2, "a", "read_file", {}, "second")
    log.run(1, 2, "a-dup", "read_file", {}, "third")
    log.next_step(1, 3)
    log.answer(1, 3, "ok")
    log.end(1, 3)
    log.prompt(2, "two")
    log.answer(2, 1, "", ("a", "read_file", {}))
    log.run(2, 1, "a", "read_file", {}, "fourth")
    log.end(2, 1)  # the turn ends without a final answer (max steps)
    log.prompt(3, "three")
    assert log.conversation() == [
        user("one"),
        assistant(None, call("a")), tool("a", "first"),
        assistant(None, call("a-dup"), call("a-dup-dup")), tool("a-dup", "second"), tool("a-dup-dup", "third"),
        assistant("ok"),
        user("two"),
        assistant(None, call("a-dup#2")), tool("a-dup#2", "fourth"),
        user("three"),
    ]


def test_verdicts_and_the_next_prompt_are_one_user_message_after_the_repaired_results():
    log = Log()
    log.prompt(1, "deploy")
    log.answer(1, 1, "Deploying.", ("d1", "run_command", {"command": "make deploy"}))
    log(ApprovalAsked(turn=1, step=1, call_id="d1"))
    log(ApprovalDecided(turn=1, step=1, call_id="d1", decision="allowed_once"))
    log(ToolCall(turn=1, step=1, call_id="d1", name="run_command", arguments={"command": "make deploy"},
                 safety="side_effecting", parent_call_id=None))  # SIGKILL while it runs
    log.repair()
    log(RecoveryVerdict(call_id="d1", verdict="happened", note="site is up"))
    log.prompt(2, "now tag it")
    assert log.conversation() == [
        user("deploy"),
        assistant("Deploying.", call("d1", "run_command", '{"command": "make deploy"}')),
        tool("d1", outcome_unknown_text("run_command", "side_effecting")),
        user("[Cairn recovery] The operator checked the interrupted call d1 (`run_command`): it DID take effect. "
             "Operator's note: site is up\n\nnow tag it"),
    ]


def test_truncated_answers_keep_their_calls_with_truncated_results_and_cut_arguments_as_an_empty_object():
    log = Log()
    log.prompt(1, "write two files")
    log.answer(1, 1, "Writing", ("w1", "write_file", {"path": "a", "text": "x"}), ("w2", "write_file", '{"path": "b'),
               finish_reason="length")
    log.unrun(1, 1, "w1", TRUNCATED, "Not run: cut off.")
    log.unrun(1, 1, "w2", TRUNCATED, "Not run: cut off.")
    log.end(1, 1, "error", TurnError("MAX_TOKENS", "limit"))
    log.prompt(2, "shorter please")
    assert log.conversation() == [
        user("write two files"),
        assistant("Writing", call("w1", "write_file", '{"path": "a", "text": "x"}'), call("w2", "write_file", "{}")),
        tool("w1", "Not run: cut off."),
        tool("w2", "Not run: cut off."),
        user("shorter please"),
    ]


def test_reasoning_is_sent_back_for_the_current_turn_only():
    log = Log()
    log.prompt(1, "one")
    log(ReasoningChunk(turn=1, step=1, delta="hmm"))
    log.answer(1, 1, "", ("r1", "read_file", {}), reasoning="I should read r1")
    log.run(1, 1, "r1", "read_file", {}, "content")
    log.next_step(1, 2)
    transcript = Transcript()
    transcript.extend(log.events)
    seen = len(log.events)
    # during turn 1, its answer with calls carries its reasoning (DeepSeek thinking mode refuses the request without)
    assert transcript.messages[1] == assistant(None, call("r1"), reasoning_content="I should read r1")
    assert conversation_violations([SYSTEM, *transcript.messages], require_reasoning=True) == []

    log.answer(1, 2, "done", reasoning="final thoughts")
    log.end(1, 2)
    log.prompt(2, "two")
    log.answer(2, 1, "", ("r2", "read_file", {}), reasoning="now r2")
    log.run(2, 1, "r2", "read_file", {}, "more")
    log.next_step(2, 2)
    log.answer(2, 2, "", ("r3", "read_file", {}))  # this answer streamed no reasoning: nothing to send back
    log.run(2, 2, "r3", "read_file", {}, "again")
    log.next_step(2, 3)
    transcript.extend(log.events[seen:])  # incrementally, as the loop feeds it
    assert transcript.messages == [
        user("one"),
        assistant(None, call("r1")), tool("r1", "content"),
        assistant("done"),  # no tool calls: its reasoning is never sent back
        user("two"),
        assistant(None, call("r2"), reasoning_content="now r2"), tool("r2", "more"),
        assistant(None, call("r3")), tool("r3", "again"),
    ]


def test_nested_calls_stay_out_and_a_call_without_any_result_still_gets_a_tool_message():
    log = Log()
    log.prompt(1, "go")
    log.answer(1, 1, "", ("p", "delegate", {}), ("q", "read_file", {}))
    parent = log(ToolCall(turn=1, step=1, call_id="p", name="delegate", arguments={}, safety="side_effecting",
                          parent_call_id=None))
    nested = log(ToolCall(turn=1, step=1, call_id="p.1", name="read_file", arguments={}, safety="read_only",
                          parent_call_id="p"))
    log(ToolResult(turn=1, step=1, call_id="p.1", is_error=False, content="inner", error_code=None,
                   source_seq=nested.seq))
    log(ToolResult(turn=1, step=1, call_id="p", is_error=False, content="outer", error_code=None,
                   source_seq=parent.seq))
    log.end(1, 1, "error", TurnError("INTERNAL_ERROR", "a bug lost q's result"))
    log.prompt(2, "again")
    assert log.conversation() == [
        user("go"), assistant(None, call("p", "delegate"), call("q")), tool("p", "outer"), tool("q", NO_RESULT),
        user("again"),
    ]


def test_a_log_that_starts_mid_way_drops_what_comes_before_the_first_user_content():
    log = Log()
    log(AssistantMessage(turn=1, step=1, text="orphan answer", tool_calls=[ToolCallRequest("x", "read_file", {})],
                         interrupted=False))
    log.unrun(1, 1, "x", UNKNOWN_TOOL, "?")
    log.end(1, 1)
    log.prompt(2, "hello")
    assert log.conversation() == [user("hello")]


def test_aborted_calls_after_a_cancelled_approval_pair_by_position():
    log = Log()
    log.prompt(1, "go")
    log.answer(1, 1, "", ("x", "write_file", {"path": "a"}), ("x", "write_file", {"path": "b"}))
    log(ApprovalAsked(turn=1, step=1, call_id="x"))
    log(ApprovalDecided(turn=1, step=1, call_id="x", decision="cancelled"))
    log.unrun(1, 1, "x", ABORTED_BEFORE_DISPATCH, "Not run: first.")
    log.unrun(1, 1, "x", ABORTED_BEFORE_DISPATCH, "Not run: second.")
    log.end(1, 1, "cancelled")
    log.prompt(2, "go on")
    assert log.conversation()[2:4] == [tool("x", "Not run: first."), tool("x-dup", "Not run: second.")]


# -- end to end: the real loop against the strict local server ----------------------------------------------------


@pytest.mark.anyio
async def test_the_real_loop_continues_after_an_http_error_and_invalid_json_past_a_strict_server(tmp_path):
    """Before rev 2 a real server refused the second prompt (two user messages) and the invalid arguments."""
    from openai_server import OpenAIServer, error, text, tool_calls

    from cairn.app.agent.approval import headless_approver
    from cairn.app.compose import open_agent
    from cairn.app.config.resolver import resolve_config
    from cairn.app.tools.registry import ToolRegistry, builtin_tools

    workspace = tmp_path / "ws"
    workspace.mkdir()
    behaviours = [
        error(400, "context too long"),  # not retryable: the first turn ends in error before any answer
        tool_calls([{"id": "call_1", "name": "read_file", "arguments": '{"path": "a.txt", '}]),
        text("My JSON was broken."),
    ]
    with OpenAIServer(behaviours) as server:
        config = resolve_config(home=str(tmp_path / "home"), provider="openai", model="m", base_url=server.base_url,
                                workspace=str(workspace), env={})
        async with open_agent(config, approver=headless_approver(True), tools=ToolRegistry(builtin_tools())) as agent:
            first = await agent.run("summarise the repo")
            second = await agent.run("then read a.txt")
        requests = list(server.requests)

    assert (first.reason, second.reason) == ("error", "completed")
    assert [r.refused for r in requests] == [None, None, None]
    bodies = [r.body["messages"] for r in requests]
    assert bodies[1][1:] == [user("summarise the repo\n\nthen read a.txt")]
    assert bodies[2][2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert bodies[2][3]["tool_call_id"] == "call_1" and "not valid JSON" in bodies[2][3]["content"]
    for messages in bodies:
        assert conversation_violations(messages) == []


# -- property: any log the loop and repair can write ----------------------------------------------------------------

TOOLS = {"read_file": "read_only", "write_file": "idempotent", "run_command": "side_effecting"}


@st.composite
def logs(draw) -> tuple[list[AnyEvent], bool]:
    """A session as the loop writes it, cut by a crash anywhere, repaired, resumed, then a new prompt.

    Returns the events and whether every answer streamed reasoning (then DeepSeek's rule must hold too)."""
    log = Log()
    reasoning = draw(st.booleans())
    fresh = itertools.count(1)
    used: list[str] = []
    turn_no = itertools.count(1)

    def pick_id(this_answer: list[str]) -> str:
        how = draw(st.sampled_from(["fresh", "fresh", "fresh", "reuse", "repeat", "dup-literal", "empty"]))
        if how == "reuse" and used:
            return draw(st.sampled_from(used))
        if how == "repeat" and this_answer:
            return draw(st.sampled_from(this_answer))
        if how == "dup-literal" and used:
            return f"{draw(st.sampled_from(used))}-dup"
        if how == "empty":
            return ""
        return f"c{next(fresh)}"

    def run_body(turn: int, step: int, request: ToolCallRequest, safety: str) -> str | None:
        """tool/call, maybe nested calls, then the result; 'cancel' when the turn was cancelled while it ran."""
        recorded = log(ToolCall(turn=turn, step=step, call_id=request.call_id, name=request.name,
                                arguments=request.arguments, safety=safety, parent_call_id=None))
        if not isinstance(request.arguments, dict):
            log(ToolResult(turn=turn, step=step, call_id=request.call_id, is_error=True, content="bad arguments",
                           error_code=BAD_ARGUMENTS, source_seq=recorded.seq))
            return None
        for k in range(draw(st.integers(0, 1))):
            nested = log(ToolCall(turn=turn, step=step, call_id=f"{request.call_id}.{k + 1}", name="read_file",
                                  arguments={}, safety="read_only", parent_call_id=request.call_id))
            log(ToolResult(turn=turn, step=step, call_id=nested.call_id, is_error=False, content="inner",
                           error_code=None, source_seq=nested.seq))
        cancelled = draw(st.integers(0, 9)) == 0
        content = "" if draw(st.integers(0, 5)) == 0 else f"out of {request.call_id}"
        log(ToolResult(turn=turn, step=step, call_id=request.call_id, is_error=cancelled, content=content,
                       error_code=TOOL_OUTCOME_UNKNOWN if cancelled else None, source_seq=recorded.seq))
        return "cancel" if cancelled else None

    def one_turn() -> None:
        turn = next(turn_no)
        for _ in range(draw(st.integers(0, 2))):
            if used:
                log(RecoveryVerdict(call_id=draw(st.sampled_from(used)),
                                    verdict=draw(st.sampled_from(["happened", "did_not_happen", "unknown"])), note=""))
        log.prompt(turn, draw(st.sampled_from(["do it", "and then?", ""])))
        for step in range(1, draw(st.integers(1, 3)) + 1):
            if step > 1:
                log.next_step(turn, step)
            if draw(st.integers(0, 5)) == 0:
                log(RequestRetry(turn=turn, step=step, attempt=2, reason="HTTP 429", delay_ms=500))
            if reasoning:
                log(ReasoningChunk(turn=turn, step=step, delta="thinking"))
            text = draw(st.sampled_from(["", "Sure.", "Here:"]))
            if text:
                log(AssistantChunk(turn=turn, step=step, delta=text))
            outcome = draw(st.sampled_from(["calls", "calls", "calls", "text", "http_error", "cancel_stream"]))
            if outcome == "http_error":
                if draw(st.booleans()):
                    log(AssistantMessage(turn=turn, step=step, text=text, tool_calls=[], interrupted=True))
                log.end(turn, step, "error", TurnError("HTTP_500", "server error"))
                return
            if outcome == "cancel_stream":
                log(AssistantMessage(turn=turn, step=step, text=text, tool_calls=[], interrupted=True))
                log.end(turn, step, "cancelled")
                return
            if outcome == "text":
                log.answer(turn, step, text, reasoning="thinking" if reasoning else None)
                log.end(turn, step)
                return
            this_answer: list[str] = []
            requests = []
            for _ in range(draw(st.integers(1, 3))):
                call_id = pick_id(this_answer)
                this_answer.append(call_id)
                name = draw(st.sampled_from([*TOOLS, "no_such_tool"]))
                arguments = draw(st.sampled_from([{"path": "a"}, {}, '{"path": ', [1, 2], 7]))
                requests.append(ToolCallRequest(call_id, name, arguments))
            used.extend(i for i in this_answer if i)
            truncated = draw(st.integers(0, 6)) == 0
            log(AssistantMessage(turn=turn, step=step, text=text, tool_calls=requests, interrupted=False,
                                 reasoning="thinking" if reasoning else None,
                                 finish_reason="length" if truncated else "tool_calls"))
            if truncated:
                for r in requests:
                    log.unrun(turn, step, r.call_id, TRUNCATED, "Not run: cut off.")
                log.end(turn, step, "error", TurnError("MAX_TOKENS", "limit"))
                return
            ending = None
            for r in requests:
                if ending is not None:
                    log.unrun(turn, step, r.call_id, ABORTED_BEFORE_DISPATCH, "Not run: the turn was cancelled.")
                    continue
                safety = TOOLS.get(r.name)
                if safety is None:
                    log.unrun(turn, step, r.call_id, UNKNOWN_TOOL, f"Unknown tool `{r.name}`.")
                    continue
                if safety != "read_only" and isinstance(r.arguments, dict):
                    decision = draw(st.sampled_from(["allowed_once", "allowed_session", "denied", "cancelled"]))
                    log(ApprovalAsked(turn=turn, step=step, call_id=r.call_id))
                    log(ApprovalDecided(turn=turn, step=step, call_id=r.call_id, decision=decision))
                    if decision == "denied":
                        log.unrun(turn, step, r.call_id, DENIED, "The operator denied this call.")
                        continue
                    if decision == "cancelled":
                        log.unrun(turn, step, r.call_id, ABORTED_BEFORE_DISPATCH, "Not run: cancelled.")
                        ending = "cancelled"
                        continue
                ending = run_body(turn, step, r, safety) and "cancelled"
            if ending:
                log.end(turn, step, "cancelled")
                return
        log(StepEnd(turn=turn, step=step))
        log(TurnEnd(turn=turn, reason="error", error=TurnError("MAX_STEPS", "too many steps")))

    for _ in range(draw(st.integers(1, 3))):
        one_turn()
    # a crash at any event (often right after a tool/call, the richest place), then resumption
    after_a_call = [i + 1 for i, e in enumerate(log.events) if isinstance(e, ToolCall)]
    anywhere = st.integers(0, len(log.events))
    cut = draw(st.one_of(anywhere, st.sampled_from(after_a_call)) if after_a_call else anywhere)
    del log.events[cut:]
    log.repair()
    for _ in range(draw(st.integers(0, 2))):
        one_turn()
    for _ in range(draw(st.integers(0, 2))):
        if used:
            log(RecoveryVerdict(call_id=draw(st.sampled_from(used)), verdict="unknown", note="checked"))
    turn = next(turn_no)
    log(TurnStart(turn=turn))
    log(StepStart(turn=turn, step=1))
    log(UserMessage(turn=turn, step=1, text="what now?"))
    return log.events, reasoning


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(logs())
def test_every_request_of_any_repaired_and_resumed_session_is_a_conversation_strict_servers_accept(case):
    events, reasoning = case
    transcript = Transcript()
    requests = 0

    def check(where: str) -> None:
        messages = [SYSTEM, *transcript.messages]
        assert conversation_violations(messages, require_reasoning=reasoning) == [], where
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert all("reasoning_content" not in m for m in messages[:last_user]), where  # older turns carry none

    for event in events:
        if isinstance(event, RequestHeader):  # the loop builds each request just before appending its header
            check(f"before the request at seq {event.seq}")
            requests += 1
        transcript.add(event)
    check("before the new prompt's request")
    assert transcript.messages[-1]["content"].endswith("what now?")

    # whatever was cut or repaired, every top-level call the conversation names is answered by position
    shown = [c["id"] for m in transcript.messages for c in m.get("tool_calls", ())]
    answered = [m["tool_call_id"] for m in transcript.messages if m["role"] == "tool"]
    assert shown == answered
    for m in transcript.messages:
        for c in m.get("tool_calls", ()):
            assert isinstance(json.loads(c["function"]["arguments"]), dict)
