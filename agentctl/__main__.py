"""``agentctl``: the command-line client of agentd.

Every command takes ``--json`` (stdout then holds exactly one JSON object, or
JSON lines for a stream, and nothing else) and reports errors on stderr with a
documented exit code (see :mod:`agentctl.exitcodes`). Only click, msgspec and
the wire types load at start; rendering, prompting and following load when a
command needs them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click
import msgspec

from agentd import wire
from agentd.contract import AgentdError, Answer, Interaction, InteractionKind, PlanAnswer

from . import __version__, exitcodes
from .client import Client, Unreachable, autostart_disabled


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
        self._client: Client | None = None

    def client(self) -> Client:
        if self._client is None:
            self._client = Client.connect(
                self.socket,
                autostart=not (self.no_autostart or autostart_disabled()),
                notify=lambda msg: _err(msg),
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
        help="agentd's control socket (default: $AGENTD_SOCKET, else <user runtime dir>/agentd/agentd.sock).",
    )(f)
    return f


# ---------------------------------------------------------------------- output helpers


def _err(text: str) -> None:
    sys.stdout.flush()
    click.echo(f"agentctl: {text}", err=True)


def _json(obj: Any) -> None:
    from .render import full

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
    """``-`` reads the text from stdin."""
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise click.UsageError("the text is empty")
    return text


def _interactive(no_input: bool) -> bool:
    o = _opts()
    if no_input or o.json:
        return False
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


class AgentctlGroup(click.Group):
    """Maps errors to exit codes in one place."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Unreachable as exc:
            _err(str(exc))
            raise click.exceptions.Exit(exitcodes.UNREACHABLE) from None
        except AgentdError as exc:
            _err(_describe(exc))
            raise click.exceptions.Exit(exitcodes.for_error(exc)) from None
        except Fail as exc:
            _err(exc.message)
            raise click.exceptions.Exit(exc.code) from None
        except KeyboardInterrupt:
            sys.stdout.flush()
            raise click.exceptions.Exit(exitcodes.INTERRUPTED) from None
        except BrokenPipeError:
            # stdout was closed (agentctl tail --json | head): stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(exitcodes.FAILED) from None


_NEXT_STEP = {
    "not_found": " (agentctl ls --all lists conversations)",
    "busy": " (use --if-busy queue|steer|interrupt, or agentctl cancel)",
}


def _describe(exc: AgentdError) -> str:
    return f"{exc.code}: {exc.message}{_NEXT_STEP.get(exc.code, '')}"


# ---------------------------------------------------------------------- the group


@click.group(
    cls=AgentctlGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=exitcodes.HELP,
)
@common
@click.version_option(__version__, prog_name="agentctl")
def cli() -> None:
    """agentctl: talk to agentd, the supervisor of AI coding-agent runtimes.

    Conversations are named by their id or any unique prefix of it. agentd is
    started on demand when it is not running (see --no-autostart).
    """
    _opts()


# ---------------------------------------------------------------------- daemon and providers


@cli.command()
@common
def status() -> None:
    """Show the daemon: version, pid, uptime, paths, conversations."""
    o = _opts()
    r = o.client().call(wire.Status, wire.StatusResult)
    if o.json:
        return _json(r)
    from .render import duration

    click.echo(f"agentd {r.version} (protocol {r.protocol}), pid {r.pid}, up {duration(r.uptime_s)}")
    click.echo(f"socket:        {r.socket}")
    click.echo(f"state dir:     {r.state_dir}")
    click.echo(f"conversations: {r.conversations} ({r.running} running)")
    click.echo(f"providers:     {', '.join(r.providers) or '-'}")


@cli.command()
@common
def providers() -> None:
    """List providers, whether each is available, and what it supports.

    --json: {"providers": [ProviderInfo, ...]}.
    """
    o = _opts()
    infos = o.client().call(wire.Providers, list[wire.ProviderInfo])
    if o.json:
        return _json({"providers": infos})
    from .render import table

    rows = []
    for p in infos:
        caps = msgspec.structs.asdict(p.capabilities)
        supported = ", ".join(k.rstrip("_") for k, v in caps.items() if v) or "-"
        state = "available" if p.available else f"unavailable: {p.error}" if p.error else "unavailable"
        rows.append([p.name, state, supported])
    click.echo(table(rows, ["NAME", "STATUS", "SUPPORTS"], _style()))


@cli.command()
@click.argument("provider")
@common
def models(provider: str) -> None:
    """List the models PROVIDER offers.

    --json: {"provider": PROVIDER, "models": [Model, ...]}.
    """
    o = _opts()
    ms = o.client().call(wire.Models, list[wire.Model], provider=provider)
    if o.json:
        return _json({"provider": provider, "models": ms})
    from .render import table

    rows = [[m.id, m.name, ", ".join(m.efforts)] for m in ms]
    click.echo(table(rows, ["ID", "NAME", "EFFORTS"], _style()))


