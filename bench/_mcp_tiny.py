"""A tiny stdio MCP server for P11, written with the `mcp` SDK: one read-only tool."""

import asyncio

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("p11-tiny")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def echo(text: str) -> str:
    """Say it back."""
    return text


if __name__ == "__main__":
    asyncio.run(server.run_stdio_async())
