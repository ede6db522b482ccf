"""The ``copilot`` provider: GitHub's Copilot CLI driven through ``github-copilot-sdk``.

One CLI process (the *runtime*) per provider, started on first use and
shared by every open conversation. It is supervised: when it exits on its
own, every open conversation gets its running turn ended ``failed``
(reason ``runtime_exit``) and an ``exit`` event, and is closed; the next
``open`` (or ``models``, ...) starts a new runtime, paced by the restart
backoff shared with the other providers (:mod:`agentd.providers._restart`):
1 s after a crash, doubling up to 60 s while it keeps crashing, a request
waiting out at most 10 s of it and failing fast with ``RuntimeRestarting``
past that. The provider stops only the runtime it started.

The SDK is asyncio-only; it runs on an :class:`~._bridge.AsyncioBridge`
thread. Every SDK event is handed to the trio thread, where the
conversation maps it and calls ``EventSink.emit``: sinks are only ever
called from the trio thread that runs :meth:`CopilotProvider.run`.

The SDK is never allowed to download a CLI: the provider always passes the
CLI path (``providers.copilot.cli_path``, else ``copilot`` on PATH).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio
from copilot import RuntimeConnection, SessionListFilter
from copilot._jsonrpc import JsonRpcError, ProcessExitedError

from ... import _fsutil, procs, runtime_output
from ..._quick_lock import QuickLock
from ...contract import (
    Account,
    Capabilities,
    ContextTier,
    DeviceCode,
    Quota,
    Closed,
    ConversationNotFound,
    EventSink,
    HistoryRecord,
    InternalError,
    Invalid,
    Model,
    McpServer,
    OpenRequest,
    PreviousConversation,
    RuntimeUnavailable,
    SessionUnreadable,
    SubmissionUncertain,
    Unsupported,
)
from .._restart import RestartBackoff, RestartPolicy
from . import _mapping as m
from ._bridge import AsyncioBridge, BridgeClosed
from .._common import keeper_set, runs_under
from .._mcp import McpStates
from ._conversation import CopilotConversation, clean_title, unread_event_type
from ._reader import AgentdCopilotClient, FrameHead, SdkChanged, check_sdk

log = structlog.get_logger(__name__)

#: How long the CLI may take to start and answer the protocol handshake.
START_TIMEOUT_S = 60.0
#: How long create/resume/list calls may take.
CALL_TIMEOUT_S = 60.0
#: How long a graceful stop may take before the CLI is killed.
STOP_TIMEOUT_S = 10.0

NOT_FOUND_MESSAGE = (
    "GitHub Copilot CLI not found: install it with `npm install -g @github/copilot` "
    "or set providers.copilot.cli_path"
)

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _register_secret(value: str) -> None:
    try:
        from ...logs import register_secret
    except ImportError:  # pragma: no cover - logs module absent
        return
    register_secret(value)


def resolve_cli_path(cli_path: str, env: dict[str, str] | None = None) -> str:
    """The Copilot CLI executable to run: ``cli_path``, else ``copilot`` on PATH.

    The npm package's launcher (``npm-loader.js``, a node script that spawns
    the native binary and waits) is replaced by the native binary it would
    run, so the supervised process is the CLI itself. Raises
    :class:`RuntimeUnavailable` when nothing usable is found.
    """
    path_var = (env or {}).get("PATH") or os.environ.get("PATH")
    if cli_path:
        candidate = os.path.expanduser(cli_path)
        if os.sep not in candidate:
            candidate = shutil.which(candidate, path=path_var) or candidate
    else:
        candidate = shutil.which("copilot", path=path_var) or ""
    if not candidate or not os.path.exists(candidate):
        where = f" at {cli_path}" if cli_path else ""
        raise RuntimeUnavailable(f"{NOT_FOUND_MESSAGE} (nothing{where} found)" if cli_path else NOT_FOUND_MESSAGE)
    real = os.path.realpath(candidate)
    if real.endswith("npm-loader.js"):
        native = _native_binary(Path(real).parent)
        if native:
            return native
    if not os.access(real, os.X_OK) and not real.endswith(".js"):
        raise RuntimeUnavailable(f"{candidate} is not executable; {NOT_FOUND_MESSAGE}")
    return candidate


#: The CLI's auth types (``auth.getStatus``) as the account sources agentd names.
_AUTH_SOURCES = {"user": "stored", "env": "env", "gh-cli": "gh-cli", "api-key": "api_key", "hmac": "other",
                 "token": "stored"}
#: The variables the Copilot CLI reads a token from, in its order of precedence.
_TOKEN_VARS = ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN")
_CODE = re.compile(r"\b([A-Z0-9]{4}-[A-Z0-9]{4})\b")
_URL = re.compile(r"https?://[^\s'\")\x1b]+")


_sdk_checked = False


async def _check_sdk() -> None:
    """:func:`check_sdk` once per process (in a worker thread: it reads the SDK's files);
    RuntimeUnavailable when the SDK's shape changed."""
    global _sdk_checked
    if _sdk_checked:
        return
    try:
        await trio.to_thread.run_sync(check_sdk)
    except SdkChanged as exc:
        raise RuntimeUnavailable(str(exc)) from None
    _sdk_checked = True


def _model(info: Any) -> Model:
    """A catalog entry of the Copilot CLI as a contract Model."""
    tiers: list[ContextTier] = []
    limits = getattr(getattr(info, "capabilities", None), "limits", None)
    window = getattr(limits, "max_context_window_tokens", None) or getattr(limits, "max_prompt_tokens", None)
    if window:
        tiers.append(ContextTier(id="default", tokens=int(window)))
    mult = getattr(getattr(info, "billing", None), "multiplier", None)
    cost = "" if mult is None else "low" if mult < 0.5 else "medium" if mult <= 1 else "high" if mult <= 3 else "very_high"
    return Model(id=info.id, name=info.name, efforts=list(info.supported_reasoning_efforts or []),
                 context_tiers=tiers, cost_tier=cost)


_ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
#: the CLI's question when it has no keychain to keep the token in
_PLAINTEXT_QUESTION = re.compile(r"store token in plaintext[^\n]*\(y/n\)", re.IGNORECASE)


async def device_flow(argv: list[str], env: dict[str, str], show: Any, *, store_plaintext: bool = False,
                      timeout_s: float = 900.0, state_dir: Path | None = None) -> str:
    """Run a device-flow login command on a pseudo-terminal (the CLI asks its questions only on
    one); call ``show(DeviceCode)`` once its output names a code and a URL.

    The one question answered is the CLI's "store token in plaintext config file? (y/N)", and
    only as the person asked with ``store_plaintext`` (else "n"). Returns the output (escape
    sequences removed) once it exited 0. Raises Invalid when it exits otherwise (its last output
    quoted) or takes over ``timeout_s``; cancelling kills it. With ``state_dir`` it runs under
    agentd's keeper (agentd.procs): the CLI polls for up to ``timeout_s`` and must not outlive agentd.
    """
    if state_dir is not None:
        argv = procs.launch_argv(argv, state_dir=state_dir, what="copilot login", path=env.get("PATH"))
    master, slave = os.openpty()
    try:
        proc = await trio.lowlevel.open_process(argv, env=env, stdin=slave, stdout=slave, stderr=slave,
                                                start_new_session=True)
    finally:
        os.close(slave)
    stream = trio.lowlevel.FdStream(master)
    text = ""
    shown = answered = False
    try:
        with trio.move_on_after(timeout_s) as scope:
            while True:
                try:
                    chunk = await stream.receive_some(4096)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    break  # EIO: the terminal's last writer exited
                if not chunk:
                    break
                text += _ANSI.sub("", chunk.decode("utf-8", "replace"))
                if not shown:
                    code, url = _CODE.search(text), _URL.search(text)
                    if code and url:
                        show(DeviceCode(url=url.group(0).rstrip(".,"), code=code.group(1)))
                        shown = True
                if not answered and _PLAINTEXT_QUESTION.search(text):
                    answered = True
                    await stream.send_all(b"y\r" if store_plaintext else b"n\r")
            await proc.wait()
        if scope.cancelled_caught:
            raise Invalid(f"the device sign-in did not complete within {timeout_s:g} s")
    finally:
        if proc.returncode is None:
            if state_dir is not None:
                procs.kill(proc.pid)  # the keeper ends the CLI and whatever it started
            else:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        if state_dir is not None:
            procs.ended(proc.pid, state_dir)
        with trio.CancelScope(shield=True):
            await stream.aclose()
    if proc.returncode != 0:
        raise Invalid(f"the device sign-in failed (exit {proc.returncode}): {text.strip()[-400:]}")
    return text


def _native_binary(package_dir: Path) -> str:
    """The platform binary next to an ``@github/copilot`` package directory, or ""."""
    scope = package_dir.parent  # node_modules/@github
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine.lower(), os.uname().machine)
    plat = {"linux": ["linux", "linuxmusl"], "darwin": ["darwin"]}.get(sys.platform, [sys.platform])
    for p in plat:
        exe = scope / f"copilot-{p}-{arch}" / "copilot"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return ""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it closed its connection"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class _Runtime:
    """One Copilot CLI process and the SDK client that speaks to it."""

    def __init__(self, client: AgentdCopilotClient, generation: int, started: float) -> None:
        self.client = client
        self.generation = generation
        self.started = started
        self.alive = True
        self.stopping = False
        self.exit_reason = ""

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        # The SDK keeps its child process here; used only to supervise it.
        return getattr(self.client, "_cli_process", None)

    @property
    def pid(self) -> int | None:
        proc = self.process
        return proc.pid if proc is not None else None

    def stderr_tail(self, limit: int = 800) -> str:
        rpc = getattr(self.client, "_client", None)
        getter = getattr(rpc, "get_stderr_output", None)
        text = getter() if callable(getter) else ""
        return text[-limit:].strip() if text else ""

    @property
    def violation(self) -> str:
        """How the CLI broke the JSON-RPC framing (which ended the connection), or ""."""
        return str(getattr(getattr(self.client, "_client", None), "violation", "") or "")


