"""Restart in place (``agentctl restart``, SIGHUP, ``agentd reload``): a new config and environment
for the runtimes started from then on, without a stop.

The rules it keeps:

* A config that does not load, or an environment file that breaks the trust rule of
  agentd._trust (writable by group or others, another user's, a symlink), is refused with its
  error (``invalid``); the config in force stays and nothing else changes (the environment
  file is not applied either).
* No running turn is cut: it waits until none runs (turns that start meanwhile are waited for too),
  unless ``now``, which cancels them first and says which.
* Connections, subscriptions, conversations, leases and the journal stay as they are. Each provider
  whose table changed (every one when the environment did) is declared anew (Runtimes.replace)
  and the loaded conversations on it have their provider conversation closed
  (ConversationService.detach), so their next prompt opens it again, resumed where the provider
  can, on a runtime started with the new settings: the same as across a stop and start.
* The environment file (``<config dir>/environment``, the file the systemd units name as
  ``EnvironmentFile``, ``KEY=VALUE`` lines) is read again and its values set in agentd's own
  environment, which every runtime starts from; a key newly put there reaches runtimes started
  afterwards. Values are never logged or answered, only names.
* What is re-read: ``[providers]``, ``[budgets]``, ``[pricing]``, ``[tasks]`` concurrency and
  ``[attachments]``; paths, ``[server]``, ``[journal]``, ``[leases]``, ``[websocket]`` and ``[log]``
  take a stop and start (the result does not pretend otherwise: the log says which differ).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from . import _trust, masking, runtime_env, systemd, wire
from .config import Config, ConfigError, default_config_path, load_config

log = structlog.get_logger("agentd.reload")

#: Sections a restart in place does not apply (they shape what is already open).
NEEDS_STOP = ("daemon", "journal", "leases", "server", "websocket", "log", "runtimes", "interactions", "agent_files")


def environment_file(config_path: Path | None) -> Path:
    """``environment`` beside the config file (by default ~/.config/agentd/environment)."""
    return Path(config_path or default_config_path()).absolute().parent / "environment"


def read_environment(config_path: Path | None) -> tuple[Path, str | None]:
    """The environment file's path and text (None when there is none), checked like the config.

    It sets the environment every runtime starts from (``LD_PRELOAD``,
    ``NODE_OPTIONS``, ``PATH``, keys), so it and its directory must pass the
    trust rule of :mod:`agentd._trust` (ours or root's, not writable by group or
    others, no symlink, a regular file). Raises :class:`~agentd._trust.Untrusted`,
    OSError (unreadable).
    """
    path = environment_file(config_path)
    try:
        raw = _trust.check_config_file(path, "environment file")
    except FileNotFoundError:
        return path, None
    return path, raw.decode("utf-8", "replace")


def parse_environment(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's EnvironmentFile reads them: blank lines and ``#``/``;``
    comments skipped, an optional ``export``, values optionally in single or double quotes."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def _section(config: Config, name: str) -> Any:
    p = config.providers
    return p.acp.get(name[4:]) if name.startswith("acp:") else getattr(p, name, None)


def _changed(old: Config, new: Config) -> set[str]:
    """Providers whose table differs between ``old`` and ``new`` (added, removed or changed)."""
    from .config import provider_names

    names = set(provider_names(old.providers)) | set(provider_names(new.providers))
    changed = {n for n in names if _section(old, n) != _section(new, n)}
    if old.runtimes != new.runtimes:  # restart backoff: every provider's supervision
        changed |= names
    return changed


class Reloader:
    """Carries out restarts, one at a time."""

    def __init__(self, service: Any, tasks: Any, config: Config, config_path: Path | None) -> None:
        self.service = service
        self.tasks = tasks
        self.config = config
        self.config_path = config_path
        self._lock = trio.Lock()

    async def reload(self, *, now: bool = False, by: str = "") -> wire.RestartResult:
        """Restart in place (see the module's rules). Returns what it did.

        Raises Invalid when the config does not load (nothing changed). Cancelled (the client went
        away) while waiting for turns: nothing changed.
        """
        from . import contract as c

        async with self._lock:
            path = self.config_path
            try:
                config = await trio.to_thread.run_sync(load_config, path)
            except ConfigError as exc:
                log.error("agentd.reload_refused", error=str(exc), by=by)
                systemd.status(f"reload refused: {exc}")
                raise c.Invalid(f"config not reloaded, agentd keeps the one it had: {exc}",
                                details={"key": exc.key}) from None
            try:
                environment = await trio.to_thread.run_sync(read_environment, path)
            except _trust.Untrusted as exc:
                log.error("agentd.reload_refused", error=str(exc), by=by)
                systemd.status(f"reload refused: {exc}")
                raise c.Invalid(f"config not reloaded, agentd keeps the one it had: {exc}") from None
            except OSError as exc:
                log.warning("agentd.env_file_unreadable", path=str(environment_file(path)),
                            error=exc.strerror or str(exc))
                environment = (environment_file(path), None)
            started = time.monotonic()
            cancelled: list[str] = []
            if now:
                for live in list(self.service.loaded()):
                    run = live.record.active_run
                    if run:
                        await self.service.cancel(live.record.id)
                        cancelled.append(run)
            # Wait for quiet: no turn runs. A turn started meanwhile is waited for too.
            if self.service.running():
                log.info("agentd.reload_waiting", running=self.service.running(), by=by)
                systemd.status(f"reload waits for {self.service.running()} running turn(s)")
            while self.service.running():
                await trio.sleep(0.05)
            waited = round(time.monotonic() - started, 3)
            # From here on it is one step: a client that goes away does not leave it half done.
            with trio.CancelScope(shield=True):
                systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
                env_file, changed = self._apply_environment(*environment)
                masking.load(os.environ, config.providers)
                claims_before = {n: runtime_env.withheld(n) for n in self.service.runtimes.names()}
                runtime_env.configure(config.providers, config.store.backend)
                changed_providers = _changed(self.config, config)
                if changed or {n: runtime_env.withheld(n) for n in claims_before} != claims_before:
                    changed_providers = None  # the environment changed: every runtime must see it
                reopened = 0
                for live in list(self.service.loaded()):
                    if (changed_providers is None or live.record.provider in changed_providers) \
                            and await self.service.detach(live):
                        reopened += 1
                await self.service.runtimes.replace(config, changed_providers)
                self._apply_settings(config)
                providers = await self.service.runtimes.describe()
                differs = [s for s in NEEDS_STOP if getattr(config, s) != getattr(self.config, s)]
                self.config = config
                log.info("agentd.reloaded", by=by, config=str(path or ""), env_changed=changed, cancelled=cancelled,
                         reopened=reopened, waited_s=waited, need_stop=differs)
                systemd.notify(f"READY=1\nSTATUS=reloaded; serving {len(self.service)} conversations")
                return wire.RestartResult(
                    pid=os.getpid(), config=str(path or (default_config_path() if default_config_path().is_file() else "")),
                    env_file=str(env_file) if env_file else "", env_changed=changed, cancelled=cancelled,
                    reopened=reopened, waited_s=waited, providers=providers,
                )

    def _apply_environment(self, path: Path, text: str | None) -> tuple[Path | None, list[str]]:
        """Set the environment file's values (``text``, read by :func:`read_environment`); (path, names changed)."""
        if text is None:
            return None, []
        changed = []
        for key, value in parse_environment(text).items():
            if key in systemd.SYSTEMD_ENV_VARS:
                continue
            if os.environ.get(key) != value:
                os.environ[key] = value
                changed.append(key)
        return path, sorted(changed)

    def _apply_settings(self, config: Config) -> None:
        svc = self.service
        svc.pricing = dict(config.pricing)
        svc.budgets = dict(config.budgets)
        svc.attachments = config.attachments
        if self.tasks is not None and hasattr(self.tasks, "config"):
            self.tasks.config = config.tasks
