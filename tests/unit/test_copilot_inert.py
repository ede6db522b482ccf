"""The Copilot SDK events agentd drops in the SDK's thread (``INERT``) must be ones it does nothing with.

``CopilotConversation._sdk_event`` returns early for them, before the hop to
trio, so a type listed there by mistake would be lost silently: a turn that
never ends (``session.idle``), a permission never shown. The rule is checked
against the code that acts on events: the mapper's dispatch and the
conversation's handler.
"""

from __future__ import annotations

import inspect
import re

from copilot.generated.session_events import SessionEventType as T

from agentd.providers.copilot import _mapping as m
from agentd.providers.copilot._conversation import CopilotConversation


def _types_named_in(*functions: object) -> set[T]:
    source = "".join(inspect.getsource(f) for f in functions)  # type: ignore[arg-type]
    return {getattr(T, name) for name in re.findall(r"\bT\.([A-Z_]+)", source)}


def test_inert_events_are_neither_mapped_nor_handled() -> None:
    acted_on = _types_named_in(m.EventMapper._map, CopilotConversation._handle, CopilotConversation._on_event)
    assert acted_on, "no event types found in the handlers: the check would prove nothing"
    assert not acted_on & m.INERT, f"dropped before trio but acted on: {sorted(t.value for t in acted_on & m.INERT)}"


def test_every_inert_event_is_also_ignored_by_the_mapper() -> None:
    assert m.INERT <= m._IGNORED


def test_no_event_the_sdk_itself_acts_on_goes_unread() -> None:
    """The reader drops unread events before the SDK parses them: its own handlers (the broadcast
    requests it answers, the waits of send_and_wait) must never be of those types."""
    import copilot.client
    import copilot.session

    from agentd.providers.copilot._conversation import unread_event_type
    from copilot.generated import session_events as se

    parse = inspect.getsource(se.SessionEvent.from_dict)
    type_of = {cls: getattr(T, member) for member, cls in
               re.findall(r"case SessionEventType\.([A-Z_]+): data = (\w+)\.from_dict", parse)}
    assert len(type_of) > 50, "the SDK's event parse changed shape: the check would prove nothing"
    used = {name for module in (copilot.session, copilot.client)
            for name in re.findall(r"\b(\w+Data)\b", inspect.getsource(module)) if name in type_of}
    assert {"PermissionRequestedData", "ExternalToolRequestedData", "SessionIdleData"} <= used
    assert not [type_of[name].value for name in sorted(used) if unread_event_type(type_of[name].value)]
