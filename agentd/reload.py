"""Restart in place (``agentctl restart``, SIGHUP, ``agentd reload``): a new config and environment
for the runtimes started from then on, without a stop.

The rules it keeps:

* A config that does not load, or an environment file that breaks the trust rule of
  agentd._trust (writable by group or others, another user's, a symlink), is refused with its
  error (``invalid``); the config in force stays and nothing else changes (the environment
  file is not applied either).
* No running turn is cut: it waits until none runs (turns that start meanwhile are waited for too),
  unless ``now``, which cancels them first and says which. Once none runs, the runtimes are
  replaced in one step, and a prompt sent during it waits for it (ConversationService.hold_starts),
  then runs on the new runtime.
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
import re
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from . import _trust, masking, runtime_env, systemd, wire
from .config import Config, ConfigError, default_config_path, load_config

log = structlog.get_logger("agentd.reload")

#: Sections a restart in place applies; every other one of the daemon's shapes what is already
#: open (its store, server, journal, checkpoints, MCP servers, ...) and needs a stop and a start.
APPLIED = frozenset({"providers", "budgets", "pricing", "tasks", "attachments"})
NEEDS_STOP = tuple(s for s in Config.__struct_fields__ if s not in APPLIED and s != "agentctl")  # agentctl's own


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


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_environment(text: str) -> tuple[dict[str, str], list[str]]:
    """(values, what was left out) of ``KEY=VALUE`` assignments as systemd's EnvironmentFile= reads them (env-file.c), so an
    agentd started some other way, or restarted, gets what a systemd one gets:

    * blank lines are skipped, and lines starting with ``#`` or ``;`` (a backslash at a
      comment's end continues it); leading whitespace and whitespace around the key go;
    * unquoted, a backslash takes the next character as it is and a backslash at the end of
      a line joins the next one; trailing whitespace goes;
    * in single quotes everything is as written; in double quotes a backslash escapes only
      ``"``, ``\\``, `````` ` `````` and ``$`` (and joins lines), else it stays; quoted
      and unquoted parts join (``"a"b`` is ``ab``), and quotes may span lines.

    agentd also takes an ``export`` before the key. An assignment whose name is not a
    variable name, or whose value holds a NUL, is left out (systemd leaves it out too), and
    said for a person, with its line, in the second list.
    """
    out: dict[str, str] = {}
    problems: list[str] = []
    key: list[str] = []
    value: list[str] = []
    state = "pre_key"
    line = start = 1
    trailing = 0  # unquoted whitespace at the value's end so far (stripped when it ends)

    def push() -> None:
        name = "".join(key).strip()
        if name.startswith("export ") or name.startswith("export\t"):
            name = name[7:].strip()
        val = "".join(value[:len(value) - trailing] if trailing else value)
        if not _NAME.match(name):
            problems.append(f"line {start}: {name[:40]!r} is not a variable name")
        elif "\0" in val:
            problems.append(f"line {start}: the value of {name} holds a NUL byte")
        else:
            out[name] = val
        key.clear()
        value.clear()

    for ch in text:
        nl = ch in "\n\r"
        if state == "pre_key":
            if ch in "#;":
                state = "comment"
            elif not ch.isspace():
                state, start = "key", line
                key.append(ch)
        elif state == "key":
            if nl:
                problems.append(f"line {start}: no '=' in {''.join(key).strip()[:40]!r}")
                key.clear()
                state = "pre_key"
            elif ch == "=":
                state, trailing = "pre_value", 0
            else:
                key.append(ch)
        elif state == "pre_value" or state == "value":
            if nl:
                push()
                state = "pre_key"
            elif ch == "'":
                state, trailing = "single", 0
            elif ch == '"':
                state, trailing = "double", 0
            elif ch == "\\":
                state, trailing = "value_escape", 0
            elif ch.isspace():
                if state == "value":
                    value.append(ch)
                    trailing += 1
            else:
                state, trailing = "value", 0
                value.append(ch)
        elif state == "value_escape":
            state = "value"
            if not nl:
                value.append(ch)
        elif state == "single":
            if ch == "'":
                state = "pre_value"
            else:
                value.append(ch)
        elif state == "double":
            if ch == '"':
                state = "pre_value"
            elif ch == "\\":
                state = "double_escape"
            else:
                value.append(ch)
        elif state == "double_escape":
            state = "double"
            if ch in '"\\`$':
                value.append(ch)
            elif not nl:
                value += ["\\", ch]
        elif state == "comment":
            if ch == "\\":
                state = "comment_escape"
            elif nl:
                state = "pre_key"
        elif state == "comment_escape":
            state = "comment"
        if ch == "\n":
            line += 1
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    elif state == "key":
        problems.append(f"line {start}: no '=' in {''.join(key).strip()[:40]!r}")
    return out, problems


def environment_values(path: Path, text: str) -> dict[str, str]:
    """The values of environment file ``path`` (its ``text``), logging the lines left out."""
    values, problems = parse_environment(text)
    if problems:
        log.warning("agentd.env_file_lines_left_out", path=str(path), problems=problems)
    return values


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
        #: the config the daemon started with: what its NEEDS_STOP sections still run with
        self.started = config
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
            # No turn runs, and none starts until the runtimes are replaced (a prompt sent meanwhile
            # waits: opened on a runtime about to be replaced, its turn was cut and the
            # conversation kept a stopped one). Held from the check above, with no await between.
            release = self.service.hold_starts()
            # From here on it is one step: a client that goes away does not leave it half done.
            with trio.CancelScope(shield=True):
                systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
                try:
                    return await self._restart(config, path, environment, cancelled, waited, by)
                finally:  # whatever happened, the service manager is told the reload is over
                    release()
                    systemd.notify(f"READY=1\nSTATUS=serving {len(self.service)} conversations")

    async def _restart(self, config: Config, path: Path | None, environment: tuple[Path, str | None],
                       cancelled: list[str], waited: float, by: str) -> wire.RestartResult:
        """The one step of :meth:`reload`, once no turn runs."""
        env_file, changed = self._apply_environment(*environment)
        masking.load(os.environ, config.providers)
        claims_before = {n: runtime_env.withheld(n) for n in self.service.runtimes.names()}
        runtime_env.configure(config.providers, self.started.store.backend)  # the store in use
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
        differs = [s for s in NEEDS_STOP if getattr(config, s) != getattr(self.started, s)]
        self.config = config
        default = default_config_path()
        loaded = str(path or (default if default.is_file() else ""))
        log.info("agentd.reloaded", by=by, config=loaded, env_changed=changed, cancelled=cancelled,
                 reopened=reopened, waited_s=waited, need_stop=differs)
        return wire.RestartResult(
            pid=os.getpid(), config=loaded,
            env_file=str(env_file) if env_file else "", env_changed=changed, cancelled=cancelled,
            reopened=reopened, waited_s=waited, providers=providers, need_stop=differs,
        )

    def _apply_environment(self, path: Path, text: str | None) -> tuple[Path | None, list[str]]:
        """Set the environment file's values (``text``, read by :func:`read_environment`); (path, names changed)."""
        if text is None:
            return None, []
        changed = []
        for key, value in environment_values(path, text).items():
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
