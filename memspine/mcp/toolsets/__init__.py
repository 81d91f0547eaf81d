"""The tool sets `memspine mcp --tools` serves: memspine's own (the default), AutoMem's, Mem0's.

Each is tools with the scope their operation needs and the instructions the server gives;
the other servers' sets keep those servers' tool names and argument shapes (docs/migrate.md).
"""

from __future__ import annotations

from typing import NamedTuple

from memspine.mcp import tools
from memspine.mcp.tools import ToolSpec
from memspine.mcp.toolsets import automem, mem0

DEFAULT = "memspine"


class Toolset(NamedTuple):
    """Tools and the server's instructions."""

    specs: tuple[ToolSpec, ...]
    instructions: str | None

    def by_name(self) -> dict[str, ToolSpec]:
        """The tools by name."""
        return {spec.tool.name: spec for spec in self.specs}


TOOLSETS = {
    DEFAULT: Toolset(tools.TOOLS, None),  # None: the server's own INSTRUCTIONS
    "automem": Toolset(automem.TOOLS, automem.INSTRUCTIONS),
    "mem0": Toolset(mem0.TOOLS, mem0.INSTRUCTIONS),
}
