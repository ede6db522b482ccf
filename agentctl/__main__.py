"""``agentctl`` entry point: ``python -m agentctl`` and the ``agentctl`` console script.

The group and its options are in :mod:`agentctl.cli`; each command is in a
module of :mod:`agentctl.commands`, imported only when that command runs.
"""

from __future__ import annotations

from agentctl.cli import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    main()
