"""Building the configured provider, and the secrets it (and the config) hold.

`make_provider` imports only what the chosen provider needs (headless start-up stays fast) and turns what the
operator can get wrong (no script, no key for a hosted endpoint, a proxy httpx cannot use) into a ConfigError (exit
2). The secrets listed here (the key, credentials in a base URL or a model name, a database password) are scrubbed
from every event and withheld from tools.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from ..providers.base import Provider, secrets_of
from .checks import ConfigError, is_local_url
from .settings import (
    DEFAULT_ANTHROPIC_MODEL,
    DEFAULT_OPENAI_MODEL,
    PROVIDER_KEY_VARIABLES,
    Config,
    withhold_from_tools,
)


def provider_secrets(provider: Provider) -> list[str]:
    """Strings that must never be stored or shown (the key, credentials in the base URL, and a key pasted into the
    model name); none for demo/script but the last."""
    return secrets_of(provider) + model_secrets(provider.model)


def model_secrets(model: str | None) -> list[str]:
    """The parts of a model name shaped like a credential: a key given as `--model sk-…`, a URL with a token or a
    `api_key=` parameter. They are masked like a configured key (SPEC §5: a key's value is never stored or shown),
    with prompt history's rules for what a credential looks like (`history.SECRET_SHAPES`) and a URL's user part."""
    if not model:
        return []
    from ..history import SECRET_SHAPES

    found: list[str] = []
    for shape in SECRET_SHAPES:
        for match in shape.finditer(model):
            label = match.group(1) if shape.groups else ""
            keep_label = bool(label) and label.rstrip().endswith(("=", ":"))
            found.append(match.group(0)[len(label):] if keep_label else match.group(0))
    userinfo = re.search(r"(?<=://)[^/\s@]+(?=@)", model)
    if userinfo:  # the whole user part, and its password (never the user name alone: "user" would mask every "user")
        found += [userinfo.group(0), userinfo.group(0).partition(":")[2]]
    return [f for f in dict.fromkeys(found) if len(f) >= 4]


def database_secrets(url: str | None) -> list[str]:
    """The password in a database URL (postgres backend): scrubbed from events like a provider key."""
    if not url:
        return []
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return []
    return [p for p in {password, unquote(password or "")} if p]


def make_provider(config: Config):  # -> Provider
    """Build the configured provider; imports only what that provider needs (keeps headless start-up fast).

    A missing key for a hosted endpoint, and proxy settings httpx cannot use, are configuration errors (exit 2)."""
    if config.provider == "demo":
        from ..providers.demo import DemoProvider

        return DemoProvider(config.model, delay=config.demo_delay)
    if config.provider == "script":
        if not config.script:
            raise ConfigError("the script provider needs a script: pass --script FILE or set CAIRN_SCRIPT")
        from ..providers.script import ScriptError, ScriptProvider

        try:
            return ScriptProvider(config.script, config.model)
        except ScriptError as e:
            raise ConfigError(str(e)) from None
    cls: Callable[..., Any]
    if config.provider == "anthropic":
        from ..providers import anthropic

        cls, default_model = anthropic.AnthropicProvider, DEFAULT_ANTHROPIC_MODEL
        default_url = anthropic.DEFAULT_BASE_URL
        extra: dict[str, Any] = {"thinking_budget": config.thinking_budget}
    else:
        from ..providers import openai

        cls, default_model, default_url = openai.OpenAIProvider, DEFAULT_OPENAI_MODEL, openai.DEFAULT_BASE_URL
        extra = {"include_usage": config.include_usage}
    _require_key(config, config.base_url or default_url)
    provider = _build(lambda: cls(
        config.model or default_model, base_url=config.base_url, api_key=config.api_key, timeout=config.timeout,
        **extra, **provider_parameters(config),
    ))
    # an explicit max_tokens is sent as set; the default one is kept inside a window the server reports
    provider.max_tokens_explicit = config.sources.get("max_tokens", "default") != "default"
    withhold_from_tools([], provider_secrets(provider))  # the key as sent, and credentials in the base URL
    return provider


def _require_key(config: Config, url: str) -> None:
    from ..providers.openai import redact_url

    if config.api_key or is_local_url(url):
        return
    variable = config.api_key_env or PROVIDER_KEY_VARIABLES.get(config.provider, "CAIRN_API_KEY")
    if config.sources.get("api_key_env", "").startswith("profile"):
        where = f"set {variable} (named by api_key_env in profile {config.profile})"
    elif config.provider == "openai":
        where = "set CAIRN_API_KEY (or OPENAI_API_KEY)"
    else:
        where = f"set {variable} (or CAIRN_API_KEY)"
    raise ConfigError(
        f"the {config.provider} provider needs an API key for {redact_url(url)}: {where}, "
        "or point --base-url / CAIRN_BASE_URL at a local server"
    )


def _build(construct: Callable[[], Any]) -> Any:
    """Construct a provider; its HTTP client reads the proxy variables, and one it cannot use is a configuration
    error naming them (never the proxy URL itself: it may carry credentials)."""
    try:
        return construct()
    except (ValueError, ImportError) as e:
        text = str(e)
        if "proxy" not in text.lower() and "socks" not in text.lower():
            raise
        names = [n for n in ("ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
                 if os.environ.get(n)]
        raise ConfigError(
            f"the proxy in {' / '.join(names) or 'the proxy variables'} cannot be used: "
            + ("install SOCKS support (pip install 'httpx[socks]')" if "socksio" in text
               else "use an http://, https:// or socks5:// proxy URL")
        ) from None


def provider_parameters(config: Config) -> dict[str, Any]:
    """The model parameters given to the provider: max_tokens always, the others only when set (unset ones are not
    sent to the server)."""
    params: dict[str, Any] = {"max_tokens": config.max_tokens}
    for name in ("temperature", "top_p", "reasoning_effort", "tool_choice", "parallel_tool_calls"):
        value = getattr(config, name)
        if value is not None:
            params[name] = value
    if config.headers:
        params["extra_headers"] = dict(config.headers)
    if config.extra_body:
        params["extra_body"] = dict(config.extra_body)
    if config.api_key_header:
        params["api_key_header"] = config.api_key_header
    return params
