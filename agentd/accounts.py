"""Accounts, sign-in and quota of each provider's runtime; the ``providers`` overview.

Rules (the seed contract's ``Account``, ``AccountManager``, ``DeviceSignInManager``,
``QuotaReporter``):

* A provider is in exactly one state (:data:`agentd.wire.ProviderState`):
  ``available`` only when a turn can run now (the runtime is installed and starts, and it
  is signed in or its key is present); ``needs_sign_in``; ``not_installed``;
  ``misconfigured``. Each state but ``available`` carries the exact command that fixes it.
  A provider's ``check()`` says what is wrong (``RuntimeUnavailable.details["state"]``,
  else the state follows from its message); its ``account()`` says whether it is signed in.
* An account never carries a credential: only where it comes from (stored sign-in, the
  environment variable named, the GitHub CLI, an API key, bring-your-own-key).
* Sign-in happens where the runtime offers it: a token handed to the runtime
  (:class:`~agentd.contract.SignInManager`), or a device flow
  (:class:`~agentd.contract.DeviceSignInManager`) that lives as long as the client's
  connection, so a client that goes away (Ctrl-C) cancels it. Where agentd cannot sign in
  for the runtime (a browser flow), the answer is the exact command a person runs.
* Quota is what the runtime reports, asked of it now (:class:`~agentd.contract.QuotaReporter`):
  Copilot's account quota; Codex's rate-limit windows (asked, else the last ones a turn
  brought). A snapshot a runtime sends during a turn also rides on the conversation's
  ``usage`` record (``Usage.quota``).

Nothing here is the turn state machine's: the server calls these functions directly.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import shlex
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import contract as c
from . import wire

if TYPE_CHECKING:
    from .runtimes import Runtimes

__all__ = ["account", "describe", "login", "login_wait", "logout", "quota"]

log = structlog.get_logger("agentd.accounts")

#: How long ``providers`` waits for one provider's check, then its account, seconds.
CHECK_TIMEOUT_S = 45.0
#: the longest sign-in token a client may hand over (a GitHub token is 40-93 characters, an API
#: key about 100-200): masking a value costs time and memory growing with its length squared
MAX_TOKEN_CHARS = 2048
ACCOUNT_TIMEOUT_S = 20.0
#: What a restart of agentd looks like to a user who exported a variable: agentctl starts the
#: daemon again with its own environment.
RESTART = "agentctl stop && agentctl status"

#: provider kind -> the command that installs its runtime
_INSTALL = {
    "copilot": "npm install -g @github/copilot",
    "claude": "pip install claude-agent-sdk",
    "codex": "npm install -g @openai/codex",
}
#: an ACP agent's executable -> the command that installs it
_ACP_INSTALL = {
    "gemini": "npm install -g @google/gemini-cli",
    "claude-agent-acp": "npm install -g @zed-industries/claude-agent-acp",
    "claude-code-acp": "npm install -g @zed-industries/claude-code-acp",
    "codex-acp": "npm install -g @zed-industries/codex-acp",
    "copilot": "npm install -g @github/copilot",
    "goose": "pipx install goose-ai",
    "opencode": "npm install -g opencode-ai",
}


def _kind(name: str) -> str:
    return name.split(":", 1)[0]


def _section(name: str) -> str:
    kind, _, agent = name.partition(":")
    return f"providers.acp.{agent}" if agent else f"providers.{kind}"


def _state_of(exc: c.AgentdError) -> str:
    """The state an unusable provider is in: the check's own word, else read from its message."""
    state = exc.details.get("state") if isinstance(exc.details, dict) else None
    if state in ("needs_sign_in", "not_installed", "misconfigured"):
        return str(state)
    text = exc.message.lower()
    if any(s in text for s in ("not installed", "not found", "not executable", "is not an executable",
                               "needs the claude-agent-sdk", "needs claude-agent-sdk", "no module named")):
        return "not_installed"
    if "is not set" in text or "not signed in" in text or "sign in" in text:
        return "needs_sign_in"
    return "misconfigured"


def _export(var: str) -> str:
    return f"export {var}=<key>; {RESTART}"


