"""Logging for the daemon: structlog to stderr, JSON lines or console, with secrets redacted.

:func:`configure_logging` routes both structlog loggers and the standard
``logging`` module (third-party libraries) through one stderr handler, so
every line has the same shape and passes the same redaction:

* a value under a key whose name contains ``key``, ``token``, ``secret``,
  ``password``/``passwd``, ``credential``, ``cookie`` or ``authorization``
  (any case, nested dicts included) becomes ``"[redacted]"``;
* every secret of :mod:`agentd.masking`'s rule (secret-named environment
  variables, values registered with :func:`register_secret` such as the
  WebSocket token, ``Authorization``/bearer header values) becomes
  ``"[redacted]"``, inside larger strings, exception text and reprs too,
  relayed runtime stderr included.

JSON lines carry ``timestamp`` (UTC, ISO 8601 with ``Z``), ``level``,
``event``, ``logger`` (stdlib loggers) and the event's keys. When stderr is
the systemd journal (``$JOURNAL_STREAM`` names it), each line is prefixed
with a ``<N>`` syslog priority that journald strips and records.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, TextIO

import msgspec
import structlog

from . import masking

__all__ = [
    "REDACTED",
    "configure_logging",
    "get_logger",
    "redact",
    "register_secret",
]

REDACTED = masking.REDACTED

#: Registered secrets shorter than this are ignored (they would redact common words).
MIN_SECRET_LENGTH = masking.MIN_LENGTH

_SENSITIVE_KEY = re.compile(r"key|token|secret|passw|credential|cookie|authorization", re.I)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

#: syslog priorities journald reads from a "<N>" line prefix
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "critical": 2, "exception": 3}


# --------------------------------------------------------------------------- secrets


def register_secret(value: str | None) -> None:
    """Redact every later occurrence of ``value`` in log output (and everything else agentd writes).

    Call it as soon as a secret is read (an API key from the environment, a
    bearer token). Empty, whitespace-only and very short values (under
    :data:`MIN_SECRET_LENGTH` characters) are ignored. Thread-safe; there is no
    unregistering. The rule itself lives in :mod:`agentd.masking`.
    """
    if isinstance(value, str):
        masking.register(value)


_redact_text = masking.mask_rendered


def redact(value: Any, key: str | None = None) -> Any:
    """``value`` with secrets replaced by ``"[redacted]"`` (see the module doc).

    Dicts, lists and tuples are copied and redacted recursively; other
    objects are returned as they are (their rendered text is redacted later).
    ``key`` is the name ``value`` is logged under.
    """
    if key is not None and _SENSITIVE_KEY.search(key) and value is not None and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str):
        return _redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, k if isinstance(k, str) else None) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    return value


def _redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: redact(v, k) for k, v in event_dict.items()}


# --------------------------------------------------------------------------- rendering


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return repr(obj)


_json = msgspec.json.Encoder(enc_hook=_enc_hook)
_FIRST = ("timestamp", "level", "event", "logger")


def _render_json(_logger: Any, _name: str, event_dict: dict[str, Any]) -> str:
    ordered = {k: event_dict[k] for k in _FIRST if k in event_dict}
    ordered.update((k, v) for k, v in event_dict.items() if k not in ordered)
    try:
        return _json.encode(ordered).decode()
    except (TypeError, ValueError, OverflowError):
        return _json.encode({str(k): _enc_hook(v) if not isinstance(v, (str, int, float, bool)) else v for k, v in ordered.items()}).decode()


class _Finish:
    """Last step: redact the rendered line once more, add the journald priority prefix."""

    def __init__(self, renderer: Any, prefix_priority: bool) -> None:
        self.renderer = renderer
        self.prefix_priority = prefix_priority

    def __call__(self, logger: Any, name: str, event_dict: dict[str, Any]) -> str:
        level = str(event_dict.get("level", name))
        line = _redact_text(self.renderer(logger, name, event_dict))
        if self.prefix_priority:
            prio = _PRIORITY.get(level, 6)
            line = "\n".join(f"<{prio}>{part}" for part in line.split("\n"))
        return line


def _redacting_exception_formatter(inner: Any) -> Any:
    def fmt(sio: TextIO, exc_info: Any) -> None:
        buf = io.StringIO()
        inner(buf, exc_info)
        sio.write(_redact_text(buf.getvalue()))

    return fmt


def _is_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journald stream systemd set up ($JOURNAL_STREAM = "dev:ino")."""
    value = environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError, io.UnsupportedOperation):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------- setup


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler configure_logging installed, so reconfiguring replaces it."""


def configure_logging(
    level: str = "info",
    format: str = "auto",
    *,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Send all logging (structlog and stdlib) to ``stream`` (default: sys.stderr).

    ``level``: debug | info | warning | error | critical. ``format``: "json"
    (one JSON object per line), "console" (human-readable, colored unless
    NO_COLOR is set), or "auto": JSON when the stream is not a tty or under
    systemd ($JOURNAL_STREAM or $INVOCATION_ID set), else console. May be
    called again to reconfigure. Raises ValueError for an unknown level or
    format.
    """
    if level not in _LEVELS:
        raise ValueError(f"unknown log level {level!r} (one of {', '.join(_LEVELS)})")
    if format not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {format!r} (auto, json or console)")
    env = os.environ if environ is None else environ
    out = sys.stderr if stream is None else stream
    under_systemd = bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))
    use_json = format == "json" or (format == "auto" and (under_systemd or not _isatty(out)))

    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.PositionalArgumentsFormatter(),
        timestamper,
        structlog.processors.StackInfoRenderer(),
    ]
    if use_json:
        renderer: Any = _render_json
        tail: list[Any] = [structlog.processors.format_exc_info]
    else:
        colors = _isatty(out) and not env.get("NO_COLOR")
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors,
            exception_formatter=_redacting_exception_formatter(structlog.dev.plain_traceback),
        )
        tail = []
    finish = _Finish(renderer, prefix_priority=use_json and _is_journal(out, env))

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *tail,
            _redact_processor,
            finish,
        ],
    )
    handler = _Handler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    logging.captureWarnings(True)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            _redact_processor,  # early too, so no other stdlib handler sees raw values
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None, **initial: Any) -> Any:
    """A structlog logger named ``name`` (its ``logger`` key; default: the caller's module), bound to ``initial``."""
    if name is None:
        name = sys._getframe(1).f_globals.get("__name__", "agentd")
    return structlog.stdlib.get_logger(name, **initial)
