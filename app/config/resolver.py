"""Resolve where sessions live, which backend and which provider to use, from options and the environment (SPEC §6).

Precedence: an option (flag or API argument), then the environment, then the default. Every variable is validated here
and a bad value is a `ConfigError` naming it (exit 2), never a traceback. Settings only a model run needs (provider,
model parameters, timeouts) are validated only when `runs_model` is true, so `cairn show` and `cairn sessions` work
whatever the provider configuration says; whether the chosen provider can actually be built (a script file, an API key
for a hosted endpoint) is checked by `make_provider`, which runs after a resumed session's own provider is known.

An API key is read (`settings.with_api_key`) and handed only to the provider; it is never put in the config's printable
form, an event, or a file. Nor does a tool see it (SPEC §10 rev 4): every key variable named here (each profile's
`api_key_env` too) and every secret value learned here (the key, the database URL and its password, credentials in a
base URL) is passed to `tools.command.withhold`, which keeps them out of `run_command`'s environment.

The rest of the room is split by job: `settings` (Config and its defaults), `resumed` (a resumed session's config),
`provider` (building the provider); callers import their names from them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from cairn.persistence.store import BACKENDS

from .checks import ConfigError, check_base_url, check_database_url
from .provider import database_secrets
from .settings import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT,
    PROVIDERS,
    Config,
    default_config_path,
    default_home,
    with_api_key,
    withhold_from_tools,
)


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
    database_url: str | None = None,
    profile: str | None = None,
    config_file: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
    runs_model: bool = True,
) -> Config:
    """The effective configuration. Precedence for every setting: an option (flag or API argument), then its
    environment variable, then the chosen profile of the config file, then the default; where sessions live
    (backend, database_url) follows the same order.

    The profile is `profile` (--profile), else CAIRN_PROFILE, else the file's `default_profile`. The file is
    `config_file` (--config), else CAIRN_CONFIG, else the user config dir's cairn/config.toml (absent is fine there,
    not when named). When `env` is given (tests, embedders) instead of the process environment, only a file it names
    with CAIRN_CONFIG is read. Commands that never run a model (`runs_model=False`) take only the storage settings
    from the profile and never fail on the file: they read sessions whatever the provider configuration says."""
    real_env = env is None
    env = os.environ if env is None else env
    sources: dict[str, str] = {}
    if home is not None and not home.strip():
        raise ConfigError("--home is empty: name a directory, or leave the option out for the default")
    if home is None and "CAIRN_HOME" in env and not env["CAIRN_HOME"].strip():
        # where sessions are written must never fall back silently (`CAIRN_HOME=$DIR` with DIR unset)
        raise ConfigError("CAIRN_HOME is set but empty: name a directory, or unset it for the default")
    if home:
        home_path, sources["home"] = Path(home), "flag --home"
    elif env.get("CAIRN_HOME"):
        home_path, sources["home"] = Path(env["CAIRN_HOME"]), "env CAIRN_HOME"
    else:
        home_path, sources["home"] = default_home(), "default"
    home_path = home_path.expanduser()
    # The file is read first: a profile can choose where sessions live (backend, database_url), which every command
    # needs. A command that only reads sessions takes nothing else from it, and goes on without a file it cannot use.
    try:
        file, sources["config_file"] = _load_file(config_file, env, real_env)
        chosen_profile, sources["profile"] = _choose_profile(file, profile, env)
    except ConfigError as e:
        if runs_model:
            raise
        file, chosen_profile = None, None
        sources["config_file"], sources["profile"] = f"not read ({e})", "default"
    picker = _Picker(env, sources, chosen_profile)
    backend = picker.pick("backend", backend, "--backend", "CAIRN_BACKEND", "jsonl")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r} (--backend / CAIRN_BACKEND); choose one of: {', '.join(BACKENDS)}")
    database_url = picker.pick("database_url", database_url, "--database-url", "CAIRN_DATABASE_URL")
    if backend == "postgres":
        check_database_url(database_url)
    ws = Path(workspace or ".").expanduser()
    if not ws.is_absolute() or not home_path.is_absolute():
        _require_cwd("--workspace DIR" if not ws.is_absolute() else "an absolute --home DIR")
    if not ws.is_dir():
        raise ConfigError(f"workspace {ws} is not a directory")
    sources["workspace"] = "flag --workspace" if workspace else "default"
    snapshots = picker.pick("snapshots", None, "", "CAIRN_SNAPSHOTS", "auto", _parse_snapshots)
    project_context = picker.pick("project_context", None, "", "CAIRN_PROJECT_CONTEXT", "on", _parse_on_off)
    config = Config(home=home_path, backend=backend, provider="demo", model=None, script=None, workspace=ws.resolve(),
                    database_url=database_url, sources=sources, env=env, snapshots=snapshots,
                    project_context=project_context,
                    config_file=file.path if file else None, profile=chosen_profile.name if chosen_profile else None)
    if not runs_model:
        return config
    # every profile's key, not only the chosen one's: a tool has no business with any key Cairn was given
    profile_keys = [p.settings.get("api_key_env") for p in file.profiles.values()] if file else []
    withhold_from_tools(profile_keys, [database_url, *database_secrets(database_url)])

    explicit_profile = chosen_profile is not None and sources.get("profile", "").startswith(("flag", "env"))

    chosen = picker.pick("provider", provider, "--provider", "CAIRN_PROVIDER")
    if chosen is not None and chosen not in PROVIDERS:
        raise ConfigError(f"unknown provider {chosen!r} (--provider / CAIRN_PROVIDER); choose one of: {', '.join(PROVIDERS)}")
    provider_from = sources["provider"]
    if chosen is None:
        has_key = bool(api_key or env.get("CAIRN_API_KEY") or env.get("OPENAI_API_KEY"))
        chosen = "openai" if has_key else "demo"
        sources["provider"] = "default (a key is set)" if has_key else "default (no key set)"
    chosen_model = picker.pick("model", model, "--model", "CAIRN_MODEL")
    url = picker.pick("base_url", base_url, "--base-url", "CAIRN_BASE_URL")
    if url is not None and sources["base_url"] != f"profile {picker.profile_name}":
        check_base_url(url, "--base-url" if base_url else "CAIRN_BASE_URL")
    config = dataclasses.replace(
        config,
        mcp_servers=tuple(file.mcp_servers.values()) if file else (),
        provider=chosen,
        provider_explicit=provider_from.startswith(("flag", "env")) or (explicit_profile and provider_from != "default"),
        model=chosen_model,
        model_explicit=sources["model"].startswith(("flag", "env")) or (explicit_profile and chosen_model is not None),
        base_url_explicit=sources["base_url"].startswith(("flag", "env", "option")) or (explicit_profile and url is not None),
        script=picker.pick("script", script, "--script", "CAIRN_SCRIPT"),
        base_url=url,
        timeout=picker.pick("timeout", None, "", "CAIRN_TIMEOUT", DEFAULT_TIMEOUT, _parse_number(0.0)),
        demo_delay=_number(env, "CAIRN_DEMO_DELAY_MS", 20.0, low=0.0) / 1000,
        max_tokens=picker.pick("max_tokens", max_tokens, "--max-tokens", "CAIRN_MAX_TOKENS", DEFAULT_MAX_TOKENS,
                               lambda raw, name: _integer(raw, name, DEFAULT_MAX_TOKENS, low=1)),
        max_retries=picker.pick("max_retries", None, "", "CAIRN_MAX_RETRIES", DEFAULT_MAX_RETRIES,
                                lambda raw, name: _integer(raw, name, DEFAULT_MAX_RETRIES, low=0, high=100)),
        temperature=picker.pick("temperature", None, "", "CAIRN_TEMPERATURE", None, _parse_number(0.0, 2.0)),
        top_p=picker.pick("top_p", None, "", "CAIRN_TOP_P", None, _parse_number(0.0, 1.0)),
        reasoning_effort=picker.pick("reasoning_effort", None, "", "CAIRN_REASONING_EFFORT", None, _parse_word),
    )
    for name, default in (("api_key_header", None), ("headers", {}), ("extra_body", {}), ("tool_choice", None),
                          ("parallel_tool_calls", None), ("include_usage", True), ("context_window", None),
                          ("thinking_budget", None), ("api_key_env", None), ("transcript", "messages")):
        setattr(config, name, picker.pick(name, None, "", None, default))
    return with_api_key(config, api_key)


class _Picker:
    """One setting's value by precedence (option, variable, profile, default), noting where it came from."""

    def __init__(self, env: Mapping[str, str], sources: dict[str, str], profile: Any) -> None:
        self.env = env
        self.sources = sources
        self.settings: dict[str, Any] = profile.settings if profile is not None else {}
        self.profile_name = profile.name if profile is not None else None

    def pick(self, name: str, option: Any, flag: str, variable: str | None, default: Any = None,
             parse: Callable[[Any, str], Any] | None = None) -> Any:
        if option is not None and option != "":
            self.sources[name] = f"flag {flag}" if flag else "option"
            return parse(option, flag) if parse else option
        raw = self.env.get(variable) if variable else None
        if variable and raw is not None and raw.strip() != "":
            self.sources[name] = f"env {variable}"
            return parse(raw, variable) if parse else raw
        if name in self.settings:
            self.sources[name] = f"profile {self.profile_name}"
            value = self.settings[name]
            return dict(value) if isinstance(value, dict) else value
        self.sources[name] = "default"
        return dict(default) if isinstance(default, dict) else default


