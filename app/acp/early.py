"""`cairn acp`'s start: the configuration checked, then `initialize` answered before anything a session needs is imported.

An ACP client spawns the agent and sends `initialize` at once; some give up after a few seconds (acpx: 4 s). Resolving
the configuration, building the provider (httpx, a TLS context), importing the ACP package (its pydantic schema alone
is ~0.35 s), the agent loop and the persistence backends take far longer than answering, and Cairn's answer to
`initialize` depends on nothing the client says or configures. So this module, which imports only the standard library,
reads the first line from stdin itself: when it is a plain `initialize` request it writes the answer (`INITIALIZE_RESULT`, the same JSON `CairnAgent.initialize` gives through the package; a
test keeps the two equal) and only then is `serve.py` (the package, the agent) imported to serve the rest. Whatever it
read but did not answer is handed to serve.py's line screen first, unchanged, so nothing the client sent is lost or
reordered.

Only an `initialize` whose params the package would accept is answered here (a JSON object with an integer
`protocolVersion`; the capabilities and info, when present, objects); anything else, a first line that is not
`initialize`, one longer than the stdio buffer limit, or an end of input, is left to the package as before.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import TYPE_CHECKING, Any, Callable

from cairn.version import __version__

from ..config.checks import ConfigError

if TYPE_CHECKING:
    from ..config.resolver import Config

# what CairnAgent.initialize answers (agent.py), as the package serialises it (by alias, unset fields left out)
INITIALIZE_RESULT: dict[str, Any] = {
    "protocolVersion": 1,
    "agentCapabilities": {
        "loadSession": True,
        "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
        "mcpCapabilities": {"http": True, "sse": False},
        "sessionCapabilities": {"list": {}},
    },
    "authMethods": [],
    "agentInfo": {"name": "cairn", "title": "Cairn", "version": __version__},
}
FIRST_LINE_LIMIT = 1 << 20  # bytes read looking for the first line before handing everything to the package
OPTIONAL_PARAMS = ("clientCapabilities", "clientInfo", "_meta")


def start_acp(resolve: Callable[[], "Config"]) -> int:
    """Entry point of `cairn acp` (cli.py); `resolve` gives the configuration (config/resolver.py).

    With a client on stdin/stdout pipes (or sockets), `initialize` is answered first, then the configuration is
    resolved and the provider built: a bad configuration is then one line on stderr and exit code 2 right after the
    answer, before any session is opened. Otherwise (a terminal, a file, /dev/null) nothing is read before those checks,
    which fail as one line and exit code 2 (raised to the CLI) first, as does stdio that is not pipes."""
    attached = client_attached()
    pending = answer_initialize(sys.stdin.fileno(), sys.stdout.fileno()) if attached else b""
    from ..config.provider import make_provider  # (providers.base, msgspec, asyncio: after the answer)

    config = resolve()
    make_provider(config)
    if not attached:
        check_stdio()
    from .serve import run_acp

    return run_acp(config, pending)


def client_attached() -> bool:
    """stdin and stdout are both pipes or sockets: what an ACP client gives the agent it spawns."""
    for stream in (sys.stdin, sys.stdout):
        try:
            mode = os.fstat(stream.fileno()).st_mode
        except (AttributeError, OSError, ValueError):
            return False
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False
    return True


def check_stdio() -> None:
    """asyncio can stream only pipes, sockets and terminals: say so in one line rather than with a traceback."""
    for stream in (sys.stdin, sys.stdout):
        try:
            fd = stream.fileno()
            mode = os.fstat(fd).st_mode
        except (AttributeError, OSError, ValueError):
            fd, mode = -1, 0
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (fd >= 0 and os.isatty(fd))):
            raise ConfigError(
                "cairn acp speaks the Agent Client Protocol over stdin/stdout pipes; start it from an ACP client "
                "(Zed, Toad), not with a file as its input or output"
            )


def answer_initialize(stdin: int, stdout: int) -> bytes:
    """Read up to the first line; answer it when it is a plain `initialize` request. Returns the bytes read and not
    answered (the package reads them first)."""
    buffered = bytearray()
    while b"\n" not in buffered and len(buffered) < FIRST_LINE_LIMIT:
        try:
            chunk = os.read(stdin, 1 << 16)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        buffered += chunk
    line, newline, rest = bytes(buffered).partition(b"\n")
    if not newline:
        return bytes(buffered)
    answer = initialize_answer(line)
    if answer is None:
        return bytes(buffered)
    _write_all(stdout, answer)
    return rest


def initialize_answer(line: bytes) -> bytes | None:
    """The answer line to `line` when it is a plain `initialize` request, else None."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or message.get("method") != "initialize":
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not set(params) <= {"protocolVersion", *OPTIONAL_PARAMS}:
        return None
    version = params.get("protocolVersion")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= 65535:
        return None
    if any(params.get(name) is not None and not isinstance(params[name], dict) for name in OPTIONAL_PARAMS):
        return None
    answer = {"jsonrpc": "2.0", "id": request_id, "result": INITIALIZE_RESULT}
    return (json.dumps(answer, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
