"""The ACP agent: the protocol surface of Cairn for editors (Zed) and other clients (Toad).

One ACP session is one Cairn session (same id), composed, checkpointed and repaired exactly as in the TUI and the CLI;
`session.SessionHost` owns it. What each method does:

| method            | Cairn                                                                                          |
|-------------------|------------------------------------------------------------------------------------------------|
| initialize        | protocol 1; `loadSession`, `sessionCapabilities.list`; prompts: text and resource links only   |
| session/new       | a new session whose workspace is `cwd`; then (after the answer) the slash commands             |
| session/load      | opens the session cold (repair committed durably first), replays it, its title, then answers   |
|                   | — in its own workspace (SPEC §10) whatever `cwd` says; a message says so when they differ      |
| session/list      | the sessions whose cwd is `cwd` (all when omitted), newest first, in one page                  |
| session/prompt    | one turn (updates follow the loop's events, updates.py), or a slash command answered directly  |
| session/set_mode  | approval mode: `ask` (default), `accept-edits` (file changes without asking), `bypass`         |
| session/cancel    | cancels the running turn through the loop (also when sent as a request, serve.py)              |

Slash commands (offered with `available_commands_update`): `/verdict <call_id> happened|did_not_happen|unknown
[note]` records an operator's verdict on an OUTCOME_UNKNOWN call as `recovery/verdict` between turns, as the TUI's
resume screen does, so the model sees it in the next request; `/usage` and `/sessions` answer with a short message; `/compact` has the next request compacted first.
`/rewind N [--files | --conversation] [--force] [--dry-run]` (SPEC §9 rev 3, §10 rev 4) takes turns N and later back
between turns: what those turns changed goes back (a path someone else changed after a turn did is named and left
alone unless `--force`; what the operator changed between turns and what Cairn never captured are left alone and
named), and the conversation continues from before turn N; the answer is what was restored, what was not and why.
`/rewind --undo` takes the most recent rewind back; `--dry-run` answers with the plan only. A rewind a crash
interrupted is named when the session is loaded, blocks every prompt until settled, and is settled with
`/rewind --finish` or `/rewind --abandon`.
The first prompt names the session (`session_info_update`, and the title in `session/list`).

Stop reasons: a completed turn → `end_turn`; a cancelled one (`session/cancel`, a dismissed permission request, or
shutdown) → `cancelled`; the loop's step limit → `max_turn_requests`; an answer cut off at the output limit (turn error
MAX_TOKENS; its tool calls were not run) → `max_tokens`. Any other turn that ends in error (provider down, bad
model output, a failed checkpoint) has no honest stop reason — `refusal` would tell the client the model refused — so
the prompt is answered with a JSON-RPC error: code -32603, the turn's error message as the message, and
`{"details": <the same message>, "code": <Cairn error code>, "turn": n, "sessionId": id}` as data. Every error Cairn
raises carries its text in `data.details` too (Toad shows only that). The session stays usable and resumable.

Reasoning streams as `agent_thought_chunk` updates (and is replayed by session/load). Token usage reported by the
provider goes out as the turn's `PromptResponse.usage` (unstable in ACP). There is no `usage_update` session update:
that one describes the context window's fill (`used`/`size`), which Cairn does not track per session.

Errors when opening a session: unknown id → -32002 (ACP's "resource not found"); malformed id, missing cwd, a session
whose workspace no longer exists → -32602; locked by another process, corrupt or unsupported log → -32603; each with
the same one-line message the CLI prints.

Not supported, so not advertised: image, audio and embedded-context prompts (a text resource that is sent anyway is
inlined, a binary one only named); the client's file system and terminals (tools act on the workspace directly);
config options, authentication; `session/close` and the other unstable methods, so a session stays open (and locked)
until the client disconnects.

MCP servers offered by the client (`mcpServers` of session/new and session/load; stdio and http, advertised in
`mcpCapabilities`) start with the session beside those of the config file (an editor's server replaces a file's of the
same name); their tools are `NAME__tool` with the safety class of their annotations (app/tools/mcp.py). One agent
message names what could not be used — an SSE or ACP-transport server, a server that failed to start — and one more
names each tool a server listed that Cairn left out (an invalid definition, an input schema that is not an object's:
SPEC §8); stderr gets the same lines, so nothing offered is dropped silently. A session that is already open keeps the
servers it was opened with.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Union
from urllib.parse import unquote, urlparse

import anyio
import anyio.abc
import anyio.to_thread
from acp import PROTOCOL_VERSION, RequestError
from acp.helpers import update_available_commands, update_current_mode
from acp.schema import (
    AgentCapabilities,
    AvailableCommand,
    AvailableCommandInput,
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
    SessionConfigOptionBoolean,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionInfo,
    SessionInfoUpdate,
    SessionListCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    StopReason,
    TextContentBlock,
    TextResourceContents,
    UnstructuredCommandInput,
)

from cairn.persistence.errors import InvalidSessionId, PersistenceError, SessionExists, SessionLocked, SessionNotFound
from cairn.persistence.events import MAX_TOKENS, SessionMode, UserMessage, usage_totals
from cairn.persistence.store import OpenedSession, SessionStore
from cairn.version import __version__

from ..agent.loop import MAX_STEPS, TurnResult
from ..config.resolver import Config, ConfigError
from ..config.resumed import resumed_workspace
from ..render import USAGE_FIELDS, first_line, format_time, format_usage
from .session import SessionHost, mode_state, pending_text
from .updates import attachment_name, looks_binary, replay, session_title, shown_prompt, wire

log = logging.getLogger("cairn.acp")

NOT_FOUND, INVALID_PARAMS, INTERNAL = -32002, -32602, -32603
ConfigOption = Union[SessionConfigOptionSelect, SessionConfigOptionBoolean]  # (what a session's config list holds)

COMMANDS = [
    AvailableCommand(name="verdict", description="Record what really happened to a call Cairn could not confirm "
                     "(OUTCOME_UNKNOWN) after a crash; the model sees it in the next request",
                     input=AvailableCommandInput(root=UnstructuredCommandInput(
                         hint="<call_id> happened|did_not_happen|unknown [note]"))),
    AvailableCommand(name="usage", description="Tokens this session has used so far"),
    AvailableCommand(name="sessions", description="Cairn sessions in this workspace, newest first"),
    AvailableCommand(name="compact", description="Summarise the conversation so far before the next request "
                     "(unresolved recovered calls are kept verbatim)"),
    AvailableCommand(name="rewind", description="Undo turn N and later: take back what those turns changed and "
                     "continue the conversation from before turn N (--undo takes the last rewind back, --dry-run "
                     "shows the plan, --force overwrites paths changed outside Cairn too)",
                     input=AvailableCommandInput(root=UnstructuredCommandInput(
                         hint="N [--files | --conversation] [--force] [--dry-run] | --undo"))),
]


def error(code: int, message: str, /, **data: Any) -> RequestError:
    """A JSON-RPC error a person can read: the message, and the same text as `data.details` (what Toad shows)."""
    return RequestError(code, wire(message), wire({"details": message, **data}))


class CairnAgent:
    def __init__(self, config: Config, hosts: anyio.abc.TaskGroup) -> None:
        self.config = config
        self.store = SessionStore(config.home, config.backend, getattr(config, "database_url", None))
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
                mcp_capabilities=McpCapabilities(http=True, sse=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            auth_methods=[],
            agent_info=Implementation(name="cairn", title="Cairn", version=__version__),
        )

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any) -> NewSessionResponse:
        config, skipped = with_editor_servers(self._config_for(cwd), mcp_servers)
        opened = self._open(lambda: self.store.create(cwd=str(config.workspace)))
        host = await self._start(opened, config)
        log.info("session %s: new, workspace %s", host.id, config.workspace)
        host.pump.hold()  # released once the answer carrying the id is out (observe)
        self._greet(host, skipped)
        return NewSessionResponse(session_id=host.id, modes=mode_state(host.mode), config_options=profile_options(host))

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           **kwargs: Any) -> LoadSessionResponse:
        config, skipped = with_editor_servers(self._config_for(cwd), mcp_servers)
        host = self.sessions.get(session_id)
        if host is not None and host.agent is not None:  # already open in this process: replay it as it stands
            skipped = []  # it keeps the servers it was opened with
            history = list(host.agent.session.events)
        else:
            opened = self._open(lambda: self.store.open_for_resume(session_id))
            try:  # its own workspace, never the client's cwd; no ACP field means "move it" (SPEC §10)
                config = resumed_workspace(config, opened.header, opened.events, may_move=False)
            except ConfigError as e:
                opened.writer.close()
                opened.lock.release()
                raise error(INVALID_PARAMS, str(e), sessionId=session_id) from None
            history = list(opened.events)  # repair included, already durable
            host = await self._start(opened, config)
            known = {m.id for m in mode_state(host.mode).available_modes}  # (a log is outside input)
            host.mode = next((e.mode for e in reversed(history) if isinstance(e, SessionMode) and e.mode in known),
                             host.mode)
            log.info("session %s: loaded (%d events, %d added by repair)", host.id, len(history), len(opened.repaired))
        tools = host.agent.loop.tools if host.agent is not None else None

        def safety_of(name: str) -> str | None:
            tool = tools.get(name) if tools is not None else None
            return tool.safety if tool is not None else None

        blobs = host.agent.loop.blobs if host.agent is not None else None

        def before_image(sha256: str) -> bytes | None:  # a file tool's before-image, for the diff it showed live
            try:
                return blobs().get(sha256) if blobs is not None else None
            except Exception as e:  # noqa: BLE001 -- a store that cannot be read costs the diff, never the load
                log.warning("session %s: before-image %s not readable (%s)", host.id, sha256[:12], e)
                return None

        # (in a thread: before-images are read from the session's store, which may be a database)
        updates = await anyio.to_thread.run_sync(replay, history, host.config.workspace, safety_of, before_image)
        await host.replay(updates)
        if host.config.workspace != Path(cwd).resolve():
            host.say(f"This session works in its own workspace, {host.config.workspace} (not {cwd}): its tools, "
                     "snapshots and rewinds run there.")
        title = session_title(history)
        if title:
            host.pump.put(SessionInfoUpdate(session_update="session_info_update", title=title))
        from ..agent.rewind import pending_rewind

        pending = pending_rewind(history)
        if pending is not None:  # a rewind a crash interrupted: shown on the next open, to finish or abandon (§9)
            host.say(pending_text(*pending))
        self._greet(host, skipped)
        await host.pump.drain()
        return LoadSessionResponse(modes=mode_state(host.mode), config_options=profile_options(host))

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        host = self._host(session_id)
        known = [m.id for m in mode_state(host.mode).available_modes]
        if mode_id not in known:
            raise error(INVALID_PARAMS, f"unknown mode {mode_id!r}; Cairn's modes are {', '.join(known)}",
                        modeId=mode_id)
        host.mode = mode_id
        if host.agent is not None and host.agent.session.events:  # an operator's decision: in the log at once
            host.agent.session.append(SessionMode(mode=mode_id))
            await host.agent.session.flush()
        # (a session with no turn yet is not on disk: its first prompt records the mode, below)
        log.info("session %s: mode %s", host.id, mode_id)
        host.pump.put(update_current_mode(mode_id))
        return SetSessionModeResponse()

    async def set_config_option(self, config_id: str, session_id: str, value: str | bool,
                                **kwargs: Any) -> SetSessionConfigOptionResponse:
        """`profile`: switch to a config-file profile (provider, endpoint, model) from the next turn; the next
        request/header records it. Between turns only."""
        host = self._host(session_id)
        options = profile_options(host)
        if config_id != "profile" or not options:
            raise error(INVALID_PARAMS, f"unknown configuration option {config_id!r}"
                        + ("" if options else " (no config-file profiles to choose from)"), configId=config_id)
        names = [o.value for o in options[0].options if o.value != AS_STARTED]
        if not isinstance(value, str) or value not in names:
            raise error(INVALID_PARAMS, f"unknown profile {value!r}; the config file has {', '.join(names)}")
        agent = host.agent
        if agent is None or agent.loop.busy:
            raise error(INVALID_PARAMS, "the profile is switched between turns: wait for this one to end")
        from ..config.provider import make_provider, provider_secrets
        from ..slash_commands import profile_config

        try:
            config = profile_config(agent.config or host.config, value)
            assert config is not None
            provider = make_provider(config)
        except ConfigError as e:
            raise error(INVALID_PARAMS, f"profile {value} cannot be used: {e}") from None
        old = agent.provider
        agent.session.add_secrets(provider_secrets(provider))
        agent.loop.provider = agent.provider = provider
        agent.loop.profile = value
        agent.config = config
        if old is not None:
            await old.aclose()
        log.info("session %s: profile %s (%s %s)", host.id, value, provider.name, provider.model)
        return SetSessionConfigOptionResponse(config_options=profile_options(host) or [])

    def observe(self, event: Any) -> None:
        """Connection observer: once the answer to `session/new` is out, that session's held updates may follow."""
        message = getattr(event, "message", None)
        result = message.get("result") if isinstance(message, dict) else None
        if getattr(event, "direction", None) == "outgoing" and isinstance(result, dict):
            host = self.sessions.get(result.get("sessionId"))  # type: ignore[arg-type]
            if host is not None:
                host.pump.release()

    def _greet(self, host: SessionHost, skipped: list[str]) -> None:
        """What a client shows beside a fresh or reopened session: the slash commands, one message naming the MCP
        servers that could not be used (a transport Cairn lacks, a failed start), and one per MCP tool left out —
        never silently dropped."""
        host.pump.put(update_available_commands(COMMANDS))
        mcp = host.agent.mcp if host.agent is not None else None
        failed = [f"{s.config.name} (did not start: {s.error})" for s in (mcp.states if mcp is not None else [])
                  if s.status == "failed"]
        unusable = skipped + failed
        if unusable:
            names = "; ".join(unusable)
            log.warning("session %s: MCP servers not used: %s", host.id, names)
            host.say(f"Cairn cannot use these MCP servers in this session: {names}. Their tools are not available; "
                     "every other tool is.")
        for line in (mcp.left_out if mcp is not None else []):  # (stderr had each line as the servers started)
            host.say(f"{line}. The server's other tools are available.")

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kwargs: Any) -> ListSessionsResponse:
        here = Path(cwd).resolve() if cwd else None
        sessions = [
            SessionInfo(
                session_id=s.id, cwd=wire(s.cwd), title=wire(first_line(shown_prompt(s.first_prompt or ""), 80)) or None,
                updated_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s.updated / 1000))
                + f".{s.updated % 1000:03d}Z",
            )
            for s in self.store.list_sessions()
            if s.status != "unreadable" and (here is None or Path(s.cwd).resolve() == here)
        ]
        return ListSessionsResponse(sessions=sessions)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        host = self._host(session_id)
        text = prompt_text(prompt, host.config.workspace)
        answer = await self._command(host, text)
        if answer is not None:
            host.pump.release()
            host.say(answer)
            await host.pump.drain()
            return PromptResponse(stop_reason="end_turn")
        if host.agent is not None and host.agent.loop.pending_rewind() is not None:
            from ..agent.rewind import pending_rewind  # nothing else runs until it is settled (SPEC §10)

            found = pending_rewind(host.agent.session.events)
            assert found is not None
            host.say(pending_text(*found))
            await host.pump.drain()
            return PromptResponse(stop_reason="end_turn")
        if host.agent is not None and not host.agent.session.events and host.mode != "ask":
            host.agent.session.append(SessionMode(mode=host.mode))  # chosen before the session was on disk
        if host.agent is not None and not any(isinstance(e, UserMessage) for e in host.agent.session.events):
            title = first_line(shown_prompt(text), 80)
            if title:
                host.pump.put(SessionInfoUpdate(session_update="session_info_update", title=wire(title)))
        self._prompt_started()
        try:
            result = await host.run_turn(text)
        finally:
            self._prompt_ended()
        usage = host.turn_usage(result.turn) if result is not None else None
        return PromptResponse(stop_reason=stop_reason(result, session_id), usage=usage)

    async def _command(self, host: SessionHost, text: str) -> str | None:
        """The answer to a slash command (see COMMANDS); None when `text` is a prompt for the model."""
        name, _, rest = text.strip().partition(" ")
        if name == "/verdict":
            return await host.record_verdict(rest.strip())
        if name == "/rewind":
            return await host.rewind(rest.strip())
        if name == "/usage":
            events = host.agent.session.events if host.agent is not None else []
            totals = usage_totals(events, USAGE_FIELDS)
            shown = format_usage(totals)
            return f"Tokens used in this session: {shown}." if shown else "No token usage reported in this session yet."
        if name == "/compact":
            if host.agent is None:
                return "Nothing to compact yet."
            host.agent.loop.compact_next = True
            return ("The conversation will be compacted before the next request: earlier turns become a summary, "
                    "and calls whose outcome is unknown are kept verbatim.")
        if name == "/sessions":
            here = host.config.workspace
            rows = [f"- `{s.id}` {format_time(s.updated)} — {first_line(shown_prompt(s.first_prompt or ''), 60) or '(empty)'}"
                    for s in self.store.list_sessions()
                    if s.status != "unreadable" and Path(s.cwd).resolve() == here]
            return "\n".join([f"Cairn sessions in {here}:", *rows]) if rows else f"No Cairn sessions in {here}."
        return None

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
                raise error(INTERNAL, "Cairn is shutting down; no new sessions")
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
            raise error(NOT_FOUND, f"no session {session_id!r} is open here; use session/new or session/load",
                        sessionId=session_id)
        return host

    def _config_for(self, cwd: str) -> Config:
        workspace = Path(cwd).expanduser()
        if not workspace.is_absolute() or not workspace.is_dir():
            raise error(INVALID_PARAMS, f"cwd {cwd!r} must be an absolute path to an existing directory", cwd=cwd)
        # the client's cwd is where it stands, not an operator's --workspace: it never moves a loaded session
        return dataclasses.replace(self.config, workspace=workspace.resolve(),
                                   sources={**self.config.sources, "workspace": "the client's cwd"})

    def _open(self, opener: Callable[[], OpenedSession]) -> OpenedSession:
        try:
            return opener()
        except SessionNotFound as e:
            raise error(NOT_FOUND, str(e), sessionId=e.session_id) from None
        except (InvalidSessionId, SessionExists) as e:
            raise error(INVALID_PARAMS, str(e)) from None
        except SessionLocked as e:
            raise error(INTERNAL, str(e), sessionId=e.session_id, pid=e.pid) from None
        except PersistenceError as e:
            raise error(INTERNAL, str(e)) from None