def _require_cwd(instead: str) -> None:
    """A relative path needs the current directory; one that was deleted (or moved away) under the shell is exit 2
    with one line, not a FileNotFoundError from deep inside pathlib."""
    try:
        os.getcwd()
    except OSError:
        raise ConfigError(f"the current directory no longer exists (deleted or moved away): cd to a directory that "
                          f"exists, or pass {instead}") from None


def _load_file(option: str | None, env: Mapping[str, str], real_env: bool):  # -> (ConfigFile | None, source)
    from .file import ConfigFileError, read_config_file

    if option:
        path, named = Path(option).expanduser(), "--config"
    elif env.get("CAIRN_CONFIG"):
        path, named = Path(env["CAIRN_CONFIG"]).expanduser(), "CAIRN_CONFIG"
    elif real_env:
        path, named = default_config_path(), None
        if not path.exists():
            return None, "default (absent)"
    else:
        return None, "default (not read: a given environment without CAIRN_CONFIG)"
    source = "flag --config" if named == "--config" else "env CAIRN_CONFIG" if named else "default"
    try:
        return read_config_file(path), source
    except ConfigFileError as e:
        message = str(e)
        if named and "does not exist" in message:
            message += f" (named by {named}); create it or fix the path"
        raise ConfigError(message) from None


