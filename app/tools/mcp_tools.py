"""An MCP server's tools as Cairn's tools: their names, safety classes, input schemas and results.

A listed tool becomes a `Tool` named `NAME__tool` (`exposed_name`) whose safety class is the config's override or
what its annotations say (`safety_from_annotations`); a tool whose input schema is not an object's is left out
(`schema_problem`); a result becomes text for the model and the log (`render_result`), bounded like the built-in
tools' output. A call goes through the server's connection (`tools.mcp_connection`), given here as a function, so
this module knows nothing of transports and never imports the `mcp` SDK.
"""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

from ..config.mcp_servers import SEPARATOR, McpServerConfig
from .base import Safety, Tool, ToolContext, ToolFailure, truncate_output

MAX_TOOL_NAME = 64  # what OpenAI-compatible servers accept for a function name
MAX_DESCRIPTION = 2000

# a connection's `call`: (tool as the server names it, arguments, context, safety class, exposed name) -> result text
CallTool = Callable[[str, dict[str, Any], ToolContext, Safety, str], Awaitable[str]]


def as_tool(config: McpServerConfig, listed: Any, shown: str, call: CallTool) -> Tool:
    """The listed tool as the model is offered it under `shown`: the config's safety class for it, else its
    annotations'; a body that calls it through `call`."""
    safety = config.safety.get(listed.name) or safety_from_annotations(getattr(listed, "annotations", None))
    description = (listed.description or getattr(listed, "title", None) or listed.name)[:MAX_DESCRIPTION]
    name = listed.name

    async def body(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return await call(name, arguments, ctx, safety, shown)

    return Tool(name=shown, description=f"{description} (MCP server {config.name})",
                parameters=input_schema(getattr(listed, "input_schema", None)), safety=safety, body=body)


def safety_from_annotations(annotations: Any) -> Safety:
    """The safety class an MCP tool's annotations give (the table in `tools.mcp`'s docstring); hints only, so unknown
    → the safe default."""
    if annotations is not None and getattr(annotations, "read_only_hint", None) is True:
        return "read_only"
    if annotations is not None and getattr(annotations, "idempotent_hint", None) is True:
        return "idempotent"
    return "side_effecting"


def exposed_name(server: str, tool: str) -> str:
    """`server__tool`, with characters model APIs refuse replaced by `_` and cut to MAX_TOOL_NAME."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", tool)
    return f"{server}{SEPARATOR}{clean}"[:MAX_TOOL_NAME]


def render_result(result: Any) -> str:
    """A CallToolResult as text for the model and the log: text kept; images, audio and binary resources summarised
    (their bytes mean nothing in a transcript); structured content only when there is nothing else."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(getattr(block, "data", "") or "") * 3 // 4
            parts.append(f"[{kind} {getattr(block, 'mime_type', '') or ''}, about {size} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.name} {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(f"[resource {resource.uri}]\n{text}")
            else:
                size = len(getattr(resource, "blob", "") or "") * 3 // 4
                mime = getattr(resource, "mime_type", None) or "binary"
                parts.append(f"[resource {resource.uri}, {mime}, about {size} bytes, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return truncate_output("\n".join(parts))


def input_schema(raw: Any) -> dict[str, Any]:
    """The input schema as offered to the model: an object schema (one without a `type` gets `"type": "object"`; a
    schema whose `type` is something else never reaches here, see `schema_problem`)."""
    schema = dict(raw) if isinstance(raw, dict) else {}
    kind = schema.get("type")
    if kind != "object":
        if isinstance(kind, list) and "object" in kind:
            return {**schema, "type": "object"}  # ["object", "null"]: Cairn always sends an object
        schema = {"type": "object", "properties": schema.get("properties") or {}}
    return schema


def schema_problem(raw: Any) -> str | None:
    """Why a listed tool's input schema cannot be offered to a model (None: it can). A tool's arguments are always a
    JSON object (MCP `tools/call`, and every model API's function parameters), so a schema that says otherwise — e.g.
    `{"type": "string"}` — describes arguments no call could send: the tool is left out (SPEC §8), never rewritten to
    an empty object the model would then call blind. A schema without a `type` is taken as an object's."""
    if not isinstance(raw, dict):
        return "its input schema is not a JSON object"
    kind = raw.get("type", "object")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return None
    shown = json.dumps(kind, ensure_ascii=False)
    return f"its input schema is not an object schema (type {shown[:40]}), and a tool's arguments are always an object"


class McpCallFailed(ToolFailure):
    """The server answered the call with an error (it ran, or refused to)."""


class McpOutcomeUnknown(ToolFailure):
    """The call was sent but no answer can come (the server died, or the call timed out): it may have taken effect."""

    code = "TOOL_OUTCOME_UNKNOWN"
