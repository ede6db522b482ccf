"""OpenAI Codex CLI as a provider: ``codex app-server`` (JSON-RPC over stdio), see :mod:`._provider`."""

from ._conversation import CodexConversation
from ._provider import CodexProvider

__all__ = ["CodexConversation", "CodexProvider"]
