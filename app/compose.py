"""One composition for every face (CLI, TUI, ACP, Python API): persistence → policy → loop, torn down in reverse.

Leaving the context cancels the running turn and waits until the loop is idle (so the real `step/end`/`turn/end` are
written), removes the policy's hooks, then flushes and closes the session and releases its lock. AsyncExitStack gives
that order by construction. Configured MCP servers (app/tools/mcp.py) are entered just before the policy, so they stop
after the loop has quiesced and before persistence closes.
"""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from cairn.persistence.coordinator import DEFAULT_WINDOW
from cairn.persistence.session import LiveSession
from cairn.persistence.store import OpenedSession, SessionStore, move_workspace

from .agent import failpoints
from .agent.approval import Approver, headless_approver
from .agent.compaction import configured_window
from .agent.evidence import Evidence
from .agent.hooks import Hooks
from .agent.loop import AgentLoop, TurnResult
from .agent.policy import CheckpointPolicy
from .agent.project_context import context_wanted
from .config.provider import database_secrets, make_provider, provider_secrets
from .config.resolver import Config
from .config.resumed import RESUMED_WORKSPACE, config_for_session, resumed_workspace
from .providers.base import Provider
from .tools.registry import ToolRegistry, builtin_tools


@dataclass
class Agent:
    session: LiveSession
    loop: AgentLoop
    policy: CheckpointPolicy | None
    provider: Provider | None = None
    config: Config | None = None  # the effective one: a resumed session's own provider and model applied
    mcp: Any = None  # tools.mcp.McpServers when MCP servers are configured (their states, for displays)

    @property
    def id(self) -> str:
        return self.session.id

    async def run(self, prompt: str) -> TurnResult:
        return await self.loop.run_turn(prompt)


def open_store(config: Config) -> SessionStore:
    return SessionStore(config.home, config.backend, config.database_url)


def close_unused(opened: OpenedSession) -> None:
    """Release a session that was opened but never handed to a LiveSession (its writer and lock)."""
    try:
        opened.writer.close()
    finally:
        opened.lock.release()


def open_session_files(config: Config, session_id: str | None = None, resume: str | None = None) -> OpenedSession:
    """Create or (repairing first) reopen a session for writing. Raises persistence errors for the caller to report."""
    store = open_store(config)
    if resume:
        return store.open_for_resume(resume)
    return store.create(cwd=str(config.workspace), session_id=session_id)


