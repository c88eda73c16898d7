"""An MCP server over stdio written as raw JSON-RPC lines (no SDK), so it can send what an SDK never would.

    python tests/mcp_raw_server.py

Tools:
- `good`     a plain tool: answers `ok <text>`;
- `garble`   first writes a line of invalid UTF-8, then answers with a text holding invalid UTF-8 bytes;
- `die`      exits in the middle of the call (the next call needs a new server);
- `broken`   listed with an input schema that is not an object (a client must leave out this one tool, not the server).

Every request appends `{"method", "pid"}` to the file named by `MCP_RECORD` (when set).
"""

from __future__ import annotations

import json
import os
import sys

TOOLS = [
    {"name": "good", "description": "answers ok", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
     "annotations": {"readOnlyHint": True}},
    {"name": "garble", "description": "invalid UTF-8", "inputSchema": {"type": "object"},
     "annotations": {"readOnlyHint": True}},
    {"name": "die", "description": "exits mid-call", "inputSchema": {"type": "object"},
     "annotations": {"readOnlyHint": True}},
    {"name": "broken", "description": "a bad schema", "inputSchema": "not an object"},
]


def send(message: dict, raw_tail: bytes = b"") -> None:
    out = sys.stdout.buffer
    out.write(json.dumps(message).encode() + raw_tail + b"\n")
    out.flush()


def record(method: str) -> None:
    path = os.environ.get("MCP_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"method": method, "pid": os.getpid()}) + "\n")


def main() -> None:
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method, ident = message.get("method"), message.get("id")
        if method:
            record(method)
        if ident is None:
            continue  # a notification
        params = message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": ident, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw-test-server", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            name = params.get("name")
            if name == "good":
                text = (params.get("arguments") or {}).get("text", "")
                send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": f"ok {text}"}]}})
            elif name == "garble":
                sys.stdout.buffer.write(b"\xff\xfe\xfd not UTF-8 at all \xc3\x28\n")
                sys.stdout.buffer.flush()
                body = json.dumps({"jsonrpc": "2.0", "id": ident,
                                   "result": {"content": [{"type": "text", "text": "caf@"}]}}).encode()
                sys.stdout.buffer.write(body.replace(b"caf@", b"caf\xe9 \xff") + b"\n")
                sys.stdout.buffer.flush()
            elif name == "die":
                os._exit(3)
            else:
                send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": f"unknown tool {name}"}})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": ident, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
