"""`cairn config [--json]`: the effective configuration, each setting with its value and where it came from (flag,
environment variable, config file profile, default). Secrets are shown as `***`; nothing is contacted, so it works
with no provider reachable (and says when a key is missing instead of failing on it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cairn.widgets.terminal_text import safe_json, safe_text

from ..config.checks import describe_database_url
from ..config.settings import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL, Config, default_config_path
from ..exit_codes import EXIT_OK
from ..render import shown_model

DEFAULT_MODELS = {"openai": DEFAULT_OPENAI_MODEL, "anthropic": DEFAULT_ANTHROPIC_MODEL}
DEFAULT_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


def settings(config: Config) -> list[tuple[str, Any, str]]:
    """(name, shown value, source) for every setting, secrets masked."""
    from ..providers.openai import is_secret_name, redact_url

    src = config.sources
    rows: list[tuple[str, Any, str]] = []
    file = config.config_file
    if file is not None:
        rows.append(("config_file", str(file), src.get("config_file", "default")))
    else:
        rows.append(("config_file", None, f"{src.get('config_file', 'default')}: {default_config_path()}"))
    rows += [
        ("profile", config.profile, src.get("profile", "default")),
        ("home", str(config.home), src.get("home", "default")),
        ("backend", config.backend, src.get("backend", "default")),
    ]
    if config.backend == "postgres" or config.database_url:
        rows.append(("database_url", describe_database_url(config.database_url), src.get("database_url", "default")))
    rows += [
        ("workspace", str(config.workspace), src.get("workspace", "default")),
        ("snapshots", snapshots_shown(config), src.get("snapshots", "default")),
        ("project_context", config.project_context, src.get("project_context", "default")),
        ("provider", config.provider, src.get("provider", "default")),
    ]
    model = config.model or DEFAULT_MODELS.get(config.provider)
    rows.append(("model", shown_model(model, [config.api_key] if config.api_key else []) if model else model,
                 src.get("model", "default") if config.model else "default"))
    if config.provider == "script":
        rows.append(("script", config.script, src.get("script", "default")))
    if config.provider not in ("openai", "anthropic"):
        return rows
    url = config.base_url or DEFAULT_URLS[config.provider]
    rows.append(("base_url", redact_url(url), src.get("base_url", "default")))
    rows.append(("api_key", "***" if config.api_key else None, src.get("api_key", "default")))
    rows.append(("api_key_header", config.api_key_header or ("x-api-key" if config.provider == "anthropic"
                                                              else "authorization"), src.get("api_key_header", "default")))
    headers = {k: ("***" if is_secret_name(k) or "key" in k.lower() or "token" in k.lower() else v)
               for k, v in config.headers.items()}
    window = context_window_row(config, model or DEFAULT_MODELS[config.provider], url)
    rows.append(("max_tokens", *max_tokens_row(config, window[0])))
    for name, value in (
        ("timeout", config.timeout), ("max_retries", config.max_retries),
        ("temperature", config.temperature), ("top_p", config.top_p), ("reasoning_effort", config.reasoning_effort),
        ("thinking_budget", config.thinking_budget), ("tool_choice", config.tool_choice),
        ("parallel_tool_calls", config.parallel_tool_calls), ("include_usage", config.include_usage),
        ("headers", headers or None), ("extra_body", config.extra_body or None),
    ):
        rows.append((name, value, src.get(name, "default")))
    rows.append(("context_window", *window))
    rows.append(("transcript", config.transcript, src.get("transcript", "default")))
    return rows


def snapshots_shown(config: Config) -> str:
    """`auto`, `off`, or `auto (git not found: off)` — what rewind can restore depends on it."""
    from ..agent.snapshots import git_path

    if config.snapshots == "auto" and git_path() is None:
        return "auto (git not found: off)"
    return config.snapshots


def max_tokens_row(config: Config, window: int) -> tuple[int | None, str]:
    """The output-token limit requests actually send, and why: as set by the operator, or the default kept within a
    quarter of the context window (ProviderLimits.output_tokens, the rule requests follow)."""
    from ..providers.base import MIN_OUTPUT_TOKENS, ProviderLimits

    source = config.sources.get("max_tokens", "default")
    if source != "default" or not config.max_tokens:
        return config.max_tokens, source
    sent = ProviderLimits(max_tokens=config.max_tokens).output_tokens(window)
    if sent == config.max_tokens:
        return sent, f"default (within a quarter of the {window:,}-token context window)"
    if sent == MIN_OUTPUT_TOKENS:
        return sent, f"default: the floor, as a quarter of the {window:,}-token context window is less"
    return sent, f"default: a quarter of the {window:,}-token context window (at most {config.max_tokens:,})"


def context_window_row(config: Config, model: str, url: str) -> tuple[int, str]:
    """The window requests are kept inside, and where it comes from: configured (profile, CAIRN_CONTEXT_WINDOW), else
    what a local server says (asked now, a few seconds at most), else the model family's (SPEC §7 rev 3)."""
    from ..agent.compaction import configured_window, context_window_for

    if config.context_window:
        return config.context_window, config.sources.get("context_window", "default")
    configured = configured_window(config.env)
    if configured:
        return configured, "env CAIRN_CONTEXT_WINDOW"
    if config.provider == "openai":
        import anyio
        import httpx

        from ..providers.served_limits import served_context_window

        async def ask() -> tuple[int, str] | None:
            async with httpx.AsyncClient(trust_env=False) as client:
                key = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
                return await served_context_window(client, url.rstrip("/"), model, key)

        found = anyio.run(ask)
        if found:
            return found
    return context_window_for(model, {}), "default (model family)"