def _fix(runtimes: "Runtimes", name: str, state: str, message: str, account: c.Account | None) -> str:
    """The exact command that takes provider ``name`` out of ``state``."""
    if state == "available":
        return ""
    kind = _kind(name)
    cfg = runtimes.config.providers
    if state == "not_installed":
        if kind == "acp":
            agent = cfg.acp.get(name.partition(":")[2])
            exe = agent.command[0].rsplit("/", 1)[-1] if agent else ""
            return _ACP_INSTALL.get(exe, f"install {exe or 'the agent'} on agentd's PATH, or fix {_section(name)}.command")
        if getattr(getattr(cfg, kind, None), "cli_path", ""):
            return f"{_INSTALL.get(kind, 'install it')}, or fix {_section(name)}.cli_path (agentd check-config)"
        return _INSTALL.get(kind, f"fix {_section(name)} in {_config_path(runtimes)}")
    if state == "needs_sign_in":
        if kind == "copilot":
            byok = cfg.copilot.byok
            if byok is not None and byok.api_key_env:
                return _export(byok.api_key_env)
            return "agentctl login copilot --device"
        if kind == "claude":
            return "agentctl login claude"
        if kind == "codex":
            mp = cfg.codex.model_provider
            return _export(mp.api_key_env) if mp is not None and mp.api_key_env else "agentctl login codex"
        if account is not None and account.env_var:
            return _export(account.env_var)
        return f"sign {name} in with its own login command, then {RESTART}"
    if "scripts_dir" in message and kind == "script":
        return f"mkdir -p {shlex.quote(cfg.script.scripts_dir)}"
    return f"fix {_section(name)} in {_config_path(runtimes)}, then agentd check-config"


def _config_path(runtimes: "Runtimes") -> str:
    from .config import default_config_path

    path = getattr(runtimes, "config_path", None) or default_config_path()
    return shlex.quote(str(path))


async def _bounded(fn: Any, timeout: float, what: str) -> Any:
    """``await fn()``; RuntimeUnavailable when it takes over ``timeout`` s, any non-agentd error as InternalError."""
    with trio.move_on_after(timeout) as scope:
        try:
            return await fn()
        except c.AgentdError:
            raise
        except Exception as exc:  # a provider bug must not break `providers`
            raise c.InternalError(f"{type(exc).__name__}: {exc}") from None
    assert scope.cancelled_caught
    raise c.RuntimeUnavailable(f"the runtime did not answer {what} within {timeout:g} s")


async def _one(runtimes: "Runtimes", name: str) -> wire.ProviderInfo:
    try:
        provider = await runtimes.get(name)
    except c.AgentdError as exc:
        state = _state_of(exc)
        return wire.ProviderInfo(name=name, display_name=name, capabilities=c.Capabilities(), available=False,
                                 error=exc.message, state=state,  # type: ignore[arg-type]
                                 fix=_fix(runtimes, name, state, exc.message, None))
    caps = provider.capabilities()
    error, state, acct = "", "available", None
    try:
        await _bounded(provider.check, CHECK_TIMEOUT_S, "its check")
        if caps.account and isinstance(provider, c.AccountReader):
            acct = await _bounded(provider.account, ACCOUNT_TIMEOUT_S, "the sign-in status")
            if not acct.signed_in:
                state, error = "needs_sign_in", acct.message or "not signed in"
    except c.AgentdError as exc:
        error, state = exc.message, _state_of(exc)
    caps = provider.capabilities()  # a first check may have taught it what the runtime advertises
    # agentd's own checkpoints work alike on every provider
    caps = msgspec.structs.replace(caps, checkpoints=runtimes.config.checkpoints.enabled)
    return wire.ProviderInfo(name=name, display_name=provider.display_name, capabilities=caps,
                             available=state == "available", error=error, state=state,  # type: ignore[arg-type]
                             fix=_fix(runtimes, name, state, error, acct), account=acct)


async def describe(runtimes: "Runtimes", name: str = "") -> list[wire.ProviderInfo]:
    """Every provider (or only ``name``) with its state, the command that fixes it, its capabilities
    and account. Checks run concurrently, each bounded (:data:`CHECK_TIMEOUT_S`). Raises NotFound
    for an unknown ``name``."""
    names = runtimes.names()
    if name:
        if name not in names:
            raise c.NotFound(f"no provider {name!r}; configured: {', '.join(names) or 'none'}")
        names = [name]
    results: dict[str, wire.ProviderInfo] = {}

    async def one(n: str) -> None:
        results[n] = await _one(runtimes, n)

    async with trio.open_nursery() as nursery:
        for n in names:
            nursery.start_soon(one, n)
    return [results[n] for n in names]


def _reporters(runtimes: "Runtimes", name: str, cap: str) -> list[str]:
    names = runtimes.names()
    if name:
        if name not in names:
            raise c.NotFound(f"no provider {name!r}; configured: {', '.join(names) or 'none'}")
        return [name]
    return names


async def _capable(runtimes: "Runtimes", name: str, cap: str, protocol: type) -> list[tuple[str, Any]]:
    """``(name, provider)`` of each provider (``name``, or every one) whose capability ``cap`` is
    true and that implements ``protocol``. One named provider that cannot be had raises what
    Runtimes.get raises, one without the capability Unsupported; unnamed ones are left out."""
    out: list[tuple[str, Any]] = []
    for n in _reporters(runtimes, name, cap):
        try:
            provider = await runtimes.get(n)
        except c.AgentdError:
            if name:
                raise
            continue
        if not (getattr(provider.capabilities(), cap) and isinstance(provider, protocol)):
            if name:
                raise c.Unsupported(f"provider {n!r} reports no {cap} (its capability {cap} is false)")
            continue
        out.append((n, provider))
    return out