# ---------------------------------------------------------------------- conversations


def _new_options(f: Any) -> Any:
    f = click.option("--yolo", is_flag=True, help="Let agentd answer permission requests (allow once).")(f)
    f = click.option("--model", "-m", default="", help="Model id (for the script provider: the script's path).")(f)
    f = click.option("--title", default="", help="Conversation title.")(f)
    f = click.option(
        "--cwd", default=".", show_default=True,
        type=click.Path(exists=True, file_okay=False, resolve_path=True),
        help="The agent's working directory.",
    )(f)
    f = click.option("--provider", "-p", required=True, help="Provider name (see agentctl providers).")(f)
    return f


def _budget_options(f: Any) -> Any:
    f = click.option("--on-reach", type=click.Choice(["pause", "stop"]), default=None,
                     help="What happens when spend reaches --max-cost-usd: pause (default) or stop (close).")(f)
    f = click.option("--max-cost-usd", type=click.FloatRange(min=0), default=None, metavar="USD",
                     help="Budget of the conversation (default: the provider's from the config, if any).")(f)
    return f


def _budget_arg(max_cost_usd: float | None, on_reach: str | None) -> wire.Budget | None:
    if max_cost_usd is None:
        if on_reach is not None:
            raise click.UsageError("--on-reach needs --max-cost-usd")
        return None
    return wire.Budget(max_cost_usd=max_cost_usd, on_reach=on_reach or "pause")  # type: ignore[arg-type]


_attach_option = click.option(
    "--attach", "attach", multiple=True, metavar="FILE",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    help="Send FILE with the prompt (repeatable); agentd's [attachments] limits apply.",
)


def _uploads(paths: tuple[str, ...]) -> list[wire.Upload]:
    """The files to send, read and base64-encoded (agentd checks names, sizes and types)."""
    import base64

    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise Fail(exitcodes.USAGE, f"cannot read {path}: {exc.strerror or exc}") from None
        out.append(wire.Upload(name=os.path.basename(path), data=base64.b64encode(data).decode("ascii")))
    return out


def _create(provider: str, cwd: str, title: str, model: str, yolo: bool,
            budget: wire.Budget | None = None) -> wire.ConversationRecord:
    if provider == "script" and model and not os.path.isabs(model) and os.path.isfile(model):
        # A script path is read by the daemon, which does not share our cwd.
        model = os.path.abspath(model)
    return _opts().client().call(
        wire.New, wire.ConversationRecord,
        provider=provider, workdir=cwd, title=title, model=model, mode="yolo" if yolo else "interactive",
        budget=budget,
    )


@cli.command()
@_new_options
@_budget_options
@common
def new(provider: str, cwd: str, title: str, model: str, yolo: bool, max_cost_usd: float | None,
        on_reach: str | None) -> None:
    """Create a conversation; print its id (--json: the conversation record).

    --max-cost-usd sets its budget: when its spend reaches it, the running turn
    is cut short and the conversation pauses (or, with --on-reach stop, closes).
    """
    rec = _create(provider, cwd, title, model, yolo, _budget_arg(max_cost_usd, on_reach))
    if _opts().json:
        return _json(rec)
    click.echo(rec.id)


@cli.command("ls")
@click.option("--all", "all_", is_flag=True, help="Include closed conversations.")
@common
def ls(all_: bool) -> None:
    """List conversations (--json: {"conversations": [record, ...]})."""
    o = _opts()
    recs = o.client().call(wire.List, list[wire.ConversationRecord], all=all_)
    if o.json:
        return _json({"conversations": recs})
    if not recs:
        _err("no conversations" + ("" if all_ else " (closed ones: agentctl ls --all)"))
        return
    from .render import table

    rows = [
        [r.id, r.state.value, r.provider, r.updated_at[:16].replace("T", " "), r.title or "-"]
        for r in recs
    ]
    click.echo(table(rows, ["ID", "STATE", "PROVIDER", "UPDATED", "TITLE"], _style()))


@cli.command()
@click.argument("conversation")
@common
def show(conversation: str) -> None:
    """Show a conversation: its record, pending interactions, usage."""
    o = _opts()
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    if o.json:
        return _json(info)
    from .render import Renderer

    r = info.record
    state = r.state.value + (f" (run {r.active_run})" if r.active_run else "")
    lines = [
        ("id", r.id),
        ("title", r.title or "-"),
        ("provider", r.provider + (f" (model {r.model})" if r.model else "")),
        ("workdir", r.workdir),
        ("state", state),
        ("mode", r.mode),
        ("created", r.created_at),
        ("updated", r.updated_at),
        ("last seq", str(info.last_seq or r.turn_after)),
    ]
    if info.queued:
        lines.append(("queued", str(info.queued)))
    if info.usage is not None:
        lines.append(("usage", _usage_text(info.usage)))
    if r.budget is not None:
        lines.append(("budget", _budget_text(r)))
    if r.error:
        lines.append(("error", r.error))
    for k, v in lines:
        click.echo(f"{k + ':':<10} {v}")
    if info.pending:
        click.echo("pending:")
        ren = Renderer(sys.stdout, socket=o.socket)
        ren.conversation = r.id
        for inter in info.pending:
            ren.interaction(inter)