def instruction_files(config: Config) -> tuple[list[dict[str, Any]], str]:
    """The project instruction files a turn in this workspace would read now (path, level, size, cut or unreadable),
    and where that comes from."""
    from ..agent.project_context import read_instructions, user_config_dir

    if config.project_context == "off":
        return [], "off (project_context)"
    files, _, _ = read_instructions(config.workspace.resolve(), user_config_dir())
    shown = [{"path": f.path, "scope": f.scope, "size": f.size, "truncated": f.truncated, "error": f.error}
             for f in files]
    return shown, "read at each turn's start"


def config_command(args: argparse.Namespace, config: Config) -> int:
    rows = settings(config)
    files, files_source = instruction_files(config)
    if args.json:
        out = {name: {"value": value, "source": source} for name, value, source in rows}
        out["instructions"] = {"value": files, "source": files_source}
        sys.stdout.write(safe_json(json.dumps(out, ensure_ascii=False).encode()).decode() + "\n")
        return EXIT_OK
    width = max(len(name) for name, _, _ in rows)
    shown = [(name, _show(value)) for name, value, _ in rows]
    value_width = min(max(len(v) for _, v in shown), 48)
    for (name, value), (_, _, source) in zip(shown, rows):
        print(safe_text(f"{name.ljust(width)}  {value.ljust(value_width)}  {source}"))
    print_instructions(files, files_source, width, value_width)
    return EXIT_OK


def print_instructions(files: list[dict[str, Any]], source: str, width: int, value_width: int) -> None:
    """`instructions  none  …`, or one line per file under `instructions (…):`."""
    from ..agent.project_context import kb

    if not files:
        shown = "-" if source.startswith("off") else "none"
        print(safe_text(f"{'instructions'.ljust(width)}  {shown.ljust(value_width)}  {source}"))
        return
    print(safe_text(f"instructions ({source}):"))
    for f in files:
        state = f"not readable: {f['error']}" if f["error"] else kb(f["size"]) + (", cut" if f["truncated"] else "")
        print(safe_text(f"  {f['path']}  ({f['scope']}, {state})"))


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