async def account(runtimes: "Runtimes", name: str = "") -> list[wire.AccountInfo]:
    """The sign-in of ``name`` (or of every provider that reports one). Raises NotFound; for one
    named provider Unsupported when it reports no account, RuntimeUnavailable when it cannot say."""
    out: list[wire.AccountInfo] = []
    for n, provider in await _capable(runtimes, name, "account", c.AccountReader):
        try:
            acct = await _bounded(provider.account, ACCOUNT_TIMEOUT_S, "the sign-in status")
        except c.AgentdError as exc:
            if name:
                raise
            acct = c.Account(signed_in=False, message=exc.message)
        fix = "" if acct.signed_in else _fix(runtimes, n, "needs_sign_in", acct.message, acct)
        out.append(wire.AccountInfo(provider=n, account=acct, fix=fix))
    return out


# --------------------------------------------------------------------------- sign-in

_flow_ids = itertools.count(1)


class _Flow:
    """A device sign-in in progress, owned by one client connection's nursery."""

    def __init__(self, provider: str) -> None:
        self.id = f"flow-{next(_flow_ids)}"
        self.provider = provider
        self.code: c.DeviceCode | None = None
        self.shown = trio.Event()
        self.done = trio.Event()
        self.result: wire.LoginResult | None = None
        self.error: c.AgentdError | None = None
        self.scope = trio.CancelScope()


#: flows by id; each is removed when it ends
_flows: dict[str, _Flow] = {}


def _login_command(runtimes: "Runtimes", name: str, provider: Any) -> str:
    """The exact command a person runs to sign ``name``'s runtime in, for runtimes agentd cannot sign in."""
    kind = _kind(name)
    if kind == "claude":
        home = shlex.quote(str(provider.config_home))
        try:
            from .providers.claude._provider import resolve_cli_path

            cli = shlex.quote(resolve_cli_path(provider.config.cli_path, provider.config.env or {}))
        except c.AgentdError:
            cli = "claude"
        return f"CLAUDE_CONFIG_DIR={home} {cli} auth login"
    if kind == "codex":
        return f"CODEX_HOME={shlex.quote(str(provider.home))} {shlex.quote(provider.cli())} login"
    if kind == "copilot":
        return f"COPILOT_HOME={shlex.quote(str(provider.copilot_home))} copilot login"
    return ""


async def login(runtimes: "Runtimes", name: str, *, token: str = "", device: bool = False,
                nursery: trio.Nursery | None = None, store_plaintext: bool = False) -> wire.LoginResult:
    """Sign provider ``name`` in.

    ``token``: handed to the runtime (SignInManager), which validates and stores it; the
    result is ``done``. ``device``: the device flow starts in ``nursery`` (the client
    connection's), and the result carries the code and a ``flow`` id for :func:`login_wait`,
    once the runtime showed the code. Neither, or a runtime that can do neither: the result
    names the exact ``command`` a person runs (where there is one). Raises NotFound,
    Unsupported (the runtime cannot sign in, say how the capability reads), Invalid (the
    runtime refused), RuntimeUnavailable.
    """
    if len(token) > MAX_TOKEN_CHARS:
        raise c.Invalid(f"the token is {len(token):,} characters; a sign-in token takes at most {MAX_TOKEN_CHARS:,}")
    provider = await runtimes.get(name)
    caps = provider.capabilities()
    if token:
        from . import masking

        if not (caps.sign_in and isinstance(provider, c.SignInManager)):
            raise c.Unsupported(f"provider {name!r} cannot be signed in with a token by agentd (capability sign_in is false)"
                                + _or_run(runtimes, name, provider))
        # Masked before the runtime sees it, should it echo it; in a thread: the rule is rebuilt.
        added = await trio.to_thread.run_sync(masking.register, token)
        try:
            acct = await provider.sign_in(token)
        except c.Invalid:
            # Refused: no secret of the user's, and masked on it would hide that text everywhere.
            await trio.to_thread.run_sync(masking.forget, added)
            raise
        log.info("accounts.signed_in", provider=name, source=acct.source)
        return wire.LoginResult(provider=name, done=True, account=acct)
    if device and caps.device_sign_in and isinstance(provider, c.DeviceSignInManager) and nursery is not None:
        return await _start_flow(name, provider, nursery, store_plaintext)
    if device:
        command = _login_command(runtimes, name, provider)
        if not command:
            raise c.Unsupported(f"provider {name!r} has no device sign-in (capability device_sign_in is false)")
        return wire.LoginResult(provider=name, command=command,
                                message=f"{name} signs in through its own command; run it in a terminal")
    if caps.device_sign_in and isinstance(provider, c.DeviceSignInManager) and nursery is not None:
        return await _start_flow(name, provider, nursery, store_plaintext)
    command = _login_command(runtimes, name, provider)
    if not command:
        raise c.Unsupported(f"provider {name!r} has no sign-in agentd knows of")
    message = f"{name} signs in through its own command; run it in a terminal"
    if _kind(name) in ("claude", "codex"):
        var = _key_var(runtimes, name)
        if var:
            message += f", or give agentd an API key: {_export(var)}"
    return wire.LoginResult(provider=name, command=command, message=message)