# ---------------------------------------------------------------------- turns


def _follow(
    conversation: str,
    after: int,
    *,
    run: str = "",
    interactive: bool = False,
    exit_on_action: bool = False,
    yolo: bool = False,
    until_caught_up: bool = False,
    until_idle: bool = False,
    all_: bool = False,
) -> int:
    """Follow with the right output (JSON lines or rendered) and Ctrl-C handling."""
    from .follow import Follower
    from .render import Renderer

    o = _opts()
    renderers: dict[str, Renderer] = {}

    def renderer_for(conv: str) -> Renderer:
        if all_:
            key = conv
            if key not in renderers:
                renderers[key] = Renderer(sys.stdout, stream_deltas=False, prefix=f"[{conv[:8]}] ",
                                          answer_hints=not interactive, socket=o.socket, yolo=yolo)
            return renderers[key]
        if "" not in renderers:
            renderers[""] = Renderer(sys.stdout, answer_hints=not interactive, socket=o.socket, yolo=yolo)
        return renderers[""]

    follower = Follower(
        o.client(),
        renderer_for=None if o.json else renderer_for,
        json_out=sys.stdout if o.json else None,
        interactive=interactive,
        exit_on_action=exit_on_action,
        yolo=yolo,
    )
    try:
        code = follower.follow(None if all_ else conversation, after, run=run, until_caught_up=until_caught_up,
                                until_idle=until_idle)
    except KeyboardInterrupt:
        for r in renderers.values():
            r.end_line()
        sys.stdout.flush()
        conv = follower.conversation or conversation
        if run and conv:
            _err(f"detached; the turn goes on in agentd. Follow it: agentctl attach {conv}; "
                 f"stop it: agentctl cancel {conv}")
        raise click.exceptions.Exit(exitcodes.INTERRUPTED) from None
    for r in renderers.values():
        r.end_line()
    return code


def _exit(code: int) -> NoReturn:
    raise click.exceptions.Exit(code)


_follow_options = [
    click.option("--no-input", is_flag=True, help="Never ask at the terminal; print how to answer instead."),
    click.option("--exit-on-action", is_flag=True,
                 help="Exit with code 4 when an interaction waits for an answer agentctl may not give."),
]


def _with(options: list[Any]) -> Any:
    def deco(f: Any) -> Any:
        for opt in reversed(options):
            f = opt(f)
        return f

    return deco


@cli.command()
@click.argument("conversation")
@click.argument("text")
@click.option("--if-busy", type=click.Choice(["reject", "queue", "steer", "interrupt"]), default="reject",
              show_default=True, help="What to do when a turn is running (reject exits 7).")
@click.option("--follow", "-f", is_flag=True, help="Follow the turn until it ends; exit with its outcome.")
@_attach_option
@_with(_follow_options)
@common
def send(conversation: str, text: str, if_busy: str, follow: bool, attach: tuple[str, ...], no_input: bool,
         exit_on_action: bool) -> None:
    """Send TEXT to a conversation (TEXT - reads stdin).

    Without --follow it returns once agentd took the prompt (--json: the send
    result: run, disposition, after). With --follow it streams the turn and
    exits 0 completed, 1 failed, 3 cancelled.
    """
    o = _opts()
    res = o.client().call(wire.Send, wire.SendResult, conversation=conversation, text=_text_arg(text), if_busy=if_busy,
                          attachments=_uploads(attach))
    if not follow:
        if o.json:
            return _json(res)
        click.echo(f"run {res.run}: {res.disposition}")
        return
    _exit(_follow(conversation, res.after, run=res.run, interactive=_interactive(no_input),
                  exit_on_action=exit_on_action))


@cli.command()
@click.argument("text")
@_new_options
@_budget_options
@_attach_option
@_with(_follow_options)
@common
def run(text: str, provider: str, cwd: str, title: str, model: str, yolo: bool, max_cost_usd: float | None,
        on_reach: str | None, attach: tuple[str, ...], no_input: bool, exit_on_action: bool) -> None:
    """Create a conversation, send TEXT, follow the turn to its end.

    Exits 0 when the turn completed, 1 failed, 3 cancelled, 4 needs action
    (with --exit-on-action). --json streams JSON lines; the last one is
    {"type": "result", "conversation", "run", "state", "exit_code", ...}.
    """
    o = _opts()
    text = _text_arg(text)
    uploads = _uploads(attach)
    rec = _create(provider, cwd, title, model, yolo, _budget_arg(max_cost_usd, on_reach))
    if not o.json:
        click.echo(_style().dim(f"conversation {rec.id} ({rec.provider})"))
    res = o.client().call(wire.Send, wire.SendResult, conversation=rec.id, text=text, attachments=uploads)
    _exit(_follow(rec.id, res.after, run=res.run, interactive=_interactive(no_input),
                  exit_on_action=exit_on_action, yolo=yolo))


