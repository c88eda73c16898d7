"""A real ACP client for the tests: the package's client side, spawning `cairn acp` as a child process.

`RecordingClient` records every `session/update` and every `session/request_permission` on one timeline (so a test can
check that a tool call was announced before the client was asked about it) and answers permission requests from a list
of choices. `connect()` spawns the agent with an explicit environment (a crash_harness `Rig`'s: nothing inherited but
PATH) and its stderr in a file, so a full pipe can never block it and a failing test can show what it logged.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, NamedTuple

import acp
import anyio
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

from crash_harness import CAIRN, Rig

WAIT = 20.0  # seconds; bounded waits fail with what was seen, never hang the suite


class RecordingClient:
    def __init__(self, choices: list[str] | None = None) -> None:
        self.timeline: list[tuple[str, Any]] = []  # ("update", update) | ("permission", tool_call)
        self.choices = list(choices or [])  # option ids to pick, in order; "cancel" dismisses; default: reject

    @property
    def updates(self) -> list[Any]:
        return [item for kind, item in self.timeline if kind == "update"]

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
    return (kind, update.tool_call_id, update.status)


def content_text(update: Any) -> str:
    return "\n".join(c.content.text for c in update.content or [])


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
            client, CAIRN, "acp", env=rig.env(env), cwd=rig.ws,
            transport_kwargs={"stderr": stderr, "shutdown_timeout": shutdown_timeout},
        ) as (conn, process):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            yield Connected(conn, process, init)


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