def _key_var(runtimes: "Runtimes", name: str) -> str:
    cfg = runtimes.config.providers
    if _kind(name) == "claude":
        return cfg.claude.api_key_env
    if _kind(name) == "codex" and cfg.codex.model_provider is not None:
        return cfg.codex.model_provider.api_key_env
    return ""


def _or_run(runtimes: "Runtimes", name: str, provider: Any) -> str:
    command = _login_command(runtimes, name, provider)
    return f"; run `{command}` instead" if command else ""


async def _start_flow(name: str, provider: Any, nursery: trio.Nursery, store_plaintext: bool) -> wire.LoginResult:
    flow = _Flow(name)
    _flows[flow.id] = flow

    def show(code: c.DeviceCode) -> None:
        flow.code = code
        flow.shown.set()

    async def run() -> None:
        try:
            with flow.scope:
                acct = await provider.device_sign_in(show, store_plaintext=store_plaintext)
                flow.result = wire.LoginResult(provider=name, done=True, account=acct)
                log.info("accounts.device_signed_in", provider=name, source=acct.source)
        except c.AgentdError as exc:
            flow.error = exc
        except Exception as exc:
            flow.error = c.InternalError(f"{type(exc).__name__}: {exc}")
        finally:
            if flow.result is None and flow.error is None:
                flow.error = c.Invalid("the device sign-in was cancelled")
            flow.done.set()
            flow.shown.set()
            _flows.pop(flow.id, None)

    nursery.start_soon(run)
    await flow.shown.wait()
    if flow.code is None:
        assert flow.error is not None
        raise flow.error
    return wire.LoginResult(provider=name, device=flow.code, flow=flow.id,
                            message=f"enter {flow.code.code} at {flow.code.url}")


async def login_wait(flow_id: str, timeout_s: float) -> wire.LoginResult:
    """Wait for device flow ``flow_id`` to end: its result, or its error raised (Invalid when refused,
    expired or cancelled). NotFound for an unknown flow (or one of another connection that ended).
    After ``timeout_s`` the flow is cancelled and Invalid raised."""
    flow = _flows.get(flow_id)
    if flow is None:
        raise c.NotFound(f"no sign-in flow {flow_id!r} in progress")
    with trio.move_on_after(timeout_s):
        await flow.done.wait()
    if not flow.done.is_set():
        flow.scope.cancel()
        await flow.done.wait()
        raise c.Invalid(f"the device sign-in did not complete within {timeout_s:g} s")
    if flow.error is not None:
        raise flow.error
    assert flow.result is not None
    return flow.result


async def logout(runtimes: "Runtimes", name: str) -> wire.LoginResult:
    """Remove ``name``'s stored sign-in (SignOutManager.sign_out): the account after it. Raises NotFound,
    Unsupported (capability sign_out false), Invalid (a token in the environment takes precedence)."""
    provider = await runtimes.get(name)
    if not (provider.capabilities().sign_out and isinstance(provider, c.SignOutManager)):
        raise c.Unsupported(f"provider {name!r} cannot be signed out by agentd (capability sign_out is false)")
    acct = await provider.sign_out()
    log.info("accounts.signed_out", provider=name)
    return wire.LoginResult(provider=name, done=True, account=acct)


# --------------------------------------------------------------------------- quota

async def quota(runtimes: "Runtimes", name: str = "") -> list[wire.QuotaInfo]:
    """The quotas of ``name`` (or of every provider that reports any), as its runtime reports them
    now (QuotaReporter: Copilot's account quota; Codex's rate-limit windows). Raises NotFound; for
    one named provider Unsupported when it reports none, RuntimeUnavailable when it cannot say."""
    out: list[wire.QuotaInfo] = []
    for n, provider in await _capable(runtimes, name, "quota", c.QuotaReporter):
        try:
            quotas = await _bounded(provider.quota, ACCOUNT_TIMEOUT_S, "the quota")
        except c.AgentdError as exc:
            if name:
                raise
            out.append(wire.QuotaInfo(provider=n, error=exc.message))
            continue
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        out.append(wire.QuotaInfo(provider=n, quotas=sorted(quotas, key=lambda q: q.type), source="account", at=now))
    return out