@cli.command()
@click.argument("conversation", required=False)
@click.option("--after", type=int, default=None, metavar="SEQ",
              help="Start after this journal seq (default 0: the whole journal).")
@click.option("--all", "all_", is_flag=True, help="Every conversation, live only.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Keep streaming live records, or stop once the journal is printed.")
@common
def tail(conversation: str | None, after: int | None, all_: bool, follow: bool) -> None:
    """Print a conversation's records, then follow it live.

    --json prints one JSON object per line: records as
    {"type", "conversation", "seq", "ts", "run", "data"}, and
    {"type": "snapshot", "conversation", "data"} once caught up.
    """
    if all_ and conversation:
        raise click.UsageError("give a conversation or --all, not both")
    if not all_ and not conversation:
        raise click.UsageError("give a conversation (or --all)")
    if all_ and not follow:
        raise click.UsageError("--all is live only; --no-follow would print nothing")
    if all_ and after is not None:
        raise click.UsageError("--all is live only; --after applies to one conversation")
    _exit(_follow(conversation or "", after or 0, until_caught_up=not follow, all_=all_))


@cli.command()
@click.argument("conversation")
@click.option("--after", type=int, default=None, metavar="SEQ",
              help="Replay the journal after SEQ first (default: from now, with the turn in flight).")
@click.option("--until-idle", is_flag=True,
              help="Stop when the turn in flight ends (exit code from its outcome), at once if none runs.")
@_with(_follow_options)
@common
def attach(conversation: str, after: int | None, until_idle: bool, no_input: bool, exit_on_action: bool) -> None:
    """Follow a conversation and answer its interactions at the terminal.

    Starts with the turn in flight (or after the last one). Ctrl-D at a
    prompt leaves that interaction for later; Ctrl-C detaches (the turn goes
    on). Stops when the conversation is closed, or with --until-idle.
    """
    o = _opts()
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    r = info.record
    interactive = _interactive(no_input)
    if not o.json:
        how = "answering at the terminal; " if interactive else ""
        click.echo(_style().dim(f"attached to {r.id} ({r.provider}, {r.state.value}); {how}Ctrl-C to detach"))
    _exit(_follow(r.id, r.turn_after if after is None else after, interactive=interactive,
                  exit_on_action=exit_on_action, yolo=r.mode == "yolo", until_idle=until_idle))


@cli.command()
@click.argument("conversation")
@click.argument("text")
@common
def steer(conversation: str, text: str) -> None:
    """Add TEXT to the running turn (--json: the send result)."""
    o = _opts()
    res = o.client().call(wire.Steer, wire.SendResult, conversation=conversation, text=_text_arg(text))
    if o.json:
        return _json(res)
    click.echo(f"run {res.run}: {res.disposition}")


def _simple(op: type, conversation: str, done: str, **fields: Any) -> None:
    o = _opts()
    o.client().call(op, Any, conversation=conversation, **fields)
    if o.json:
        return _ok_json(conversation=conversation, **fields)
    click.echo(done)


@cli.command()
@click.argument("conversation")
@common
def cancel(conversation: str) -> None:
    """Cancel the running turn; the conversation stays open."""
    _simple(wire.Cancel, conversation, "cancelled")


@cli.command()
@click.argument("conversation")
@common
def close(conversation: str) -> None:
    """Close a conversation (kept on disk; agentctl ls --all lists it)."""
    _simple(wire.Close, conversation, "closed")


@cli.command()
@click.argument("conversation")
@common
def rm(conversation: str) -> None:
    """Remove a conversation and its journal."""
    _simple(wire.Remove, conversation, "removed")


@cli.command()
@click.argument("conversation")
@click.argument("title")
@common
def title(conversation: str, title: str) -> None:
    """Set a conversation's title (also in the provider's own store, where it keeps titles)."""
    _simple(wire.SetTitle, conversation, "title set", title=title)


# ---------------------------------------------------------------------- usage, budgets, export


def _usage_text(u: Any) -> str:
    bits = [f"{u.input_tokens:,} input tokens ({u.cached_tokens:,} cached), {u.output_tokens:,} output"]
    if u.cost_usd is not None:
        bits.append(f"{'~' if u.estimated else ''}${u.cost_usd:.4f}" + (" (estimated from [pricing])" if u.estimated else ""))
    else:
        bits.append("no cost known")
    if u.ai_units:
        bits.append(f"{u.ai_units:g} AI units")
    return ", ".join(bits)


