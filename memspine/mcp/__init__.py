"""MCP: memspine's memory as tools for agent hosts, over Streamable HTTP (/mcp) and stdio."""
