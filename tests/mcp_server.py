"""A small MCP server for the tests, written with the official `mcp` package (the same SDK Cairn's client uses).

    python tests/mcp_server.py [--fail-start] [--hang-start] [--http PORT]

Its tools cover every annotation combination that decides a safety class, plus the awkward cases a client must survive:

- `lookup`        readOnlyHint                           → read_only
- `set_flag`      idempotentHint (not read-only)         → idempotent
- `create_ticket` destructiveHint=false, not idempotent  → side_effecting; records the idempotency key it received
- `drop_table`    destructiveHint                        → side_effecting
- `plain`         no annotations at all                  → side_effecting
- `slow_deploy`   side-effecting, sleeps `seconds`; records start, and a cancellation if one reaches it
- `crash`         the server process dies in the middle of the call
- `picture`       answers with text, an image, an embedded resource and a resource link
- `huge`          answers with `size` characters of text
- `echo`          answers with its `text` (secret scrubbing, control characters)
- `fail`          answers with an MCP error result (`isError`)

Every call appends one JSON line to the file named by `MCP_RECORD` (when set): `{"tool", "event", "key", "pid"}` where
`key` is `_meta["cairn/call_id"]` as received. `--fail-start` exits at once (a server that cannot start);
`--hang-start` never answers `initialize` (a server that is too slow to start); `--http PORT` serves streamable HTTP on
127.0.0.1 instead of stdio. `MCP_ENV_ECHO` names an environment variable whose value `lookup` appends (for the `env`
setting).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import BlobResourceContents, EmbeddedResource, ImageContent, ResourceLink, TextContent, ToolAnnotations

server = MCPServer("cairn-test-server")


def record(tool: str, event: str, ctx: Context | None) -> None:
    path = os.environ.get("MCP_RECORD")
    if not path:
        return
    meta = (ctx.request_context.meta or {}) if ctx is not None else {}
    line = json.dumps({"tool": tool, "event": event, "key": meta.get("cairn/call_id"), "pid": os.getpid()})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def lookup(query: str, ctx: Context) -> str:
    """Look something up (changes nothing)."""
    record("lookup", "done", ctx)
    extra = os.environ.get(os.environ.get("MCP_ENV_ECHO", ""), "")
    return f"found: {query}" + (f" ({extra})" if extra else "")


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
async def set_flag(name: str, value: bool, ctx: Context) -> str:
    """Set a flag; setting it twice has the same effect."""
    record("set_flag", "done", ctx)
    return f"{name}={value}"


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
async def create_ticket(title: str, ctx: Context) -> str:
    """Open a ticket (a new one each time)."""
    record("create_ticket", "done", ctx)
    return f"ticket opened: {title}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
async def drop_table(table: str, ctx: Context) -> str:
    """Drop a table."""
    record("drop_table", "done", ctx)
    return f"dropped {table}"


@server.tool()
async def plain(ctx: Context) -> str:
    """A tool that says nothing about itself."""
    record("plain", "done", ctx)
    return "plain done"


@server.tool(annotations=ToolAnnotations(destructive_hint=False))
async def slow_deploy(seconds: float, ctx: Context) -> str:
    """Deploy, slowly."""
    record("slow_deploy", "started", ctx)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            record("slow_deploy", "cancelled", ctx)
        raise
    record("slow_deploy", "done", ctx)
    return f"deployed after {seconds}s"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def crash(ctx: Context) -> str:
    """Die in the middle of the call."""
    record("crash", "started", ctx)
    os._exit(7)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def picture(ctx: Context) -> list:
    """Text, an image, an embedded resource and a link."""
    return [
        TextContent(type="text", text="a chart of the build times"),
        ImageContent(type="image", data="iVBORw0KGgo=" * 100, mime_type="image/png"),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///tmp/report.bin", blob="AAAA", mime_type="application/octet-stream")),
        ResourceLink(type="resource_link", uri="file:///tmp/log.txt", name="log.txt"),
    ]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def huge(size: int, ctx: Context) -> str:
    """A very long answer."""
    return "x" * size


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def echo(text: str, ctx: Context) -> str:
    """Say it back."""
    return text


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def fail(ctx: Context) -> str:
    """Always fails."""
    raise ToolError("the backend said no")


def main() -> None:
    args = sys.argv[1:]
    if "--fail-start" in args:
        print("cannot reach the ticket system", file=sys.stderr)
        sys.exit(3)
    if "--hang-start" in args:
        time.sleep(3600)
    if "--http" in args:
        port = int(args[args.index("--http") + 1])
        asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=port))
        return
    asyncio.run(server.run_stdio_async())


if __name__ == "__main__":
    main()
