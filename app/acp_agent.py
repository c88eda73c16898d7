"""The ACP agent: the protocol surface of Cairn for editors (Zed) and other clients (Toad).

One ACP session is one Cairn session (same id), composed, checkpointed and repaired exactly as in the TUI and the CLI;
`acp_session.SessionHost` owns it. What each method does:

| method            | Cairn                                                                                          |
|-------------------|------------------------------------------------------------------------------------------------|
| initialize        | protocol 1; `loadSession`, `sessionCapabilities.list`; prompts: text and resource links only   |
| session/new       | a new session whose workspace is `cwd`                                                          |
| session/load      | opens the session cold (repair committed durably first), replays it as updates, then answers  |
| session/list      | the sessions whose cwd is `cwd` (all when omitted), newest first, in one page                  |
| session/prompt    | one turn; updates follow the loop's events (acp_updates.py)                                    |
| session/cancel    | cancels the running turn through the loop                                                      |

Stop reasons: a completed turn → `end_turn`; a cancelled one (`session/cancel`, a dismissed permission request, or
shutdown) → `cancelled`; the loop's step limit → `max_turn_requests`; an answer cut off at the output limit (turn error
MAX_TOKENS; its tool calls were not run) → `max_tokens`. Any other turn that ends in error (provider down, bad
model output, a failed checkpoint) has no honest stop reason — `refusal` would tell the client the model refused — so
the prompt is answered with a JSON-RPC error: code -32603, the turn's error message as the message, and
`{"code": <Cairn error code>, "turn": n, "sessionId": id}` as data. The session stays usable and resumable.

Reasoning streams as `agent_thought_chunk` updates (and is replayed by session/load). Token usage reported by the
provider goes out as the turn's `PromptResponse.usage` (unstable in ACP). There is no `usage_update` session update:
that one describes the context window's fill (`used`/`size`), which Cairn does not track per session.

Errors when opening a session: unknown id → -32002 (ACP's "resource not found"); malformed id, missing cwd → -32602;
locked by another process, corrupt or unsupported log → -32603; each with the same one-line message the CLI prints.

Not supported, so not advertised: image, audio and embedded-context prompts (a text resource that is sent anyway is
inlined); MCP servers offered by the client (Cairn's tools are its own); the client's file system and terminals (tools
act on the workspace directly); modes, config options, authentication; `session/close` and the other unstable
methods, so a session stays open (and locked) until the client disconnects.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

import anyio
import anyio.abc
from acp import PROTOCOL_VERSION, RequestError
from acp.schema import (
    AgentCapabilities,
    EmbeddedResourceContentBlock,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    StopReason,
    TextContentBlock,
    TextResourceContents,
)

from cairn import __version__
from cairn.persistence.errors import InvalidSessionId, PersistenceError, SessionExists, SessionLocked, SessionNotFound
from cairn.persistence.events import MAX_TOKENS
from cairn.persistence.store import OpenedSession, SessionStore

from .acp_session import SessionHost
from .acp_updates import replay, wire
from .config import Config
from .loop import TurnResult
from .render import first_line

log = logging.getLogger("cairn.acp")

NOT_FOUND, INVALID_PARAMS, INTERNAL = -32002, -32602, -32603


class CairnAgent:
    def __init__(self, config: Config, hosts: anyio.abc.TaskGroup) -> None:
        self.config = config
        self.store = SessionStore(config.home, config.backend)
        self.sessions: dict[str, SessionHost] = {}
        self.closing = False
        self._hosts = hosts  # the task group every SessionHost runs in
        self._conn: Any = None
        self._prompts = 0
        self._prompts_idle = anyio.Event()
        self._prompts_idle.set()

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    # -- protocol ---------------------------------------------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=False),
                mcp_capabilities=McpCapabilities(http=False, sse=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            auth_methods=[],
            agent_info=Implementation(name="cairn", title="Cairn", version=__version__),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        config = self._config_for(cwd)
        opened = self._open(lambda: self.store.create(cwd=str(config.workspace)))
        host = await self._start(opened, config)
        log.info("session %s: new, workspace %s", host.id, config.workspace)
        return NewSessionResponse(session_id=host.id)

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        host = self.sessions.get(session_id)
        if host is not None and host.agent is not None:  # already open in this process: replay it as it stands
            history = list(host.agent.session.events)
        else:
            config = self._config_for(cwd)
            opened = self._open(lambda: self.store.open_for_resume(session_id))
            history = list(opened.events)  # repair included, already durable
            host = await self._start(opened, config)
            log.info("session %s: loaded (%d events, %d added by repair)", host.id, len(history), len(opened.repaired))
        await host.replay(replay(history, host.config.workspace))
        return LoadSessionResponse()

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kwargs: Any) -> ListSessionsResponse:
        here = Path(cwd).resolve() if cwd else None
        sessions = [
            SessionInfo(
                session_id=s.id, cwd=wire(s.cwd), title=wire(first_line(s.first_prompt, 80)) or None,
                updated_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s.updated / 1000))
                + f".{s.updated % 1000:03d}Z",
            )
            for s in self.store.list_sessions()
            if s.status != "unreadable" and (here is None or Path(s.cwd).resolve() == here)
        ]
        return ListSessionsResponse(sessions=sessions)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        host = self._host(session_id)
        text = prompt_text(prompt)
        self._prompt_started()
        try:
            result = await host.run_turn(text)
        finally:
            self._prompt_ended()
        usage = host.turn_usage(result.turn) if result is not None else None
        return PromptResponse(stop_reason=stop_reason(result, session_id), usage=usage)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        host = self.sessions.get(session_id)
        if host is not None:
            host.cancel()

    # -- lifecycle --------------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop every session in order (each cancels its turn and waits for its closing events, then removes its
        policy, then closes its log), and wait until every prompt has been answered. Idempotent."""
        self.closing = True
        for host in list(self.sessions.values()):
            host.stop()
        for host in list(self.sessions.values()):
            await host.closed.wait()
        await self._prompts_idle.wait()

    async def _start(self, opened: OpenedSession, config: Config) -> SessionHost:
        host = SessionHost(self._conn, config, opened)
        try:
            if self.closing:
                raise RequestError(INTERNAL, "Cairn is shutting down; no new sessions")
            await self._hosts.start(host.serve)
        except BaseException:
            if opened.lock.held:  # the live session never took ownership of the files: release them here
                opened.writer.close()
                opened.lock.release()
            raise
        self.sessions[host.id] = host
        if self.closing:  # shutdown began while this session was starting: it closes with the others
            host.stop()
        return host

    def _prompt_started(self) -> None:
        if self._prompts == 0:
            self._prompts_idle = anyio.Event()
        self._prompts += 1

    def _prompt_ended(self) -> None:
        self._prompts -= 1
        if self._prompts == 0:
            self._prompts_idle.set()

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _host(self, session_id: str) -> SessionHost:
        host = self.sessions.get(session_id)
        if host is None:
            raise RequestError(NOT_FOUND, f"no session {session_id!r} is open here; use session/new or session/load",
                               {"sessionId": session_id})
        return host

    def _config_for(self, cwd: str) -> Config:
        workspace = Path(cwd).expanduser()
        if not workspace.is_absolute() or not workspace.is_dir():
            raise RequestError(INVALID_PARAMS, f"cwd {cwd!r} must be an absolute path to an existing directory")
        return dataclasses.replace(self.config, workspace=workspace.resolve())

    def _open(self, opener: Callable[[], OpenedSession]) -> OpenedSession:
        try:
            return opener()
        except SessionNotFound as e:
            raise RequestError(NOT_FOUND, str(e), {"sessionId": e.session_id}) from None
        except (InvalidSessionId, SessionExists) as e:
            raise RequestError(INVALID_PARAMS, str(e)) from None
        except SessionLocked as e:
            raise RequestError(INTERNAL, str(e), {"sessionId": e.session_id, "pid": e.pid}) from None
        except PersistenceError as e:
            raise RequestError(INTERNAL, str(e)) from None


