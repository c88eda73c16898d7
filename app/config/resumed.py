"""The config a resumed session continues with: its own workspace, and the provider, model and endpoint of its last
request unless the operator chose others (SPEC §6 rev 3, §10)."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any, Iterable
from urllib.parse import urlsplit, urlunsplit

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
    (base URL, key variable, headers, …): they belong to that profile's server, not to the session's. Whatever was
    overridden, the server is the session's own unless one is named (`_keep_endpoint`)."""
    from cairn.persistence.events import RequestHeader

    headers = [event for event in events if isinstance(event, RequestHeader)]
    if not headers:
        return config
    header = headers[-1]
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
                              headers)
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
    return with_api_key(_keep_endpoint(resumed, headers))


# Providers whose requests leave this machine for a server; demo and script send nothing anywhere.
SERVER_PROVIDERS = ("openai", "anthropic")
# Hosts known to speak one of the two protocols only. A session recorded at one of them cannot be continued there
# with the other provider (and the other provider's key must not be sent to a vendor it does not belong to).
# Anthropic's own beta OpenAI-compatibility layer is deliberately not counted: an OpenAI key would go to Anthropic.
ONE_PROTOCOL_HOSTS = {"api.openai.com": "openai", "api.anthropic.com": "anthropic"}
ONE_PROTOCOL_SUFFIXES = {".openai.azure.com": "openai"}
HOSTED_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
_NAME_ONE = "--base-url URL (or CAIRN_BASE_URL, or --profile NAME)"


def _keep_endpoint(config: Config, headers: list[Any]) -> Config:
    """SPEC §6 rev 3: a conversation never goes to a host it was not sent to before unless the operator names that
    host. With no server named (no --base-url, no CAIRN_BASE_URL, no profile chosen by --profile / CAIRN_PROFILE that
    has a `base_url`), a resumed session continues at the endpoint its last request went to, whatever else was
    overridden (provider or model, by flag, variable or profile):

    - same provider (a model override included): that endpoint as recorded;
    - the other server provider (openai <-> anthropic): the same host, with the new protocol's path convention
      (`switched_endpoint`), when that host is this machine (a local LiteLLM or llama.cpp serves both); a host known
      to speak only the old protocol (api.openai.com, api.anthropic.com, Azure OpenAI), or any other remote host
      (the new provider's key would go to it), is a ConfigError naming what to pass;
    - from demo or script: the session's last earlier request that went to a server, if any; a session that was never
      sent to any server needs one named, the hosted default included (every host is one it was not sent to);
    - to demo or script: nothing leaves the machine, nothing to keep.

    A session from before endpoints were recorded, resumed with no server named, is refused rather than sent to the
    hosted default: it may have talked to a local server, with a key meant for that one."""
    if config.provider not in SERVER_PROVIDERS or config.base_url_explicit:
        return config
    sent = [h for h in headers if h.provider in SERVER_PROVIDERS]
    if not sent:
        raise ConfigError(
            f"this session has never been sent to a server (it used the {headers[-1].provider} provider): name the "
            f"one to continue it with {config.provider}: {_NAME_ONE}, the hosted default "
            f"({HOSTED_URLS[config.provider]}) included"
        )
    last = sent[-1]
    endpoint = getattr(last, "endpoint", None)
    if not endpoint:
        if config.base_url is None:
            raise ConfigError(
                "this session's requests went to a server Cairn did not record (it was made before endpoints were "
                f"kept); name it to continue: {_NAME_ONE}, the hosted default included"
            )
        return config
    if last.provider == config.provider:
        config.base_url = endpoint
        config.sources["base_url"] = "the resumed session's last request"
        return config
    switched = switched_endpoint(endpoint, last.provider, config.provider)
    host = urlsplit(switched).hostname or ""
    if not _on_this_machine(host):
        # a remote host may serve one vendor only: the new provider's key must not go to it unasked
        raise ConfigError(
            f"this session was sent to {host}, which Cairn cannot tell speaks the {config.provider} protocol (and "
            f"{config.provider}'s key would be sent there): name the server to continue it with {config.provider}: "
            f"{_NAME_ONE}, e.g. --base-url {switched}"
        )
    config.base_url = switched
    config.sources["base_url"] = f"the resumed session's last request (its host, with the {config.provider} path)"
    return config


def _on_this_machine(host: str) -> bool:
    """Whether `host` is this machine (a LiteLLM, llama.cpp, vLLM or Ollama started beside Cairn)."""
    if host in ("localhost", "") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def switched_endpoint(endpoint: str, old: str, new: str) -> str:
    """The base URL at `endpoint`'s host (recorded for provider `old`) for provider `new`, or a ConfigError when that
    host is known to speak `old`'s protocol only.

    Only the path changes, by each provider's convention: an OpenAI base URL ends in `/v1` (the provider appends
    `/chat/completions`), an Anthropic one is the server's root (the provider appends `/v1/messages`). LiteLLM,
    llama.cpp, vLLM and Ollama serve both under one root that way, so `http://h:4000` (anthropic) becomes
    `http://h:4000/v1` (openai) and back. A recorded full request path (`…/chat/completions`, `…/v1/messages`) is
    reduced to its base first; a prefix before `/v1` (`/openai/v1`) and the query string are kept as they were:
    Cairn cannot know more about a server than the URL it was given."""
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").lower()
    speaks = ONE_PROTOCOL_HOSTS.get(host) or next(
        (proto for suffix, proto in ONE_PROTOCOL_SUFFIXES.items() if host.endswith(suffix)), None)
    if speaks is not None and speaks != new:
        raise ConfigError(
            f"this session was sent to {host}, which does not speak the {new} protocol: name the server to continue "
            f"it with {new}: {_NAME_ONE}, e.g. --base-url {HOSTED_URLS[new]}"
        )
    path = parts.path.rstrip("/")
    full = "/chat/completions" if old == "openai" else "/messages"
    if path.endswith(full):
        path = path[: -len(full)]
    root = path[:-3] if path.endswith("/v1") else path
    return urlunsplit((parts.scheme, parts.netloc, root + "/v1" if new == "openai" else root, parts.query, ""))
