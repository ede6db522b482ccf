"""The ``claude`` provider: Claude Code through the ``claude-agent-sdk`` package.

Public surface:

* :class:`ClaudeProvider` ``(config, *, state_dir, name="claude")`` - the
  :class:`agentd.contract.Provider` (plus ``AccountReader`` via
  :meth:`~ClaudeProvider.account`, and :meth:`~ClaudeProvider.history` to read
  a session's transcript without opening it).
* :class:`ClaudeConversation` - what :meth:`ClaudeProvider.open` returns; its
  id is the Claude Code session id.
* :class:`ClaudeConfig` - the ``[providers.claude]`` config section.
* :func:`resolve_cli_path` - which Claude Code binary runs.

This package imports neither ``claude_agent_sdk`` nor the CLI: the provider
imports the SDK (in a worker thread) when it first opens a conversation. How
it runs is told in the docstrings of ``_provider`` and ``_conversation``; how
to configure it in docs/claude.md.
"""

from ...config import ClaudeConfig
from ._conversation import ClaudeConversation
from ._provider import DEFAULT_ENV, NOT_FOUND_MESSAGE, ClaudeProvider, bundled_cli, resolve_cli_path

__all__ = [
    "ClaudeConfig",
    "ClaudeConversation",
    "ClaudeProvider",
    "DEFAULT_ENV",
    "NOT_FOUND_MESSAGE",
    "bundled_cli",
    "resolve_cli_path",
]
