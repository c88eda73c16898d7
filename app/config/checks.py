"""What the resolver and the config file reader both check: the error type (exit 2) and the URLs they accept.

Both import this module and it imports neither, so reading the file never needs the resolver, and the resolver reads
the file only when it is asked to.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from typing import Iterable
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A bad option, environment value or config file; exit code 2."""


def read_regular_file(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """The first `limit + 1` bytes of the file the user named as `what` ("config file", "script file"), or ConfigError
    with one line naming it.

    Only a regular file is read. It is looked at with `stat` first, so a FIFO, a device or a socket is refused without
    being opened (opening a FIFO for reading waits for a writer: every command would hang); it is then opened
    non-blocking and checked again on the descriptor actually read, so one swapped in meanwhile is refused too. A
    symbolic link to a regular file is followed (dotfile managers link config files)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is {_kind(mode)}, not a regular file; name a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{what} {path} is {_kind(mode)}, not a regular file; name a regular file")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):  # (os.read allocates what it is asked for)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    return {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(mode), "not a regular file")


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether lists and dicts nest more than `limit` levels inside `value` (checked without recursion, so a value
    that only just parsed is never what overflows the stack later, when it is validated, encoded or sent)."""
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        todo.extend((child, depth + 1) for child in children)
    return False


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
