"""Resolve where sessions live, which backend and which provider to use, from options and the environment (SPEC §6).

Precedence: an option (flag or API argument), then the environment, then the default. Every variable is validated here
and a bad value is a `ConfigError` naming it (exit 2), never a traceback. Settings only a model run needs (provider,
model parameters, timeouts) are validated only when `runs_model` is true, so `cairn show` and `cairn sessions` work
whatever the provider configuration says; whether the chosen provider can actually be built (a script file, an API key
for a hosted endpoint) is checked by `make_provider`, which runs after a resumed session's own provider is known.

An API key is read here and handed only to the provider; it is never put in the config's printable form, an event, or a
file. Nor does a tool see it (SPEC §10 rev 4): every key variable named here (each profile's `api_key_env` too) and
every secret value learned here (the key, the database URL and its password, credentials in a base URL) is passed to
`tools.command.withhold`, which keeps them out of `run_command`'s environment.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from cairn.persistence.store import BACKENDS

from .checks import ConfigError, check_base_url, check_database_url, describe_database_url, is_local_url

PROVIDERS = ("demo", "script", "openai", "anthropic")
DEFAULT_MAX_TOKENS = 8192
DEFAULT_MAX_RETRIES = 4
DEFAULT_TIMEOUT = 120.0
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
# where each provider looks for its key when neither CAIRN_API_KEY nor the profile's api_key_env gives one
PROVIDER_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# settings a profile gives that only make sense for that profile's provider and endpoint: a resumed session that
# continues with another provider does not take them
ENDPOINT_SETTINGS = ("base_url", "api_key_env", "api_key_header", "headers", "extra_body", "tool_choice",
                     "parallel_tool_calls", "reasoning_effort", "thinking_budget", "include_usage", "transcript")


def default_home() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("cairn", appauthor=False))


def default_config_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("cairn", appauthor=False)) / "config.toml"


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
    # postgres backend: a libpq URL; it may hold a password, so it is never printed (describe_database_url)
    database_url: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT  # seconds; 0 = no limit on waiting for the answer
    demo_delay: float = 0.02
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_retries: int = DEFAULT_MAX_RETRIES
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    # whether provider / model were chosen by an option or variable (or a profile chosen by one): a resumed session
    # keeps its own otherwise
    provider_explicit: bool = False
    model_explicit: bool = False
    base_url_explicit: bool = False  # the operator named the server (option, variable, or a profile chosen by one)
    # rev 2: the config file and the profile these settings came from, and the profile-only settings
    config_file: Path | None = None
    profile: str | None = None
    api_key_env: str | None = None  # the variable the key was (or would have been) read from
    api_key_header: str | None = None  # authorization (Bearer, default) | api-key (Azure) | x-api-key
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    include_usage: bool = True
    context_window: int | None = None
    thinking_budget: int | None = None
    transcript: str = "messages"  # "text": tool calls and results written as text (SPEC §7 rev 3, text form)
    snapshots: str = "auto"  # workspace snapshots for rewind (SPEC §9 rev 3): "auto" (where git is) or "off"
    # MCP servers this session starts (config file `[mcp_servers.NAME]`, plus an editor's in ACP): tools.mcp configs
    mcp_servers: tuple[Any, ...] = ()
    # setting -> where its value came from: "flag --model", "env CAIRN_MODEL", "profile NAME", "default"
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)


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
    config = Config(home=home_path, backend=backend, provider="demo", model=None, script=None, workspace=ws.resolve(),
                    database_url=database_url, sources=sources, env=env, snapshots=snapshots,
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


def with_api_key(config: Config, option: str | None = None) -> Config:
    """Read the key for `config.provider`: the option (API argument), else CAIRN_API_KEY, else the profile's
    `api_key_env`, else the provider's own variable (OPENAI_API_KEY, ANTHROPIC_API_KEY)."""
    env = config.env
    default_variable = PROVIDER_KEY_VARIABLES.get(config.provider)
    if option:
        key, variable, source = option, config.api_key_env or default_variable, "option api_key"
    elif env.get("CAIRN_API_KEY"):
        key, variable, source = env["CAIRN_API_KEY"], "CAIRN_API_KEY", "env CAIRN_API_KEY"
    elif config.api_key_env:
        variable = config.api_key_env
        key, source = env.get(variable) or None, f"env {variable} ({config.sources.get('api_key_env', 'profile')})"
    elif default_variable:
        variable = default_variable
        key, source = env.get(variable) or None, f"env {variable}"
    else:
        key, variable, source = None, None, "not used"
    config.sources["api_key"] = source if key or source == "not used" else f"{source}: not set"
    withhold_from_tools([config.api_key_env, variable], [key])
    return dataclasses.replace(config, api_key=key or None, api_key_env=variable)


def withhold_from_tools(names: Iterable[str | None], values: Iterable[str | None] = ()) -> None:
    """Key variables and secret values no tool may inherit (see the module docstring). Imported here, not at the
    top: commands that run no model (`show`, `sessions`) never load the tools."""
    from ..tools.command import withhold

    withhold(names, values)


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
        if raw is not None and raw.strip() != "":
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


def _parse_word(raw: Any, name: str) -> str:
    raw = str(raw).strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", raw):
        raise ConfigError(f"{name} must be a single word such as low, medium or high, not {raw[:40]!r}")
    return raw


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


def provider_secrets(provider: Any) -> list[str]:
    """Strings that must never be stored or shown (the key, credentials in the base URL, and a key pasted into the
    model name); none for demo/script but the last."""
    return [s for s in getattr(provider, "secrets", None) or [] if s] + model_secrets(getattr(provider, "model", None))


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
    if config.provider == "anthropic":
        from ..providers import anthropic as module

        cls, default_model = module.AnthropicProvider, DEFAULT_ANTHROPIC_MODEL
        extra: dict[str, Any] = {"thinking_budget": config.thinking_budget}
    else:
        from ..providers import openai as module

        cls, default_model = module.OpenAIProvider, DEFAULT_OPENAI_MODEL
        extra = {"include_usage": config.include_usage}
    _require_key(config, config.base_url or module.DEFAULT_BASE_URL)
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


openai_parameters = provider_parameters  # the rev 2 name, kept for callers
