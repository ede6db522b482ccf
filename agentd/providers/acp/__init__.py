"""The ``acp`` provider: a generic Agent Client Protocol client over an agent's stdio.

Configured per agent in ``[providers.acp.<name>]`` (see ``docs/acp.md``);
each becomes the provider ``acp:<name>``.
"""

from ...config import AcpAgentConfig
from ._provider import AcpConversation, AcpProvider

__all__ = ["AcpAgentConfig", "AcpConversation", "AcpProvider"]
