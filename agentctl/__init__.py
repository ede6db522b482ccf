"""agentctl: the command-line client of agentd.

A thin client: it speaks the control protocol of :mod:`agentd.wire` over the
daemon's Unix socket and renders what comes back. It imports only the wire
types (never trio or structlog), and loads each command's module, the client,
rendering and prompting when they are needed (see :mod:`agentctl.cli`), so
``agentctl status --json`` pays for click, msgspec, the frames and its own
command alone.
"""

from agentd import __version__

__all__ = ["__version__"]