def with_editor_servers(config: Config, offered: list[Any] | None) -> tuple[Config, list[str]]:
    """The session's config with the editor's MCP servers added (replacing a config-file server of the same name), and
    one line per offered server Cairn cannot use. tools/mcp.py imports nothing heavy; the SDK loads only when a session
    with servers starts."""
    if not offered:
        return config, []
    from ..config.mcp_servers import from_editor

    servers, skipped = from_editor(offered)
    editor_names = {s.name for s in servers}
    kept = tuple(s for s in config.mcp_servers if s.name not in editor_names)
    return dataclasses.replace(config, mcp_servers=(*kept, *servers)), skipped


def prompt_text(blocks: list[Any], workspace: Path) -> str:
    """The prompt as the model will read it. Text and resource links are what every agent must accept: a `file://` link
    becomes an `@path` mention of the file in the workspace, set apart by spaces, so the loop attaches the file like a
    typed mention (mentions.py; a link outside the workspace is refused); a text resource
    sent although embedded context is not advertised is inlined between markers a replay folds back to its name; a
    binary one is named, never inlined; images and audio are refused."""
    parts: list[str] = []
    mention = False  # the part before is an `@path` mention: what follows it needs whitespace between
    for block in blocks:
        glued = bool(parts) and not parts[-1][-1:].isspace()
        if isinstance(block, TextContentBlock):
            parts.append(" " + block.text if mention and block.text[:1].strip() else block.text)
            mention = False
            continue
        mention = False
        if isinstance(block, ResourceContentBlock):
            link = link_text(block.name, block.uri, workspace)
            mention = link.startswith("@")
            parts.append(" " + link if glued and mention and parts[-1] else link)
        elif isinstance(block, EmbeddedResourceContentBlock):
            resource = block.resource
            uri = resource.uri.replace('"', "%22").replace("\n", "%0A")
            if isinstance(resource, TextResourceContents) and not looks_binary(resource.text):
                parts.append(f'\n<attached-file uri="{uri}">\n{resource.text}\n</attached-file>\n')
            else:
                parts.append(f" {attachment_name(uri)} (binary file, not included)")
        else:
            kind = getattr(block, "type", type(block).__name__)
            raise error(INVALID_PARAMS, f"Cairn takes text prompts only; it cannot use a {kind!r} block")
    text = "".join(parts)
    if not text.strip():
        raise error(INVALID_PARAMS, "the prompt is empty")
    return text


