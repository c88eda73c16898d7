"""What an MCP server sends, read before the SDK parses it, and what Cairn learns at the transport boundary.

A stdio server's output is decoded with Cairn's codec (`STDIO_ENCODING`, registered by `register_codec`), and an HTTP
server's bodies are read through `http_client`: either way invalid UTF-8 and lone surrogate escapes become U+FFFD, so
an answer is never dropped and no call waits for its time limit (SPEC §8). The HTTP client also notes each call whose
request could not even be sent (no connection), so that call can say it did not run. Nothing here imports the `mcp`
SDK at import time.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

META_KEY = "cairn/call_id"  # where a request's `_meta` carries the Cairn call id (the idempotency key of SPEC §1)

# JSON text from a server, read before the SDK parses it. A server on the official TypeScript SDK that cuts a string
# between the two halves of an emoji sends what JSON.stringify makes of it: a lone surrogate escape ("\ud83d"). The
# SDK's strict parser refuses the whole message, so the answer is lost and the call waits for its time limit (SPEC §8:
# never a stalled call). Each lone surrogate escape becomes "\ufffd" (U+FFFD, the same six characters, so a
# Content-Length stays right); a well-formed pair and every other escape pass unchanged. Escapes are read from left to
# right, so the "\\" of an escaped backslash is never taken for the start of one. Backslashes occur only inside JSON
# strings, so no other context is needed; only an escape cut by a chunk's end is held back for the next chunk.
_LOW_ESCAPE_PREFIX = re.compile(r"(\\(u([dD]([c-fC-F][0-9a-fA-F]{0,2})?)?)?)?")  # what may still become "\\udcXX"
_HEX = frozenset("0123456789abcdefABCDEF")
REPLACEMENT_ESCAPE = "\\ufffd"


def _hex4(text: str, at: int) -> int | None:
    """The value of the four hex digits at `at`, or None when they are not four hex digits."""
    digits = text[at:at + 4]
    return int(digits, 16) if len(digits) == 4 and all(c in _HEX for c in digits) else None


def replace_lone_surrogates(text: str, final: bool = True) -> tuple[str, str]:
    """(`text` with each lone surrogate escape replaced by "\\ufffd", the tail held back because an escape there is
    cut short — always "" when `final`)."""
    out: list[str] = []
    i, n = 0, len(text)
    while True:
        j = text.find("\\", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out), ""
        out.append(text[i:j])
        if not final and (j + 6 > n and _could_be_escape(text[j:])):
            return "".join(out), text[j:]
        if text[j + 1:j + 2] != "u" or (code := _hex4(text, j + 2)) is None:
            out.append(text[j:j + 2])  # any other escape ("\\\\", "\\n", …), or not one at all: unchanged
            i = j + 2
            continue
        i = j + 6
        if not 0xD800 <= code <= 0xDFFF:
            out.append(text[j:i])
            continue
        if code <= 0xDBFF:  # a high surrogate: whole only when a low one follows
            rest = text[i:i + 6]
            if not final and len(rest) < 6 and _LOW_ESCAPE_PREFIX.fullmatch(rest):
                return "".join(out), text[j:]
            low = _hex4(text, i + 2) if rest.startswith("\\u") else None
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                out.append(text[j:i + 6])
                i += 6
                continue
        out.append(REPLACEMENT_ESCAPE)


def _could_be_escape(tail: str) -> bool:
    """Whether `tail` (a backslash and fewer than six characters) may still become a \\uXXXX escape."""
    return tail == "\\" or (tail[1] == "u" and all(c in _HEX for c in tail[2:]))


class JsonTextDecoder(codecs.IncrementalDecoder):
    """UTF-8 (with the error handler given, "replace" for servers), then lone surrogate escapes replaced."""

    def __init__(self, errors: str = "strict") -> None:
        super().__init__(errors)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors)
        self._held = ""

    def decode(self, data: Any, final: bool = False) -> str:
        text, self._held = replace_lone_surrogates(self._held + self._utf8.decode(data, final), final)
        return text

    def reset(self) -> None:
        self._utf8.reset()
        self._held = ""

    def getstate(self) -> tuple[bytes, int]:
        buffered, flag = self._utf8.getstate()
        return self._held.encode("ascii") + buffered, flag  # (what is held is an escape's start: ASCII)

    def setstate(self, state: tuple[bytes, int]) -> None:
        self.reset()
        self._utf8.setstate(state)


STDIO_ENCODING = "cairn_mcp_json"  # the codec a stdio server's output is read with (see `JsonTextDecoder`)


def _find_codec(name: str) -> codecs.CodecInfo | None:
    if name != STDIO_ENCODING:
        return None

    def decode(data: Any, errors: str = "strict") -> tuple[str, int]:
        text, _ = codecs.utf_8_decode(data, errors, True)
        return replace_lone_surrogates(text)[0], len(data)

    return codecs.CodecInfo(codecs.utf_8_encode, decode, name=STDIO_ENCODING,
                            incrementalencoder=codecs.getincrementalencoder("utf-8"),
                            incrementaldecoder=JsonTextDecoder)


_codec_registered = False


def register_codec() -> None:
    """The SDK's stdio transport decodes the server's stdout with the encoding it is given (StdioServerParameters):
    that name is the seam where Cairn reads the bytes before the SDK parses them."""
    global _codec_registered
    if not _codec_registered:
        codecs.register(_find_codec)
        _codec_registered = True


def http_client(headers: dict[str, str], unsent: dict[str, str]) -> Any:
    """The HTTP client a streamable HTTP server is reached with: the SDK's (its timeouts, proxies from the
    environment), plus two things at the transport boundary, where Cairn sees the bytes and the failures first:

    - every response body is read through `replace_lone_surrogates` (bodies with a Content-Encoding are left as they
      are: their bytes are not JSON text yet);
    - a `tools/call` whose request could not even be sent — no connection to the server (refused, unreachable, timed
      out connecting) — has its call id put in `unsent` (with why), so the call says it never reached the server and
      did not run, instead of "stopped while this call was running"."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    class Fixed(httpx2.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            held = ""
            async for chunk in self.inner:
                # bytes as Latin-1 text: one character per byte, so the ASCII escapes are found and the rest kept as is
                text, held = replace_lone_surrogates(held + chunk.decode("latin-1"), final=False)
                if text:
                    yield text.encode("latin-1")
            if held:
                yield replace_lone_surrogates(held)[0].encode("latin-1")

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Client(httpx2.AsyncClient):
        async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
            try:
                response = await super().send(request, stream=True, **kwargs)
            except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as e:
                call_id = _call_id_of(request)
                if call_id is not None:
                    unsent[call_id] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                raise
            if response.headers.get("content-encoding", "identity").strip().lower() in ("", "identity"):
                response.stream = Fixed(response.stream)
            if not stream:
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            return response

    return Client(headers=headers, timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))


def _call_id_of(request: Any) -> str | None:
    """The Cairn call id a `tools/call` request carries (`params._meta["cairn/call_id"]`), else None."""
    try:
        message = json.loads(request.content)
        if message.get("method") != "tools/call":
            return None
        value = message["params"]["_meta"][META_KEY]
    except Exception:  # noqa: BLE001 -- not a request Cairn can read: not a call
        return None
    return value if isinstance(value, str) else None