def _mcp_config(server: McpServer, workdir: str) -> dict[str, Any]:
    """An MCP server as the SDK's session config takes it, every tool of it offered."""
    if server.transport == "http":
        return {"type": "http", "url": server.url, "headers": dict(server.headers), "tools": ["*"]}
    return {"type": "stdio", "command": server.command, "args": list(server.args), "env": dict(server.env),
            "working_directory": workdir, "tools": ["*"]}


class CopilotProvider:
    """GitHub Copilot CLI as an agentd provider (see the module docstring).

    Build it with the ``[providers.copilot]`` config section (attributes
    ``cli_path``, ``model``, ``copilot_home``, ``env``, ``byok``), the daemon's
    state dir and the provider's name; run :meth:`run` in a nursery for the
    provider's whole life.
    """

    display_name = "GitHub Copilot"
    #: how ``in_use`` is told (agentctl import)
    in_use_check = "true while a live Copilot CLI process keeps inuse.<pid>.lock in the session's session-state directory"

    def __init__(self, config: Any, *, state_dir: Path, name: str = "copilot",
                 restart_policy: RestartPolicy | None = None) -> None:
        self.config = config
        self.name = name
        self.state_dir = Path(state_dir)
        self._bridge: AsyncioBridge | None = None
        self._nursery: trio.Nursery | None = None
        self._runtime: _Runtime | None = None
        self._start_lock = QuickLock()
        self._generation = 0
        #: restart backoff of the one runtime (slot "")
        self._restarts = RestartBackoff("the Copilot CLI", provider=name, log_prefix="copilot", policy=restart_policy)
        self._conversations: set[CopilotConversation] = set()

    # ------------------------------------------------------------------ description

    @property
    def byok(self) -> Any:
        return getattr(self.config, "byok", None)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cancel=True,
            steer=True,
            commands=True,
            permissions=True,
            questions=True,
            plan=True,
            history=True,
            reopen=True,
            models=True,
            set_model=True,
            titles=True,
            usage=True,
            context_size=True,
            subagents=True,
            cancel_subagent=True,
            todos=True,
            import_=True,
            account=True,
            # signed-in only: with bring-your-own-key there is no GitHub account to sign in or out
            sign_in=self.byok is None,
            sign_out=self.byok is None,
            device_sign_in=self.byok is None,
            quota=self.byok is None,
            runtime_process=True,
            model_endpoint=True,
            attachments=True,
            fork=True,
            rewind=True,
            mcp=True,
        )

    @property
    def runtime_pid(self) -> int | None:
        """Process id of the running Copilot CLI, or None when none runs."""
        rt = self._runtime
        return rt.pid if rt is not None and rt.alive else None

    @property
    def copilot_home(self) -> Path:
        """The CLI's home (config and session state): config, else $COPILOT_HOME, else ~/.copilot."""
        home = self.config.copilot_home or (self.config.env or {}).get("COPILOT_HOME") or os.environ.get("COPILOT_HOME") or "~/.copilot"
        return Path(os.path.expanduser(home))

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started once ``open`` can be called.

        On cancellation: open conversations get an ``exit`` event and the
        runtime this provider started is stopped (gracefully, then killed).
        """
        bridge = AsyncioBridge(f"agentd-{self.name}-asyncio")
        await bridge.start()
        self._bridge = bridge
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                for conv in list(self._conversations):
                    conv.detach("agentd stopped the Copilot CLI")
                self._conversations.clear()
                rt, self._runtime = self._runtime, None
                if rt is not None:
                    await self._stop_runtime(rt)
                await bridge.stop()
                self._bridge = None

    def _require_bridge(self) -> AsyncioBridge:
        if self._bridge is None or self._nursery is None:
            raise InternalError(f"provider {self.name} is not running (run() was not started)")
        return self._bridge

    def _spawn(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the provider's nursery; dropped when the provider stopped."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    def _forget(self, conv: CopilotConversation) -> None:
        self._conversations.discard(conv)

    async def delete_session(self, sid: str) -> None:
        """Delete session ``sid`` from the CLI's store (``session.delete``); Closed when no CLI runs."""
        rt = self._runtime
        if rt is None or not rt.alive:
            raise Closed("the Copilot CLI is not running")
        await self._call("the session deletion", rt.client.delete_session, sid)

    # ------------------------------------------------------------------ the runtime

    def _cli_env(self) -> dict[str, str]:
        """The CLI's environment: ours less other providers' secrets, plus ``config.env``, without the BYOK key variable.

        The key reaches the CLI over its JSON-RPC pipe; leaving it out of the
        environment keeps it from every shell command the agent runs.
        """
        from ...runtime_env import environ

        env = environ(self.name)  # without other providers' secrets
        env.update(self.config.env or {})
        byok = self.byok
        if byok is not None and byok.api_key_env:
            env.pop(byok.api_key_env, None)
        return env

    def _api_key(self) -> str:
        byok = self.byok
        if byok is None or not byok.api_key_env:
            return ""
        key = os.environ.get(byok.api_key_env, "")
        if not key:
            raise RuntimeUnavailable(
                f"providers.copilot.byok.api_key_env names {byok.api_key_env}, but that environment variable is not set"
            )
        _register_secret(key)
        return key

    def provider_config(self) -> dict[str, Any] | None:
        """The SDK's bring-your-own-key provider dict (with the key), or None when signed in."""
        byok = self.byok
        if byok is None:
            return None
        cfg: dict[str, Any] = {"type": byok.type, "base_url": byok.base_url}
        key = self._api_key()
        if key:
            cfg["api_key"] = key
        if byok.type in ("openai", "azure") and byok.wire_api:
            cfg["wire_api"] = byok.wire_api
        return cfg

    async def check(self) -> None:
        """Raise :class:`RuntimeUnavailable` when the CLI is missing, the BYOK key is unset, or the SDK changed."""
        await _check_sdk()
        resolve_cli_path(self.config.cli_path, self.config.env or {})
        self._api_key()
        if self.byok is not None and not (self.byok.model or self.config.model):
            raise RuntimeUnavailable("providers.copilot.byok.model is required with bring-your-own-key")

    async def _ensure_runtime(self) -> _Runtime:
        """The running CLI, started if needed (after the crash backoff). Raises RuntimeUnavailable."""
        bridge = self._require_bridge()
        async with self._start_lock:
            rt = self._runtime
            if rt is not None and rt.alive:
                return rt
            await self._restarts.wait()
            await _check_sdk()
            cli = resolve_cli_path(self.config.cli_path, self.config.env or {})
            self._api_key()  # fail early (and register the secret) before spawning
            home = self.copilot_home
            workdir = self.state_dir / "providers" / self.name

            def make_dirs() -> str:
                home.mkdir(parents=True, exist_ok=True)
                _fsutil.make_dirs(workdir)  # under the state dir: 0700, parents too
                # The SDK spawns [path, args...] itself: path is a script running the CLI under agentd's keeper.
                command = ["node", cli] if cli.endswith(".js") else [cli]
                return procs.launch_script(command, state_dir=self.state_dir, what=self.name)

            launcher = await trio.to_thread.run_sync(make_dirs)
            self._generation += 1
            generation = self._generation

            def refused(head: FrameHead, text: str) -> None:  # the asyncio thread, in order with the events
                bridge.to_trio(self._message_refused, generation, head, text)

            async def start() -> AgentdCopilotClient:
                client = AgentdCopilotClient(
                    connection=RuntimeConnection.for_stdio(path=launcher),
                    working_directory=str(workdir),
                    env=self._cli_env(),
                    base_directory=str(home),
                    use_logged_in_user=self.byok is None,
                    client_info={"application_name": "agentd"},
                    on_refused=refused,
                    drop_event=unread_event_type,
                )
                try:
                    await client.start()
                except BaseException:
                    try:
                        await client.force_stop()
                    except Exception:
                        pass
                    raise
                return client

            log.info("copilot.runtime_starting", provider=self.name, cli=cli, home=str(home), byok=self.byok is not None)
            try:
                with trio.fail_after(START_TIMEOUT_S):
                    client = await bridge.run(start)
            except trio.TooSlowError:
                error = RuntimeUnavailable(f"the Copilot CLI ({cli}) did not start within {START_TIMEOUT_S:g} s")
                self._restarts.failed(error=error.message)
                raise error from None
            except (RuntimeError, OSError, ProcessExitedError, JsonRpcError) as exc:
                error = RuntimeUnavailable(f"the Copilot CLI ({cli}) did not start: {exc}")
                self._restarts.failed(error=error.message)
                raise error from None
            rt = _Runtime(client, generation, trio.current_time())
            self._runtime = rt
            self._watch(rt)
            log.info("copilot.runtime_started", provider=self.name, pid=rt.pid, generation=generation)
            return rt

    def _watch(self, rt: _Runtime) -> None:
        """Notice the runtime's end: its connection closing, or its process exiting."""
        bridge = self._require_bridge()
        rpc = getattr(rt.client, "_client", None)
        if rpc is not None and hasattr(rpc, "on_close"):
            previous = rpc.on_close

            def on_close() -> None:  # the SDK's reader thread
                try:
                    if previous is not None:
                        previous()
                finally:
                    bridge.to_trio(self._runtime_lost, rt)

            rpc.on_close = on_close
        proc = rt.process
        if proc is not None:
            self._spawn(self._wait_process, rt, proc)

    def _message_refused(self, generation: int, head: FrameHead, text: str) -> None:
        """The reader refused a frame of runtime ``generation`` (trio thread): its session's turn fails.

        Not for an event agentd drops unseen anyway (the CLI's ``model.*`` telemetry, whose
        ``model.messages_snapshot`` holds the whole history and so passes the ceiling in a long
        session of small messages): that one is only logged.
        """
        if head.method == "session.event" and m.inert_type(head.event_type):
            log.info("copilot.inert_event_refused", provider=self.name, session=head.session_id,
                     event_type=head.event_type, why=text)
            return
        log.warning("copilot.message_refused", provider=self.name, session=head.session_id, method=head.method,
                    event_type=head.event_type, why=text)
        sid = head.session_id
        convs = [c for c in self._conversations if c._runtime.generation == generation and sid and c.id == sid]
        for conv in convs:
            conv.message_refused(text)

    async def _wait_process(self, rt: _Runtime, proc: subprocess.Popen[bytes]) -> None:
        await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
        self._runtime_lost(rt)

    def _runtime_lost(self, rt: _Runtime) -> None:
        """The runtime's connection closed or its process exited (trio thread)."""
        if not rt.alive:
            return
        rt.alive = False
        if rt.stopping:
            return
        rt.exit_reason = "the Copilot CLI exited"
        self._restarts.failed(uptime=trio.current_time() - rt.started, error=rt.exit_reason)
        self._spawn(self._after_exit, rt)

    async def _after_exit(self, rt: _Runtime) -> None:
        proc = rt.process
        code = None
        if proc is not None:
            with trio.move_on_after(1.0):
                code = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
            if code is None and rt.violation and rt.pid is not None:
                procs.kill(rt.pid)  # it still runs, on a connection agentd gave up
                with trio.move_on_after(STOP_TIMEOUT_S):
                    code = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
        if code is not None:
            procs.ended(rt.pid, self.state_dir)
        reason = f"the Copilot CLI exited unexpectedly ({_describe_exit(code)})"
        tail = rt.stderr_tail()
        if rt.violation:  # the CLI still ran: agentd ended the connection it broke
            reason = f"the Copilot CLI broke the JSON-RPC framing ({rt.violation}); agentd stopped it"
        elif tail:
            reason += f": {tail.splitlines()[-1][:300]}"
        rt.exit_reason = reason
        self._restarts.explain("", reason)
        log.warning("copilot.runtime_exited", provider=self.name, pid=rt.pid, code=code, generation=rt.generation)
        for conv in [c for c in self._conversations if c._runtime is rt]:
            conv.runtime_exited(reason)
            self._conversations.discard(conv)
        if self._runtime is rt:
            self._runtime = None
        bridge = self._bridge
        if bridge is not None:
            with trio.move_on_after(STOP_TIMEOUT_S):
                try:
                    await bridge.run(rt.client.force_stop)
                except Exception as exc:
                    log.debug("copilot.cleanup_failed", error=str(exc))

    async def _stop_runtime(self, rt: _Runtime) -> None:
        """Stop a runtime this provider started: gracefully, then by force."""
        rt.stopping = True
        bridge = self._bridge
        if bridge is None or not bridge.running:
            return
        stopped = False
        with trio.move_on_after(STOP_TIMEOUT_S):
            try:
                await bridge.run(rt.client.stop)
                stopped = True
            except BaseException as exc:  # an ExceptionGroup of StopErrors, or a dead transport
                if isinstance(exc, trio.Cancelled):
                    raise
                log.debug("copilot.stop_failed", error=str(exc))
        if not stopped:
            if rt.pid is not None:
                procs.kill(rt.pid)  # the keeper kills what the SDK's SIGKILL of it would leave
            with trio.move_on_after(STOP_TIMEOUT_S):
                try:
                    await bridge.run(rt.client.force_stop)
                except Exception as exc:
                    log.debug("copilot.force_stop_failed", error=str(exc))
        rt.alive = False
        procs.ended(rt.pid, self.state_dir)
        log.info("copilot.runtime_stopped", provider=self.name, generation=rt.generation)

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with trio.fail_after(CALL_TIMEOUT_S):
                return await self._require_bridge().run(fn, *args, **kwargs)
        except (ProcessExitedError, BridgeClosed, BrokenPipeError, ConnectionError) as exc:
            raise Closed(f"the Copilot CLI exited during {what}: {exc}") from None
        except trio.TooSlowError:
            raise InternalError(f"the Copilot CLI did not answer {what} within {CALL_TIMEOUT_S:g} s") from None

    # ------------------------------------------------------------------ conversations

    async def open(self, request: OpenRequest, sink: EventSink) -> CopilotConversation:
        """Create a session, or resume exactly ``request.conversation_id``.

        Starts the runtime if needed. Raises :class:`ConversationNotFound` when
        the CLI has no session with that id (never creates one instead),
        :class:`RuntimeUnavailable` when the CLI cannot start.
        """
        # Every session of the provider runs in its one CLI: the one running now, after a restart too.
        runs_under(sink, lambda: keeper_set(self.runtime_pid))
        rt = await self._ensure_runtime()
        byok = self.byok
        if request.conversation_id and byok is None:
            model = request.model  # a resumed session keeps its own model unless asked otherwise
        else:
            model = request.model or (byok.model if byok is not None else "") or self.config.model
        effort = request.effort
        conv = CopilotConversation(self, rt, sink, workdir=request.workdir, model=model, effort=effort)
        conv.mcp = McpStates(request.mcp_servers)
        options = conv.session_options()
        if request.mcp_servers:
            options["mcp_servers"] = {s.name: _mcp_config(s, request.workdir) for s in request.mcp_servers}
        provider_cfg = self.provider_config()
        if provider_cfg is not None:
            options["provider"] = provider_cfg
        if model:
            options["model"] = model
        if effort:
            options["reasoning_effort"] = effort
        client = rt.client
        if request.conversation_id:
            sid = request.conversation_id
            if not _SESSION_ID.match(sid):
                raise ConversationNotFound(f"no Copilot session {sid!r}")
            meta = await self._call("the session lookup", client.get_session_metadata, sid)
            if meta is None:
                raise ConversationNotFound(f"the Copilot CLI has no session {sid!r} (in {self.copilot_home})")
            for other in [c for c in self._conversations if c.id == sid]:
                other.detach("the conversation was reopened")
                self._conversations.discard(other)
            try:
                session = await self._call("the session resume", client.resume_session, sid, **options)
            except JsonRpcError as exc:
                if "not found" in exc.message.lower():
                    raise ConversationNotFound(f"the Copilot CLI has no session {sid!r}: {exc.message}") from None
                raise SessionUnreadable(f"the Copilot CLI could not resume session {sid!r}: {exc.message}") from None
        else:
            title = clean_title(request.title) if request.title else ""
            if title:
                options["name"] = title
            try:
                session = await self._call("the session creation", client.create_session, **options)
            except JsonRpcError as exc:
                raise InternalError(f"the Copilot CLI could not create a session: {exc.message}") from None
        conv.session = session
        conv._id = session.session_id
        self._conversations.add(conv)
        if not rt.alive:  # died while we were opening
            conv.runtime_exited(rt.exit_reason or "the Copilot CLI exited")
            self._conversations.discard(conv)
        log.info("copilot.opened", provider=self.name, conversation=conv.id, resumed=bool(request.conversation_id))
        return conv

    async def models(self) -> list[Model]:
        """The models the signed-in account may use (the CLI's ``models.list``), each with its
        reasoning efforts, its context window as one tier and a cost tier from its premium
        multiplier; with bring-your-own-key, the models the config names (``byok.model``,
        ``byok.models``, ``model``).

        Raises :class:`RuntimeUnavailable` when not signed in.
        """
        byok = self.byok
        if byok is not None:
            names = [byok.model, *getattr(byok, "models", []), self.config.model]
            out: list[Model] = []
            for n in names:
                if n and all(m.id != n for m in out):
                    out.append(Model(id=n, name=f"{byok.type} at {byok.base_url}"))
            return out
        rt = await self._ensure_runtime()
        try:
            infos = await self._call("the model list", rt.client.list_models)
        except JsonRpcError as exc:
            raise RuntimeUnavailable(f"the Copilot CLI cannot list models: {exc.message} (sign in with "
                                     f"`agentctl login {self.name} --device`)", details={"state": "needs_sign_in"}) from None
        return [_model(i) for i in infos]

    async def account(self) -> Account:
        """The CLI's sign-in (never a credential); with BYOK, which key variable is used."""
        byok = self.byok
        if byok is not None:
            present = bool(byok.api_key_env and os.environ.get(byok.api_key_env)) or not byok.api_key_env
            return Account(
                signed_in=present,
                source="byok",
                env_var=byok.api_key_env,
                message=f"bring-your-own-key: {byok.type} at {byok.base_url}, model {byok.model or self.config.model}"
                + ("" if present else f" ({byok.api_key_env} is not set)"),
            )
        rt = await self._ensure_runtime()
        status = await self._call("the sign-in status", rt.client.get_auth_status)
        kind = status.authType or ""
        var = next((v for v in _TOKEN_VARS if os.environ.get(v) or (self.config.env or {}).get(v)), "") if kind == "env" else ""
        return Account(
            signed_in=status.isAuthenticated,
            login=status.login or "",
            source=_AUTH_SOURCES.get(kind, kind) if status.isAuthenticated else "",
            env_var=var,
            host=status.host or "",
            message=status.statusMessage or "",
        )

    async def quota(self) -> list[Quota]:
        """The signed-in account's Copilot quotas (``account.getQuota``), sorted by type.

        Raises :class:`Unsupported` with bring-your-own-key, :class:`RuntimeUnavailable` when the
        CLI cannot say (not signed in, offline)."""
        if self.byok is not None:
            raise Unsupported("with bring-your-own-key there is no Copilot account quota")
        from copilot.generated.rpc import AccountGetQuotaRequest

        rt = await self._ensure_runtime()
        try:
            result = await self._call("the quota", rt.client.rpc.account.get_quota, AccountGetQuotaRequest())
        except JsonRpcError as exc:
            raise RuntimeUnavailable(f"the Copilot CLI cannot read the quota: {exc.message}") from None
        try:  # the plan and reset date the CLI keeps for the account, where it has them
            user = ((await self._active_user(rt)).get("authInfo") or {}).get("copilotUser") or {}
        except (JsonRpcError, Closed, InternalError):
            user = {}
        plan, reset = str(user.get("copilot_plan") or ""), str(user.get("quota_reset_date") or "")
        out = []
        for kind, snap in sorted((result.quota_snapshots or {}).items()):
            unlimited = bool(snap.is_unlimited_entitlement)
            out.append(Quota(type=kind, used=snap.used_requests, entitlement=0 if unlimited else snap.entitlement_requests,
                             unlimited=unlimited, remaining_percent=snap.remaining_percentage, overage=snap.overage,
                             reset_at=snap.reset_date or reset, unit="requests", plan=plan))
        return out

    async def _active_user(self, rt: Any) -> dict[str, Any]:
        """The signed-in account as ``account.getAllUsers`` lists it (its token stays here), or {}."""
        users = await self._call("the account list", rt.client.rpc.account.get_all_users)
        status = await self._call("the sign-in status", rt.client.get_auth_status)
        for u in users or []:
            info = (u or {}).get("authInfo") or {}
            if info.get("login") == status.login and (not status.host or info.get("host") == status.host):
                return u
        return (users or [{}])[0] or {}

    async def sign_in(self, token: str) -> Account:
        """Hand ``token`` (a GitHub token Copilot takes) to the CLI's ``account.login``, which validates
        and stores it. Raises Unsupported with BYOK, Invalid when the CLI refuses it."""
        if self.byok is not None:
            raise Unsupported("with bring-your-own-key there is no GitHub account to sign in")
        from copilot.generated.rpc import AccountLoginRequest

        rt = await self._ensure_runtime()
        host = (self.config.env or {}).get("COPILOT_GH_HOST") or "https://github.com"
        try:
            result = await self._call("the sign-in", rt.client.rpc.account.login,
                                      AccountLoginRequest(host=host, token=token))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused the token: {exc.message}") from None
        acct = await self.account()
        if acct.signed_in and not result.stored_in_vault:  # no keychain: it lasts until the CLI stops
            acct = msgspec.structs.replace(acct, message=(acct.message + "; " if acct.message else "")
                                           + "not stored (no system keychain): lasts until the Copilot CLI stops")
        return acct

    async def sign_out(self) -> Account:
        """Remove the CLI's stored sign-in (``account.logout``). Raises Invalid while a token in the
        environment signs it in (that token is not the CLI's to forget)."""
        if self.byok is not None:
            raise Unsupported("with bring-your-own-key there is no GitHub account to sign out")
        from copilot.generated.rpc import AccountLogoutRequest

        current = await self.account()
        if current.source == "env":
            raise Invalid(f"a token in ${current.env_var or 'GH_TOKEN'} signs the Copilot CLI in; "
                          "unset it in agentd's environment to sign out")
        rt = await self._ensure_runtime()
        try:
            active = await self._active_user(rt)
            # The CLI logs out one account: the one signed in (its opaque selection id).
            await self._call("the sign-out", rt.client.rpc.account.logout,
                             AccountLogoutRequest(selection_id=str(active.get("selectionId") or "") or None))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI could not sign out: {exc.message}") from None
        return await self.account()

    async def device_sign_in(self, show: Any, *, store_plaintext: bool = False) -> Account:
        """GitHub's device flow through the CLI's own ``copilot login --device-code``: the code and
        URL it prints go to ``show``; returns once it exited 0 and the runtime reports the sign-in.

        The login runs with the CLI's environment (its ``COPILOT_HOME``; ``COPILOT_GH_HOST``, when
        the config's env sets it, is passed as ``--host``: GitHub Enterprise, or a local stand-in);
        without a system keychain the CLI keeps the token in its config file only with
        ``store_plaintext``. A runtime already running is restarted so it reads the new sign-in.
        Cancelling stops the login. Raises Invalid when the flow fails, expires, or leaves no
        sign-in (the CLI's reason quoted), RuntimeUnavailable when the CLI is missing.
        """
        if self.byok is not None:
            raise Unsupported("with bring-your-own-key there is no GitHub account to sign in")
        cli = resolve_cli_path(self.config.cli_path, self.config.env or {})
        env = self._cli_env()
        if self.config.copilot_home:
            env["COPILOT_HOME"] = os.path.expanduser(self.config.copilot_home)
        env.setdefault("TERM", "dumb")
        argv = [cli, "login", "--device-code"]
        host = (self.config.env or {}).get("COPILOT_GH_HOST", "")
        if host:
            argv += ["--host", host]
        hint = " (agentctl login copilot --device --store-plaintext lets it keep the token in its config file)"
        try:
            out = await device_flow(argv, env, show, store_plaintext=store_plaintext, state_dir=self.state_dir)
        except Invalid as exc:
            if store_plaintext or "plaintext" not in exc.message.lower():
                raise
            raise Invalid(exc.message + hint) from None
        rt, self._runtime = self._runtime, None
        if rt is not None:
            await self._stop_runtime(rt)
        acct = await self.account()
        if not acct.signed_in:
            why = out.strip().splitlines()[-1] if out.strip() else acct.message
            raise Invalid(f"copilot login ended, yet the CLI reports no sign-in: {why}"
                          + ("" if store_plaintext or "plaintext" not in out.lower() else hint))
        return acct

    async def previous(self, workdir: str) -> list[PreviousConversation]:
        """The CLI's sessions started in ``workdir`` (same real path; one whose folder the CLI does
        not say is kept), newest first."""
        rt = await self._ensure_runtime()
        sessions = await self._call("the session list", rt.client.list_sessions, SessionListFilter(working_directory=workdir))
        out = [
            PreviousConversation(
                id=s.session_id,
                title=s.summary or "",
                workdir=(s.context.working_directory or "") if s.context else "",
                created_at=runtime_output.utc(s.start_time),
                updated_at=runtime_output.utc(s.modified_time),
            )
            for s in sessions
            if not s.is_remote
        ]
        epoch = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
        out.sort(key=lambda p: p.updated_at or p.created_at or epoch, reverse=True)
        return out

    async def in_use(self, ids: list[str]) -> set[str]:
        """The ids among ``ids`` another Copilot CLI holds open: its session directory has an
        ``inuse.<pid>.lock`` of a live process other than this provider's CLI (agentd.providers._inuse)."""
        from .. import _inuse

        own = {pid} if (pid := self.runtime_pid) is not None else set()
        ids = [i for i in ids if _SESSION_ID.match(i)]
        return await trio.to_thread.run_sync(lambda: _inuse.copilot(self.copilot_home, ids, own=own))

    async def fork(self, source: str, marker: str, request: OpenRequest) -> str:
        """A new session forked off session ``source`` through the root user turn whose
        ``user.message`` event is ``marker`` (``sessions.fork`` up to the next root user turn's
        event, exclusive; the whole session when none follows). Sends nothing.

        Raises ConversationNotFound, Invalid (no such turn), SubmissionUncertain (the CLI went
        away mid-fork), InternalError (it refused).
        """
        from copilot.generated import rpc as _rpc
        from copilot.generated import session_events as se

        lines = await self._stored_events(source)
        roots = [str(ev.id) for ev in m.parse_events_jsonl(lines)
                 if ev.type is se.SessionEventType.USER_MESSAGE and not ev.agent_id
                 and ev.data.delivery is not se.UserMessageDelivery.STEERING]
        if marker not in roots:
            raise Invalid(f"Copilot session {source} has no user turn {marker!r}")
        after = roots[roots.index(marker) + 1:]
        rt = await self._ensure_runtime()
        params = _rpc.SessionsForkRequest(session_id=source, to_event_id=after[0] if after else None,
                                          name=clean_title(request.title) or None if request.title else None)
        try:
            result = await self._call("the fork", rt.client.rpc.sessions.fork, params)
        except JsonRpcError as exc:
            raise InternalError(f"the Copilot CLI refused to fork session {source}: {exc.message}") from None
        except (Closed, InternalError) as exc:
            raise SubmissionUncertain(f"the fork of {source} may or may not have made a session: {exc.message}") from None
        log.info("copilot.forked", provider=self.name, source=source, turn=marker, conversation=result.session_id)
        return str(result.session_id)

    async def history(self, conversation_id: str) -> HistoryRecord:
        """A session's transcript read from the CLI's store, without opening it or starting the CLI.

        Raises :class:`ConversationNotFound` when the store has no such session.
        """
        return m.history_from_events(m.parse_events_jsonl(await self._stored_events(conversation_id)))

    async def _stored_events(self, session: str) -> list[bytes]:
        """The lines of session ``session``'s ``events.jsonl`` in the CLI's store (read in a worker
        thread); a line over runtime_output.MAX_MESSAGE_BYTES is left out. Raises ConversationNotFound
        for an id that is no session id, no such session, or an ``events.jsonl`` that is no regular
        file (a symlink, a FIFO, a device)."""
        if not _SESSION_ID.match(session):
            raise ConversationNotFound(f"no Copilot session {session!r}")
        path = self.copilot_home / "session-state" / session / "events.jsonl"
        try:
            return await trio.to_thread.run_sync(_read_lines, path, runtime_output.MAX_MESSAGE_BYTES)
        except FileNotFoundError:
            raise ConversationNotFound(f"the Copilot CLI has no session {session!r} (in {self.copilot_home})") from None
        except OSError as exc:
            raise ConversationNotFound(f"the Copilot CLI's session {session!r} cannot be read: {path}: "
                                       f"{exc.strerror or exc}") from None


def _read_lines(path: Path, max_line: int) -> list[bytes]:
    """The lines of the regular file at ``path`` as it stood when opened, each up to ``max_line``
    bytes (a longer one is left out, logged). Raises OSError as :func:`agentd._fsutil.open_regular`."""
    f, st = _fsutil.open_regular(path)
    with f:
        out: list[bytes] = []
        for line in _fsutil.bounded_lines(f, st.st_size, max_line):
            if isinstance(line, int):
                log.warning("copilot.events_line_skipped", path=str(path), bytes=line, max_bytes=max_line)
            else:
                out.append(line)
        return out