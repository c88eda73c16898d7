"""An MCP server written as raw JSON-RPC (no SDK), so it can send what an SDK never would.

    python tests/mcp_raw_server.py              # stdio, one JSON-RPC message per line
    python tests/mcp_raw_server.py --http PORT  # streamable HTTP on 127.0.0.1:PORT/mcp (JSON responses, no SSE)

Tools:
- `good`     a plain tool: answers `ok <text>`;
- `garble`   first writes a line of invalid UTF-8 (stdio only), then answers with a text holding invalid UTF-8 bytes;
- `die`      exits in the middle of the call (the next call needs a new server);
- `quit`     answers `bye`, then exits (stdio: the server is gone before the next call is made);
- `broken`   listed with an input schema that is not an object (a client must leave out this one tool, not the server);
- `stringy`  listed with a valid JSON Schema that is not an object schema (`{"type": "string"}`): left out too;
- `emoji`    answers at once with a text cut mid-emoji, as the official TypeScript SDK sends it: a lone surrogate
             escape (`"\\ud83d"`) in the JSON, and a well-formed pair (`"\\ud83d\\ude00"`) beside it.

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
    {"name": "quit", "description": "answers, then exits", "inputSchema": {"type": "object"},
     "annotations": {"readOnlyHint": True}},
    {"name": "broken", "description": "a bad schema", "inputSchema": "not an object"},
    {"name": "stringy", "description": "a schema for a string, not an object", "inputSchema": {"type": "string"}},
    {"name": "emoji", "description": "a text cut mid-emoji", "inputSchema": {"type": "object"},
     "annotations": {"readOnlyHint": True}},
]
# what JSON.stringify makes of "cut 😀 here 😀".slice(...) when the cut falls between the two halves of an emoji
EMOJI_TEXT = '"cut \\ud83d here, whole \\ud83d\\ude00, escaped \\\\ud83d"'


def encoded(message: dict) -> bytes:
    return json.dumps(message).encode()


def record(method: str) -> None:
    path = os.environ.get("MCP_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"method": method, "pid": os.getpid()}) + "\n")


def answer(message: dict, stdio: bool) -> bytes | None:
    """The reply to one message, as the bytes of one JSON-RPC message (None for a notification)."""
    method, ident = message.get("method"), message.get("id")
    if method:
        record(method)
    if ident is None:
        return None  # a notification
    params = message.get("params") or {}
    if method == "initialize":
        return encoded({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw-test-server", "version": "1"}}})
    if method == "tools/list":
        return encoded({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    if method == "tools/call":
        name = params.get("name")
        if name == "good":
            text = (params.get("arguments") or {}).get("text", "")
            return encoded({"jsonrpc": "2.0", "id": ident,
                            "result": {"content": [{"type": "text", "text": f"ok {text}"}]}})
        if name == "garble":
            if stdio:
                sys.stdout.buffer.write(b"\xff\xfe\xfd not UTF-8 at all \xc3\x28\n")
                sys.stdout.buffer.flush()
            body = encoded({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": "caf@"}]}})
            return body.replace(b"caf@", b"caf\xe9 \xff")
        if name == "emoji":
            body = encoded({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": "@"}]}})
            return body.replace(b'"@"', EMOJI_TEXT.encode())
        if name == "die":
            os._exit(3)
        if name == "quit" and stdio:
            sys.stdout.buffer.write(encoded({"jsonrpc": "2.0", "id": ident,
                                             "result": {"content": [{"type": "text", "text": "bye"}]}}) + b"\n")
            sys.stdout.buffer.flush()
            os._exit(0)
        return encoded({"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": f"unknown tool {name}"}})
    if method == "ping":
        return encoded({"jsonrpc": "2.0", "id": ident, "result": {}})
    return encoded({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})


def serve_stdio() -> None:
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        reply = answer(message, stdio=True)
        if reply is not None:
            sys.stdout.buffer.write(reply + b"\n")
            sys.stdout.buffer.flush()


def serve_http(port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 -- http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                reply = answer(json.loads(body), stdio=False)
            except ValueError:
                reply = encoded({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
            if reply is None:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def do_GET(self) -> None:  # noqa: N802 -- no server-initiated stream
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_DELETE = do_GET  # noqa: N815

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        serve_http(int(sys.argv[2]))
    else:
        serve_stdio()
