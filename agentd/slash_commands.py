"""Slash commands: the prompt commands and skills a conversation's runtime offers, run as turns.

Rules (the seed contract's ``Conversation.Commands`` and ``RunCommand``):

* Only commands that become a prompt are offered: skills and the runtime's prompt
  commands. A runtime's local commands (clear, model, config ...) are not, so a
  client never runs something that changes the runtime behind agentd's back.
* A command runs as a turn, exactly like a prompt: ``send`` of ``/name args`` (or
  the ``command`` op) journals the prompt ``/name args`` (which is the user item
  history and attach show), then the provider runs it natively
  (:meth:`~agentd.contract.CommandRunner.run_command`).
* On a provider with commands, a prompt whose first word is ``/name`` is a command.
  A name the runtime does not offer is :class:`~agentd.contract.Invalid`, the
  message listing what it offers, and nothing is journaled or sent. A prompt that
  starts with a space is sent as plain text.
* A provider without commands (``capabilities().commands`` False) answers the
  ``commands`` and ``command`` ops ``unsupported``; its prompts go out as typed.

The conversation service stays the turn state machine: it calls :func:`check`
before it takes a prompt and :func:`submit` where it hands one to the provider.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import contract as c
from . import wire
from .termsafe import visible_name

if TYPE_CHECKING:
    from .conversations import ConversationService, _Live

__all__ = ["check", "listing", "parse", "run", "submit"]

#: ``/name`` then the end or whitespace: a name is letters, digits and ``_ - . :`` (plugin:command).
_COMMAND = re.compile(r"/([A-Za-z0-9][\w.:-]*)(?:\s+(.*))?\Z", re.DOTALL)


def parse(text: str) -> tuple[str, str] | None:
    """``(name, args)`` when ``text`` is a slash command (``/name args``), else None."""
    m = _COMMAND.match(text)
    if m is None:
        return None
    return m.group(1), (m.group(2) or "").strip()


async def _commands_of(service: "ConversationService", live: "_Live") -> list[c.Command]:
    record = live.record
    if record.state is wire.ConversationState.CLOSED:
        raise c.Closed(f"conversation {record.id} is closed")
    if not (await service.runtimes.get(record.provider)).capabilities().commands:
        raise c.Unsupported(f"provider {record.provider!r} offers no slash commands")
    conv = live.conv if live.conv is not None else await service.open_conversation(live)
    if not isinstance(conv, c.CommandRunner):
        raise c.Unsupported(f"provider {record.provider!r} offers no slash commands")
    return await conv.commands()


async def listing(service: "ConversationService", ref: str) -> wire.CommandList:
    """The commands conversation ``ref``'s runtime offers now (it is opened on its runtime if it is not).

    Raises NotFound, Closed, Unsupported (no commands on this provider), RuntimeUnavailable.
    """
    live = await service.live(ref, open_only=True)
    commands = await _commands_of(service, live)
    return wire.CommandList(conversation=live.record.id, provider=live.record.provider, commands=commands)


#: how many of the runtime's command names an error message lists
_OFFERED_SHOWN = 50


def _offered(commands: list[c.Command]) -> str:
    """The runtime's command names for a message: each on one line (a name is the runtime's
    choice: a newline in it would forge a line of the message), the first 50 of them."""
    shown = ", ".join(f"/{visible_name(cmd.name)}" for cmd in commands[:_OFFERED_SHOWN]) or "none"
    more = len(commands) - _OFFERED_SHOWN
    return shown + (f" and {more:,} more (agentctl commands lists them)" if more > 0 else "")


async def check(service: "ConversationService", live: "_Live", text: str) -> None:
    """Raise Invalid when ``text`` is ``/name ...`` and the runtime offers no command ``name``.

    Does nothing for plain text, or on a provider without commands. Raises what
    listing the commands raises (RuntimeUnavailable when the runtime cannot start).
    """
    parsed = parse(text)
    if parsed is None or live.record.state is wire.ConversationState.CLOSED:
        return
    if not (await service.runtimes.get(live.record.provider)).capabilities().commands:
        return
    commands = await _commands_of(service, live)
    name = parsed[0]
    if not any(cmd.name == name for cmd in commands):
        raise c.Invalid(f"{live.record.provider} offers no command /{name}; it offers: {_offered(commands)} "
                        "(start the prompt with a space to send it as text)",
                        details={"commands": [cmd.name for cmd in commands]})


async def submit(service: "ConversationService", live: "_Live", conv: c.Conversation, prompt: c.Prompt) -> None:
    """Hand ``prompt`` to the provider: as a command when it is one (see :func:`check`), else ``send``.

    Raises what ``send`` / ``run_command`` raise.
    """
    parsed = parse(prompt.text)
    if parsed is not None and isinstance(conv, c.CommandRunner) \
            and (await service.runtimes.get(live.record.provider)).capabilities().commands:
        await conv.run_command(parsed[0], c.Prompt(text=parsed[1], attachments=list(prompt.attachments)))
        return
    await conv.send(prompt)


async def run(service: "ConversationService", ref: str, name: str, args: str = "", *,
              if_busy: str = "reject") -> wire.SendResult:
    """Run command ``name`` with ``args`` as a turn of ``ref``: ``send`` of ``/name args``.

    ``if_busy`` is reject, queue or interrupt (steer is Invalid: a command is a turn).
    Raises Invalid (not offered: the message lists what is), Unsupported (no
    commands on this provider), and what ``send`` raises.
    """
    name = name.removeprefix("/")
    if if_busy == "steer":
        raise c.Invalid("a command runs as a turn of its own; it cannot be steered into the running one")
    parsed = parse(f"/{name}")
    if parsed is None or parsed[1] or parsed[0] != name:  # a name, and only a name: arguments go in ``args``
        raise c.Invalid(f"{name!r} is not a command name")
    live = await service.live(ref, open_only=True)
    await _commands_of(service, live)  # Unsupported before anything else
    text = f"/{name} {args.strip()}" if args.strip() else f"/{name}"
    return await service.send(ref, text, if_busy=if_busy)
