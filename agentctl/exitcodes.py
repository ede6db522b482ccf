"""agentctl's exit codes: stable, documented in ``agentctl --help`` and docs/cli.md.

One table maps the outcome of a turn and each wire error code to the status a
script sees, so every command reports the same failure the same way.
"""

from __future__ import annotations

OK = 0
#: the turn failed, or any error without a code of its own
FAILED = 1
#: click's usage errors (bad option, missing argument)
USAGE = 2
CANCELLED = 3
#: an interaction is pending and agentctl may not answer it (``--exit-on-action``)
NEEDS_ACTION = 4
UNREACHABLE = 5
NOT_FOUND = 6
BUSY = 7
#: the daemon refused a request or an answer as invalid
INVALID = 8
#: ``cancel``: the runtime did not confirm the cancel in time; agentd ended the turn itself
CANCEL_UNCONFIRMED = 9
#: interrupted by Ctrl-C; a turn that was running goes on in the daemon
INTERRUPTED = 130

#: Wire error code -> exit code. Codes not listed exit with :data:`FAILED`.
#: ``gone`` (the interaction is no longer pending) counts as not found.
BY_ERROR_CODE: dict[str, int] = {
    "not_found": NOT_FOUND,
    "gone": NOT_FOUND,
    "busy": BUSY,
    "invalid": INVALID,
}

#: Terminal turn state -> exit code.
BY_TURN_STATE: dict[str, int] = {
    "completed": OK,
    "failed": FAILED,
    "cancelled": CANCELLED,
}

HELP = """\
Exit codes:

\b
  0  ok; the followed turn completed
  1  the turn failed, or another error
  2  usage error
  3  the turn was cancelled
  4  needs action: an interaction is pending and agentctl may not answer it
     (--exit-on-action); account: a provider needs a sign-in
  5  agentd unreachable
  6  not found (conversation, interaction)
  7  busy: a turn is running (send --if-busy reject)
  8  refused as invalid (e.g. an answer that does not fit)
  9  cancel: the runtime did not confirm it in time; agentd ended the turn
     (cancel_timeout)
"""


def for_error(err: BaseException) -> int:
    """The exit code for an error raised by a request (wire error or other)."""
    from agentd.contract import AgentdError  # here: this module is imported at start, the wire types are not

    if isinstance(err, AgentdError):
        return BY_ERROR_CODE.get(err.code, FAILED)
    return FAILED


def for_turn(state: object) -> int:
    """The exit code for a terminal turn state (``TurnState`` or its string value)."""
    value = getattr(state, "value", state)
    return BY_TURN_STATE.get(str(value), FAILED)
