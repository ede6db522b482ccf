"""agentctl's conversation commands: new, ls, show, send, run, tail, attach, steer,
cancel, close, rm, title, budget, continue, export.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import msgspec

from agentd import wire
from agentd.termsafe import visible, visible_name

from .. import exitcodes
from ..cli import Fail, FiniteFloat, _err, _exit, _interactive, _json, _notice, _ok_json, _opts, _style, _text_arg, common


def _new_options(f: Any) -> Any:
    f = click.option("--yolo", is_flag=True, help="Let agentd answer permission requests (allow once).")(f)
    f = click.option("--effort", default="", help="Effort level the model lists (agentctl models PROVIDER).")(f)
    f = click.option("--context-tier", default="", metavar="TIER", expose_value=False,
                     callback=lambda ctx, param, value: ctx.meta.__setitem__("agentctl.context_tier", value),
                     help="Context tier the model lists (agentctl models PROVIDER), e.g. 1m.")(f)
    f = click.option("--model", "-m", default="", help="Model id (for the script provider: the script's path).")(f)
    f = click.option("--title", default="", help="Conversation title.")(f)
    f = click.option(
        "--cwd", default=".", show_default=True,
        type=click.Path(exists=True, file_okay=False, resolve_path=True),
        help="The agent's working directory.",
    )(f)
    f = click.option("--provider", "-p", default="",
                     help="Provider name (see agentctl providers); default: [providers] default of agentd.toml.")(f)
    # Not parameters of the commands: _create reads them from the context (see _mcp_arg).
    f = click.option("--no-mcp", is_flag=True, expose_value=False, callback=_keep_option,
                     help="No MCP servers, not even the provider's defaults.")(f)
    f = click.option("--mcp", "mcp", multiple=True, metavar="NAME", expose_value=False, callback=_keep_option,
                     help="An MCP server of agentd.toml ([mcp.servers.NAME]); repeatable; default: the provider's defaults.")(f)
    return f


def _keep_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"agentctl.{param.name}"] = value
    return value


def _mcp_arg() -> list[str] | None:
    """``--mcp`` names, [] for ``--no-mcp``, None for neither (the provider's defaults)."""
    meta = click.get_current_context().meta
    names, none = list(meta.get("agentctl.mcp") or ()), bool(meta.get("agentctl.no_mcp"))
    if names and none:
        raise click.UsageError("--mcp and --no-mcp exclude each other")
    return [] if none else (names or None)


def _budget_options(f: Any) -> Any:
    f = click.option("--on-reach", type=click.Choice(["pause", "stop"]), default=None,
                     help="What happens when spend reaches --max-cost-usd: pause (default) or stop (close).")(f)
    f = click.option("--max-cost-usd", type=FiniteFloat(min=0), default=None, metavar="USD",
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
    """The files to send, read and base64-encoded (agentd checks names, sizes and types).

    Regular files only, opened non-blocking (a FIFO or a device would hang or never end),
    and never more read than agentd's attachment limit (from its hello) + 1 byte.
    Raises Fail (usage) for a file that cannot be read or is not a regular file,
    LimitExceeded (exit 1, as agentd's own refusal) for one over the limit.
    """
    import base64
    import stat

    if not paths:
        return []
    client = _opts().client()
    # Older daemons do not say; a frame cannot carry more than 3/4 of its limit in base64.
    limit = client.max_attachment_bytes or (client.max_frame_bytes or wire.DEFAULT_MAX_FRAME_BYTES) * 3 // 4
    out = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise Fail(exitcodes.USAGE, f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Fail(exitcodes.USAGE, f"cannot attach {path}: not a regular file ({_file_kind(st.st_mode)})")
            name = os.path.basename(path)
            if st.st_size > limit:
                raise wire.attachment_over_limit(name, st.st_size, limit)
            chunks, size = [], 0
            while size <= limit:  # it may grow while read: never more than limit + 1 bytes
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise Fail(exitcodes.USAGE, f"cannot read {path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if size > limit:
            raise wire.attachment_over_limit(name, size, limit, at_least=True)
        data = b"".join(chunks)
        out.append(wire.Upload(name=name, data=base64.b64encode(data).decode("ascii")))
    return out


def _file_kind(mode: int) -> str:
    import stat

    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def local_script(model: str) -> str:
    """``model`` made absolute when it names a file relative to agentctl's directory, else "": a
    script provider's model is a script path, read by the daemon, which does not share our cwd.
    Only for the script provider (a file of that name does not make another's model a path)."""
    if model and not os.path.isabs(model) and os.path.isfile(model):
        return os.path.abspath(model)
    return ""


def _create(provider: str, cwd: str, title: str, model: str, effort: str, yolo: bool,
            budget: wire.Budget | None = None) -> wire.ConversationRecord:
    if provider in ("script", ""):
        model = local_script(model) or model
    return _opts().client().call(
        wire.New, wire.ConversationRecord,
        provider=provider, workdir=cwd, title=title, model=model, effort=effort,
        context_tier=click.get_current_context().meta.get("agentctl.context_tier", ""),
        mode="yolo" if yolo else "interactive", budget=budget, mcp=_mcp_arg(),
    )


@click.command()
@_new_options
@_budget_options
@common
def new(provider: str, cwd: str, title: str, model: str, effort: str, yolo: bool, max_cost_usd: float | None,
        on_reach: str | None) -> None:
    """Create a conversation; print its id (--json: the conversation record).

    --max-cost-usd sets its budget: when its spend reaches it, the running turn
    is cut short and the conversation pauses (or, with --on-reach stop, closes).
    Without -p, the provider is agentd.toml's [providers] default.

    \b
    Examples:
      agentctl new -p claude --cwd ~/src/app --title "flaky test"
      agentctl new -p script -m conf/demo.toml --cwd "$(mktemp -d)"
      agentctl new --yolo --max-cost-usd 2      # the default provider, in this directory
    """
    rec = _create(provider, cwd, title, model, effort, yolo, _budget_arg(max_cost_usd, on_reach))
    if _opts().json:
        return _json(rec)
    click.echo(rec.id)


@click.command("ls")
@click.option("--all", "all_", is_flag=True, help="Include closed conversations.")
@click.option("--provider", "-p", "providers", multiple=True, help="Only this provider's (repeatable).")
@click.option("--state", "states", multiple=True, type=click.Choice([s.value for s in wire.ConversationState]),
              help="Only conversations in this state (repeatable; closed implies --all).")
@click.option("--limit", "-n", type=click.IntRange(min=1), default=None, help="At most this many (the newest).")
@common
def ls(all_: bool, providers: tuple[str, ...], states: tuple[str, ...], limit: int | None) -> None:
    """List conversations, the last updated first (--json: {"conversations": [record, ...]}).

    \b
    Examples:
      agentctl ls
      agentctl ls --state running --state requires_action    # what is busy or waiting
      agentctl ls -p claude -n 5 --json | jq -r '.conversations[].id'
    """
    o = _opts()
    recs = o.client().call(wire.List, list[wire.ConversationRecord], all=all_ or "closed" in states)
    # As the UPDATED column reads: -n N is the N last used
    recs.sort(key=lambda r: (r.updated_at or r.created_at, r.created_at, r.id), reverse=True)
    recs = [r for r in recs if (not providers or r.provider in providers) and (not states or r.state.value in states)]
    recs = recs[:limit] if limit else recs
    if o.json:
        return _json({"conversations": recs})
    if not recs:
        _err("no conversations" + ("" if all_ else " (closed ones: agentctl ls --all)"))
        return
    from ..render import table

    rows = [
        [r.id, r.state.value, r.provider, r.updated_at[:16].replace("T", " "), r.title or "-"]
        for r in recs
    ]
    click.echo(table(rows, ["ID", "STATE", "PROVIDER", "UPDATED", "TITLE"], _style()))


def _show_item(o: Any, conversation: str, item_id: str, agent_id: str, full: bool) -> None:
    client = o.client()
    info = client.call(wire.ShowItem, wire.ItemInfo, conversation=conversation, item=item_id, agent_id=agent_id)
    pages = [info.full_output]
    while full and info.kept and info.next_offset:
        info = client.call(wire.ShowItem, wire.ItemInfo, conversation=conversation, item=item_id,
                           agent_id=agent_id, offset=info.next_offset)
        pages.append(info.full_output)
    whole = "".join(pages) if info.kept else ""
    if o.json:
        return _json(msgspec.structs.replace(info, full_output=whole if full else "", next_offset=0))
    item, tool = info.item, info.item.tool
    if full:
        if tool is None:
            raise click.UsageError(f"item {item_id} is not a tool call")
        if tool.cut and not info.kept:
            _err(f"the whole output of {item_id} was not kept ({tool.cut:,} bytes were cut; "
                 "see [journal] tool_output_quota_bytes); showing the cut")
        text = visible(whole if info.kept else tool.output)  # the tool's bytes: --json has them as they are
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    lines = [("id", item.id), ("kind", item.kind.value)]
    if item.agent_id:
        lines.append(("agent", item.agent_id))
    if tool is not None:
        lines += [("tool", tool.name), ("title", tool.title), ("status", tool.status.value)]
        if tool.exit_code is not None:
            lines.append(("exit", str(tool.exit_code)))
        if tool.input:
            lines.append(("input", tool.input))
        if tool.cut:
            kept = f"kept: agentctl show {conversation} --item {item_id} --full" if info.kept else "not kept"
            lines.append(("cut", f"{tool.cut:,} bytes of the output left out ({kept})"))
    for k, v in lines:
        click.echo(visible(f"{k + ':':<10} {v}"))  # agent text: title, input
    body = tool.output if tool is not None else item.text
    if body:
        click.echo(visible(body))


@click.command()
@click.argument("conversation")
@click.option("--item", "item_id", metavar="ID", help="Show this item instead (a tool call with its output).")
@click.option("--agent", "agent_id", default="", metavar="AGENT_ID", help="With --item: the subagent the item belongs to.")
@click.option("--full", is_flag=True, help="With --item: the tool's whole output, where the journal keeps a cut of it.")
@common
def show(conversation: str, item_id: str | None, agent_id: str, full: bool) -> None:
    """Show a conversation: its record, pending interactions, usage (or one item, --item).

    \b
    Examples:
      agentctl show c3f9
      agentctl show c3f9 --item r1.t2 --full
    """
    o = _opts()
    if item_id is not None:
        return _show_item(o, conversation, item_id, agent_id, full)
    if full or agent_id:
        raise click.UsageError("--full and --agent go with --item ID")
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    if o.json:
        return _json(info)
    from ..render import Renderer, visible

    r = info.record
    state = r.state.value + (f" (run {r.active_run})" if r.active_run else "")
    last = info.last_seq or r.turn_after
    lines = [
        ("id", r.id),
        ("title", r.title or "-"),
        ("provider", r.provider),
        ("model", (r.model or "the runtime's default") + (f", effort {r.effort}" if r.effort else "")
         + (f"; next turn: {r.next_model.model or r.model}" + (f", effort {r.next_model.effort}" if r.next_model.effort else "")
            if r.next_model else "")),
        ("workdir", r.workdir),
        ("state", state),
        ("mode", r.mode),
        ("created", r.created_at),
        ("updated", r.updated_at),
        ("last seq", f"{last} (agentctl tail --after {last} prints only what comes next; "
                     "tail --seq shows each record's seq)"),
    ]
    if info.queued:
        lines.append(("queued", str(info.queued)))
    if info.usage is not None:
        lines.append(("usage", _usage_text(info.usage)))
    if r.budget is not None:
        lines.append(("budget", _budget_text(r)))
    if r.error:
        lines.append(("error", r.error))
    if r.forked_from:
        lines.append(("forked", f"from {r.forked_from} at run {r.forked_at}"))
    if r.dropped:
        lines.append(("rewound", f"{len(r.dropped)} turn(s) dropped (agentctl history {r.id} --all shows them)"))
    for k, v in lines:
        click.echo(visible(f"{k + ':':<10} {v}"))
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
    seq: bool = False,
    send: Any = None,
    verbose: bool = False,
    dropped: bool = False,
) -> int:
    """Follow with the right output (JSON lines or rendered) and Ctrl-C handling.

    ``send`` (a function returning the run it started) is called once subscribed; see Follower.follow.
    On a terminal (never with --json) the live view is on (agentctl.liveview): Markdown, running
    tools' output and a spinner redrawn in place, a bell and a notification when a person is needed.
    """
    from ..follow import Follower
    from ..render import Renderer

    o = _opts()
    renderers: dict[str, Renderer] = {}
    notifier = None
    live = False
    if not o.json:
        from ..liveview import Notifier, is_live, notify_settings

        live = is_live(sys.stdout)
        if live:
            bell, desktop = notify_settings()
            if bell or desktop:
                notifier = Notifier(sys.stdout, bell=bell, desktop=desktop)

    def renderer_for(conv: str) -> Renderer:
        if all_:
            key = conv
            if key not in renderers:
                renderers[key] = Renderer(sys.stdout, stream_deltas=False, prefix=f"[{conv[:8]}] ",
                                          answer_hints=not interactive, socket=o.socket, yolo=yolo, seq=seq,
                                          verbose=verbose)
            return renderers[key]
        if "" not in renderers:
            # One conversation: the journal is replayed up to a snapshot first (--all is live only).
            renderers[""] = Renderer(sys.stdout, answer_hints=not interactive, socket=o.socket, yolo=yolo,
                                     replay=True, seq=seq, live=live, verbose=verbose)
        return renderers[""]

    follower = Follower(
        o.client(),
        renderer_for=None if o.json else renderer_for,
        json_out=sys.stdout if o.json else None,
        interactive=interactive,
        exit_on_action=exit_on_action,
        yolo=yolo,
        notifier=notifier,
        live=live and not all_,
    )
    follower.dropped = dropped
    try:
        code = follower.follow(None if all_ else conversation, after, run=run, send=send,
                               until_caught_up=until_caught_up, until_idle=until_idle)
    except KeyboardInterrupt:
        for r in renderers.values():
            r.end_line()
        sys.stdout.flush()
        conv = follower.conversation or conversation
        if (run or follower.run) and conv:
            _notice(f"detached; the turn goes on in agentd. Follow it: agentctl attach {conv}; "
                 f"stop it: agentctl cancel {conv}")
        raise click.exceptions.Exit(exitcodes.INTERRUPTED) from None
    except BaseException:
        for r in renderers.values():
            r.end_line()  # an error message never runs into streamed text
        sys.stdout.flush()
        raise
    for r in renderers.values():
        r.end_line()
    return code


_verbose_option = click.option("--verbose", "-v", is_flag=True,
                               help="Also show who answered (pid, uid) and lease changes.")

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


@click.command()
@click.argument("conversation")
@click.argument("text")
@click.option("--if-busy", type=click.Choice(["reject", "queue", "steer", "interrupt"]), default="reject",
              show_default=True, help="What to do when a turn is running (reject exits 7).")
@click.option("--follow", "-f", is_flag=True, help="Follow the turn until it ends; exit with its outcome.")
@_attach_option
@_with(_follow_options)
@_verbose_option
@common
def send(conversation: str, text: str, if_busy: str, follow: bool, attach: tuple[str, ...], no_input: bool,
         exit_on_action: bool, verbose: bool) -> None:
    """Send TEXT to a conversation (TEXT - reads stdin).

    Without --follow it returns once agentd took the prompt (--json: the send
    result: run, disposition, after). With --follow it streams the turn and
    exits 0 completed, 1 failed, 3 cancelled.

    \b
    Examples:
      agentctl send c3f9 "now add a test" --follow
      agentctl send c3f9 "and the docs" --if-busy queue
      git diff | agentctl send c3f9 - --follow    # the prompt from stdin
    """
    o = _opts()
    text, uploads = _text_arg(text), _uploads(attach)

    def send_prompt() -> wire.SendResult:
        return o.client().call(wire.Send, wire.SendResult, conversation=conversation, text=text, if_busy=if_busy,
                               attachments=uploads)

    if not follow:
        res = send_prompt()
        if o.json:
            return _json(res)
        click.echo(f"run {res.run}: {res.disposition}")
        return
    from ..follow import FROM_NOW

    _exit(_follow(conversation, FROM_NOW, send=lambda: send_prompt().run, interactive=_interactive(no_input),
                  exit_on_action=exit_on_action, verbose=verbose))


@click.command()
@click.argument("text")
@_new_options
@_budget_options
@_attach_option
@_with(_follow_options)
@_verbose_option
@common
def run(text: str, provider: str, cwd: str, title: str, model: str, effort: str, yolo: bool, max_cost_usd: float | None,
        on_reach: str | None, attach: tuple[str, ...], no_input: bool, exit_on_action: bool, verbose: bool) -> None:
    """Create a conversation, send TEXT, follow the turn to its end.

    Exits 0 when the turn completed, 1 failed, 3 cancelled, 4 needs action
    (with --exit-on-action). --json streams JSON lines; the last one is
    {"type": "result", "conversation", "run", "state", "exit_code", ...}.

    \b
    Examples:
      agentctl run -p claude "fix the failing test"
      agentctl run --yolo --max-cost-usd 1 "tidy the imports"   # [providers] default
      agentctl run -p script -m conf/demo.toml --cwd "$(mktemp -d)" "Show me around"
      agentctl run -p codex --json "list the TODOs" | tail -n 1 | jq .state
    """
    o = _opts()
    text = _text_arg(text)
    uploads = _uploads(attach)
    rec = _create(provider, cwd, title, model, effort, yolo, _budget_arg(max_cost_usd, on_reach))
    if not o.json:
        click.echo(_style().dim(f"conversation {rec.id} ({visible_name(rec.provider)})"))
    from ..follow import FROM_NOW

    def send_prompt() -> str:
        return o.client().call(wire.Send, wire.SendResult, conversation=rec.id, text=text, attachments=uploads).run

    _exit(_follow(rec.id, FROM_NOW, send=send_prompt, interactive=_interactive(no_input),
                  exit_on_action=exit_on_action, yolo=yolo, verbose=verbose))


@click.command()
@click.argument("conversation", required=False)
@click.option("--after", type=click.IntRange(min=0), default=None, metavar="SEQ",
              help="Start after this journal seq (default 0: the whole journal).")
@click.option("--all", "all_", is_flag=True,
              help="Every conversation, live only; with CONVERSATION: also the turns a rewind dropped, marked.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Keep streaming live records, or stop once the journal is printed.")
@click.option("--seq", "show_seq", is_flag=True,
              help="Start each record's first line with its journal seq (#12), what --after takes.")
@_verbose_option
@common
def tail(conversation: str | None, after: int | None, all_: bool, follow: bool, show_seq: bool, verbose: bool) -> None:
    """Print a conversation's records, then follow it live.

    --json prints one JSON object per line: records as
    {"type", "conversation", "seq", "ts", "run", "data"}, and
    {"type": "snapshot", "conversation", "data"} once caught up.
    Text of the turn in flight that was journaled at or before --after is
    not shown; text still streaming is.

    \b
    Examples:
      agentctl tail c3f9 --after 120
      agentctl tail c3f9 --no-follow --seq
      agentctl tail --all --json
    """
    if all_ and conversation:
        # One conversation with --all: its whole journal, the turns a rewind dropped included.
        _exit(_follow(conversation, after or 0, until_caught_up=not follow, seq=show_seq, dropped=True))
    if not all_ and not conversation:
        raise click.UsageError("give a conversation (or --all)")
    if all_ and not follow:
        raise click.UsageError("--all is live only; --no-follow would print nothing")
    if all_ and after is not None:
        raise click.UsageError("--all is live only; --after applies to one conversation")
    _exit(_follow(conversation or "", after or 0, until_caught_up=not follow, all_=all_, seq=show_seq,
                  verbose=verbose))


@click.command()
@click.argument("conversation")
@click.option("--after", type=click.IntRange(min=0), default=None, metavar="SEQ",
              help="Replay the journal after SEQ first (default: from now, with the turn in flight).")
@click.option("--until-idle", is_flag=True,
              help="Stop when the turn in flight ends (exit code from its outcome), at once if none runs.")
@click.option("--all", "all_", is_flag=True, help="Also replay the turns a rewind dropped, marked [dropped].")
@_with(_follow_options)
@_verbose_option
@common
def attach(conversation: str, after: int | None, until_idle: bool, no_input: bool, exit_on_action: bool,
           verbose: bool, all_: bool) -> None:
    """Follow a conversation and answer its interactions at the terminal.

    Starts with the turn in flight (or after the last one). Ctrl-D at a
    prompt leaves that interaction for later; Ctrl-C detaches (the turn goes
    on). Stops when the conversation is closed, or with --until-idle.

    \b
    Examples:
      agentctl attach c3f9                  # follow and answer at the terminal
      agentctl attach c3f9 --until-idle --no-input
    """
    o = _opts()
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    r = info.record
    interactive = _interactive(no_input)
    if not o.json:
        how = "answering at the terminal; " if interactive else ""
        if until_idle and r.state is wire.ConversationState.IDLE:  # --until-idle returns once caught up
            until = "idle already: nothing to follow" if after is None else f"idle: the records after seq {after}, then done"
        else:
            until = f"{how}Ctrl-C to detach"
        click.echo(_style().dim(f"attached to {r.id} ({visible_name(r.provider)}, {r.state.value}); {until}"))
    _exit(_follow(r.id, r.turn_after if after is None else after, interactive=interactive,
                  exit_on_action=exit_on_action, yolo=r.mode == "yolo", until_idle=until_idle, verbose=verbose, dropped=all_))


@click.command()
@click.argument("conversation")
@click.argument("text")
@common
def steer(conversation: str, text: str) -> None:
    """Add TEXT to the running turn (--json: the send result).

    \b
    Examples:
      agentctl steer c3f9 "use tabs, not spaces"
    """
    o = _opts()
    res = o.client().call(wire.Steer, wire.SendResult, conversation=conversation, text=_text_arg(text))
    if o.json:
        return _json(res)
    click.echo(f"run {res.run}: {res.disposition}")


def _call(op: type, conversation: str, **fields: Any) -> tuple[str, Any]:
    """(the conversation's full id, the reply) of request ``op`` on the conversation typed."""
    res = _opts().client().call(op, Any, conversation=conversation, **fields)
    if isinstance(res, dict) and isinstance(res.get("conversation"), str):
        conversation = res["conversation"]  # the full id, not the prefix typed (older agentd: None)
    return conversation, res


def _simple(op: type, conversation: str, done: str, **fields: Any) -> None:
    o = _opts()
    conversation, _ = _call(op, conversation, **fields)
    if o.json:
        return _ok_json(conversation=conversation, **fields)
    click.echo(f"{done} {conversation}")  # the full id: a prefix was typed


@click.command()
@click.argument("conversation")
@common
def cancel(conversation: str) -> None:
    """Cancel the running turn; the conversation stays open.

    Waits until the turn ended (at most agentd's [runtimes] cancel_timeout_s).
    With no turn running it says so and changes nothing (still exit 0). A
    runtime that did not confirm the cancel in time (agentd ended the turn
    itself, reason cancel_timeout) exits 9.
    --json: {"ok", "conversation", "cancelled", "run", "state", "reason",
    "inferred"}; cancelled is false (run "") when no turn was running, ok is
    false after a cancel_timeout.

    \b
    Examples:
      agentctl cancel c3f9
      agentctl cancel c3f9 --json | jq .state
    """
    o = _opts()
    # Look first: "nothing to cancel" is said without touching the turn state.
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    r = info.record
    run = r.active_run
    res = wire.CancelResult()
    if run:
        res = o.client().call(wire.Cancel, wire.CancelResult | None, conversation=r.id) or wire.CancelResult(run=run)
        run = res.run or run
    timed_out = res.reason == "cancel_timeout"
    if o.json:
        _json({"ok": not timed_out, "conversation": r.id, "cancelled": bool(run), "run": run,
               "state": res.state, "reason": res.reason, "inferred": res.inferred})
    elif not run:
        click.echo(f"nothing to cancel: no turn is running in {r.id}")
    elif timed_out:
        _err(f"run {run} in {r.id}: the runtime did not confirm the cancel in time (cancel_timeout); "
             "agentd ended the turn itself (cancelled) and the runtime's own end, if it comes, is ignored")
    elif res.state and res.state != "cancelled":
        click.echo(f"run {run} in {r.id} ended {res.state} before the cancel took effect")
    else:
        click.echo(f"cancelled run {run} in {r.id}")
    if timed_out:
        _exit(exitcodes.CANCEL_UNCONFIRMED)


@click.command()
@click.argument("conversation")
@common
def close(conversation: str) -> None:
    """Close a conversation (kept on disk; agentctl ls --all lists it).

    \b
    Examples:
      agentctl close c3f9
      agentctl ls --all --state closed
    """
    _simple(wire.Close, conversation, "closed")


@click.command()
@click.argument("conversation")
@click.option("--force", "-f", is_flag=True, help="Remove it even while a turn runs (the turn is cancelled first).")
@common
def rm(conversation: str, force: bool) -> None:
    """Remove a conversation and its journal.

    A conversation whose turn is running is refused (exit 7) unless --force,
    as `docker rm` refuses a running container. --json: {"ok", "conversation"}.

    \b
    Examples:
      agentctl rm c3f9
      agentctl rm --force c3f9        # cancel its running turn, then remove it
    """
    if force:
        _simple(wire.Remove, conversation, "removed", force=True)
    else:
        _simple(wire.Remove, conversation, "removed")


@click.command()
@click.argument("conversation")
@click.argument("title")
@common
def title(conversation: str, title: str) -> None:
    """Set a conversation's title (also in the provider's own store, where it keeps titles).

    Its whitespace is folded to single spaces; "" clears it. Prints the
    title as set. --json: {"ok", "conversation", "title"}.

    \b
    Examples:
      agentctl title c3f9 "flaky CI test"
      agentctl title c3f9 ""
    """
    o = _opts()
    conversation, res = _call(wire.SetTitle, conversation, title=title)
    if isinstance(res, dict) and isinstance(res.get("title"), str):
        title = res["title"]  # as set (older agentd: as typed)
    if o.json:
        return _ok_json(conversation=conversation, title=title)
    click.echo(f"title of {conversation}: {visible_name(title)}" if title else f"title of {conversation} cleared")


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


@click.command()
@click.argument("conversation")
@click.option("--max-cost-usd", type=FiniteFloat(min=0), default=None, metavar="USD",
              help="The new budget (raise or lower it).")
@click.option("--on-reach", type=click.Choice(["pause", "stop"]), default=None,
              help="pause (default) or stop (close) when spend reaches it; default: as before.")
@click.option("--none", "none_", is_flag=True, help="Remove the budget.")
@common
def budget(conversation: str, max_cost_usd: float | None, on_reach: str | None, none_: bool) -> None:
    """Set a conversation's budget: raise, lower or remove it (journaled).

    A conversation paused on its budget stays paused: resume it with
    agentctl continue. --json: the conversation record.

    \b
    Examples:
      agentctl budget c3f9 --max-cost-usd 10 && agentctl continue c3f9
      agentctl budget c3f9 --none
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


@click.command("continue")
@click.argument("conversation")
@common
def continue_(conversation: str) -> None:
    """Resume a conversation paused on its budget, once the budget was raised.

    Nothing is resent: send the next prompt yourself. Exits 8 when the
    conversation is not paused, 1 (limit) while it is still at its budget.
    --json: the conversation record.

    \b
    Examples:
      agentctl budget c3f9 --max-cost-usd 10 && agentctl continue c3f9
    """
    o = _opts()
    rec = o.client().call(wire.Continue, wire.ConversationRecord, conversation=conversation)
    if o.json:
        return _json(rec)
    click.echo(f"continued: {rec.id} is {rec.state.value}")


@click.command()
@click.argument("conversation")
@click.option("--format", "fmt", type=click.Choice(["md", "json", "html"]), default="md", show_default=True,
              help="Markdown, JSON, or one self-contained HTML file.")
@click.option("--include-tools", is_flag=True,
              help="Add tool calls and their output, permission requests, reasoning and subagents' work.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to FILE instead of stdout.")
@click.option("--all", "all_", is_flag=True, help="Also the turns a rewind dropped, marked (dropped).")
@common
def export(conversation: str, fmt: str, include_tools: bool, output: str | None, all_: bool) -> None:
    """Export a conversation's transcript, rendered by agentd from its journal.

    --json: {"conversation", "format", "title", "text"}, or with -o
    {"ok", "conversation", "format", "path", "bytes"}.

    \b
    Examples:
      agentctl export c3f9 > c3f9.md
      agentctl export c3f9 --format html --include-tools -o c3f9.html
    """
    o = _opts()
    res = o.client().call(wire.Export, wire.ExportResult, conversation=conversation, format=fmt,
                          include_tools=include_tools, all=all_)
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
