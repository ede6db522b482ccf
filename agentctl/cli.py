"""``agentctl``: the command-line client of agentd.

Every command takes ``--json`` (stdout then holds exactly one JSON object, or
JSON lines for a stream, and nothing else) and reports errors on stderr with a
documented exit code (see :mod:`agentctl.exitcodes`).

Start-up cost is what a short command such as ``agentctl status --json`` pays,
so this module imports click and nothing else heavy: each command lives in a
module of :mod:`agentctl.commands` that loads only when that command runs (or
when help lists it), and the client (msgspec, :mod:`agentd.wire`) loads only
when a command talks to agentd. Rendering, prompting and following load when a
command needs them. And :func:`main` ends the process without the interpreter's
teardown.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from agentd.termsafe import visible  # re only: no msgspec, no wire types

from . import __version__, exitcodes

if TYPE_CHECKING:  # not at run time: these import msgspec and the wire types
    from agentd.contract import AgentdError

    from .client import Client


class Fail(Exception):
    """A client-side failure with its exit code (the daemon was not asked, or its answer was not usable)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Opts:
    """Global options, settable before or after the command name."""

    def __init__(self) -> None:
        self.socket: str | None = None
        self.no_autostart = False
        self.json = False
        #: the client started agentd (autostart): nothing was running before this command
        self.autostarted = False
        self._client: Client | None = None

    def client(self) -> Client:
        if self._client is None:
            from .client import Client, autostart_disabled

            def notify(text: str) -> None:
                self.autostarted = True
                _notice(text)

            self._client = Client.connect(
                self.socket,
                autostart=not (self.no_autostart or autostart_disabled()),
                notify=notify,
            )
        return self._client


def _opts() -> Opts:
    return click.get_current_context().ensure_object(Opts)


def _setter(name: str) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value:  # given at this level; never reset what the group level set
            setattr(ctx.ensure_object(Opts), name, value)
        return value

    return callback


def common(f: Any) -> Any:
    """``--json``, ``--socket`` and ``--no-autostart`` on a command (as on the group)."""
    f = click.option(
        "--json", "json_", is_flag=True, expose_value=False, callback=_setter("json"),
        help="Print machine-readable JSON on stdout (JSON lines for streams).",
    )(f)
    f = click.option(
        "--no-autostart", is_flag=True, expose_value=False, callback=_setter("no_autostart"),
        help="Do not start agentd when it is not running (also AGENTD_NO_AUTOSTART=1).",
    )(f)
    f = click.option(
        "--socket", metavar="PATH", expose_value=False, callback=_setter("socket"),
        help="agentd's control socket (default: $AGENTD_SOCKET, else $AGENTD_RUNTIME_DIR/agentd.sock, else <user runtime dir>/agentd/agentd.sock).",
    )(f)
    return f


# ---------------------------------------------------------------------- output helpers


def _err(text: str) -> None:
    sys.stdout.flush()
    click.echo(visible(f"agentctl: {text}"), err=True)  # messages may quote agent text


def _notice(text: str) -> None:
    """A notice on stderr (agentd was started, ...): under --json a JSON line ``{"notice": TEXT}``,
    so that every line of stderr is a JSON object (see _report)."""
    if not _json_mode():
        _err(text)
        return
    import json as _stdjson

    sys.stdout.flush()
    sys.stderr.write(_stdjson.dumps({"notice": visible(text)}, ensure_ascii=False) + "\n")
    sys.stderr.flush()


