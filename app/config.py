"""Resolve where sessions live, which backend and which provider to use, from options and the environment (SPEC §6).

Precedence: an option (flag or API argument), then the environment, then the default. Every variable is validated here
and a bad value is a `ConfigError` naming it (exit 2), never a traceback. Settings only a model run needs (provider,
model parameters, timeouts) are validated only when `runs_model` is true, so `cairn show` and `cairn sessions` work
whatever the provider configuration says; whether the chosen provider can actually be built (a script file, an API key
for a hosted endpoint) is checked by `make_provider`, which runs after a resumed session's own provider is known.

An API key is read here and handed only to the provider; it is never put in the config's printable form, an event, or a
file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from cairn.persistence.store import BACKENDS

PROVIDERS = ("demo", "script", "openai")
DEFAULT_MAX_TOKENS = 8192
DEFAULT_MAX_RETRIES = 4
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class ConfigError(ValueError):
    """A bad option or environment value; exit code 2."""


def default_home() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("cairn", appauthor=False))


@dataclass
class Config:
    home: Path
    backend: str
    provider: str
    model: str | None
    script: str | None
    workspace: Path
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0  # seconds; 0 = no limit on waiting for the answer
    demo_delay: float = 0.02
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_retries: int = DEFAULT_MAX_RETRIES
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    # whether provider / model were chosen by an option or variable: a resumed session keeps its own otherwise
    provider_explicit: bool = False
    model_explicit: bool = False


def resolve_config(
    *,
    home: str | None = None,
    backend: str | None = None,
    provider: str | None = None,
    model: str | None = None,
    script: str | None = None,
    workspace: str | None = None,
    base_url: str | None = None,
    max_tokens: int | str | None = None,
    env: Mapping[str, str] | None = None,
    runs_model: bool = True,
) -> Config:
    env = os.environ if env is None else env
    home_path = Path(home or env.get("CAIRN_HOME") or default_home()).expanduser()
    backend = backend or env.get("CAIRN_BACKEND") or "jsonl"
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r} (--backend / CAIRN_BACKEND); choose one of: {', '.join(BACKENDS)}")
    ws = Path(workspace or ".").expanduser()
    if not ws.is_dir():
        raise ConfigError(f"workspace {ws} is not a directory")
    config = Config(home=home_path, backend=backend, provider="demo", model=None, script=None, workspace=ws.resolve())
    if not runs_model:
        return config

    api_key = env.get("CAIRN_API_KEY") or env.get("OPENAI_API_KEY") or None
    chosen = provider or env.get("CAIRN_PROVIDER") or None
    if chosen is not None and chosen not in PROVIDERS:
        raise ConfigError(f"unknown provider {chosen!r} (--provider / CAIRN_PROVIDER); choose one of: {', '.join(PROVIDERS)}")
    chosen_model = model or env.get("CAIRN_MODEL") or None
    url = base_url or env.get("CAIRN_BASE_URL") or None
    if url is not None:
        check_base_url(url, "--base-url" if base_url else "CAIRN_BASE_URL")
    return dataclasses.replace(
        config,
        provider=chosen or ("openai" if api_key else "demo"),
        provider_explicit=chosen is not None,
        model=chosen_model,
        model_explicit=chosen_model is not None,
        script=script or env.get("CAIRN_SCRIPT") or None,
        base_url=url,
        api_key=api_key,
        timeout=_number(env, "CAIRN_TIMEOUT", 120.0, low=0.0),
        demo_delay=_number(env, "CAIRN_DEMO_DELAY_MS", 20.0, low=0.0) / 1000,
        max_tokens=_max_tokens(max_tokens, env),
        max_retries=_integer(env.get("CAIRN_MAX_RETRIES"), "CAIRN_MAX_RETRIES", DEFAULT_MAX_RETRIES, low=0, high=100),
        temperature=_number(env, "CAIRN_TEMPERATURE", None, low=0.0, high=2.0),
        top_p=_number(env, "CAIRN_TOP_P", None, low=0.0, high=1.0),
        reasoning_effort=_word(env, "CAIRN_REASONING_EFFORT"),
    )


def _number(env: Mapping[str, str], name: str, default: float | None, low: float, high: float | None = None):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        limits = f"between {low:g} and {high:g}" if high is not None else f"a number >= {low:g}"
        raise ConfigError(f"{name} must be {limits}, not {raw.strip()[:40]!r}")
    return value


def _integer(raw: Any, name: str, default: int, low: int, high: int | None = None) -> int:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return default
    try:
        value = int(raw.strip()) if isinstance(raw, str) else int(raw)
        ok = not isinstance(raw, (bool, float)) and value >= low and (high is None or value <= high)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        limits = f"a whole number from {low} to {high}" if high is not None else f"a whole number >= {low}"
        raise ConfigError(f"{name} must be {limits}, not {str(raw).strip()[:40]!r}")
    return value


def _max_tokens(option: int | str | None, env: Mapping[str, str]) -> int:
    if option is not None:
        return _integer(option, "--max-tokens", DEFAULT_MAX_TOKENS, low=1)
    return _integer(env.get("CAIRN_MAX_TOKENS"), "CAIRN_MAX_TOKENS", DEFAULT_MAX_TOKENS, low=1)


def _word(env: Mapping[str, str], name: str) -> str | None:
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", raw):
        raise ConfigError(f"{name} must be a single word such as low, medium or high, not {raw[:40]!r}")
    return raw


def check_base_url(url: str, name: str) -> None:
    """An http(s) URL with a host; the message never repeats the URL (it may carry credentials)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{name} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1")


