"""A small real MCP server for the tests, on stdio: one tool, ``write_marker``, that writes a file.

Run as ``python mcp_marker_server.py MARKER_PATH``. ``write_marker(text)`` writes ``text``
(and a newline) to MARKER_PATH and answers ``marker written: <text>``. Built with the ``mcp``
package (the test extra), as any third-party server would be.
"""

from __future__ import annotations

import pathlib
import sys

from mcp.server.mcpserver import MCPServer

SERVER = "marker"
TOOL = "write_marker"

server = MCPServer(SERVER)


@server.tool(name=TOOL, description="Write the given text to the test's marker file.")
def write_marker(text: str) -> str:
    pathlib.Path(sys.argv[1]).write_text(text + "\n")
    return f"marker written: {text}"


if __name__ == "__main__":
    server.run("stdio")