async def mount_agent(
    stack: AsyncExitStack,
    session: LiveSession,
    provider: Provider,
    config: Config,
    *,
    approver: Approver | None = None,
    report: Callable[[str], None] | None = None,
    with_policy: bool = True,
    tools: ToolRegistry | None = None,
    mcp_background: bool = False,
    mcp: Any = None,
    mcp_waiting: Callable[[list[str]], None] | None = None,
) -> Agent:
    """Mount policy then loop on a live session; `stack` unwinds them in reverse (loop stops first, then the policy's
    hooks go). Who owns the session itself differs by face: `open_agent` enters it here, the TUI's service widget owns
    it there.

    The provider's secrets (its key, credentials in its base URL) are registered with the session before the loop can
    append anything, so no event ever stores them.

    Configured MCP servers start here (or were started by `open_agent`: `mcp`). With `mcp_background` (TUI, `cairn
    run`) nothing waits for them: their tools join the registry once they are ready, and a turn that reaches its first
    request before then waits for them only (after its prompt is durable), saying so through `mcp_waiting` (the names
    still starting). Without it (ACP, the Python API) the agent is returned once each server is ready or failed."""
    secrets = provider_secrets(provider) + database_secrets(config.database_url)
    if secrets:
        session.add_secrets(secrets)
    registry = tools or ToolRegistry(builtin_tools())
    if mcp is None and config.mcp_servers:
        # before the policy and the loop, so the stack stops the servers after the loop has quiesced and before
        # persistence closes; mcp (and pydantic) are imported only when they start, in a thread
        mcp = new_mcp_servers(config, report)
        if mcp_background:
            await mcp.start()
            stack.push_async_callback(mcp.close)
        else:
            await stack.enter_async_context(mcp)  # waits until every server is ready or failed
    elif mcp is not None:
        stack.push_async_callback(mcp.stop)  # started by open_agent: stopped after the loop, before persistence
    if mcp is not None:
        session.add_secrets(mcp.secrets)
        registry = ToolRegistry(list(registry))  # the caller's registry stays as it was

        def join(tools: list[Any]) -> None:
            for tool in tools:
                if tool.name not in registry:
                    registry.register(tool)

        if mcp.settled.is_set():
            join(mcp.tools)
        else:
            mcp.on_settled.append(join)
    hooks = Hooks()
    policy = None
    if with_policy:
        policy = CheckpointPolicy(session, report).install(hooks)
        stack.callback(policy.dispose)
    if mcp is not None and not mcp.settled.is_set():
        hooks.add("before_step", mcp_ready_hook(mcp, mcp_waiting))  # after the policy's: the prompt is durable first
    failpoint = failpoints.from_env(session)
    if failpoint is not None:
        failpoint.install(hooks)  # after the policy: it stops *after* the barrier at the same point
        approver = failpoint.wrap_approver(approver or headless_approver(False))
    loop = AgentLoop(
        session, provider, registry, config.workspace, approver, hooks,
        max_retries=config.max_retries,
        # configured (profile, CAIRN_CONTEXT_WINDOW) or None: the loop asks the server, then the model family
        context_window=config.context_window or configured_window(),
        profile=config.profile,
        text_form=config.transcript == "text",
        # this process's own CAIRN_PROJECT_CONTEXT=off holds too when the config was resolved from another environment
        # (an embedder's, a test's)
        project_context=config.project_context == "on" and context_wanted(),
        evidence=Evidence(session, config.workspace, blobs=before_images(stack, config), report=report,
                          snapshots=workspace_snapshots(config, report, session_id=session.id,
                                                        holds_secret=session.holds_secret)),
        report=report,
    )
    await stack.enter_async_context(loop)
    return Agent(session, loop, policy, provider, config, mcp)


def workspace_snapshots(config: Config, report: Callable[[str], None] | None, workspace: Path | None = None,
                        session_id: str = "shared", holds_secret: Callable[[bytes], bool] | None = None) -> Any:
    """The shadow git repository of `workspace` (default: the config's; SPEC §9 rev 3), or None when snapshots are off,
    git is missing, or the store cannot be used (one line says so: rewind then restores only what the file tools
    changed).

    An unusable store (`CAIRN_HOME/snapshots`, or the workspace's repository in it, is a regular file, a FIFO, a
    dangling link, unreadable) is treated like a missing git, not like a broken session: snapshots are an addition to
    the log (SPEC §9: without them rewind works from the before-images "and says so"), and a session stays continuable
    whatever sits beside it (§7). So turns go on without snapshots and a rewind works from the before-images, each
    saying once which path is in the way; nothing is created or removed at that path."""
    if config.snapshots == "off":
        return None
    from .agent.snapshots import ShadowRepo, git_path

    if git_path() is None:
        if report is not None:
            report("git is not installed: no workspace snapshots, so rewind restores only what Cairn's file tools changed")
        return None
    repo = ShadowRepo(Path(config.home), Path(workspace or config.workspace), session_id, holds_secret=holds_secret)
    unusable = unusable_snapshot_store(repo.git_dir)
    if unusable is not None:
        if report is not None:
            report(f"{unusable}: no workspace snapshots, so rewind restores only what Cairn's file tools changed "
                   "(move it away to have snapshots again)")
        return None
    return repo


def unusable_snapshot_store(git_dir: Path) -> str | None:
    """Why the snapshot store at `git_dir` (`CAIRN_HOME/snapshots/<key>.git`) cannot be used, or None (it can, or is
    not made yet). Looked at with stat only: nothing is opened, so a FIFO there never blocks."""
    import os
    import stat

    for path in (git_dir.parent, git_dir):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if os.path.islink(path):
                return f"the snapshot store {path} is a symbolic link to nothing"
            return None  # made on first use
        except OSError as e:
            return f"the snapshot store {path} cannot be looked at ({e.strerror})"
        if not stat.S_ISDIR(mode):
            kind = {stat.S_IFREG: "a regular file", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                    stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}.get(stat.S_IFMT(mode), "not a directory")
            return f"the snapshot store {path} is {kind}, not a directory"
    return None


