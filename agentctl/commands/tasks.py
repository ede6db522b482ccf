"""agentctl task: queue non-interactive jobs and follow them."""

from __future__ import annotations

import os
import sys

import click

from agentd import wire
from agentd.termsafe import visible

from .. import exitcodes
from ..cli import AgentctlGroup, Fail, FiniteFloat, _err, _exit, _json, _notice, _opts, _style, _text_arg, common


@click.group(cls=AgentctlGroup)
@common
def task() -> None:
    """Queue non-interactive jobs and follow them: create, ls, show, cancel, comment, wait.

    A task runs its input as the first turn of a new conversation of its own,
    at most tasks.concurrency per provider at once. Tasks are named by their id
    or any unique prefix of it.
    """


def _task_model(provider: str, model: str) -> str:
    if provider in ("script", "") and model and not os.path.isabs(model) and os.path.isfile(model):
        return os.path.abspath(model)  # the daemon does not share our cwd
    return model


@task.command("create")
@click.argument("text")
@click.option("--provider", "-p", default="",
              help="Provider name (see agentctl providers); default: [providers] default of agentd.toml.")
@click.option(
    "--cwd", default=".", show_default=True, type=click.Path(exists=True, file_okay=False, resolve_path=True),
    help="The agent's working directory.",
)
@click.option("--model", "-m", default="", help="Model id (for the script provider: the script's path).")
@click.option("--callback", default="", metavar="URL",
              help="http(s) URL that gets a JSON POST when the task ends (retried with backoff).")
@click.option("--yolo", is_flag=True, help="Let agentd answer its permission requests (allow once): it runs unattended.")
@click.option("--max-cost-usd", type=FiniteFloat(min=0), default=None, metavar="USD",
              help="Its budget (default: the provider's from the config, if any); on reach the turn is cut short.")
@click.option("--on-reach", type=click.Choice(["pause", "stop"]), default=None,
              help="With --max-cost-usd: pause (default) or stop (close) its conversation.")
@common
def task_create(text: str, provider: str, cwd: str, model: str, callback: str, yolo: bool,
                max_cost_usd: float | None, on_reach: str | None) -> None:
    """Queue TEXT as a task (TEXT - reads stdin); print its id (--json: the task record).

    Without --yolo the task stops at its first permission request until
    someone answers it (agentctl answer on its conversation). A provider that
    cannot run a turn now (not installed, not signed in, no key) is refused
    here (exit 1), with what fixes it, rather than failing later.

    \b
    Examples:
      agentctl task create -p claude --yolo --max-cost-usd 2 "fix the failing test"
      agentctl task create -p codex -m gpt-5 --cwd ~/src/app --callback https://ci.example/hook - < job.txt
      id=$(agentctl task create --yolo "update the changelog") && agentctl task wait "$id"
    """
    from .conversations import _budget_arg

    o = _opts()
    rec = o.client().call(
        wire.TaskCreate, wire.TaskRecord, provider=provider, workdir=cwd, input=_text_arg(text),
        model=_task_model(provider, model), callback=callback, mode="yolo" if yolo else "interactive",
        budget=_budget_arg(max_cost_usd, on_reach),
    )
    if o.json:
        return _json(rec)
    click.echo(rec.id)


@task.command("ls")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in wire.TaskStatus]),
              help="Only tasks in this status (repeatable).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=None,
              help="At most N tasks, and the cursor of the next on stderr (default: every task, page by page).")
@click.option("--after", "after", default="", metavar="TASK", help="Only tasks after this one (a full task id).")
@common
def task_ls(statuses: tuple[str, ...], limit: int | None, after: str) -> None:
    """List tasks, oldest first (--json: {"tasks": [task, ...], "next"}).

    agentd answers a page at a time (at most 1,000 tasks or 16 MiB); without --limit every
    page is fetched. With --limit, "next" (also on stderr) is the --after of the next page.

    \b
    Examples:
      agentctl task ls
      agentctl task ls --status running --status waiting_for_input --json
      agentctl task ls --limit 100 --after t3f2c9a1b7d04
    """
    o = _opts()
    client = o.client()
    status = [wire.TaskStatus(s) for s in statuses]
    res = wire.TaskListResult()
    while True:
        page = client.call(wire.TaskList, wire.TaskListResult, status=status, after=after,
                           limit=min(limit - len(res.tasks), 1000) if limit else 1000)
        res.tasks += page.tasks
        res.next = after = page.next
        if not page.next or (limit and len(res.tasks) >= limit):
            break
    if limit and res.next:
        _notice(f"more: agentctl task ls --limit {limit} --after {res.next}")
    if o.json:
        return _json(res)
    if not res.tasks:
        _err("no tasks")
        return
    from ..render import table

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
    """Show a task: status, result, usage, conversation, times, comments, callback attempts.

    \b
    Examples:
      agentctl task show t7a2
      agentctl task show t7a2 --json | jq -r .task.result
    """
    o = _opts()
    info = o.client().call(wire.TaskShow, wire.TaskInfo, task=task_id)
    if o.json:
        return _json(info)
    from ..render import visible_all

    t = visible_all(info.task)  # its result and error are agent text
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
        n = len(t.callback_attempts)
        lines.append(("callback", f"{t.callback} ({state}, {n} attempt{'' if n == 1 else 's'})"))
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
        from ..render import Renderer

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

    \b
    Examples:
      agentctl task cancel t7a2
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

    \b
    Examples:
      agentctl task comment t7a2 "skip the integration tests"
    """
    o = _opts()
    res = o.client().call(wire.TaskAddComment, wire.TaskCommentResult, task=task_id, text=_text_arg(text))
    if o.json:
        return _json(res)
    cm = res.comment
    if cm.delivery == "steered":
        click.echo(f"comment {cm.id}: recorded and steered into the running turn")
    else:
        click.echo(f"comment {cm.id}: recorded only ({visible(cm.note)})" if cm.note else f"comment {cm.id}: recorded")


@task.command("wait")
@click.argument("task_id", metavar="TASK")
@click.option("--timeout", type=FiniteFloat(min=0), default=None, metavar="SECONDS", help="Give up after this long (exit 1).")
@click.option("--exit-on-action", is_flag=True, help="Exit 4 when the task waits for input.")
@common
def task_wait(task_id: str, timeout: float | None, exit_on_action: bool) -> None:
    """Wait until a task ends; exit 0 completed, 1 failed, 3 cancelled (--json: the task record).

    With --exit-on-action it exits 4 as soon as the task is waiting_for_input.

    \b
    Examples:
      agentctl task wait t7a2 --timeout 600
      agentctl task wait t7a2 --exit-on-action || agentctl task show t7a2
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
        click.echo(f"task {t.id}: {t.status.value}" + (f": {visible(t.error)}" if t.error else ""))
    _exit(exitcodes.NEEDS_ACTION if waiting else exitcodes.for_turn(t.status.value))
