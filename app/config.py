"""Resolve where sessions live, which backend and which provider to use, from options and the environment (SPEC §6).

An API key is read here and handed only to the provider's HTTP header; it is never put in the config's printable form,
an event, or a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cairn.persistence.store import BACKENDS

PROVIDERS = ("demo", "script", "openai")


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
    timeout: float = 120.0
    demo_delay: float = 0.02


def resolve_config(
    *,
    home: str | None = None,
    backend: str | None = None,
    provider: str | None = None,
    model: str | None = None,
    script: str | None = None,
    workspace: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    env = os.environ if env is None else env
    home_path = Path(home or env.get("CAIRN_HOME") or default_home()).expanduser()
    backend = backend or env.get("CAIRN_BACKEND") or "jsonl"
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    api_key = env.get("CAIRN_API_KEY") or env.get("OPENAI_API_KEY") or None
    provider = provider or env.get("CAIRN_PROVIDER") or ("openai" if api_key else "demo")
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; choose one of: {', '.join(PROVIDERS)}")
    script = script or env.get("CAIRN_SCRIPT") or None
    if provider == "script" and not script:
        raise ConfigError("the script provider needs a script: pass --script FILE or set CAIRN_SCRIPT")
    ws = Path(workspace or ".").expanduser()
    if not ws.is_dir():
        raise ConfigError(f"workspace {ws} is not a directory")
    try:
        timeout = float(env.get("CAIRN_TIMEOUT") or 120)
        demo_delay = float(env.get("CAIRN_DEMO_DELAY_MS") or 20) / 1000
    except ValueError:
        raise ConfigError("CAIRN_TIMEOUT and CAIRN_DEMO_DELAY_MS must be numbers") from None
    return Config(
        home=home_path,
        backend=backend,
        provider=provider,
        model=model or env.get("CAIRN_MODEL") or None,
        script=script,
        workspace=ws.resolve(),
        base_url=env.get("CAIRN_BASE_URL") or None,
        api_key=api_key,
        timeout=timeout,
        demo_delay=demo_delay,
    )


def make_provider(config: Config):  # -> Provider
    """Build the configured provider; imports only what that provider needs (keeps headless start-up fast)."""
    if config.provider == "demo":
        from .providers.demo import DemoProvider

        return DemoProvider(config.model, delay=config.demo_delay)
    if config.provider == "script":
        from .providers.script import ScriptError, ScriptProvider

        try:
            return ScriptProvider(config.script or "", config.model)
        except ScriptError as e:
            raise ConfigError(str(e)) from None
    from .providers.openai import OpenAIProvider

    return OpenAIProvider(
        config.model or "gpt-4o-mini", base_url=config.base_url, api_key=config.api_key, timeout=config.timeout
    )