def _choose_profile(file: Any, option: str | None, env: Mapping[str, str]):  # -> (Profile | None, source)
    from .file import ConfigFileError

    if option:
        name, how = option, "--profile"
    elif env.get("CAIRN_PROFILE"):
        name, how = env["CAIRN_PROFILE"], "CAIRN_PROFILE"
    elif file is not None and file.default_profile:
        name, how = file.default_profile, "default_profile"
    else:
        return None, "default"
    if file is None:
        raise ConfigError(
            f"{how} names the profile {name!r}, but there is no config file "
            f"(looked for {env.get('CAIRN_CONFIG') or default_config_path()}; --config FILE or CAIRN_CONFIG names one)"
        )
    try:
        profile = file.profile(name, how)
    except ConfigFileError as e:
        raise ConfigError(str(e)) from None
    return profile, ("flag --profile" if how == "--profile" else "env CAIRN_PROFILE" if how == "CAIRN_PROFILE"
                     else "config file default_profile")


def _number(env: Mapping[str, str], name: str, default: float | None, low: float, high: float | None = None):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return _parse_number(low, high)(raw, name)


def _parse_number(low: float, high: float | None = None) -> Callable[[Any, str], float]:
    def parse(raw: Any, name: str) -> float:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < low or (high is not None and value > high):
            limits = f"between {low:g} and {high:g}" if high is not None else f"a number >= {low:g}"
            raise ConfigError(f"{name} must be {limits}, not {str(raw).strip()[:40]!r}")
        return value

    return parse


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


def _parse_snapshots(raw: Any, name: str) -> str:
    value = str(raw).strip().lower()
    if value not in ("auto", "off"):
        raise ConfigError(f"{name} must be auto or off, not {str(raw).strip()[:40]!r}")
    return value


def _parse_on_off(raw: Any, name: str) -> str:
    value = str(raw).strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"{name} must be on or off, not {str(raw).strip()[:40]!r}")
    return value


def _parse_word(raw: Any, name: str) -> str:
    raw = str(raw).strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", raw):
        raise ConfigError(f"{name} must be a single word such as low, medium or high, not {raw[:40]!r}")
    return raw
