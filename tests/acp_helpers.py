"""A real ACP client for the tests: the package's client side, spawning `cairn acp` as a child process.

`RecordingClient` records every `session/update` and every `session/request_permission` on one timeline (so a test can
check that a tool call was announced before the client was asked about it) and answers permission requests from a list
of choices. `connect()` spawns the agent with an explicit environment (a crash_harness `Rig`'s: nothing inherited but
PATH) and its stderr in a file, so a full pipe can never block it and a failing test can show what it logged.

Every message exchanged through `connect()` is recorded as it crossed the pipe and, when the connection closes, checked
against the ACP schema the `acp` package ships (its pydantic models, generated from the official schema.json):
`schema_problems()` validates each message with the model of its method, and also requires that the message survives
the round trip unchanged, so an unknown field or a value the package would silently salvage counts as a violation.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, NamedTuple

import acp
import anyio
from acp import schema
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse
from pydantic import BaseModel, ValidationError

from acp import text_block

from crash_harness import CAIRN, Rig

WAIT = 20.0  # seconds; bounded waits fail with what was seen, never hang the suite


CONVERSATION = {"user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update"}


class RecordingClient:
    def __init__(self, choices: list[str] | None = None) -> None:
        self.timeline: list[tuple[str, Any]] = []  # ("update", update) | ("permission", tool_call)
        self.choices = list(choices or [])  # option ids to pick, in order; "cancel" dismisses; default: reject
        self.wire: list[tuple[str, dict]] = []  # (direction, message) as they crossed the pipe

    @property
    def all_updates(self) -> list[Any]:
        return [item for kind, item in self.timeline if kind == "update"]

    @property
    def updates(self) -> list[Any]:
        """The conversation: messages, thoughts and tool calls (not commands, titles, modes)."""
        return [u for u in self.all_updates if u.session_update in CONVERSATION]

    def session_updates(self, kind: str) -> list[Any]:
        return [u for u in self.all_updates if u.session_update == kind]

    def observe(self, event: Any) -> None:
        self.wire.append((event.direction.value, event.message))

    @property
    def permission_requests(self) -> list[Any]:
        return [item for kind, item in self.timeline if kind == "permission"]

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.timeline.append(("update", update))

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any],
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.timeline.append(("permission", (tool_call, [o.option_id for o in options])))
        choice = self.choices.pop(0) if self.choices else "reject_once"
        if choice == "cancel":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))

    def on_connect(self, conn: Any) -> None:
        pass


def summary(update: Any) -> tuple[Any, ...]:
    """An update as a short tuple: (kind, text) for messages, (kind, call_id, status) for tool calls."""
    kind = update.session_update
    if kind in ("agent_message_chunk", "user_message_chunk", "agent_thought_chunk"):
        return (kind, update.content.text)
    if kind in ("tool_call", "tool_call_update"):
        return (kind, update.tool_call_id, update.status)
    return (kind,)


def content_text(update: Any) -> str:
    return "\n".join(c.content.text for c in update.content or [])


def result_text(update: Any) -> str:
    """The last text block of a finished call: its result (a command or a diff comes before it)."""
    texts = [c.content.text for c in update.content or [] if c.type == "content"]
    return texts[-1] if texts else ""


def script_env(rig: Rig, responses: list[dict]) -> dict[str, str]:
    """The environment for a `script` provider answering `responses` in order."""
    return {"CAIRN_PROVIDER": "script", "CAIRN_SCRIPT": rig.script(responses),
            "CAIRN_SNAPSHOTS": "off"}  # these tests pin the ACP updates; test_snapshots.py covers snapshots


async def prompt(conn: Any, session_id: str, text: str) -> Any:
    return await conn.prompt(session_id=session_id, prompt=[text_block(text)])


def rig_fixture(tmp_path: Any) -> Any:
    """A test module's `rig` fixture: `rig = pytest.fixture(rig_fixture, name="rig")`."""
    rig = Rig(tmp_path)
    yield rig
    rig.cleanup()


