"""The ``copilot`` provider: GitHub's Copilot CLI through the ``github-copilot-sdk`` package.

Public surface:

* :class:`CopilotProvider` ``(config, *, state_dir, name="copilot")`` - the
  :class:`agentd.contract.Provider` (plus ``Importer`` via :meth:`~CopilotProvider.previous`,
  ``AccountReader`` via :meth:`~CopilotProvider.account`, and
  :meth:`~CopilotProvider.history` to read a session's transcript without opening it).
* :class:`CopilotConversation` - what :meth:`CopilotProvider.open` returns.
* :class:`CopilotConfig`, :class:`ByokConfig` - the ``[providers.copilot]`` config section.
* :func:`resolve_cli_path` - where the CLI is looked for.

How it runs (threads, the runtime's supervision, the event mapping) is told in
the docstrings of ``_provider``, ``_bridge``, ``_conversation`` and ``_mapping``;
how to configure it in docs/copilot.md.
"""

from ...config import ByokConfig, CopilotConfig
from ._conversation import CopilotConversation
from ._provider import NOT_FOUND_MESSAGE, CopilotProvider, resolve_cli_path

__all__ = [
    "ByokConfig",
    "CopilotConfig",
    "CopilotConversation",
    "CopilotProvider",
    "NOT_FOUND_MESSAGE",
    "resolve_cli_path",
]
