"""The effective configuration (`Config`), its defaults, and the API key read for it.

`resolver` fills a `Config` from options, the environment and the config file; `resumed` adjusts it for a resumed
session; `provider` builds the provider it names. An API key is read here (`with_api_key`) and handed only to the
provider; it is never put in the config's printable form, an event, or a file. Nor does a tool see it (SPEC §10 rev 4):
every key variable and secret value learned while resolving is passed to `tools.command.withhold`
(`withhold_from_tools`), which keeps them out of `run_command`'s environment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

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
    project_context: str = "on"  # project instructions and environment in the system prompt (issue 42): "on" or "off"
    # MCP servers this session starts (config file `[mcp_servers.NAME]`, plus an editor's in ACP): tools.mcp configs
    mcp_servers: tuple[Any, ...] = ()
    # setting -> where its value came from: "flag --model", "env CAIRN_MODEL", "profile NAME", "default"
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)


def with_api_key(config: Config, option: str | None = None) -> Config:
    """Read the key for `config.provider`: the option (API argument), else CAIRN_API_KEY, else the profile's
    `api_key_env`, else the provider's own variable (OPENAI_API_KEY, ANTHROPIC_API_KEY)."""
    env = config.env
    default_variable = PROVIDER_KEY_VARIABLES.get(config.provider)
    key: str | None
    variable: str | None
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
