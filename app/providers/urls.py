"""Base URLs as Cairn shows and records them: credentials inside a URL (userinfo, key-like query parameters) are used
as given but never shown (`redact_url`), listed for the session's scrubber, and left out of the endpoint a
`request/header` records (`endpoint_of`)."""

from __future__ import annotations

from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

# URL credentials shorter than this are still hidden in URLs, but not listed in `secrets`: scrubbing every occurrence
# of a 3-letter word from a whole session log would mangle it and protect nothing.
MIN_SECRET_CHARS = 6

_SECRET_NAMES = frozenset(
    {
        "key", "apikey", "api_key", "x_api_key", "token", "access_token", "auth", "auth_token", "refresh_token",
        "id_token", "session_token", "sig", "signature", "password", "passwd", "pwd", "secret", "client_secret",
        "authorization", "proxy_authorization", "cookie",
    }
)
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_signature", "_password", "_sig")


def is_secret_name(name: str) -> bool:
    norm = name.strip().lower().replace("-", "_")
    return norm in _SECRET_NAMES or norm.endswith(_SECRET_SUFFIXES)


def url_credentials(url: str) -> list[str]:
    """The secret strings inside `url` (userinfo parts, values of key-like query parameters), raw and decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found.append(userinfo)
        for piece in userinfo.split(":", 1):
            found += [piece, unquote(piece)]
    for item in parts.query.split("&"):
        name, eq, value = item.partition("=")
        if eq and value and is_secret_name(unquote_plus(name)):
            found += [value, unquote_plus(value)]
    return found


def redact_url(url: str) -> str:
    """`url` with its credentials (userinfo, key-like query parameters) replaced by `***`; unchanged otherwise.

    Public: whoever prints a base URL (errors, `cairn show`, the TUI) calls this rather than guessing what is secret."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not even splittable: hide everything that could be a credential
        return "***" if "@" in url or "?" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query_items = []
    for item in parts.query.split("&") if parts.query else []:
        name, eq, value = item.partition("=")
        if eq and value and is_secret_name(unquote_plus(name)):
            item = f"{name}=***"
        query_items.append(item)
    query = "&".join(query_items)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing secret: keep the text byte for byte
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def endpoint_of(url: str) -> str:
    """`url` as a session records where it was sent (SPEC §2 rev 3): userinfo and key-like query parameters removed,
    so it can be stored, shown and used again by a resume without holding a credential."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return ""
    query = "&".join(item for item in parts.query.split("&") if item
                     and not is_secret_name(unquote_plus(item.partition("=")[0])))
    return urlunsplit((parts.scheme, host, parts.path, query, parts.fragment))