def _budget_text(r: wire.ConversationRecord) -> str:
    b = r.budget
    if b is None or b.max_cost_usd is None:
        return "-"
    spent = r.usage.cost_usd if r.usage is not None and r.usage.cost_usd is not None else None
    used = f"${spent:.4f} of " if spent is not None else "no cost known yet, of "
    return f"{used}${b.max_cost_usd:.4f}, on reach: {b.on_reach}"


@cli.command()
@click.argument("conversation")
@click.option("--max-cost-usd", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="The new budget (raise or lower it).")
@click.option("--on-reach", type=click.Choice(["pause", "stop"]), default=None,
              help="pause (default) or stop (close) when spend reaches it; default: as before.")
@click.option("--none", "none_", is_flag=True, help="Remove the budget.")
@common
def budget(conversation: str, max_cost_usd: float | None, on_reach: str | None, none_: bool) -> None:
    """Set a conversation's budget: raise, lower or remove it (journaled).

    A conversation paused on its budget stays paused: resume it with
    agentctl continue. --json: the conversation record.
    """
    if none_ == (max_cost_usd is not None):
        raise click.UsageError("give --max-cost-usd USD or --none")
    o = _opts()
    if not none_ and on_reach is None:
        info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
        on_reach = info.record.budget.on_reach if info.record.budget is not None else "pause"
    new_budget = wire.Budget() if none_ else wire.Budget(max_cost_usd=max_cost_usd, on_reach=on_reach)  # type: ignore[arg-type]
    rec = o.client().call(wire.SetBudget, wire.ConversationRecord, conversation=conversation, budget=new_budget)
    if o.json:
        return _json(rec)
    click.echo(f"budget: {_budget_text(rec)}" + (f" (state {rec.state.value})" if rec.state.value != "idle" else ""))


@cli.command("continue")
@click.argument("conversation")
@common
def continue_(conversation: str) -> None:
    """Resume a conversation paused on its budget, once the budget was raised.

    Nothing is resent: send the next prompt yourself. Exits 8 when the
    conversation is not paused, 1 (limit) while it is still at its budget.
    --json: the conversation record.
    """
    o = _opts()
    rec = o.client().call(wire.Continue, wire.ConversationRecord, conversation=conversation)
    if o.json:
        return _json(rec)
    click.echo(f"continued: {rec.id} is {rec.state.value}")


@cli.command()
@click.argument("conversation")
@click.option("--format", "fmt", type=click.Choice(["md", "json", "html"]), default="md", show_default=True,
              help="Markdown, JSON, or one self-contained HTML file.")
@click.option("--include-tools", is_flag=True,
              help="Add tool calls and their output, permission requests, reasoning and subagents' work.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to FILE instead of stdout.")
