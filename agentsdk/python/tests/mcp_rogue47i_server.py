"""A stdio MCP server for the rogue47i tests: one tool, ``delete``, that
appends ``delete <path>`` to the file named by its first argument (what it
ran, seen from outside its process)."""

import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("files")


@app.tool()
def delete(path: str) -> str:
    """Deletes a file."""
    with open(sys.argv[1], "a") as f:
        f.write(f"delete {path}\n")
    return "deleted"


if __name__ == "__main__":
    app.run()