def new_mcp_servers(config: Config, report: Callable[[str], None] | None) -> Any:
    from .tools.mcp import McpServers  # (light: the SDK itself is imported when the servers start, in a thread)

    return McpServers(config.mcp_servers, config.workspace, report=report)


def mcp_ready_hook(mcp: Any, waiting: Callable[[list[str]], None] | None) -> Callable[..., Any]:
    """A `before_step` wrapper: a request waits until the MCP servers have settled (ready or failed), so the model
    sees their tools; one line (`waiting`) names those still starting. Esc/Ctrl+C cancel the turn meanwhile."""

    async def wait_for_servers(ctx: Any, call_next: Callable[[], Any]) -> Any:
        if not mcp.settled.is_set():
            if waiting is not None:
                waiting(mcp.starting)
            await mcp.wait_ready()
        return await call_next()

    return wait_for_servers


def before_images(stack: AsyncExitStack, config: Config) -> Callable[[], Any]:
    """The before-image store beside the config's sessions (SPEC §9 rev 3), built on the first file-tool call and
    closed with the stack."""
    built: list[Any] = []

    def store() -> Any:
        if not built:
            from cairn.persistence.blobs import blob_store_for
            from cairn.persistence.store import make_backend

            built.append(blob_store_for(make_backend(config.backend, Path(config.home),
                                                     config.database_url)))
            stack.callback(built[0].close)
        return built[0]

    return store


@asynccontextmanager
async def open_agent(
    config: Config,
    *,
    session_id: str | None = None,
    resume: str | None = None,
    opened: OpenedSession | None = None,
    approver: Approver | None = None,
    report: Callable[[str], None] | None = None,
    with_policy: bool = True,
    tools: ToolRegistry | None = None,
    window: float = DEFAULT_WINDOW,
    mcp_background: bool = False,
    mcp_waiting: Callable[[list[str]], None] | None = None,
) -> AsyncIterator[Agent]:
    """Open (or resume) a session and mount the agent on it. A new session's provider is built, and a bad provider
    configuration fails, before anything is created. A resumed one (`resume`, or `opened` with history) continues with
    the provider and model of its last request unless the config chose them explicitly, and in its own workspace
    unless the config names one explicitly (then the move is recorded durably before the session goes live; `report`
    says either); if that provider cannot be built or that workspace is gone, a session this function opened is
    closed again before the error is raised.

    With `mcp_background` (`cairn run`), configured MCP servers start first, before the provider and the session, and
    nothing waits for them but the first request (see `mount_agent`)."""
    async with AsyncExitStack() as stack:
        mcp = None
        if mcp_background and config.mcp_servers and not resume and opened is None:
            mcp = new_mcp_servers(config, report)  # (a resumed session may switch config: started in mount_agent)
            await mcp.start()
            stack.push_async_callback(mcp.close)
        if opened is None and not resume:
            provider = make_provider(config)
            stack.push_async_callback(provider.aclose)
            opened = open_session_files(config, session_id)
        else:
            opened_here = opened is None
            if opened is None:
                opened = open_session_files(config, session_id, resume)
            resumed = bool(resume or opened.events)  # (a new session the caller created keeps its own cwd)
            try:
                if resumed:
                    config = resumed_workspace(config, opened.header, opened.events)
                config = config_for_session(config, opened.events)
                provider = make_provider(config)
            except BaseException:
                if opened_here:
                    close_unused(opened)
                raise
            stack.push_async_callback(provider.aclose)
            try:
                moved = move_workspace(opened, config.workspace) if resumed else None
            except BaseException:
                if opened_here:
                    close_unused(opened)
                raise
            if report is not None:
                if moved is not None:
                    report(f"session {opened.header.id} moved from {moved.from_} to {moved.to} (--workspace)")
                elif config.sources.get("workspace") == RESUMED_WORKSPACE:
                    report(f"session {opened.header.id} works in {config.workspace} (not the current directory)")
        session = LiveSession(opened, window=window)
        await stack.enter_async_context(session)
        yield await mount_agent(
            stack, session, provider, config, approver=approver, report=report, with_policy=with_policy, tools=tools,
            mcp_background=mcp_background, mcp=mcp, mcp_waiting=mcp_waiting,
        )
