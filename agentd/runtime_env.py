"""What each runtime's environment holds: agentd's own, minus other providers' secrets.

A provider's secrets are the environment variables its config names as
holding its key: ``providers.copilot.byok.api_key_env`` and
``providers.claude.api_key_env`` and ``providers.codex.model_provider.api_key_env``,
for an enabled provider, and the sign-in variable only its runtime reads
(:data:`SIGN_IN`: ``COPILOT_GITHUB_TOKEN``, ``ANTHROPIC_AUTH_TOKEN``,
``CODEX_API_KEY``). General-purpose tokens (``GH_TOKEN``, ``GITHUB_TOKEN``,
``OPENAI_API_KEY`` unless named as a key) are not claimed: the tools an agent
runs (``gh``, SDK scripts) use them too; they are masked wherever echoed. Every runtime process (the Copilot CLI, Claude Code,
the Codex app-server, each ACP agent) starts from agentd's
environment without the variables another provider claims, then adds its own
configured ``env``; so the Copilot bring-your-own-key never reaches an ACP
agent or Claude Code, nor the shell commands they run. An ACP agent that
needs such a variable lists it in ``providers.acp.<name>.pass_env``.

agentd's own variables are withheld from every runtime too (:func:`own`):
those of :data:`AGENTD_VARS`, which point at this daemon's config, state,
socket and runtime dir (an ``agentd`` or ``agentctl`` an agent's shell runs, a
test suite say, would otherwise act on the daemon supervising it), and, when
``[store] backend = "postgres"``, libpq's ``PGPASSWORD``, the password of the
database that holds every host's conversations.

:func:`configure` is called once at start, before any runtime starts; until
then nothing is withheld. No trio, no structlog.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["AGENTD_VARS", "SIGN_IN", "configure", "environ", "own", "withheld"]

#: provider -> the variables only its runtime signs in with (withheld from the others when it is enabled)
SIGN_IN: dict[str, tuple[str, ...]] = {
    "copilot": ("COPILOT_GITHUB_TOKEN",),
    "claude": ("ANTHROPIC_AUTH_TOKEN",),
    "codex": ("CODEX_API_KEY",),
}

#: provider name -> the variables it claims
_claims: dict[str, frozenset[str]] = {}
#: the variables agentd and agentctl read (agentd.config, agentd.__main__, agentctl.client, agentd.agentfs)
AGENTD_VARS = frozenset({"AGENTD_CONFIG", "AGENTD_STATE_DIR", "AGENTD_RUNTIME_DIR", "AGENTD_SOCKET",
                         "AGENTD_NO_AUTOSTART", "AGENTD_AGENTFS_WALK"})
#: agentd's own variables besides AGENTD_VARS (see configure)
_own: set[str] = set()


def configure(providers: Any, store_backend: str = "file") -> None:
    """Record which variables each enabled provider of ``providers`` (a ProvidersConfig) claims,
    and agentd's own (``store_backend``: ``[store] backend``)."""
    _own.clear()
    if store_backend == "postgres":
        _own.add("PGPASSWORD")
    keys = {
        "copilot": providers.copilot.byok.api_key_env if providers.copilot.byok is not None else "",
        "claude": providers.claude.api_key_env,
        "codex": providers.codex.model_provider.api_key_env if providers.codex.model_provider is not None else "",
    }
    claims: dict[str, frozenset[str]] = {}
    for name, key in keys.items():
        if getattr(providers, name).enabled:
            claims[name] = frozenset({*SIGN_IN[name], *([key] if key else [])})
    _claims.clear()
    _claims.update(claims)


def own(base: Mapping[str, str] | None = None) -> frozenset[str]:
    """agentd's own variables set in ``base`` (default: agentd's environment): those of
    :data:`AGENTD_VARS` and those :func:`configure` recorded."""
    env = os.environ if base is None else base
    return frozenset(k for k in (*AGENTD_VARS, *_own) if k in env)


def withheld(provider: str, pass_env: Iterable[str] = (), base: Mapping[str, str] | None = None) -> frozenset[str]:
    """The variables ``provider``'s runtime must not get: agentd's own (set in ``base``, default
    agentd's environment) and those other providers claim, less ``pass_env``."""
    names: set[str] = set(own(base))
    for name, claimed in _claims.items():
        if name != provider:
            names |= claimed
    return frozenset(names - set(pass_env) - _claims.get(provider, frozenset()))


def environ(provider: str, pass_env: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """agentd's environment (or ``base``) without what :func:`withheld` names, as a new dict."""
    env = dict(os.environ if base is None else base)
    for name in withheld(provider, pass_env, env):
        env.pop(name, None)
    return env
