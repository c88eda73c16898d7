"""The config a resumed session continues with: its own workspace, and the provider, model and endpoint of its last
request unless the operator chose others (SPEC §6 rev 3, §10)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from .checks import ConfigError
from .settings import ENDPOINT_SETTINGS, PROVIDERS, Config, with_api_key


def last_request_header(events: Iterable[Any]) -> Any | None:
    from cairn.persistence.events import RequestHeader

    last = None
    for event in events:
        if isinstance(event, RequestHeader):
            last = event
    return last


RESUMED_WORKSPACE = "the resumed session"  # sources["workspace"] when a resume took the session's own directory


def workspace_explicit(config: Config) -> bool:
    """Whether the operator named the workspace (--workspace, or the API's `workspace=`): only then does a resume move
    the session; otherwise the directory Cairn started in is just where the operator happens to be."""
    return config.sources.get("workspace", "default").startswith(("flag", "option"))


def resumed_workspace(config: Config, header: Any, events: list[Any], *, may_move: bool = True) -> Config:
    """The config a resumed session works in (SPEC §10: a session belongs to its workspace): its own (header `cwd`, or
    its last `workspace/moved`), not the current directory; marked in `sources` so every face can say so. With
    `may_move` and an explicit workspace, that one instead: the caller records the move (`store.move_workspace`)
    before the session goes live. A recorded workspace that no longer exists, with none named, is a ConfigError."""
    from cairn.persistence.store import session_workspace

    if may_move and workspace_explicit(config):
        return config
    recorded = session_workspace(header, events)
    if not recorded.is_dir():
        raise ConfigError(
            f"session {header.id} works in {recorded}, which no longer exists: "
            "resume it with --workspace DIR to move it"
        )
    own = recorded.resolve()
    if own == config.workspace:
        return config
    return dataclasses.replace(config, workspace=own, sources={**config.sources, "workspace": RESUMED_WORKSPACE})


def config_for_session(config: Config, events: Iterable[Any]) -> Config:
    """The config a resumed session continues with: the provider and model of its last `request/header`, unless an
    option or variable chose them (a profile chosen with --profile / CAIRN_PROFILE counts as chosen; the file's
    `default_profile` does not). The session's model is kept only while its provider is (a model name means nothing
    to another provider). Continuing with another provider than the profile's drops the profile's endpoint settings
    (base URL, key variable, headers, …): they belong to that profile's server, not to the session's."""
    header = last_request_header(events)
    if header is None:
        return config
    provider = config.provider if config.provider_explicit else header.provider
    if provider not in PROVIDERS:
        raise ConfigError(
            f"this session used the provider {header.provider!r}, which this build does not know; "
            f"choose one with --provider or CAIRN_PROVIDER"
        )
    model = config.model
    if not config.model_explicit and provider == header.provider:
        model = header.model
    if provider == "script" and not config.script and not config.provider_explicit:
        raise ConfigError(
            "this session used the script provider: pass --script FILE or set CAIRN_SCRIPT to continue it "
            "(or choose another provider with --provider)"
        )
    chosen_profile = config.sources.get("profile", "").startswith(("flag", "env"))
    profile = config.profile if chosen_profile else getattr(header, "profile", None)  # what the next request uses
    if provider == config.provider:
        return _keep_endpoint(dataclasses.replace(config, model=model, profile=profile, sources=dict(config.sources)),
                              header)
    resumed = dataclasses.replace(config, provider=provider, model=model, profile=profile, sources=dict(config.sources))
    defaults = Config(home=config.home, backend=config.backend, provider=provider, model=None, script=None,
                      workspace=config.workspace)
    for name in ENDPOINT_SETTINGS:
        if resumed.sources.get(name, "").startswith("profile"):
            setattr(resumed, name, getattr(defaults, name))
            resumed.sources[name] = "default (the session's provider is not the profile's)"
    resumed.sources["provider"] = "the resumed session"
    if resumed.sources.get("api_key_env", "").startswith("default"):
        resumed.api_key_env = None
    return with_api_key(_keep_endpoint(resumed, header))


def _keep_endpoint(config: Config, header: Any) -> Config:
    """SPEC §6 rev 3: a conversation never goes to a host it was not sent to before unless the operator names that
    host. With no server named, a resumed session continues with the endpoint its last request went to; a named one
    (flag, variable, or a profile chosen by one) is the operator's choice. A session from before endpoints were
    recorded, resumed with no server named, is refused rather than sent to the hosted default: it may have talked to a
    local server, with a key meant for that one."""
    if config.provider != header.provider or config.provider not in ("openai", "anthropic") or config.base_url_explicit:
        return config
    endpoint = getattr(header, "endpoint", None)
    if endpoint:
        config.base_url = endpoint
        config.sources["base_url"] = "the resumed session's last request"
        return config
    if config.base_url is None:
        raise ConfigError(
            "this session's requests went to a server Cairn did not record (it was made before endpoints were kept); "
            "name it to continue: --base-url URL (or CAIRN_BASE_URL, or --profile NAME), the hosted default included"
        )
    return config
