"""The ``codex`` provider: OpenAI Codex CLI, driven as ``codex app-server`` over its stdio.

One app-server process per provider serves every conversation; a
conversation's id is the Codex thread id, so a later daemon reopens it with
``thread/resume`` (Codex keeps threads under ``CODEX_HOME``). ``CODEX_HOME``
is ``<state_dir>/providers/codex/home`` unless configured, so a daemon never
shares threads or settings with an interactive Codex by accident. The model
endpoint (``[providers.codex.model_provider]``) and any other setting reach
Codex as ``-c key=value`` overrides: agentd never writes Codex's config.toml.

Client: our own, on the JSON-RPC layer shared with the ACP provider (:mod:`.._jsonrpc`:
one JSON object per line; Codex leaves out the ``jsonrpc`` field and accepts
it). The official ``openai-codex`` SDK (OpenAI, on PyPI) drives the same
protocol from threads with an asyncio wrapper, pins its own Codex binary and
needs pydantic; under trio it would need the asyncio bridge for no gain. The
third-party app-server clients on PyPI (``codex-app-server-sdk``,
``codex-python-sdk-unofficial``, ``codex-app-server-client``) are early one-person
projects doing their I/O on asyncio subprocess pipes: the same bridge, more risk.

Process hygiene: the app-server runs in its own process group
(``start_new_session``); stopping the provider closes its stdin, then
SIGTERMs, then SIGKILLs the group. An app-server that exits on its own fails
the running turns (reason ``runtime_exit``); the next request starts a new one,
paced by the shared restart backoff (:mod:`.._restart`, one slot ""), and each
conversation resumes its thread in it. A completed turn or an opened
conversation starts the backoff over.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import structlog
import trio

from ..._fsutil import make_dirs
from ...config import CodexConfig
from ...contract import (
    Account,
    Busy,
    Capabilities,
    Closed,
    ConversationNotFound,
    DeviceCode,
    EventSink,
    Invalid,
    Model,
    McpServer,
    OpenRequest,
    PreviousConversation,
    Quota,
    RuntimeUnavailable,
    SubmissionUncertain,
    Unsupported,
)
from .._restart import RestartBackoff, RestartPolicy
from .._mcp import McpStates
from .._common import agentd_version as _version
from .._common import check_workdir as _check_workdir
from .._common import keeper_set, runs_under
from .._jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, AgentProcess, RpcError
from ._conversation import CodexConversation, parse_time

log = structlog.get_logger("agentd.providers.codex")

#: Timeout of a request other than a turn (model/list, thread/list, thread/read, name/set).
REQUEST_TIMEOUT_S = 30.0


class AppServer:
    """One ``codex app-server`` process and the threads it serves, routing its messages by threadId."""

    def __init__(self, provider: CodexProvider) -> None:
        self.provider = provider
        self.spawned_at: float | None = None
        self.threads: dict[str, CodexConversation] = {}
        #: thread id -> MCP startup notifications that came before the thread was routed here
        self.early_mcp: dict[str, list[dict[str, Any]]] = {}
        self._failure_noted = False
        self.proc = AgentProcess(provider.argv(), env=provider.env(), cwd=str(provider.dir), label=provider.name,
                                 state_dir=provider.state_dir, on_request=self._on_request, on_notification=self._on_notification,
                                 on_exit=self._on_exit)

    @property
    def alive(self) -> bool:
        return self.proc.alive

    async def start(self, nursery: trio.Nursery, timeout: float) -> None:
        """Spawn, initialize, send ``initialized``. Raises RuntimeUnavailable (the process is stopped)."""
        name = self.provider.name
        try:
            await self.proc.start(nursery)
        except OSError as exc:
            raise RuntimeUnavailable(f"{name}: cannot start {self.provider.cli()!r}: {exc.strerror or exc}") from None
        self.spawned_at = trio.current_time()
        try:
            await self.proc.request("initialize", {
                "clientInfo": {"name": "agentd", "title": "agentd", "version": _version()},
            }, timeout=timeout)
            assert self.proc.conn is not None
            await self.proc.conn.notify("initialized", None)
        except BaseException as exc:
            await self.proc.stop()
            raise self.error("initialize", exc, timeout) from None

    def error(self, what: str, exc: BaseException, timeout: float = REQUEST_TIMEOUT_S) -> BaseException:
        """The contract error for a failed request to the app-server (cancellation passes through)."""
        return self.proc.request_failure(self.provider.name, what, exc, timeout)

    def note_failure(self, error: str) -> None:
        """Count this process's failure once against the restart backoff (a never-spawned one is none)."""
        if self._failure_noted or self.spawned_at is None:
            return
        self._failure_noted = True
        self.provider.restarts.failed("", uptime=trio.current_time() - self.spawned_at, error=error)

    async def request(self, method: str, params: Any, *, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """A request's result; raises RpcError, ConnectionLost, trio.TooSlowError."""
        return await self.proc.request(method, params, timeout=timeout)

    def _on_notification(self, method: str, params: Any) -> None:
        if not isinstance(params, dict):
            return
        if method == "account/login/completed":  # a device sign-in ended (agentd.accounts waits on it)
            waiter = self.provider.login_waiters.get(str(params.get("loginId") or ""))
            if waiter is not None:
                waiter[1].update(params)
                waiter[0].set()
            return
        if method == "account/rateLimits/updated":  # the account's, not a thread's: every running turn gets it
            quotas = rate_limit_quotas(params.get("rateLimits"))
            if quotas:
                self.provider.rate_limits = quotas
                for conv in list(self.threads.values()):
                    conv.note_quota(quotas)
            return
        if method == "mcpServer/startupStatus/updated":
            tid = params.get("threadId")
            if not isinstance(tid, str):
                for conv in list(self.threads.values()):  # the app-server's: each thread with that server
                    conv._on_mcp_startup(params)
                return
            if tid not in self.threads:
                # Sent before thread/start's answer named the thread: kept for it (a few, bounded).
                early = self.early_mcp.setdefault(tid, [])
                if len(self.early_mcp) <= 64 and len(early) < 64:
                    early.append(params)
                return
        tid = params.get("threadId")
        if not isinstance(tid, str):
            thread = params.get("thread")
            tid = thread.get("id") if isinstance(thread, dict) else None
        conv = self.threads.get(tid) if isinstance(tid, str) else None
        if conv is None:
            log.debug("codex.notification_unrouted", provider=self.provider.name, method=method)
            return
        conv._on_notification(self, method, params)

    async def _on_request(self, method: str, params: Any) -> Any:
        tid = params.get("threadId") if isinstance(params, dict) else None
        conv = self.threads.get(tid) if isinstance(tid, str) else None
        if conv is None or method not in CodexConversation.SERVER_REQUESTS:
            log.info("codex.request_refused", provider=self.provider.name, method=method)
            raise RpcError(METHOD_NOT_FOUND if conv is not None or tid is None else INVALID_PARAMS,
                           f"agentd does not handle {method}" + ("" if conv is not None or tid is None else f" for thread {tid!r}"))
        return await conv._on_server_request(self, method, params)

    def _on_exit(self, reason: str) -> None:
        self.note_failure(reason)
        for conv in list(self.threads.values()):
            conv._runtime_exited(self, reason)
        self.threads.clear()
        self.provider._server_gone(self)


def rate_limit_quotas(raw: Any) -> list[Quota]:
    """Codex's rate-limit snapshot (``account/rateLimits/updated``, ``account/rateLimits/read``) as
    quotas: one per window (``primary``, ``secondary``), in percent of the window used."""
    if not isinstance(raw, dict):
        return []
    out: list[Quota] = []
    plan = str(raw.get("planType") or "")
    for key in ("primary", "secondary"):
        w = raw.get(key)
        if not isinstance(w, dict) or not isinstance(w.get("usedPercent"), (int, float)):
            continue
        used = float(w["usedPercent"])
        mins = w.get("windowDurationMins")
        reset = w.get("resetsAt")
        out.append(Quota(
            type=f"{key}" + (f" ({int(mins)} min window)" if isinstance(mins, (int, float)) else ""),
            used=used, entitlement=100, remaining_percent=max(0.0, 100 - used), unit="percent",
            reset_at=_dt.datetime.fromtimestamp(reset, _dt.timezone.utc).isoformat().replace("+00:00", "Z")
            if isinstance(reset, (int, float)) else "", plan=plan))
    return out


def _toml(value: Any) -> str:
    """A TOML value for ``-c key=value`` (a JSON string or number is valid TOML)."""
    return json.dumps(value)


def _mcp_config(server: McpServer) -> dict[str, Any]:
    """An MCP server as Codex's ``[mcp_servers.<name>]`` table."""
    if server.transport == "http":
        return {"url": server.url, "http_headers": dict(server.headers)}
    return {"command": server.command, "args": list(server.args), "env": dict(server.env)}


class CodexProvider:
    """The Codex app-server; implements contract.Provider and contract.Importer.

    The app-server starts lazily (``check``, ``open``, ``models``,
    ``previous``) as a task of the nursery that :meth:`run` owns; cancelling
    ``run`` ends running turns (reason ``shutdown``) and stops the process.
    """

    def __init__(self, config: CodexConfig, *, state_dir: Path, name: str = "codex",
                 restart_policy: RestartPolicy | None = None) -> None:
        self.name = name
        self.config = config
        self.display_name = "OpenAI Codex"
        #: agentd's state dir: the app-server runs under a keeper recorded there (agentd.procs)
        self.state_dir = Path(state_dir)
        self.dir = Path(state_dir) / "providers" / "codex"
        self.home = Path(os.path.expanduser(config.codex_home)) if config.codex_home else self.dir / "home"
        self.restarts = RestartBackoff(f"the {name} app-server", provider=name, log_prefix="codex", policy=restart_policy)
        self._nursery: trio.Nursery | None = None
        self._server: AppServer | None = None
        self._server_lock = trio.Lock()
        self._stopping = False
        self._open: dict[str, CodexConversation] = {}
        #: the rate-limit windows Codex last reported (account/rateLimits/updated), newest
        self.rate_limits: list[Quota] = []
        #: device sign-ins in progress: loginId -> (ended, the account/login/completed params)
        self.login_waiters: dict[str, tuple[trio.Event, dict[str, Any]]] = {}
        key_env = config.model_provider.api_key_env if config.model_provider else ""
        if key_env:
            from ...logs import register_secret

            register_secret(os.environ.get(key_env) or config.env.get(key_env))

    # ------------------------------------------------------------------ contract.Provider

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cancel=True, steer=True, commands=True, permissions=True, questions=True, history=True, reopen=True,
            models=True, set_model=True, titles=True, usage=True, context_size=True, import_=True,
            runtime_process=True, model_endpoint=True, attachments=True, fork=True, rewind=True, account=True,
            quota=True, mcp=True,
            # Codex's own sign-in (auth.json in CODEX_HOME); with model_provider the key is an env var
            sign_in=self.config.model_provider is None, sign_out=self.config.model_provider is None,
            device_sign_in=self.config.model_provider is None,
        )

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; the app-server and every turn live in the nursery owned here."""
        if self._nursery is not None:
            raise RuntimeError(f"provider {self.name!r} is already running")
        await trio.to_thread.run_sync(make_dirs, self.dir)  # the app-server's cwd
        await trio.to_thread.run_sync(make_dirs, self.home)
        self._stopping = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    self._stopping = True
                    if self._server is not None:
                        self._server.proc.stopping()
                    for conv in list(self._open.values()):
                        conv._shutdown()
                    if self._server is not None:
                        with trio.CancelScope(shield=True):
                            await self._server.proc.stop()
        finally:
            self._nursery = None
            self._server = None
            self._open.clear()

    async def check(self) -> None:
        """Raises RuntimeUnavailable when disabled, not installed, or failing to start (it starts it once)."""
        await trio.lowlevel.checkpoint()
        if not self.config.enabled:
            raise RuntimeUnavailable(f"{self.name} is disabled in the config (enabled = false)")
        if shutil.which(self.cli(), path=self.env().get("PATH")) is None:
            raise RuntimeUnavailable(f"{self.name}: {self.cli()!r} is not installed or not executable "
                                     "(npm install -g @openai/codex, or set providers.codex.cli_path)")
        await self.server(wait_limit=0.0)

    async def account(self) -> Account:
        """How Codex authenticates: with ``model_provider``, its key variable (present or not); else
        Codex's own sign-in (``account/read``: an API key or a ChatGPT login it stored). Never a key."""
        mp = self.config.model_provider
        if mp is not None:
            var = mp.api_key_env
            where = f"model provider {mp.id} at {mp.base_url}"
            if not var:
                return Account(signed_in=True, source="other", message=f"{where}, which needs no key")
            present = bool(os.environ.get(var) or self.config.env.get(var))
            return Account(signed_in=present, source="api_key" if present else "", env_var=var,
                           message=f"{where}, key in ${var}" + ("" if present else f" ({var} is not set)"))
        server = await self.server()
        try:
            raw = await server.request("account/read", {})
        except BaseException as exc:
            raise server.error("account/read", exc) from None
        acct = (raw or {}).get("account")
        if not isinstance(acct, dict):
            if not (raw or {}).get("requiresOpenaiAuth", True):
                return Account(signed_in=True, source="other", message="Codex needs no OpenAI sign-in")
            return Account(signed_in=False, message=f"Codex is not signed in (CODEX_HOME {self.home})")
        if acct.get("type") == "apiKey":
            return Account(signed_in=True, source="stored", message=f"API key stored by Codex in {self.home}")
        plan = str(acct.get("planType") or "")
        return Account(signed_in=True, source="stored", login=str(acct.get("email") or ""),
                       message=f"ChatGPT sign-in{' (' + plan + ')' if plan else ''} stored by Codex")

    async def quota(self) -> list[Quota]:
        """The account's rate-limit windows: ``account/rateLimits/read`` (a ChatGPT sign-in), else
        the windows Codex last reported during a turn (from the endpoint's rate-limit headers).
        Raises RuntimeUnavailable when it has neither."""
        server = await self.server()
        try:
            raw = await server.request("account/rateLimits/read", None)
            quotas = rate_limit_quotas((raw or {}).get("rateLimits"))
            if quotas:
                return quotas
        except RpcError as exc:
            if not self.rate_limits:
                raise RuntimeUnavailable(f"Codex reports no rate limits yet: {exc.describe()}") from None
        except BaseException as exc:
            raise server.error("account/rateLimits/read", exc) from None
        if not self.rate_limits:
            raise RuntimeUnavailable("Codex reports no rate limits yet (none came with a turn)")
        return list(self.rate_limits)

    async def sign_in(self, token: str) -> Account:
        """Hand the OpenAI API key ``token`` to Codex (``account/login/start``), which stores it in its
        CODEX_HOME. Raises Unsupported with model_provider (its key is an env var), Invalid when refused."""
        if self.config.model_provider is not None:
            raise Unsupported(f"with providers.codex.model_provider the key is ${self.config.model_provider.api_key_env}")
        server = await self.server()
        try:
            await server.request("account/login/start", {"type": "apiKey", "apiKey": token})
        except RpcError as exc:
            raise Invalid(f"Codex refused the key: {exc.describe()}") from None
        except BaseException as exc:
            raise server.error("account/login/start", exc) from None
        return await self.account()

    async def device_sign_in(self, show: Any, *, store_plaintext: bool = False) -> Account:
        """ChatGPT's device sign-in through the app-server (``account/login/start`` with
        ``chatgptDeviceCode``): its code and URL go to ``show``; returns once Codex reports the
        sign-in completed (``account/login/completed``). Cancelling sends ``account/login/cancel``.
        Raises Unsupported with model_provider, Invalid when Codex refuses or the sign-in fails."""
        if self.config.model_provider is not None:
            raise Unsupported(f"with providers.codex.model_provider the key is ${self.config.model_provider.api_key_env}")
        server = await self.server()
        try:
            raw = await server.request("account/login/start", {"type": "chatgptDeviceCode"})
        except RpcError as exc:
            raise Invalid(f"Codex could not start the device sign-in: {exc.describe()}") from None
        except BaseException as exc:
            raise server.error("account/login/start", exc) from None
        login_id = str((raw or {}).get("loginId") or "")
        url, code = str((raw or {}).get("verificationUrl") or ""), str((raw or {}).get("userCode") or "")
        if not (login_id and url and code):
            raise Invalid(f"Codex answered the device sign-in without a code: {sorted((raw or {}).keys())}")
        ended, result = self.login_waiters.setdefault(login_id, (trio.Event(), {}))
        try:
            show(DeviceCode(url=url, code=code))
            await ended.wait()
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await server.request("account/login/cancel", {"loginId": login_id})
                except BaseException:  # noqa: BLE001 - the flow ends either way
                    pass
            raise
        finally:
            self.login_waiters.pop(login_id, None)
        if not result.get("success"):
            raise Invalid(f"the Codex sign-in failed: {result.get('error') or 'no reason given'}")
        return await self.account()

    async def sign_out(self) -> Account:
        """Remove Codex's stored sign-in (``account/logout``). Unsupported with model_provider."""
        if self.config.model_provider is not None:
            raise Unsupported(f"with providers.codex.model_provider the key is ${self.config.model_provider.api_key_env}; "
                              "unset it in agentd's environment")
        server = await self.server()
        try:
            await server.request("account/logout", None)
        except BaseException as exc:
            raise server.error("account/logout", exc) from None
        return await self.account()

    async def models(self) -> list[Model]:
        """Codex's model catalog (model/list, every page, with its reasoning efforts), then the
        configured ``model`` when Codex does not list it."""
        server = await self.server()
        out: list[Model] = []
        cursor: str | None = None
        for _ in range(20):
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            try:
                page = await server.request("model/list", params)
            except BaseException as exc:
                raise server.error("model/list", exc) from None
            for m in (page or {}).get("data") or []:
                if not isinstance(m, dict) or not m.get("id"):
                    continue
                efforts = [str(e.get("reasoningEffort")) for e in m.get("supportedReasoningEfforts") or []
                           if isinstance(e, dict) and e.get("reasoningEffort")]
                out.append(Model(id=str(m["id"]), name=str(m.get("displayName") or ""), efforts=efforts))
            cursor = (page or {}).get("nextCursor")
            if not cursor:
                break
        if self.config.model and all(m.id != self.config.model for m in out):
            # the configured model (a custom endpoint's, say) is selectable though Codex does not list it
            out.append(Model(id=self.config.model, name="configured"))
        if not out:
            raise Unsupported(f"{self.name} lists no models")
        return out

    async def open(self, request: OpenRequest, sink: EventSink) -> CodexConversation:
        """thread/start (empty ``conversation_id``) or thread/resume of exactly that thread.

        Raises ConversationNotFound when Codex has no such thread, Busy when that
        thread runs a turn here, Invalid for a missing workdir, RuntimeUnavailable when the app-server cannot start,
        Closed when the provider is not running.
        """
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        workdir = await _check_workdir(request.workdir) if request.workdir or not request.conversation_id else ""
        model = request.model or self.config.model
        # Every thread of the provider runs in its one app-server: the one running now, after a restart too.
        runs_under(sink, self._keepers)
        if request.conversation_id:
            old = self._open.get(request.conversation_id)
            if old is not None:
                if old._turn is not None:
                    raise Busy(f"conversation {request.conversation_id} is running a turn here")
                await old.close()
            conv = CodexConversation(self, request.conversation_id, workdir, sink, model=request.model, effort=request.effort)
            conv.mcp = McpStates(request.mcp_servers)
            await conv._resume(await self.server())
        else:
            server = await self.server()
            params = self.thread_params(workdir, model, request.mcp_servers)
            try:
                raw = await server.request("thread/start", params, timeout=self.config.startup_timeout_s)
                tid = str(raw["thread"]["id"])
            except (KeyError, TypeError):
                raise RuntimeUnavailable(f"{self.name} answered thread/start without a thread id") from None
            except BaseException as exc:
                raise server.error("thread/start", exc, self.config.startup_timeout_s) from None
            conv = CodexConversation(self, tid, workdir, sink, model=model, effort=request.effort)
            conv.mcp = McpStates(request.mcp_servers)
            conv._attach(server, raw)
        self._open[conv.id] = conv
        self.restarts.succeeded("", why="a conversation opened")
        return conv

    async def fork(self, source: str, marker: str, request: OpenRequest) -> str:
        """thread/fork of thread ``source`` through its turn ``marker`` (``lastTurnId``); the new
        thread's id. Sends no prompt. Raises ConversationNotFound, Invalid (Codex refused the
        fork: no such turn), SubmissionUncertain (sent, answer lost), RuntimeUnavailable."""
        server = await self.server()
        params = {"threadId": source, "lastTurnId": marker, "excludeTurns": True,
                  **self.thread_params(request.workdir, request.model or self.config.model)}
        try:
            raw = await server.request("thread/fork", params, timeout=self.config.startup_timeout_s)
        except RpcError as exc:
            text = exc.describe()
            if any(m in text.lower() for m in ("no rollout", "not found", "invalid thread id")):
                raise ConversationNotFound(f"{self.name} has no thread {source!r}: {text}") from None
            raise Invalid(f"{self.name} refused to fork thread {source} at turn {marker}: {text}") from None
        except BaseException as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            raise SubmissionUncertain(f"thread/fork of {source} may or may not have made a thread: {exc}") from None
        try:
            tid = str(raw["thread"]["id"])
        except (KeyError, TypeError):
            raise SubmissionUncertain(f"{self.name} answered thread/fork without a thread id") from None
        log.info("codex.forked", provider=self.name, source=source, turn=marker, thread=tid)
        return tid

    async def previous(self, workdir: str) -> list[PreviousConversation]:
        """Codex's threads whose cwd is ``workdir`` (thread/list), newest first.

        Threads of every top-level source: the interactive CLI and IDE, ``codex exec``, and
        app-server clients (thread/list alone lists only the interactive ones); not subagents'.
        """
        workdir = await _check_workdir(workdir)
        server = await self.server()
        out: list[PreviousConversation] = []
        cursor: str | None = None
        for _ in range(20):
            params: dict[str, Any] = {"cwd": workdir, "sourceKinds": ["cli", "vscode", "exec", "appServer"]}
            if cursor:
                params["cursor"] = cursor
            try:
                page = await server.request("thread/list", params)
            except BaseException as exc:
                raise server.error("thread/list", exc) from None
            for t in (page or {}).get("data") or []:
                if isinstance(t, dict) and t.get("id"):
                    out.append(PreviousConversation(
                        id=str(t["id"]), title=str(t.get("name") or t.get("preview") or "")[:200],
                        workdir=str(t.get("cwd") or workdir), created_at=parse_time(t.get("createdAt")),
                        updated_at=parse_time(t.get("updatedAt"))))
            cursor = (page or {}).get("nextCursor")
            if not cursor:
                break
        return out

    # ------------------------------------------------------------------ the app-server

    def cli(self) -> str:
        return self.config.cli_path or "codex"

    def env(self) -> dict[str, str]:
        from ...runtime_env import environ  # without other providers' secrets

        return {**environ(self.name), **self.config.env, "CODEX_HOME": str(self.home)}

    def argv(self) -> list[str]:
        """``codex app-server`` with the model endpoint and the configured overrides as ``-c`` options."""
        overrides: list[str] = []
        mp = self.config.model_provider
        if mp is not None:
            base = f"model_providers.{mp.id}"
            overrides += [f"model_provider={_toml(mp.id)}", f"{base}.name={_toml(mp.id)}",
                          f"{base}.base_url={_toml(mp.base_url)}", f"{base}.wire_api={_toml(mp.wire_api)}"]
            if mp.api_key_env:
                overrides.append(f"{base}.env_key={_toml(mp.api_key_env)}")
            if mp.request_max_retries is not None:
                overrides.append(f"{base}.request_max_retries={mp.request_max_retries}")
            if mp.stream_max_retries is not None:
                overrides.append(f"{base}.stream_max_retries={mp.stream_max_retries}")
        overrides += list(self.config.overrides)
        argv = [self.cli(), "app-server"]
        for o in overrides:
            argv += ["-c", o]
        return argv

    def thread_params(self, workdir: str, model: str, mcp_servers: list[McpServer] | None = None) -> dict[str, Any]:
        """What thread/start and thread/resume get besides the thread: cwd, model, approvals, sandbox,
        and the thread's MCP servers (``config.mcp_servers``, Codex's ``[mcp_servers.<name>]``)."""
        params: dict[str, Any] = {"approvalPolicy": self.config.approval_policy, "sandbox": self.config.sandbox}
        if mcp_servers:
            params["config"] = {"mcp_servers": {s.name: _mcp_config(s) for s in mcp_servers}}
        if workdir:
            params["cwd"] = workdir
        if model:
            params["model"] = model
        return params

    async def server(self, *, wait_limit: float | None = None) -> AppServer:
        """The running app-server, started (once its restart backoff allows) when there is none.

        Raises Closed, RuntimeUnavailable (RuntimeRestarting while the backoff
        holds more than ``wait_limit`` seconds back).
        """
        async with self._server_lock:
            if self._server is not None and self._server.alive:
                return self._server
            if self._nursery is None or self._stopping:
                raise Closed(f"provider {self.name!r} is not running")
            await self.restarts.wait("", limit=wait_limit)
            if self._nursery is None or self._stopping:
                raise Closed(f"provider {self.name!r} is not running")
            server = AppServer(self)
            try:
                await server.start(self._nursery, self.config.startup_timeout_s)
            except BaseException as exc:
                if isinstance(exc, RuntimeUnavailable):
                    server.note_failure(exc.message)
                raise
            self._server = server
            log.info("codex.app_server_started", provider=self.name, pid=server.proc.pid, codex_home=str(self.home))
            return server

    def _keepers(self) -> frozenset[int]:
        server = self._server
        return keeper_set(server.proc.pid) if server is not None and server.alive else frozenset()

    def _server_gone(self, server: AppServer) -> None:
        if self._server is server:
            self._server = None

    def _turn_completed(self) -> None:
        self.restarts.succeeded("", why="a turn completed")

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        self._nursery.start_soon(fn, *args)

    def _forget(self, conv: CodexConversation) -> None:
        if self._open.get(conv.id) is conv:
            del self._open[conv.id]


__all__ = ["AppServer", "CodexProvider"]