@common
def export(conversation: str, fmt: str, include_tools: bool, output: str | None) -> None:
    """Export a conversation's transcript, rendered by agentd from its journal.

    --json: {"conversation", "format", "title", "text"}, or with -o
    {"ok", "conversation", "format", "path", "bytes"}.
    """
    o = _opts()
    res = o.client().call(wire.Export, wire.ExportResult, conversation=conversation, format=fmt,
                          include_tools=include_tools)
    if output is None:
        if o.json:
            return _json(res)
        sys.stdout.write(res.text)
        sys.stdout.flush()
        return
    data = res.text.encode("utf-8")
    try:
        with open(output, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise Fail(exitcodes.FAILED, f"cannot write {output}: {exc.strerror or exc}") from None
    if o.json:
        return _ok_json(conversation=res.conversation, format=fmt, path=os.path.abspath(output), bytes=len(data))
    click.echo(f"wrote {output} ({len(data)} bytes)", err=True)


# ---------------------------------------------------------------------- answering


@cli.command()
@click.argument("conversation")
@click.argument("interaction", required=False)
@click.option("--option", "option", metavar="ID", help="Permission: the option to pick.")
@click.option("--allow", is_flag=True, help="Permission: the allow-once option.")
@click.option("--deny", is_flag=True, help="Permission: the reject option.")
@click.option("--choice", multiple=True, metavar="TEXT", help="Question: a choice (repeatable).")
@click.option("--text", "texts", multiple=True, metavar="TEXT",
              help="Question: a free-text answer (repeatable: one per question, in order).")
@click.option("--field", "fields", multiple=True, metavar="NAME=VALUE",
              help="Form: a field's value (repeatable; repeat a name for a multi-choice field).")
@click.option("--reject", is_flag=True, help="Question or form: decline to answer.")
@click.option("--dismiss", is_flag=True, help="Form or link: dismiss without declining.")
@click.option("--accept", is_flag=True, help="Link: accept (after opening it).")
@click.option("--action", metavar="ACTION", help="Plan review: the action to take (autopilot, interactive, exit_only).")
@click.option("--feedback", metavar="TEXT", help="Plan review: refuse the plan with this feedback.")
@common
def answer(
    conversation: str,
    interaction: str | None,
    option: str | None,
    allow: bool,
    deny: bool,
    choice: tuple[str, ...],
    texts: tuple[str, ...],
    fields: tuple[str, ...],
    reject: bool,
    dismiss: bool,
    accept: bool,
    action: str | None,
    feedback: str | None,
) -> None:
    """Answer a pending interaction (INTERACTION: an id or unique prefix;
    default: the only pending one).

    Exits 6 when nothing (or not that) is pending, 8 when agentd refuses the
    answer as not fitting.
    """
    o = _opts()
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    conv = info.record.id
    inter = _pick_interaction(conv, info.pending, interaction)
    ans = _build_answer(
        inter, option=option, allow=allow, deny=deny, choices=list(choice), texts=list(texts),
        fields=list(fields), reject=reject, dismiss=dismiss, accept=accept, action=action, feedback=feedback,
    )
    o.client().call(wire.AnswerInteraction, Any, conversation=conv, interaction=inter.id, answer=ans)
    if o.json:
        return _ok_json(conversation=conv, interaction=inter.id, answer=ans)
    from .render import answer_summary

    click.echo(f"answered {inter.id}: {answer_summary(ans, inter)}")


def _pick_interaction(conv: str, pending: list[Interaction], wanted: str | None) -> Interaction:
    if wanted:
        exact = [p for p in pending if p.id == wanted]
        matches = exact or [p for p in pending if p.id.startswith(wanted)]
        if not matches:
            raise Fail(exitcodes.NOT_FOUND, f"no pending interaction {wanted!r} in conversation {conv}")
        if len(matches) > 1:
            raise Fail(exitcodes.USAGE, f"{wanted!r} matches several pending interactions: "
                                        + ", ".join(p.id for p in matches))
        return matches[0]
    if not pending:
        raise Fail(exitcodes.NOT_FOUND, f"nothing is pending in conversation {conv}")
    if len(pending) > 1:
        raise Fail(exitcodes.USAGE, "several interactions are pending; name one: "
                                    + ", ".join(f"{p.id} ({p.kind.value}: {p.title})" for p in pending))
    return pending[0]


def _build_answer(
    inter: Interaction,
    *,
    option: str | None,
    allow: bool,
    deny: bool,
    choices: list[str],
    texts: list[str],
    fields: list[str],
    reject: bool,
    dismiss: bool,
    accept: bool,
    action: str | None,
    feedback: str | None,
) -> Answer:
    """Turn answer options into an :class:`Answer` for ``inter``.

    Raises :class:`Fail`: usage (2) when no answer was given, invalid (8)
    when the options do not fit the interaction's kind. Whether the values
    fit (a known option, an offered choice, a field's bounds) is for the
    daemon to decide.
    """
    perm = [x for x in (option is not None, allow, deny) if x]
    question = bool(choices or texts or fields or reject or dismiss or accept)
    plan = action is not None or feedback is not None
    given = len(perm) + question + plan
    kinds_given = bool(perm) + question + plan
    if given == 0:
        raise Fail(exitcodes.USAGE, f"give an answer for {inter.kind.value} {inter.id}: " + _answer_flags(inter))
    if kinds_given > 1:
        raise Fail(exitcodes.USAGE, "mixed answer options of different kinds: " + _answer_flags(inter))
    if inter.kind is InteractionKind.PERMISSION:
        if not perm:
            raise Fail(exitcodes.INVALID, f"{inter.id} is a permission request: {_answer_flags(inter)}")
        if len(perm) > 1:
            raise Fail(exitcodes.USAGE, "give one of --option, --allow, --deny")
        if option is not None:
            return Answer(decision=option)
        wanted = [o for o in inter.options if (o.allow_once if allow else o.reject)]
        if not wanted:
            raise Fail(exitcodes.INVALID, f"{inter.id} has no {'allow-once' if allow else 'reject'} option; "
                                          f"pick one with --option: {', '.join(o.id for o in inter.options)}")
        return Answer(decision=wanted[0].id)
    if inter.kind is InteractionKind.PLAN_REVIEW:
        if not plan:
            raise Fail(exitcodes.INVALID, f"{inter.id} is a plan review: {_answer_flags(inter)}")
        if action is not None and feedback is not None:
            raise Fail(exitcodes.USAGE, "give --action or --feedback, not both")
        if action is not None:
            return Answer(plan=PlanAnswer(action=action))  # type: ignore[arg-type]
        return Answer(plan=PlanAnswer(feedback=feedback or ""))
    # question
    if not question:
        raise Fail(exitcodes.INVALID, f"{inter.id} is a question: {_answer_flags(inter)}")
    if sum((reject, dismiss, accept)) > 1 or ((reject or dismiss or accept) and (choices or texts or fields)):
        raise Fail(exitcodes.USAGE, "--reject, --dismiss and --accept stand alone")
    if reject:
        return Answer(reject=True)
    if dismiss:
        return Answer(cancel=True)
    qs = inter.questions
    answers: list[list[str]] = [[] for _ in qs]
    if accept:
        return Answer(answers=answers)
    if not qs:
        raise Fail(exitcodes.INVALID, f"{inter.id} asks nothing to fill in: use --accept, --reject or --dismiss")
    for spec in fields:
        name, sep, value = spec.partition("=")
        if not sep:
            raise Fail(exitcodes.USAGE, f"--field takes NAME=VALUE, not {spec!r}")
        idx = [i for i, q in enumerate(qs) if q.field is not None and q.field.name == name]
        if not idx:
            names = ", ".join(q.field.name for q in qs if q.field is not None) or "none"
            raise Fail(exitcodes.INVALID, f"{inter.id} has no field {name!r} (fields: {names})")
        answers[idx[0]].append(value)
    plain = [i for i, q in enumerate(qs) if q.field is None] or list(range(len(qs)))
    for c in choices:
        offered = [i for i in plain if c in qs[i].choices]
        open_ = [i for i in offered if not answers[i]]
        target = (open_ or offered or [i for i in plain if not answers[i]] or plain)[0]
        answers[target].append(c)
    for t in texts:
        target = ([i for i in plain if not answers[i]] or [i for i in plain if qs[i].custom] or plain)[0]
        answers[target].append(t)
    return Answer(answers=answers)


def _answer_flags(inter: Interaction) -> str:
    if inter.kind is InteractionKind.PERMISSION:
        ids = ", ".join(o.id for o in inter.options)
        return f"use --allow, --deny or --option ID (options: {ids})"
    if inter.kind is InteractionKind.PLAN_REVIEW:
        acts = ", ".join(inter.plan.actions) if inter.plan else ""
        return f"use --action ACTION ({acts or 'none offered'}) or --feedback TEXT"
    if inter.elicitation is not None and not inter.questions:
        return "use --accept, --reject or --dismiss"
    return "use --choice, --text, --field NAME=VALUE, or --reject"


# ---------------------------------------------------------------------- tasks


@cli.group(cls=AgentctlGroup)
@common
def task() -> None:
    """Queue non-interactive jobs and follow them: create, ls, show, cancel, comment, wait.

    A task runs its input as the first turn of a new conversation of its own,
    at most tasks.concurrency per provider at once. Tasks are named by their id
    or any unique prefix of it.
    """


def _task_model(provider: str, model: str) -> str:
    if provider == "script" and model and not os.path.isabs(model) and os.path.isfile(model):
        return os.path.abspath(model)  # the daemon does not share our cwd
    return model


@task.command("create")
@click.argument("text")
@click.option("--provider", "-p", required=True, help="Provider name (see agentctl providers).")
@click.option(
    "--cwd", default=".", show_default=True, type=click.Path(exists=True, file_okay=False, resolve_path=True),
    help="The agent's working directory.",
)
@click.option("--model", "-m", default="", help="Model id (for the script provider: the script's path).")
@click.option("--callback", default="", metavar="URL",
              help="http(s) URL that gets a JSON POST when the task ends (retried with backoff).")
@common
def task_create(text: str, provider: str, cwd: str, model: str, callback: str) -> None:
    """Queue TEXT as a task (TEXT - reads stdin); print its id (--json: the task record)."""
    o = _opts()
    rec = o.client().call(
        wire.TaskCreate, wire.TaskRecord, provider=provider, workdir=cwd, input=_text_arg(text),
        model=_task_model(provider, model), callback=callback,
    )
    if o.json:
        return _json(rec)
    click.echo(rec.id)


@task.command("ls")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in wire.TaskStatus]),
              help="Only tasks in this status (repeatable).")