def _json_mode() -> bool:
    """Whether --json was given: from the options parsed so far, else (a usage error before
    they were) from the command line itself."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if isinstance(ctx.obj, Opts) and ctx.obj.json:
            return True
        ctx = ctx.parent
    args = sys.argv[1:]
    return "--json" in (args[: args.index("--")] if "--" in args else args)


#: Exit code -> the error code a --json error object names when no wire error code applies.
_CODE_NAMES = {
    exitcodes.FAILED: "failed", exitcodes.USAGE: "usage", exitcodes.NEEDS_ACTION: "needs_action",
    exitcodes.UNREACHABLE: "unreachable", exitcodes.NOT_FOUND: "not_found", exitcodes.BUSY: "busy",
    exitcodes.INVALID: "invalid", exitcodes.CANCEL_UNCONFIRMED: "cancel_timeout",
    exitcodes.INTERRUPTED: "interrupted",
}


def _report(exit_code: int, message: str, *, code: str = "", details: Any = None) -> None:
    """Report an error on stderr: ``agentctl: MESSAGE``, or under --json one JSON object,
    ``{"code", "message", "exit_code"[, "details"]}``, on a line of its own (stdout is left as it was:
    empty for a one-result command, the lines streamed so far for a stream)."""
    if not _json_mode():
        _err(message)
        return
    import json as _stdjson

    obj: dict[str, Any] = {"code": code or _CODE_NAMES.get(exit_code, "failed"), "message": message,
                           "exit_code": exit_code}
    if details:
        obj["details"] = details
    sys.stdout.flush()
    sys.stderr.write(_stdjson.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stderr.flush()


def _json(obj: Any) -> None:
    import msgspec

    from .jsonout import full

    data = msgspec.json.encode(full(obj))
    if sys.stdout.isatty():
        data = msgspec.json.format(data, indent=2)
    sys.stdout.write(data.decode() + "\n")
    sys.stdout.flush()


def _ok_json(**fields: Any) -> None:
    _json({"ok": True, **fields})


def _style() -> Any:
    from .render import Style, use_color

    return Style(use_color(sys.stdout))


def _text_arg(text: str) -> str:
    """``-`` reads the text from stdin (UTF-8: UsageError otherwise), less the line ends after
    its last line (``echo`` and a file's last line add one; ``$(...)`` drops them likewise)."""
    if text == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise click.UsageError(f"the text on stdin is not UTF-8 (byte {exc.start})") from None
        if not _utf8(text):
            raise click.UsageError("the text on stdin is not UTF-8")
        text = text.rstrip("\r\n")
    if not text.strip():
        raise click.UsageError("the text is empty")
    return text


def _utf8(text: str) -> bool:
    """Whether ``text`` is valid Unicode: not bytes that were not UTF-8, kept as lone surrogates
    (how Python reads them from argv, stdin or a file name)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class FiniteFloat(click.FloatRange):
    """A number in range that is finite: ``nan`` passes a range check, and JSON carries
    neither it nor ``inf`` (both became null, which a budget reads as "no limit")."""

    name = "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _interactive(no_input: bool) -> bool:
    o = _opts()
    if no_input or o.json:
        return False
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _exit(code: int) -> NoReturn:
    raise click.exceptions.Exit(code)


# ---------------------------------------------------------------------- the group


class AgentctlGroup(click.Group):
    """Maps errors to exit codes in one place, and loads its commands lazily.

    ``lazy`` maps a command name to ``"module:attribute"`` (a module of
    :mod:`agentctl.commands`); the module is imported when the command is
    looked up, so running one command loads only its own module, while help
    and name suggestions still see every command.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:
            if not _json_mode():
                raise
            _report(exc.exit_code, exc.format_message(), code="usage" if exc.exit_code == exitcodes.USAGE else "")
            raise click.exceptions.Exit(exc.exit_code) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in self.lazy:
            import importlib

            module, attr = self.lazy[cmd_name].split(":")
            cmd = getattr(importlib.import_module(f"{__package__}.commands.{module}"), attr)
            _completing(cmd)
            self.add_command(cmd, cmd_name)
        return cmd

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            # click suggests close names ("Did you mean 'status'?") among the commands
            # loaded so far: suggest among all of them.
            if not isinstance(exc, click.exceptions.NoSuchCommand):
                raise
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.invoked_subcommand:
            _invoked.append(ctx.invoked_subcommand)
        try:
            return super().invoke(ctx)
        except Fail as exc:
            _report(exc.code, exc.message)
            raise click.exceptions.Exit(exc.code) from None
        except click.ClickException as exc:
            if not _json_mode():
                raise
            _report(exc.exit_code, exc.format_message(), code="usage" if exc.exit_code == exitcodes.USAGE else "")
            raise click.exceptions.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            sys.stdout.flush()
            raise click.exceptions.Exit(exitcodes.INTERRUPTED) from None
        except UnicodeEncodeError as exc:
            if "surrogates not allowed" not in str(exc):
                raise
            # A name agentctl read that is not UTF-8 (the working directory, an attachment's file name).
            _report(exitcodes.USAGE, f"{exc.object[:80]!r} is not UTF-8: agentd takes text and names in UTF-8",
                    code="usage")
            raise click.exceptions.Exit(exitcodes.USAGE) from None
        except BrokenPipeError:
            # stdout was closed (agentctl tail --json | head): stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(exitcodes.FAILED) from None
        except Exception as exc:
            code = _error_exit_code(exc)
            if code is None:
                raise
            raise click.exceptions.Exit(code) from None


def _error_exit_code(exc: Exception) -> int | None:
    """Report an error from talking to agentd and return its exit code; None for any other exception.

    Unreachable and AgentdError are looked up where they are defined only if
    those modules were imported: an exception of theirs cannot exist otherwise,
    and importing them here would cost every other error path the wire types.
    """
    client = sys.modules.get(f"{__package__}.client")
    if client is not None and isinstance(exc, client.Unreachable):
        _report(exitcodes.UNREACHABLE, str(exc), code="unreachable")
        return exitcodes.UNREACHABLE
    contract = sys.modules.get("agentd.contract")
    if contract is not None and isinstance(exc, contract.AgentdError):
        code = exitcodes.for_error(exc)
        if _json_mode():
            _report(code, _describe(exc).split(": ", 1)[1], code=exc.code, details=exc.details or None)
        else:
            _err(_describe(exc))
        return code
    return None


# ---------------------------------------------------------------------- shell completion
# Values come from the running agentd (never started for this); any failure completes nothing.


def _ask_quietly(ctx: click.Context, op: Any, result: Any) -> Any:
    from agentd import wire

    from .client import Client

    opts = ctx.find_object(Opts)  # --socket, when its callback ran while completing
    client = Client.connect(opts.socket if opts else None, autostart=False)
    try:
        return client.call(getattr(wire, op), getattr(wire, result) if isinstance(result, str) else result)
    finally:
        client.close()


def complete_conversation(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Conversation ids (with their titles) starting with ``incomplete``, newest first."""
    from click.shell_completion import CompletionItem

    try:
        from agentd import wire

        recs = _ask_quietly(ctx, "List", list[wire.ConversationRecord])
    except Exception:  # noqa: BLE001 - no daemon, an old one: nothing to offer
        return []
    recs.sort(key=lambda r: r.created_at, reverse=True)
    return [CompletionItem(r.id, help=visible(r.title or r.provider)) for r in recs if r.id.startswith(incomplete)]


def complete_provider(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """The configured provider names starting with ``incomplete``."""
    from click.shell_completion import CompletionItem

    try:
        names = _ask_quietly(ctx, "Status", "StatusResult").providers
    except Exception:  # noqa: BLE001
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_task(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    try:
        tasks = _ask_quietly(ctx, "TaskList", "TaskListResult").tasks
    except Exception:  # noqa: BLE001
        return []
    return [CompletionItem(t.id, help=t.status.value) for t in reversed(tasks) if t.id.startswith(incomplete)]


_COMPLETERS = {"conversation": complete_conversation, "provider": complete_provider, "task_id": complete_task}


def _completing(cmd: click.Command) -> None:
    """Give every CONVERSATION argument, --provider option and TASK argument of ``cmd`` (and of its
    subcommands) the completion of its values, unless it has one of its own: new commands get it too."""
    for param in cmd.params:
        fn = _COMPLETERS.get(param.name or "")
        # click keeps a parameter's shell_complete= here; set only where none was given
        if fn is not None and getattr(param, "_custom_shell_complete", None) is None:
            param._custom_shell_complete = fn  # type: ignore[attr-defined]
    for sub in getattr(cmd, "commands", {}).values():
        _completing(sub)


#: Error code -> (what the message starts with, the next step to suggest): the first
#: whose start fits gives the hint ("" fits any message); none fits: no hint.
_NEXT_STEP: dict[str, list[tuple[str, str]]] = {
    "not_found": [
        ("no provider ", " (agentctl providers lists them)"),
        ("no task ", " (agentctl task ls lists tasks)"),
        ("no conversation ", " (agentctl ls --all lists conversations)"),
    ],
    "busy": [("cannot remove ", "")],
}
#: A busy error's next step, by the command that met it: only those with --if-busy offer one.
_BUSY_STEP = {"send": " (use --if-busy queue|steer|interrupt, or agentctl cancel)",
              "command": " (use --if-busy queue|interrupt, or agentctl cancel)"}
#: the command being run (AgentctlGroup.invoke), for the hints of _describe
_invoked: list[str] = []


def _describe(exc: AgentdError) -> str:
    hint = next((h for start, h in _NEXT_STEP.get(exc.code, []) if exc.message.startswith(start)), None)
    if hint is None and exc.code == "busy" and _invoked:
        hint = _BUSY_STEP.get(_invoked[-1], "")
    return f"{exc.code}: {exc.message}{hint or ''}"


#: Every command: name -> "module:attribute" in agentctl.commands.
COMMANDS: dict[str, str] = {
    "status": "daemon:status",
    "hosts": "daemon:hosts",
    "providers": "accounts:providers",
    "models": "accounts:models",
    "stop": "daemon:stop",
    "new": "conversations:new",
    "ls": "conversations:ls",
    "show": "conversations:show",
    "send": "conversations:send",
    "run": "conversations:run",
    "tail": "conversations:tail",
    "attach": "conversations:attach",
    "steer": "conversations:steer",
    "cancel": "conversations:cancel",
    "close": "conversations:close",
    "rm": "conversations:rm",
    "title": "conversations:title",
    "budget": "conversations:budget",
    "continue": "conversations:continue_",
    "export": "conversations:export",
    "history": "history:history",
    "set-model": "models:set_model",
    "import": "adopt:import_",
    "completion": "cli:completion",
    "restart": "cli:restart",
    "fork": "forkrewind:fork",
    "rewind": "forkrewind:rewind",
    "commands": "commands:commands",
    "command": "commands:command",
    "subagents": "commands:subagents",
    "subagent": "commands:subagent",
    "account": "accounts:account",
    "login": "accounts:login",
    "logout": "accounts:logout",
    "quota": "accounts:quota",
    "diff": "checkpoints:diff",
    "revert": "checkpoints:revert",
    "mcp": "mcp:mcp",
    "tool": "tool:tool",
    "answer": "answer:answer",
    "task": "tasks:task",
}


@click.group(
    cls=AgentctlGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=exitcodes.HELP,
)
@common
@click.version_option(__version__, prog_name="agentctl")
def cli() -> None:
    """agentctl: talk to agentd, the supervisor of AI coding-agent runtimes.

    Conversations are named by their id or any unique prefix of it. agentd is
    started on demand when it is not running (see --no-autostart).

    \b
    Examples:
      agentctl run -p claude "fix the failing test"   # new conversation, prompt, follow
      agentctl ls --state requires_action             # what waits for you
      agentctl answer c3f9 --allow
      agentctl COMMAND --help                         # each command's own examples
    """
    _opts()


def main() -> None:
    """Console-script entry point (also ``python -m agentctl``).

    Once the command is done and stdout and stderr are flushed, the process
    ends at once (:func:`os._exit`, same exit status): the interpreter's
    teardown, freeing every module, class and Struct type that click,
    msgspec and the wire types created, costs 15-30 ms on a slow machine
    and is of no use to a process about to end. It is skipped only when
    nothing asked to run at exit (no atexit handler, e.g. coverage's or
    logging's) and no thread but daemon ones runs (the normal exit would
    wait for it); agentctl itself writes no file it leaves open.
    """
    bad = next((a for a in sys.argv[1:] if not _utf8(a)), None)
    if bad is not None:  # before anything is asked of agentd: nothing half done
        _report(exitcodes.USAGE, f"argument {bad!r} is not UTF-8: agentd takes text and names in UTF-8", code="usage")
        _exit_now(exitcodes.USAGE)
        raise SystemExit(exitcodes.USAGE)
    try:
        cli(prog_name="agentctl")
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
        if isinstance(code, int):
            _exit_now(code)
        raise


def _exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, when nothing needs it.

    Returns (for a normal exit) when a stream cannot be flushed, e.g. stdout
    was a pipe closed early: Python's own exit then reports it as usual.
    """
    import atexit

    if getattr(atexit, "_ncallbacks", lambda: 1)() != 0:
        return
    threading = sys.modules.get("threading")
    if threading is not None and any(
        not t.daemon and t is not threading.main_thread() for t in threading.enumerate()
    ):
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with that descriptor closed
            continue
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - whatever it is, the normal exit reports it as it always did
            return
    os._exit(code)