class Connected(NamedTuple):
    conn: Any  # acp ClientSideConnection
    process: Any  # asyncio subprocess
    init: Any  # the InitializeResponse


@asynccontextmanager
async def connect(rig: Rig, client: RecordingClient, env: dict[str, str] | None = None,
                  shutdown_timeout: float = 30.0) -> AsyncIterator[Connected]:
    """Spawn `cairn acp` and initialize. Leaving closes the agent's stdin and waits for it to exit by itself (it is
    terminated only after `shutdown_timeout`)."""
    with open(rig.io / "acp.stderr", "ab") as stderr:
        async with acp.spawn_agent_process(
            client, CAIRN, "acp", env=rig.env(env), cwd=rig.ws, observers=[client.observe],
            transport_kwargs={"stderr": stderr, "shutdown_timeout": shutdown_timeout},
        ) as (conn, process):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            yield Connected(conn, process, init)
    problems = schema_problems(client.wire)
    assert not problems, "messages that break the ACP schema:\n" + "\n".join(problems)


# method -> (params model, result model); notifications have no result model
METHODS: dict[str, tuple[type[BaseModel], type[BaseModel] | None]] = {
    "initialize": (schema.InitializeRequest, schema.InitializeResponse),
    "session/new": (schema.NewSessionRequest, schema.NewSessionResponse),
    "session/load": (schema.LoadSessionRequest, schema.LoadSessionResponse),
    "session/list": (schema.ListSessionsRequest, schema.ListSessionsResponse),
    "session/prompt": (schema.PromptRequest, schema.PromptResponse),
    "session/set_mode": (schema.SetSessionModeRequest, schema.SetSessionModeResponse),
    "session/set_config_option": (schema.SetSessionConfigOptionSelectRequest, schema.SetSessionConfigOptionResponse),
    "session/cancel": (schema.CancelNotification, None),
    "session/update": (schema.SessionNotification, None),
    "session/request_permission": (schema.RequestPermissionRequest, schema.RequestPermissionResponse),
}


def _check(model: type[BaseModel], value: Any, where: str) -> str | None:
    try:
        parsed = model.model_validate(value)
    except ValidationError as e:
        return f"{where}: {e}"
    again = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if again != value:
        return f"{where}: changed by a round trip through {model.__name__} (unknown field or salvaged value):\n" \
               f"  sent  {value}\n  model {again}"
    return None


def schema_problems(wire: list[tuple[str, dict]]) -> list[str]:
    """Every message of one connection checked against the schema model of its method (see the module docstring)."""
    problems: list[str] = []
    methods: dict[tuple[str, Any], str] = {}  # (who sent the request, id) -> method
    for direction, message in wire:
        where = f"{direction} {str(message)[:200]}"
        if message.get("jsonrpc") != "2.0":
            problems.append(f"{where}: jsonrpc is not '2.0'")
        method = message.get("method")
        if method is not None:
            if method not in METHODS:
                problems.append(f"{where}: a method these tests do not expect")
                continue
            if "id" in message:
                methods[(direction, message["id"])] = method
            params_model, _ = METHODS[method]
            if (problem := _check(params_model, message.get("params"), where)) is not None:
                problems.append(problem)
            continue
        asker = "incoming" if direction == "outgoing" else "outgoing"
        method = methods.get((asker, message.get("id")))
        if "error" in message:
            if (problem := _check(schema.Error, message["error"], where)) is not None:
                problems.append(problem)
        elif method is None:
            problems.append(f"{where}: a response to no known request")
        elif (result_model := METHODS[method][1]) is not None:
            if (problem := _check(result_model, message.get("result"), where)) is not None:
                problems.append(problem)
    return problems


def agent_stderr(rig: Rig) -> str:
    path = rig.io / "acp.stderr"
    return path.read_text(errors="replace") if path.exists() else ""


async def wait_for(condition: Callable[[], Any], what: str, rig: Rig, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n--- agent stderr ---\n"
                                 f"{agent_stderr(rig)}")
        await anyio.sleep(0.005)
    return value