@common
def task_ls(statuses: tuple[str, ...]) -> None:
    """List tasks, oldest first (--json: {"tasks": [task, ...]})."""
    o = _opts()
    res = o.client().call(wire.TaskList, wire.TaskListResult, status=[wire.TaskStatus(s) for s in statuses])
    if o.json:
        return _json(res)
    if not res.tasks:
        _err("no tasks")
        return
    from .render import table

    rows = [
        [t.id, t.status.value, t.provider, t.created_at[:19].replace("T", " "), t.conversation or "-",
         " ".join(t.input.split())[:40]]
        for t in res.tasks
    ]
    click.echo(table(rows, ["ID", "STATUS", "PROVIDER", "CREATED", "CONVERSATION", "INPUT"], _style()))


@task.command("show")
@click.argument("task_id", metavar="TASK")
@common
def task_show(task_id: str) -> None:
    """Show a task: status, result, usage, conversation, times, comments, callback attempts."""
    o = _opts()
    info = o.client().call(wire.TaskShow, wire.TaskInfo, task=task_id)
    if o.json:
        return _json(info)
    t = info.task
    status = t.status.value + (f" ({t.reason})" if t.reason and t.reason != t.status.value else "")
    lines = [
        ("id", t.id),
        ("status", status),
        ("provider", t.provider + (f" (model {t.model})" if t.model else "")),
        ("workdir", t.workdir),
        ("conversation", t.conversation or "-"),
        ("created", t.created_at),
    ]
    if t.started_at:
        lines.append(("started", t.started_at))
    if t.ended_at:
        lines.append(("ended", t.ended_at))
    if t.usage is not None:
        u = t.usage
        spend = f"{u.input_tokens} in, {u.output_tokens} out ({u.cached_tokens} cached) tokens"
        if u.cost_usd is not None:
            spend += f", ${u.cost_usd:.4f}"
        if u.ai_units:
            spend += f", {u.ai_units:g} AI units"
        lines.append(("usage", spend))
    if t.callback:
        state = t.callback_state or "not sent yet"
        lines.append(("callback", f"{t.callback} ({state}, {len(t.callback_attempts)} attempts)"))
    if t.error:
        lines.append(("error", t.error))
    for k, v in lines:
        click.echo(f"{k + ':':<14}{v}")
    for a in t.callback_attempts:
        outcome = "ok" if a.ok else a.error
        code = f"HTTP {a.status_code}" if a.status_code else "no response"
        click.echo(f"  attempt {a.attempt}  {a.at}  {code}  {outcome}")
    click.echo("input:")
    click.echo("  " + t.input.replace("\n", "\n  "))
    if t.result:
        click.echo("result:")
        click.echo("  " + t.result.replace("\n", "\n  "))
    if t.comments:
        click.echo("comments:")
        for cm in t.comments:
            how = "steered" if cm.delivery == "steered" else f"recorded{': ' + cm.note if cm.note else ''}"
            click.echo(f"  {cm.created_at}  {cm.text}  [{how}]")
    if info.pending:
        from .render import Renderer

        click.echo("waiting for:")
        ren = Renderer(sys.stdout, socket=o.socket)
        ren.conversation = t.conversation
        for inter in info.pending:
            ren.interaction(inter)