def is_local_url(url: str) -> bool:
    """Loopback servers (llama.cpp, Ollama, vLLM on this machine) and plain-http ones need no key."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "http":
        return True
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def last_request_header(events: Iterable[Any]) -> Any | None:
    from cairn.persistence.events import RequestHeader

    last = None
    for event in events:
        if isinstance(event, RequestHeader):
            last = event
    return last


def config_for_session(config: Config, events: Iterable[Any]) -> Config:
    """The config a resumed session continues with: the provider and model of its last `request/header`, unless an
    option or variable chose them. The session's model is kept only while its provider is (a model name means nothing
    to another provider)."""
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
    return dataclasses.replace(config, provider=provider, model=model)


def provider_secrets(provider: Any) -> list[str]:
    """Strings that must never be stored or shown (the key, credentials in the base URL); none for demo/script."""
    return [s for s in getattr(provider, "secrets", None) or [] if s]


def make_provider(config: Config):  # -> Provider
    """Build the configured provider; imports only what that provider needs (keeps headless start-up fast)."""
    if config.provider == "demo":
        from .providers.demo import DemoProvider

        return DemoProvider(config.model, delay=config.demo_delay)
    if config.provider == "script":
        if not config.script:
            raise ConfigError("the script provider needs a script: pass --script FILE or set CAIRN_SCRIPT")
        from .providers.script import ScriptError, ScriptProvider

        try:
            return ScriptProvider(config.script, config.model)
        except ScriptError as e:
            raise ConfigError(str(e)) from None
    from .providers.openai import DEFAULT_BASE_URL, OpenAIProvider, redact_url

    url = config.base_url or DEFAULT_BASE_URL
    if not config.api_key and not is_local_url(url):
        raise ConfigError(
            f"the openai provider needs an API key for {redact_url(url)}: set CAIRN_API_KEY (or OPENAI_API_KEY), "
            "or point CAIRN_BASE_URL at a local server"
        )
    return OpenAIProvider(
        config.model or DEFAULT_OPENAI_MODEL,
        base_url=config.base_url,
        api_key=config.api_key,
        timeout=config.timeout,
        **openai_parameters(config),
    )


def openai_parameters(config: Config) -> dict[str, Any]:
    """The model parameters given to the provider: max_tokens always, the others only when set (unset ones are not
    sent to the server)."""
    params: dict[str, Any] = {"max_tokens": config.max_tokens}
    for name in ("temperature", "top_p", "reasoning_effort"):
        value = getattr(config, name)
        if value is not None:
            params[name] = value
    return params
