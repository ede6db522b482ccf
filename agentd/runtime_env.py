"""What each runtime's environment holds: agentd's own, minus other providers' secrets.

A provider's secrets are the environment variables its config names as
holding its key: ``providers.copilot.byok.api_key_env`` and
``providers.claude.api_key_env`` and ``providers.codex.model_provider.api_key_env``,
for an enabled provider. Every runtime process (the Copilot CLI, Claude Code,
the Codex app-server, each ACP agent) starts from agentd's
environment without the variables another provider claims, then adds its own
configured ``env``; so the Copilot bring-your-own-key never reaches an ACP
agent or Claude Code, nor the shell commands they run. An ACP agent that
needs such a variable lists it in ``providers.acp.<name>.pass_env``.

:func:`configure` is called once at start, before any runtime starts; until
then nothing is withheld. No trio, no structlog.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["configure", "environ", "withheld"]

#: provider name -> the variables it claims
_claims: dict[str, frozenset[str]] = {}


def configure(providers: Any) -> None:
    """Record which variables each enabled provider of ``providers`` (a ProvidersConfig) claims."""
    claims: dict[str, frozenset[str]] = {}
    copilot = providers.copilot
    if copilot.enabled and copilot.byok is not None and copilot.byok.api_key_env:
        claims["copilot"] = frozenset({copilot.byok.api_key_env})
    claude = providers.claude
    if claude.enabled and claude.api_key_env:
        claims["claude"] = frozenset({claude.api_key_env})
    codex = providers.codex
    if codex.enabled and codex.model_provider is not None and codex.model_provider.api_key_env:
        claims["codex"] = frozenset({codex.model_provider.api_key_env})
    _claims.clear()
    _claims.update(claims)


def withheld(provider: str, pass_env: Iterable[str] = ()) -> frozenset[str]:
    """The variables ``provider``'s runtime must not get: those other providers claim, less ``pass_env``."""
    names: set[str] = set()
    for name, claimed in _claims.items():
        if name != provider:
            names |= claimed
    return frozenset(names - set(pass_env) - _claims.get(provider, frozenset()))


def environ(provider: str, pass_env: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """agentd's environment (or ``base``) without what :func:`withheld` names, as a new dict."""
    env = dict(os.environ if base is None else base)
    for name in withheld(provider, pass_env):
        env.pop(name, None)
    return env