def link_text(name: str, uri: str, workspace: Path) -> str:
    """A resource link as the model should read it: an `@path` mention (quoted when the path has spaces) for a local
    file, the link itself otherwise."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return f"[{name}]({uri})"
    target = os.path.realpath(unquote(parsed.path))
    root = os.path.realpath(workspace)
    if target != root and not target.startswith(root.rstrip("/") + "/"):
        raise error(INVALID_PARAMS, f"the linked file {unquote(parsed.path)} is outside this session's workspace "
                    f"{root}; Cairn's tools only reach files inside it", uri=uri)
    path = os.path.relpath(target, root)
    if not any(c.isspace() for c in path):
        return f"@{path}"
    return f'@"{path}"' if '"' not in path and "\n" not in path else f"`{path}`"  # no quoted form for these


def stop_reason(result: TurnResult | None, session_id: str) -> StopReason:
    """See the module docstring for why an error is a JSON-RPC error and not a stop reason."""
    if result is None or result.reason == "cancelled":
        return "cancelled"
    if result.reason == "completed":
        return "end_turn"
    assert result.error is not None
    if result.error.code == MAX_STEPS:
        return "max_turn_requests"
    if result.error.code == MAX_TOKENS:
        return "max_tokens"
    raise error(INTERNAL, f"the turn ended in error: {result.error.message}", code=result.error.code,
                turn=result.turn, sessionId=session_id)


AS_STARTED = "(as started)"


def profile_options(host: SessionHost) -> list[ConfigOption] | None:
    """The config file's profiles as a `profile` select option (ACP session config options), or None without any."""
    from ..config.file import ConfigFileError, read_config_file

    agent = host.agent
    config = (agent.config if agent is not None and agent.config is not None else None) or host.config
    path = getattr(config, "config_file", None)
    if path is None:
        return None
    try:
        profiles = read_config_file(path).profiles
    except (ConfigFileError, OSError):
        return None
    if not profiles:
        return None
    current = (agent.loop.profile if agent is not None else None) or getattr(config, "profile", None)
    options = [
        SessionConfigSelectOption(value=name, name=name, description=wire(" ".join(
            str(p.settings.get(k)) for k in ("provider", "model") if p.settings.get(k)) or None))
        for name, p in sorted(profiles.items())
    ]
    if current not in profiles:
        current = AS_STARTED
        options.insert(0, SessionConfigSelectOption(value=current, name="as started (flags and environment)"))
    return [SessionConfigOptionSelect(id="profile", name="Model profile", category="model", type="select",
                                      current_value=current, options=options)]
