"""The Python API: run Cairn turns from your own code, with the same composition, barriers and repair as the CLI.

    import anyio
    from cairn import open_session

    async def main():
        async with open_session(workspace=".", provider="demo") as session:
            result = await session.run("list files")
            print(session.id, result.reason, result.text)

    anyio.run(main)

`resume="ID"` reopens a session (repairing a crashed turn first; `session.session.repaired` lists what repair added)
and continues with the provider and model of its last request unless `provider=`/`model=` (or CAIRN_PROVIDER /
CAIRN_MODEL) choose others, and in its own workspace (SPEC §10) unless `workspace=` names another, which moves the
session there (a `workspace/moved` event); `workspace` defaults to the current directory for a new session only;
`approve=True` allows every tool call, or pass an async callable `(ApprovalRequest) -> decision`.

Provider settings come as with the CLI (option, then environment, then the config file's profile, then defaults):
`profile="deepseek"` picks a profile of the config file (`config_file=` names another file), or pass them explicitly,
`provider="anthropic", base_url=…, api_key=…, model=…` (a key given here is used, never stored or shown).

`await session.rewind(2)` (SPEC §9 rev 3) undoes turn 2 and later between turns, as `cairn rewind` does: the files
Cairn's file tools changed go back to their content before turn 2 and the next `run` continues the conversation from
before it (`scope="files"` or `"conversation"` for one of the two). It returns the lines an operator reads (what was
restored, what was not and why, which turns ran commands whose changes are not restored) and raises `RewindRefused`,
with nothing changed, for an unknown turn or a path a turn changed that someone else changed after it (`force=True`
overwrites). Rev 4 (§10): only what the rewound turns changed goes back; what the operator changed between turns, and
what Cairn never captured, is left alone and named. `await session.rewind_undo()` puts files and conversation back as
they were just before the most recent rewind (same crash safety). While a rewind a crash interrupted is not settled,
`run` starts no turn: it returns a `TurnResult` with error code `REWIND_PENDING`.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import AsyncIterator, Callable

from .agent.approval import ApprovalRequest, Approver, headless_approver
from .agent.loop import TurnResult
from .agent.rewind import RewindRefused, Scope
from .compose import Agent, open_agent
from .config.resolver import resolve_config

__all__ = ["open_session", "Agent", "Session", "ApprovalRequest", "TurnResult", "RewindRefused"]


@dataclass
class Session(Agent):
    """What `open_session` yields: the composed agent (`run`, `id`, `session`, `loop`, …) plus `rewind` and
    `rewind_undo`."""

    async def rewind(self, turn: int, scope: Scope = "both", force: bool = False) -> list[str]:
        """Undo turn `turn` and later (see the module docstring); returns what happened, as readable lines."""
        from .agent.rewind import describe, rewind

        if scope not in ("files", "conversation", "both"):
            raise ValueError(f"scope is 'files', 'conversation' or 'both', not {scope!r}")
        if self.loop.busy:
            raise RewindRefused("a turn is running: rewind between turns")
        blobs = self.loop.blobs() if self.loop.blobs is not None else None
        assert self.config is not None  # (open_agent always sets it: the session's own workspace, SPEC §10)
        outcome = await rewind(self.session, self.config.workspace, blobs, turn, scope, force=force,
                               repo=self.loop.snapshots)
        return describe(outcome)

    async def rewind_undo(self, force: bool = False) -> list[str]:
        """Undo the most recent rewind: what it changed goes back to what it held just before (SPEC §10)."""
        from .agent.rewind import describe, undo_rewind

        if self.loop.busy:
            raise RewindRefused("a turn is running: undo a rewind between turns")
        blobs = self.loop.blobs() if self.loop.blobs is not None else None
        assert self.config is not None
        outcome = await undo_rewind(self.session, self.config.workspace, blobs, force=force, repo=self.loop.snapshots)
        return describe(outcome)


@asynccontextmanager
async def open_session(
    workspace: str | None = None,
    *,
    resume: str | None = None,
    session_id: str | None = None,
    provider: str | None = None,
    model: str | None = None,
    script: str | None = None,
    home: str | None = None,
    backend: str | None = None,
    base_url: str | None = None,
    max_tokens: int | None = None,
    profile: str | None = None,
    config_file: str | None = None,
    api_key: str | None = None,
    approve: bool | Approver = False,
    report: Callable[[str], None] | None = None,
) -> AsyncIterator[Session]:
    """Open (or resume) a session; leaving the block cancels any running turn and closes the session durably."""
    config = resolve_config(
        home=home, backend=backend, provider=provider, model=model, script=script, workspace=workspace,
        base_url=base_url, max_tokens=max_tokens, profile=profile, config_file=config_file, api_key=api_key,
    )
    approver = approve if callable(approve) else headless_approver(bool(approve))
    async with open_agent(config, session_id=session_id, resume=resume, approver=approver, report=report) as agent:
        yield Session(**{f.name: getattr(agent, f.name) for f in fields(Agent)})
