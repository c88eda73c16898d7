"""The tool registry: which tools exist, by name, and how they are described to the model.

The loop looks tools up here (an unknown name is UNKNOWN_TOOL, SPEC §2) and sends `schemas()` with every request; the
order of registration is the order the model sees, so it stays stable across requests and sessions.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ..providers.base import ToolSchema
from .base import Tool
from .command import RUN_COMMAND
from .file_writes import EDIT_FILE, WRITE_FILE
from .files import LIST_DIR, READ_FILE, SEARCH_TEXT
from .find_files import FIND_FILES


def builtin_tools() -> list[Tool]:
    """The seven tools of SPEC §8, in the order the model is shown them."""
    return [LIST_DIR, READ_FILE, SEARCH_TEXT, FIND_FILES, WRITE_FILE, EDIT_FILE, RUN_COMMAND]


def builtin_safety(name: str) -> str | None:
    """The safety class of a built-in tool, for displays that know only a name (None for other tools)."""
    tool = next((t for t in builtin_tools() if t.name == name), None)
    return tool.safety if tool else None


class ToolRegistry:
    """Tools by name. Starts empty unless given tools; `ToolRegistry.default()` holds the built-ins."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    @classmethod
    def default(cls) -> ToolRegistry:
        return cls(builtin_tools())

    def register(self, tool: Tool) -> None:
        """Add a tool. A second tool with the same name is a programming error, not a silent override."""
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        """The tool called `name`, or None (the loop reports UNKNOWN_TOOL)."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[ToolSchema]:
        return [ToolSchema(name=t.name, description=t.description, parameters=t.parameters) for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    # No __len__ on purpose: an empty registry must stay truthy, or `tools or ToolRegistry(builtin_tools())` would
    # silently swap a deliberately empty registry for the built-ins.
