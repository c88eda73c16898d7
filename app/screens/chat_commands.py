"""What the chat's slash commands do (`app/slash_commands.py` says which there are and parses them). Each runs exactly
as typed, from the prompt or from the command palette; what it reports goes to the transcript."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from .. import slash_commands

if TYPE_CHECKING:
    from textual.app import App
    from textual.worker import Worker

    from cairn.persistence.session import LiveSession
    from cairn.widgets.status_bar import TokenTotals

    from ..agent.loop import AgentLoop
    from ..compose import Agent
    from ..config.resolver import Config
    from ..providers.base import Provider
    from .call_review import CallReview
    from .rewind_flow import RewindFlow


class CommandHost(Protocol):
    """What the slash commands need from the chat they run in."""

    provider: Provider  # `/model` switches them
    config: Config
    host_suffix: str

    @property
    def app(self) -> App[Any]: ...
    @property
    def session(self) -> LiveSession: ...
    @property
    def agent(self) -> Agent | None: ...
    @property
    def turn_running(self) -> bool: ...
    @property
    def turn_tokens(self) -> TokenTotals: ...
    @property
    def session_tokens(self) -> TokenTotals: ...
    @property
    def rewind_flow(self) -> RewindFlow: ...
    @property
    def call_review(self) -> CallReview: ...

    async def say(self, text: str, kind: str = "") -> None: ...

    def action_help(self) -> None: ...

    def action_sessions(self) -> None: ...

    def refresh_provider(self) -> None: ...

    def refresh_activity(self) -> None: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, exit_on_error: bool = True) -> Worker[None]: ...


async def run_slash(chat: CommandHost, name: str, argument: str) -> None:
    say = chat.say
    loop = chat.agent.loop if chat.agent else None
    if name == "help":
        chat.action_help()
    elif name == "new":
        chat.app.action_new_session()  # type: ignore[attr-defined]
    elif name == "sessions":
        chat.action_sessions()
    elif name == "quit":
        await chat.app.action_quit()
    elif name == "model":
        if argument and chat.turn_running:
            await say("The model is switched between turns: wait for this one to end (or Esc).", "-warning")
        elif argument and await switch_profile(chat, argument):
            pass
        elif argument:
            chat.provider.model = argument
            chat.refresh_provider()
            await say(f"From the next request on, the model is {argument} ({chat.provider.name}).")
        else:  # the profiles, the one in use marked, and how to switch
            await say(slash_commands.model_listing(chat.config, chat.provider,
                                                   loop.profile if loop else chat.config.profile))
    elif name == "permissions":
        await say(permissions(loop, argument))
        chat.refresh_activity()
    elif name == "mcp":
        await say(slash_commands.mcp_summary(chat.agent.mcp if chat.agent else None))
    elif name == "compact":
        if loop is None:
            await say("Nothing to compact yet.")
        else:
            loop.compact_next = True
            await say("The conversation will be compacted before the next request: earlier turns become a "
                      "summary, and calls whose outcome is unknown are kept verbatim.")
    elif name == "instructions":
        from ..agent.project_context import instructions_report

        await say(instructions_report(chat.session.events, chat.config.workspace,
                                      None if loop is None else loop.project_context is not None))
    elif name == "usage":
        from cairn.widgets.status_bar import usage_text

        await say(usage_text(chat.turn_tokens, chat.session_tokens) or "The provider has reported no usage yet.")
    elif name == "rewind":
        await chat.rewind_flow.open()
    elif name == "verdict":
        await chat.call_review.waiting_for_verdict()
    elif name == "copy":
        from .copy import copy_last_answer

        await copy_last_answer(chat.app, chat.session.events)
    else:
        known = ", ".join(c.usage.split()[0] for c in slash_commands.COMMANDS)
        await say(f"Unknown command /{name}. Commands: {known}. (Start with // to send a / to the model.)", "-warning")


async def switch_profile(chat: CommandHost, name: str) -> bool:
    """`/model PROFILE`: the config file's profile from the next turn (provider, endpoint, model), recorded in the
    next request/header. False when `name` is no profile (it is then a model name)."""
    from ..config.provider import make_provider
    from ..config.provider import provider_secrets as secrets_of
    from ..config.resolver import ConfigError

    try:
        config = slash_commands.profile_config(chat.config, name)
        if config is None:
            return False
        provider = make_provider(config)
    except ConfigError as e:
        await chat.say(f"Profile {name} cannot be used: {e}", "-error")
        return True
    old, chat.provider, chat.config = chat.provider, provider, config
    if chat.agent is not None:
        chat.session.add_secrets(secrets_of(provider))
        loop = chat.agent.loop
        loop.provider = chat.agent.provider = provider
        loop.profile = name
        from ..agent.compaction import configured_window

        loop.context_window = config.context_window or configured_window()
        loop.known_window = None  # asked again of the new endpoint before the next request
        chat.host_suffix = ""
        loop.text_form = config.transcript == "text" or loop.exchange.text_form_recorded()
        chat.agent.config = config
    chat.run_worker(old.aclose(), exit_on_error=False)
    chat.refresh_provider()
    await chat.say(f"From the next turn on: profile {name}, {provider.name} {provider.model}.")
    return True


def permissions(loop: AgentLoop | None, argument: str) -> str:
    """`/permissions`: the session's grants; `revoke N|LABEL` and `clear` take them back."""
    if loop is None:
        return "The agent is not ready yet."
    grants = loop.grants
    labels = grants.labels()
    word, _, rest = argument.partition(" ")
    if word == "clear":
        grants.clear()
        return f"Revoked {len(labels)} grant(s): every tool asks again."
    if word == "revoke":
        rest = rest.strip()
        label = labels[int(rest) - 1] if rest.isdigit() and 0 < int(rest) <= len(labels) else rest
        if grants.revoke(label):
            return f"Revoked: {label}. It asks again."
        return f"No grant {rest!r}. /permissions lists them."
    if not labels:
        return "Nothing is allowed for this session: every side effect asks."
    listed = "  ".join(f"{i}. {label}" for i, label in enumerate(labels, 1))
    return f"Allowed for this session: {listed}   (/permissions revoke N, /permissions clear)"
