"""What the resolver and the config file reader both check: the error type (exit 2) and the URLs they accept.

Both import this module and it imports neither, so reading the file never needs the resolver, and the resolver reads
the file only when it is asked to.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A bad option, environment value or config file; exit code 2."""


def check_database_url(url: str | None) -> None:
    """The postgres backend needs a libpq URL (or key=value conninfo); the message never repeats it (it may hold a
    password)."""
    if not url or not url.strip():
        raise ConfigError("the postgres backend needs a database: pass --database-url, set CAIRN_DATABASE_URL or give "
                          "the profile a database_url, e.g. postgresql://cairn@db.example:5432/cairn")
    if "://" in url and not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("--database-url / CAIRN_DATABASE_URL must be a postgresql:// URL, "
                          "e.g. postgresql://cairn@db.example:5432/cairn")


def describe_database_url(url: str | None) -> str | None:
    """The database URL as it may be shown: scheme, host, port and database; never the user's password or options."""
    if not url:
        return None
    parts = urlsplit(url) if "://" in url else None
    if parts is None:
        return "(a key=value connection string)"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


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