@task.command("cancel")
@click.argument("task_id", metavar="TASK")
@common
def task_cancel(task_id: str) -> None:
    """Cancel a task: a pending one never runs; a running one has its turn cancelled.

    Exits 8 when the task already ended. --json: {"task": task, "disposition"}
    with disposition dequeued, cancelled, cancelling or ended.
    """
    o = _opts()
    res = o.client().call(wire.TaskCancel, wire.TaskCancelResult, task=task_id)
    if o.json:
        return _json(res)
    text = {
        "dequeued": "cancelled; it never ran",
        "cancelled": "cancelled; its turn was cancelled",
        "cancelling": "its turn was asked to stop and has not ended yet",
        "ended": f"it ended {res.task.status.value} before the cancel took effect",
    }[res.disposition]
    click.echo(f"task {res.task.id}: {text}")


@task.command("comment")
@click.argument("task_id", metavar="TASK")
@click.argument("text")
@common
def task_comment(task_id: str, text: str) -> None:
    """Add a comment to a task (TEXT - reads stdin); while its turn runs, also steer it when the provider can.

    Prints whether it was steered or only recorded (and why). --json:
    {"task", "comment": {"id", "text", "created_at", "delivery", "note"}}.
    """
    o = _opts()
    res = o.client().call(wire.TaskAddComment, wire.TaskCommentResult, task=task_id, text=_text_arg(text))
    if o.json:
        return _json(res)
    cm = res.comment
    if cm.delivery == "steered":
        click.echo(f"comment {cm.id}: recorded and steered into the running turn")
    else:
        click.echo(f"comment {cm.id}: recorded only ({cm.note})" if cm.note else f"comment {cm.id}: recorded")


@task.command("wait")
@click.argument("task_id", metavar="TASK")
@click.option("--timeout", type=float, default=None, metavar="SECONDS", help="Give up after this long (exit 1).")
@click.option("--exit-on-action", is_flag=True, help="Exit 4 when the task waits for input.")
@common
def task_wait(task_id: str, timeout: float | None, exit_on_action: bool) -> None:
    """Wait until a task ends; exit 0 completed, 1 failed, 3 cancelled (--json: the task record).

    With --exit-on-action it exits 4 as soon as the task is waiting_for_input.
    """
    import time

    o = _opts()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = o.client().call(wire.TaskShow, wire.TaskInfo, task=task_id)
        t = info.task
        waiting = exit_on_action and t.status is wire.TaskStatus.WAITING_FOR_INPUT
        if t.status.terminal or waiting:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise Fail(exitcodes.FAILED, f"task {t.id} is still {t.status.value} after {timeout:g}s")
        time.sleep(0.2)
    if o.json:
        _json(t)
    else:
        click.echo(f"task {t.id}: {t.status.value}" + (f": {t.error}" if t.error else ""))
    _exit(exitcodes.NEEDS_ACTION if waiting else exitcodes.for_turn(t.status.value))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="agentctl")


if __name__ == "__main__":
    main()
