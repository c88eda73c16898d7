"""What a local server says about its own context size (SPEC §7 rev 3, "Limits from the server").

Asked in this order, the first answer winning: llama.cpp's `GET /props` (`default_generation_settings.n_ctx`, the
size of one slot), the `GET /v1/models` entry of the model (vLLM `max_model_len`, llama.cpp `meta.n_ctx` or
`n_ctx_train`, LM Studio / OpenRouter style `context_length`), then Ollama's `POST /api/show` (`num_ctx` from the
model's parameters; without one, Ollama runs the model with its default context, so the model's own
`context_length` is capped at that default rather than trusted). Only local servers are asked (a hosted endpoint
gets no probes), each once per process and endpoint. Everything a server answers is outside input: only whole numbers
in a sane range are taken.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..config.checks import is_local_url

MIN_WINDOW = 256
MAX_WINDOW = 100_000_000
OLLAMA_DEFAULT_CTX = 4096  # what Ollama runs a model with when nothing sets num_ctx
PROBE_TIMEOUT = 3.0

_asked: dict[tuple[str, str], tuple[int, str] | None] = {}


def _tokens(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return None
    value = int(value)
    return value if MIN_WINDOW <= value <= MAX_WINDOW else None


def window_from_props(payload: Any) -> int | None:
    """llama.cpp `GET /props`."""
    settings = payload.get("default_generation_settings") if isinstance(payload, dict) else None
    return _tokens(settings.get("n_ctx")) if isinstance(settings, dict) else None


def window_from_models(payload: Any, model: str) -> int | None:
    """`GET /v1/models`: the entry whose id is the model (or the only entry), in any of the known metadata shapes."""
    entries = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    named = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in named:
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        for value in (entry.get("max_model_len"), meta.get("n_ctx"), entry.get("context_length"),
                      entry.get("context_window"), meta.get("n_ctx_train")):
            if _tokens(value):
                return _tokens(value)
    return None


def window_from_ollama_show(payload: Any) -> int | None:
    """Ollama `POST /api/show`: the model's `num_ctx` parameter, else its trained length capped at Ollama's default."""
    if not isinstance(payload, dict):
        return None
    parameters = payload.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx" and value.strip().isdigit():
                return _tokens(int(value.strip()))
    info = payload.get("model_info")
    if isinstance(info, dict):
        found = [_tokens(v) for k, v in info.items() if isinstance(k, str) and k.endswith(".context_length")]
        trained = [t for t in found if t is not None]
        if trained:
            return min(trained[0], OLLAMA_DEFAULT_CTX)
    return None


async def served_context_window(client: httpx.AsyncClient, base_url: str, model: str,
                                headers: dict[str, str] | None = None) -> tuple[int, str] | None:
    """(tokens, where it came from) as the server at `base_url` says, or None; asked once per process and endpoint,
    and never of a hosted endpoint. `headers`: the key, for a local server started with one."""
    key = (base_url, model)
    if key in _asked:
        return _asked[key]
    _asked[key] = None
    if not is_local_url(base_url):
        return None
    base = base_url.split("?", 1)[0].rstrip("/")
    root = base.removesuffix("/v1")
    probes = (
        ("GET", f"{root}/props", None, window_from_props, "server (GET /props)"),
        ("GET", f"{base}/models", None, lambda p: window_from_models(p, model), "server (GET /v1/models)"),
        ("POST", f"{root}/api/show", {"model": model}, window_from_ollama_show, "server (POST /api/show)"),
    )
    for method, url, body, read, source in probes:
        try:
            reply = await client.request(method, url, json=body, headers=headers, timeout=PROBE_TIMEOUT)
            found = read(reply.json()) if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            found = None
        if found:
            _asked[key] = (found, source)
            break
    return _asked[key]