def prompt_text(blocks: list[Any]) -> str:
    """The prompt as the model will read it. Text and resource links are what every agent must accept; a text resource
    sent although embedded context is not advertised is inlined; images and audio are refused."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(block.resource, TextResourceContents):
            parts.append(f"\n\n{block.resource.uri}:\n```\n{block.resource.text}\n```\n")
        else:
            kind = getattr(block, "type", type(block).__name__)
            raise RequestError(INVALID_PARAMS, f"Cairn takes text prompts only; it cannot use a {kind!r} block")
    text = "".join(parts)
    if not text.strip():
        raise RequestError(INVALID_PARAMS, "the prompt is empty")
    return text


def stop_reason(result: TurnResult | None, session_id: str) -> StopReason:
    """See the module docstring for why an error is a JSON-RPC error and not a stop reason."""
    if result is None or result.reason == "cancelled":
        return "cancelled"
    if result.reason == "completed":
        return "end_turn"
    assert result.error is not None
    if result.error.code == "MAX_STEPS":
        return "max_turn_requests"
    if result.error.code == MAX_TOKENS:
        return "max_tokens"
    raise RequestError(
        INTERNAL, wire(f"the turn ended in error: {result.error.message}"),
        {"code": result.error.code, "turn": result.turn, "sessionId": session_id},
    )
