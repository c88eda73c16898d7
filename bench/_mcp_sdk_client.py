"""P11's baseline: the `mcp` SDK's own client starting a stdio server and listing its tools, as a process of its own
(Python start-up, the SDK's import, the server's start, `initialize`, `tools/list`, the SDK's ordered stop).

    python bench/_mcp_sdk_client.py SERVER.py   # prints the number of tools
"""

import sys

import anyio
import mcp
from mcp import StdioServerParameters, stdio_client


async def main(server: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=[server])
    async with stdio_client(params) as (read, write):
        async with mcp.ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
    print(len(tools.tools))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
